"""DeLS-Spec: a block drafter alone vs the same block drafter fused with a local head, on two block checkpoints.

    python -m experiments.studies.dels --pair tiny-code                       # shipped head on dflash and dflash-dpace
    python -m experiments.studies.dels --pair smollm2-135m --prompts 8 --max-new 64
    python -m experiments.studies.dels --pair tiny-code --weights 0.3:0.3 0.5:0.3 1.0:0.3  # fusion weights alpha:beta

For each block drafter in --blocks, each T and K: `sd` with the block drafter alone and with the local head fused
(`DeLSDrafter(block, head, alpha, beta)`), on the same prompts and seeds. Reported: mean acceptance length
(tokens per target call, stats.mean_acceptance_length), the paired difference fused - alone with its bootstrap
standard error over requests x seeds (experiments/bench/tree.py), and the training cost of the head next to each
block drafter's (wall time, params, from their training.json). JSON: --out (default
experiments/results/dels_study_<pair>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from experiments import report
from experiments.common import REPO

SCHEMA = "smcsd.dels_study/1"


def _training(path: str) -> dict:
    try:
        with open(os.path.join(path, "training.json")) as f:
            return json.load(f)
    except OSError:
        return {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--blocks", nargs="+", default=["dflash", "dflash-dpace"])
    ap.add_argument("--head", default=None, help="a LocalHead directory (default: the pair's shipped `dels`)")
    ap.add_argument("--weights", nargs="+", default=["0.3:0.3"], help="alpha:beta fusion weights to try")
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import smcsd
    from experiments.common import prompts_for
    from smcsd.models.shipped import SHIPPED_DIR
    from smcsd.drafters import DeLSDrafter, LocalHead
    from experiments.bench.tree import bootstrap_se, per_request, pooled

    smol = args.pair == "smollm2-135m"
    dtype = "float32" if smol else None
    head_dir = args.head or os.path.join(SHIPPED_DIR, args.pair, "drafters", "dels")
    head = LocalHead.load(head_dir)
    weights = [tuple(float(x) for x in w.split(":")) for w in args.weights]
    target = smcsd.load(args.pair, dtype=dtype)[0]
    blocks = {b: smcsd.load(args.pair, drafter=b, dtype=dtype)[1] for b in args.blocks}
    head_info = _training(head_dir)
    costs = [{"drafter": "local head", "train_wall_s": head_info.get("train_wall_s"),
              "num_params": head.num_params, "steps": head_info.get("run", {}).get("steps")}]
    for b in args.blocks:
        info = _training(os.path.join(SHIPPED_DIR, args.pair, "drafters", b))
        costs.append({"drafter": b, "train_wall_s": info.get("train_wall_s"), "num_params": blocks[b].num_params,
                      "steps": info.get("run", {}).get("steps")})
    prompts = prompts_for(args.pair, target, args.prompts, args.prompt_tokens)
    rows, t0 = [], time.time()
    for T in args.temperatures:
        for K in args.ks:
            for b, block in blocks.items():
                runs = [("alone", None, block)] + [(f"+head a={a:g} b={be:g}", (a, be), DeLSDrafter(block, head, a, be))
                                                  for a, be in weights]
                per = {}
                for label, w, d in runs:
                    lens, pr = [], []
                    for seed in range(args.seeds):
                        r = smcsd.decode(prompts, target=target, draft=d, method="sd", num_speculative_tokens=K,
                                         max_new_tokens=args.max_new, temperature=T, seed=seed)
                        lens.append(r.stats.mean_acceptance_length)
                        pr += per_request(r)
                    per[label] = pr
                    row = {"block": b, "drafter": label, "alpha": w and w[0], "beta": w and w[1], "K": K,
                           "temperature": T, "mean_acceptance_length": statistics.mean(lens),
                           "tokens_per_call": pooled(pr), "se": bootstrap_se(pr), "samples": len(pr)}
                    if w is not None:
                        row["gain"] = pooled(pr) - pooled(per["alone"])
                        row["gain_se"] = bootstrap_se(pr, per["alone"])
                    rows.append(row)
                    print(f"T={T} K={K} {b:13s} {label:18s} accept len {row['mean_acceptance_length']:.3f} ± "
                          f"{row['se']:.3f}" + (f"  gain {row['gain']:+.3f} ± {row['gain_se']:.3f}" if w else ""),
                          flush=True)
    cols = ["block drafter", "drafter", "T", "K", "mean acceptance length", "± se", "fused − alone (paired)"]
    table = [[r["block"], r["drafter"], r["temperature"], r["K"], report.fmt(r["mean_acceptance_length"], ".3f"),
              report.fmt(r["se"], ".3f"),
              f"{r['gain']:+.3f} ± {r['gain_se']:.3f}" if "gain" in r else "–"] for r in rows]
    markdown = report.markdown_table(cols, table)
    cost_table = report.markdown_table(
        ["trained", "params", "steps", "train wall (s)"],
        [[c["drafter"], f"{c['num_params'] / 1e6:.2f} M", c["steps"], report.fmt(c["train_wall_s"], ".0f")]
         for c in costs])
    print(markdown)
    print(cost_table)
    out = report.new_result(SCHEMA, command=report.command(__file__, argv), pair=args.pair,
                            machine=report.machine_info(), head=os.path.relpath(head_dir, REPO),
                            prompts=len(prompts), max_new_tokens=args.max_new, seeds=args.seeds, rows=rows,
                            training_cost=costs, markdown=markdown + "\n\n" + cost_table,
                            wall_s=round(time.time() - t0, 1))
    path = args.out or report.results_path(f"dels_study_{args.pair}.json")
    report.write_json(path, report.json_safe(out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
