"""The tiny-arith drafters compared: each drafter alone, `sd` acceptance, and `smc` accuracy at small N against `ar`.

    python -m experiments.studies.arith_drafters                       # ar vs ar-distilled, 500 problems, T=0.7
    python -m experiments.studies.arith_drafters --limit 1000 --smc-particles 2 4 8 16

For every drafter of the pair (default: the original `ar` draft and the distilled `ar-distilled`), on the first
--limit test problems at --temperature (one seed schedule for all cells, batches of 64 problems):
- the drafter alone (`ar` with the drafter as the model): exact-match accuracy;
- `sd` with K=--sd-k: acceptance rate and mean acceptance length (accepted draft tokens per draft block);
- `smc` with N in --smc-particles, K=--smc-k: accuracy, against the target's `ar` accuracy (run once).
Also the drafters' per-token cost relative to the target (matmul FLOPs per token: the layers' weights plus the
LM head; embedding lookups are free; attention over the context left out). Accuracies carry a binomial standard error sqrt(a(1-a)/n).
Prints a markdown table, writes JSON (--out).
"""

from __future__ import annotations

import argparse
import math

from experiments import arith_data
from experiments import report
from experiments.studies.eval_arith import evaluate
from smcsd.cost_model import matmul_params


def flops_per_token(config) -> int:
    """2 x the params a token's forward multiplies by (roofline's `matmul_params`: layers and the LM head)."""
    return 2 * matmul_params(config)


def stderr(acc: float, n: int) -> float:
    return math.sqrt(max(acc * (1 - acc), 1e-12) / n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", nargs="+", default=["ar", "ar-distilled"])
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--sd-k", type=int, default=4)
    ap.add_argument("--smc-particles", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--smc-k", type=int, default=4)
    ap.add_argument("--out", default=report.results_path("arith_drafters.json"))
    ap.add_argument("--ess-threshold", type=float, default=0.5, help="smc's tau (1: resample every cycle)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    import smcsd

    problems = arith_data.test_set()[:args.limit]
    n = len(problems)
    common = dict(temperature=args.temperature, progress=not args.no_progress)
    target, _ = smcsd.load("tiny-arith")
    ar = evaluate(target, None, problems, method="ar", **common)
    target_flops = flops_per_token(target.config)
    cells = {"target": {"ar_accuracy": ar["accuracy"], "ar_tokens_per_s": ar["tokens_per_s"]}}
    body = [["target (ar)", "1.00", f"{ar['accuracy']:.3f} ± {stderr(ar['accuracy'], n):.3f}", "–", "–"]
            + ["–"] * len(args.smc_particles)]
    for name in args.drafters:
        _, draft = smcsd.load("tiny-arith", drafter=name)
        alone = evaluate(draft, None, problems, method="ar", **common)
        sd = evaluate(target, draft, problems, method="sd", num_speculative_tokens=args.sd_k, **common)
        smc = {N: evaluate(target, draft, problems, method="smc", num_particles=N, num_speculative_tokens=args.smc_k,
                           ess_threshold=args.ess_threshold, **common) for N in args.smc_particles}
        cost = flops_per_token(draft.config) / target_flops
        cells[name] = {
            "params": draft.num_params, "flops_ratio": cost, "alone_accuracy": alone["accuracy"],
            "sd": {k: sd[k] for k in ("accuracy", "acceptance_rate", "mean_acceptance_length", "tokens_per_s")},
            "smc": {N: {k: r[k] for k in ("accuracy", "tokens_per_s")} for N, r in smc.items()},
            "smc_minus_ar_points": {N: 100 * (r["accuracy"] - ar["accuracy"]) for N, r in smc.items()}}
        body.append([name, f"{cost:.2f}", f"{alone['accuracy']:.3f} ± {stderr(alone['accuracy'], n):.3f}",
                     f"{sd['acceptance_rate']:.3f}", f"{sd['mean_acceptance_length']:.2f}"]
                    + [f"{smc[N]['accuracy']:.3f} ({100 * (smc[N]['accuracy'] - ar['accuracy']):+.1f})"
                       for N in args.smc_particles])
    table = report.markdown_table(
        ["drafter", "FLOPs/token vs target", "alone: accuracy", f"sd K={args.sd_k}: acceptance",
         f"sd K={args.sd_k}: mean acceptance length"]
        + [f"smc N={N} K={args.smc_k} τ={args.ess_threshold:g}: accuracy (pts vs ar)" for N in args.smc_particles],
        body)
    print(table)
    result = report.new_result("smcsd.arith_drafters/1", machine=report.machine_info(),
                               settings=dict(limit=n, temperature=args.temperature, sd_k=args.sd_k,
                                             smc_k=args.smc_k, smc_particles=args.smc_particles,
                                             ess_threshold=args.ess_threshold),
                               cells=cells, markdown=table, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
