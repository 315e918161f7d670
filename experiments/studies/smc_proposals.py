"""SMC proposals compared on tiny-arith: the base drafter against drafters fine-tuned for SMC with forward KL,
reverse KL, Rényi-2 (χ²) and the Rényi-1.5 + 0.5·KL mix, each × N particles, against the target's `ar`.

    python -m experiments.studies.smc_proposals                                   # the proposals of the last runs
    python -m experiments.studies.smc_proposals --limit 1000 --particles 1 2 4 8 16 --k 4

Proposals: `base` is the pair's `ar-distilled` drafter; the others are experiments/data/proposals/tiny-arith/<name>/
(written by `experiments/train/smc_proposal.py --out ...`, commands in their training.json; the best of them ships
as the pair's `smc-proposal`, which `decode(method="smc")` uses). Every cell runs the first --limit unseen test
problems at T = --temperature with one seed schedule for all cells (batches of 64), and reports exact-match
accuracy with its 95 % interval (Wilson), mean ESS/N over live cycles, the resampling rate, tokens/s and the
held-out divergences each proposal was trained on (from its training.json). Prints a markdown table, writes JSON
(experiments/results/smc_proposals_tiny-arith.json) and a plot (accuracy and ESS/N against N, one line per proposal;
docs/figures/smc_proposals_tiny-arith.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from experiments import arith_data
from experiments import report
from experiments.common import DATA, DOCS, RESULTS
from experiments.studies.eval_arith import evaluate

PROPOSALS_DIR = os.path.join(DATA, "proposals", "tiny-arith")
ORDER = ("base", "forward_kl", "reverse_kl", "renyi", "renyi_kl_mix")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k / n."""
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def proposals(names):
    import smcsd
    from smcsd.models.shipped import load_model_dir
    target = smcsd.load("tiny-arith")[0]
    out = {}
    for name in names:
        if name == "base":
            out[name] = (smcsd.load("tiny-arith", drafter="ar-distilled")[1], None)
            continue
        path = os.path.join(PROPOSALS_DIR, name)
        if not os.path.isfile(os.path.join(path, "config.json")):
            print(f"skip {name}: no proposal at {path}", flush=True)
            continue
        info = None
        if os.path.isfile(os.path.join(path, "training.json")):
            with open(os.path.join(path, "training.json")) as f:
                info = json.load(f)
        import dataclasses
        m = dataclasses.replace(load_model_dir(path, name=f"tiny-arith/{name}"), tokenizer=target.tokenizer)
        out[name] = (m, info)
    return target, out


def plot(rows, ar, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name in ORDER:
        mine = sorted((r for r in rows if r["proposal"] == name), key=lambda r: r["N"])
        if not mine:
            continue
        ns = [r["N"] for r in mine]
        a1.errorbar(ns, [100 * r["accuracy"] for r in mine],
                    yerr=[[100 * (r["accuracy"] - r["ci95"][0]) for r in mine],
                          [100 * (r["ci95"][1] - r["accuracy"]) for r in mine]], marker="o", capsize=3, label=name)
        a2.plot(ns, [r["mean_ess_fraction"] for r in mine], marker="o", label=name)
    a1.axhline(100 * ar["accuracy"], color="k", ls="--", label="ar (target)")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xlabel("particles N")
        a.grid(alpha=0.3)
    a1.set_ylabel("accuracy (%), 95 % interval")
    a2.set_ylabel("mean ESS / N")
    a1.legend(fontsize=8)
    fig.suptitle("tiny-arith: SMC proposals (T = 0.7)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proposals", nargs="+", default=list(ORDER))
    ap.add_argument("--particles", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--out", default=os.path.join(RESULTS, "smc_proposals_tiny-arith.json"))
    ap.add_argument("--plot", default=os.path.join(DOCS, "figures", "smc_proposals_tiny-arith.png"))
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    target, props = proposals(args.proposals)
    problems = arith_data.test_set()[:args.limit]
    kw = dict(temperature=args.temperature, progress=not args.no_progress)
    ar = evaluate(target, None, problems, method="ar", **kw)
    ar.pop("samples")
    ar["ci95"] = wilson(ar["correct"], ar["n"])
    print(f"ar: {100 * ar['accuracy']:.1f} %", flush=True)
    rows = []
    for name, (draft, info) in props.items():
        for n in args.particles:
            r = evaluate(target, draft, problems, method="smc", num_particles=n, num_speculative_tokens=args.k, **kw)
            r.pop("samples")
            final = (info or {}).get("final_eval") or {}
            rows.append(dict(proposal=name, N=n, K=args.k, ci95=wilson(r["correct"], r["n"]),
                             trained=dict(objective=(info or {}).get("run", {}).get("objective"),
                                          heldout_kl=final.get("kl"), heldout_objective=final.get("objective")),
                             **r))
            print(f"{name} N={n}: {100 * r['accuracy']:.1f} %  ESS/N {r.get('mean_ess_fraction', float('nan')):.2f}  "
                  f"resample {r.get('resample_rate', float('nan')):.2f}  {r['tokens_per_s']:.0f} tok/s", flush=True)
    table = report.markdown_table(
        ["proposal", "N", "accuracy (95 % CI)", "vs ar (points)", "ESS/N", "resample rate", "tok/s"],
        [[r["proposal"], r["N"], f"{100 * r['accuracy']:.1f} [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]",
          f"{100 * (r['accuracy'] - ar['accuracy']):+.1f}", f"{r.get('mean_ess_fraction', float('nan')):.3f}",
          f"{r.get('resample_rate', float('nan')):.3f}", f"{r['tokens_per_s']:.0f}"] for r in rows])
    print(f"\nar (target): {100 * ar['accuracy']:.1f} % [{100 * ar['ci95'][0]:.1f}, {100 * ar['ci95'][1]:.1f}]\n")
    print(table)
    res = report.new_result("smcsd.smc_proposals/1", pair="tiny-arith", command=report.command(__file__, argv),
                            machine=report.machine_info(), settings=dict(limit=args.limit, K=args.k,
                                                                         temperature=args.temperature),
                            ar=ar, rows=rows, markdown=table)
    print("wrote", report.write_json(args.out, res, indent=1))
    p = plot(rows, ar, args.plot)
    if p:
        print("wrote", p)


if __name__ == "__main__":
    main()
