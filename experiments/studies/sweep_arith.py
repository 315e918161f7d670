"""The speed/accuracy sweep on the shipped `tiny-arith` pair that picks `decode`'s SMC-SD defaults.

    python -m experiments.studies.sweep_arith                      # the full grid, 500 problems per cell
    python -m experiments.studies.sweep_arith --limit 100 --smc-particles 2 4 --smc-tokens 4   # smaller

1. Accuracy: every cell (ar; sd per K; sd-multi per N at K=4; smc per N x K) on the first --limit
   tiny-arith test problems at --temperature, via eval_arith.evaluate (batches of 64 problems).
2. Speed: bench_speed over the same cells, interleaved rounds on the same pair, at --batch-size
   requests of arithmetic questions (tokens/s, target calls per token, speed-up vs ar).
3. The default: the fastest `smc` cell (tokens/s) whose accuracy is within --within points of ar's.

Prints a markdown table; writes JSON (--out, default experiments/results/sweep_arith.json) with
`cells` (label, method, N, K, accuracy, n, tokens_per_s, speedup_vs_ar, target_calls_per_token,
acceptance_rate, mean_ess_fraction), `ar_accuracy`, `chosen` (the selected smc cell) and `settings`.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments import report
from experiments.common import REPO


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=500, help="test problems per cell (default 500)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--sd-tokens", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--multi-particles", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--smc-particles", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--smc-tokens", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--batch-size", type=int, default=1, help="requests per call in the speed benchmark")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--within", type=float, default=3.0, help="accuracy tolerance vs ar, in points")
    ap.add_argument("--out", default=report.results_path("sweep_arith.json"))
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    from experiments import arith_data
    from experiments.bench import speed as bench_speed
    from experiments.studies.eval_arith import evaluate
    from smcsd.models.shipped import load_shipped

    target, draft = load_shipped("tiny-arith")
    problems = arith_data.test_set()[:args.limit]
    cells = [("ar", None, None)] + [("sd", None, k) for k in args.sd_tokens] \
        + [("sd-multi", n, 4) for n in args.multi_particles] \
        + [("smc", n, k) for n in args.smc_particles for k in args.smc_tokens]

    def label(m, n, k):
        return m + (f" N={n}" if n else "") + (f" K={k}" if k else "")

    accuracy = {}
    for m, n, k in cells:
        kw = {} if m == "ar" else dict(num_particles=n or 1, num_speculative_tokens=k)
        res = evaluate(target, None if m == "ar" else draft, problems, method=m, temperature=args.temperature,
                       progress=not args.no_progress, **kw)
        accuracy[label(m, n, k)] = res
        print(f"{label(m, n, k)}: accuracy {res['accuracy']:.3f}", flush=True)
        report.write_json(os.path.splitext(args.out)[0] + "_accuracy.json",  # progress survives a crash
                          {lab: {k: v for k, v in r.items() if k != "samples"} for lab, r in accuracy.items()})

    specs = ["ar"] + [f"{m},N={n},K={k}" if n else f"{m},K={k}" for m, n, k in cells if m != "ar"]
    bench_out = os.path.splitext(args.out)[0] + "_speed.json"
    questions = [p.question for p in problems[:max(args.batch_size, 4)]]
    bench_speed.main(["--model", "tiny-arith", "--cells", *specs, "--batch-sizes", str(args.batch_size),
                      "--temperature", str(args.temperature), "--repeats", str(args.repeats),
                      "--max-new-tokens", "64", "--prompts", *questions, "--out", bench_out]
                     + (["--no-progress"] if args.no_progress else []))
    with open(bench_out) as f:
        speed = {c["label"]: c for c in json.load(f)["cells"]}

    rows = []
    for m, n, k in cells:
        lab = label(m, n, k)
        acc, sp = accuracy[lab], speed.get(lab, {})
        rows.append(dict(label=lab, method=m, num_particles=n, num_speculative_tokens=k,
                         accuracy=acc["accuracy"], n=acc["n"], tokens_per_s=sp.get("tokens_per_s"),
                         speedup_vs_ar=sp.get("speedup_vs_ar"),
                         target_calls_per_token=sp.get("target_calls_per_token"),
                         acceptance_rate=sp.get("acceptance_rate"), mean_ess_fraction=sp.get("mean_ess_fraction")))
    ar_acc = rows[0]["accuracy"]
    ok = [r for r in rows if r["method"] == "smc" and r["accuracy"] >= ar_acc - args.within / 100
          and r["tokens_per_s"] is not None]
    chosen = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None

    fmt = report.fmt
    print("\n" + report.markdown_table(
        ["cell", f"accuracy (n={args.limit})", f"tokens/s (B={args.batch_size})", "speed-up vs ar",
         "target calls/token", "acceptance", "ESS/N"],
        [[r["label"] + (" **(default)**" if chosen is r else ""), f"{r['accuracy']:.3f}", fmt(r["tokens_per_s"], ".0f"),
          fmt(r["speedup_vs_ar"]) + "x", fmt(r["target_calls_per_token"], ".3f"), fmt(r["acceptance_rate"]),
          fmt(r["mean_ess_fraction"])] for r in rows]))
    print(f"\nar accuracy {ar_acc:.3f}; chosen smc default: {chosen['label'] if chosen else 'none within tolerance'}")
    print("wrote", report.write_json(args.out, {"cells": rows, "ar_accuracy": ar_acc, "chosen": chosen,
                                                "settings": vars(args),
                                                "speed_json": os.path.relpath(bench_out, REPO)}))


if __name__ == "__main__":
    main()
