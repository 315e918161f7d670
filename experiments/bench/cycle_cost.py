"""What one decode cycle costs in the loop, per method setting: the difference of a long and a short greedy decode
of the same prompt, divided by the difference of their target calls (so the prefill and the compile drop out).

    python -m experiments.bench.cycle_cost                      # SmolLM2 + EAGLE: ar, sd K=1/3, the cut's extremes
    python -m experiments.bench.cycle_cost --k 3 --prompts 3 --rounds 2

Cells: `ar` (a one-token call); `sd` K=1 (a two-token call) and K (a K+1-token call); `sd` K with a confidence cut
so low that every draft is verified (the full-width `lax.switch` branch: the switch's own overhead against plain
`sd` K) and so high that none is (width 0: a one-token call after K drafter steps). Prints a table of medians and
writes JSON (--out).
"""

from __future__ import annotations

import argparse
import statistics

from experiments import report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long", type=int, default=200, help="new tokens of the long decode")
    ap.add_argument("--short", type=int, default=40, help="new tokens of the short decode")
    ap.add_argument("--corpus-heldout", default="experiments/data/corpus/smollm2-135m", metavar="DIR")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.k < 1 or args.prompts < 1 or args.rounds < 1 or not 0 < args.short < args.long:
        ap.error("--k, --prompts and --rounds must be >= 1, and 0 < --short < --long")

    import smcsd
    from experiments.common import heldout_chat_prompts, pair_prompts

    target, drafter = smcsd.load(args.pair, drafter=args.drafter)
    if args.pair == "smollm2-135m":  # chat requests held out of the corpus
        prompts = heldout_chat_prompts(args.corpus_heldout, target)[:args.prompts]
    else:  # the toy pairs' held-out prompts
        prompts = pair_prompts(args.pair, target, args.prompts)[0][:args.prompts]
    K = args.k
    cells = {"ar": "ar", "sd K=1": smcsd.SD(num_speculative_tokens=1), f"sd K={K}": smcsd.SD(num_speculative_tokens=K),
             f"sd K={K}, cut verifying all": smcsd.SD(num_speculative_tokens=K, confidence_cut=1e-9),
             f"sd K={K}, cut verifying none": smcsd.SD(num_speculative_tokens=K, confidence_cut=0.999999)}

    def run(method, n, prompt):
        return smcsd.decode([prompt], target=target, draft=None if method == "ar" else drafter, method=method,
                            temperature=0, max_new_tokens=n, eos_id=[])

    for method in cells.values():  # compile both lengths' programs
        run(method, args.long, prompts[0])
        run(method, args.short, prompts[0])
    per = {name: [] for name in cells}
    for _ in range(args.rounds):
        for p in prompts:
            for name, method in cells.items():  # interleaved, so drift hits every cell alike
                a, b = run(method, args.long, p), run(method, args.short, p)
                calls = a.stats.num_target_calls - b.stats.num_target_calls
                per[name].append(1000 * (a.stats.wall_time_s - b.stats.wall_time_s) / max(calls, 1))
    ar = statistics.median(per["ar"])
    rows = [dict(cell=name, ms_per_cycle=statistics.median(v), vs_ar_step=statistics.median(v) / ar, samples=v)
            for name, v in per.items()]
    table = report.markdown_table(["cell", "ms per cycle (median)", "× an ar step"],
                                  [[r["cell"], f"{r['ms_per_cycle']:.1f}", f"{r['vs_ar_step']:.2f}"] for r in rows])
    print(table)
    result = report.new_result("smcsd.bench_cycle_cost/1", machine=report.machine_info(), pair=args.pair,
                               drafter=args.drafter, settings=vars(args), rows=rows, markdown=table,
                               command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out or report.results_path(f"cycle_cost_{args.pair}.json"), result,
                                     indent=2))


if __name__ == "__main__":
    main()
