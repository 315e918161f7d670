"""PARD-2 mask drafters compared by decoding: CAT vs uniform weights, and one dual-mode drafter in both modes vs two
separately trained ones (always / never target features).

    python -m experiments.studies.pard2 --pair tiny-code \\
        --drafter cat=shipped uniform=checkpoints/pard2-study/tiny-code-uniform \\
        feat=checkpoints/pard2-study/tiny-code-feat plain=checkpoints/pard2-study/tiny-code-plain

Each drafter (trained by experiments/train/mask_drafter.py with the same steps, data and seeds) runs `sd` on the same
prompts (a batch), K in --ks, T in --temperatures, --seeds seeds; a drafter trained with features runs with them
and, where it is the dual-mode one (trained with feature dropout), also without (`with_features(False)`).
Reported: mean acceptance length (stats.mean_acceptance_length: accepted + 1 per target call) and the bootstrap
standard error (over requests x seeds) of the tokens per target call. JSON: --out (default
experiments/results/pard2_study_<pair>.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from experiments import report
from experiments.common import SHIPPED

SCHEMA = "smcsd.pard2_study/1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--drafter", nargs="+", required=True, metavar="LABEL=DIR",
                    help="LABEL=DIR of a saved mask drafter, or LABEL=shipped for the pair's pard2")
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
    from smcsd.drafters import PARD2Drafter
    from experiments.bench.tree import bootstrap_se, per_request

    smol = args.pair == "smollm2-135m"
    target, _ = smcsd.load(args.pair, dtype="float32" if smol else None)
    runs = []  # (label, mode, drafter)
    for spec in args.drafter:
        label, _, path = spec.partition("=")
        if path == "shipped":
            d = smcsd.load(args.pair, drafter="pard2", dtype="float32" if smol else None)[1]
        else:
            d = PARD2Drafter.load(path, dtype=target.config.dtype, name=label, tokenizer=target.tokenizer).bind(target)
        info = _training(path if path != "shipped" else os.path.join(SHIPPED, args.pair,
                                                                      "drafters", "pard2"))
        dual = bool(d.feature_layers) and (info.get("run", {}).get("feature_drop", 0) or 0) > 0
        runs.append((label, "features" if d.feature_layers else "none", d))
        if dual:
            runs.append((label, "none", d.with_features(False)))
    prompts = prompts_for(args.pair, target, args.prompts, args.prompt_tokens)
    rows, t0 = [], time.time()
    for T in args.temperatures:
        for K in args.ks:
            for label, mode, d in runs:
                lens, per = [], []
                for seed in range(args.seeds):
                    r = smcsd.decode(prompts, target=target, draft=d, method="sd", num_speculative_tokens=K,
                                     max_new_tokens=args.max_new, temperature=T, seed=seed)
                    lens.append(r.stats.mean_acceptance_length)
                    per += per_request(r)
                rows.append({"drafter": label, "features": mode, "K": K, "temperature": T,
                             "mean_acceptance_length": statistics.mean(lens), "se": bootstrap_se(per), "samples": len(per)})
                print(f"T={T} K={K} {label:8s} features={mode:8s} accept len {rows[-1]['mean_acceptance_length']:.3f}"
                      f" ± {rows[-1]['se']:.3f}", flush=True)
    cols = ["drafter", "target features", "T", "K", "mean acceptance length", "± se"]
    table = [[r["drafter"], r["features"], r["temperature"], r["K"], report.fmt(r["mean_acceptance_length"], ".3f"),
              report.fmt(r["se"], ".3f")] for r in rows]
    markdown = report.markdown_table(cols, table)
    print(markdown)
    out = report.new_result(SCHEMA, command=report.command(__file__, argv), pair=args.pair,
                            machine=report.machine_info(), prompts=len(prompts), max_new_tokens=args.max_new,
                            seeds=args.seeds, rows=rows, markdown=markdown, wall_s=round(time.time() - t0, 1))
    path = args.out or report.results_path(f"pard2_study_{args.pair}.json")
    report.write_json(path, report.json_safe(out))
    print(f"wrote {path}")
    return 0


def _training(path: str) -> dict:
    import json
    try:
        with open(os.path.join(path, "training.json")) as f:
            return json.load(f)
    except OSError:
        return {}


if __name__ == "__main__":
    sys.exit(main())
