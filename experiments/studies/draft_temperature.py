"""Does a draft temperature other than the target's raise `sd`'s acceptance? Accepted drafts per cycle of `sd` at one
target temperature against the drafter's sampling temperature τ_q (`decode(..., draft_temperature=τ_q)`).

    python -m experiments.studies.draft_temperature --pair smollm2-135m --drafter eagle \
        --corpus-heldout experiments/data/corpus/smollm2-135m --prompts 24 --draft-temperatures 0.5 0.6 0.7 0.85 1.0

`sd` is exact for any proposal q, so τ_q is a free knob: per drafted token the acceptance is Σ_x min(p_T(x), q(x)),
which a drafter whose softmax is too flat or too sharp against p_T loses. Each prompt decodes --max-new-tokens once
per (K, τ_q) with the same seed; the table gives accepted drafts per cycle with a 95 % interval from the per-prompt
ratios (prompts are the independent units). Acceptance only: no timing, so it may run beside other work. Prompts:
held-out chat requests of a self-distillation corpus (--corpus-heldout), else the pair's evaluation prompts.
Writes JSON (--out) and prints a table.
"""

from __future__ import annotations

import argparse
import math
import statistics

from experiments import report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="tiny-code")
    ap.add_argument("--drafter", default=None, help="a drafter of the pair (default: its default drafter)")
    ap.add_argument("--temperature", type=float, default=0.7, help="the target's temperature (> 0)")
    ap.add_argument("--draft-temperatures", type=float, nargs="+", default=[0.5, 0.7, 1.0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--corpus-heldout", default=None, metavar="DIR")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.temperature <= 0:
        ap.error("--temperature must be > 0 (at 0 the draft temperature only breaks ties)")
    if any(t <= 0 for t in args.draft_temperatures):
        ap.error("--draft-temperatures must all be > 0")
    if args.prompts < 2 or any(k < 1 for k in args.ks):
        ap.error("--prompts must be >= 2 (the interval needs two) and every --ks >= 1")

    import smcsd
    from experiments.common import heldout_chat_prompts, pair_prompts

    target, draft = smcsd.load(args.pair, drafter=args.drafter)
    if draft is None:
        raise SystemExit(f"pair {args.pair!r} has no drafter to study")
    prompts, stops, _ = pair_prompts(args.pair, target, args.prompts)
    if args.corpus_heldout:
        prompts = heldout_chat_prompts(args.corpus_heldout, target)[:args.prompts]
    rows = []
    for K in args.ks:
        for tau in args.draft_temperatures:
            ratios, acc, cycles = [], 0, 0
            for i, p in enumerate(prompts):
                st = smcsd.decode([p], target=target, draft=draft, method="sd", num_speculative_tokens=K,
                                  temperature=args.temperature, draft_temperature=tau,
                                  max_new_tokens=args.max_new_tokens, eos_id=stops, seed=1000 + i).stats
                a, c = st.num_accepted_tokens or 0, st.num_drafts or 0
                acc, cycles = acc + a, cycles + c
                if c:
                    ratios.append(a / c)
            half = 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
            rows.append(dict(K=K, draft_temperature=tau, accepted_per_cycle=acc / max(cycles, 1),
                             per_prompt_mean=statistics.fmean(ratios) if ratios else float("nan"), ci95=half,
                             cycles=cycles, prompts=len(ratios)))
            print(f"  K={K} draft temperature {tau}: {rows[-1]['accepted_per_cycle']:.3f} ± {half:.3f}", flush=True)
    print(report.markdown_table(
        ["K", "draft temperature", "accepted drafts per cycle", "per-prompt mean ± 95 %", "cycles"],
        [[r["K"], f"{r['draft_temperature']:g}", f"{r['accepted_per_cycle']:.3f}",
          f"{r['per_prompt_mean']:.3f} ± {r['ci95']:.3f}", r["cycles"]] for r in rows]))
    if args.out:
        report.write_json(args.out, report.new_result(
            "smcsd.draft_temperature/1", pair=args.pair, drafter=args.drafter, temperature=args.temperature,
            prompts=len(prompts), max_new_tokens=args.max_new_tokens, corpus_heldout=args.corpus_heldout,
            rows=rows, command=report.command(__file__, argv), machine=report.machine_info()))


if __name__ == "__main__":
    main()
