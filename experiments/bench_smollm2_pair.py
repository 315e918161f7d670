"""The SmolLM2-135M pair on this machine: `ar` against `sd` and `smc` with a drafter of the pair, side by side.

    python experiments/bench_smollm2_pair.py                          # drafter ar-distilled, batch 1, T=0.7
    python experiments/bench_smollm2_pair.py --sd-ks 3 4 --smc 2:3 4:3 --repeats 2
    python experiments/bench_smollm2_pair.py --drafters ar-distilled dflash-dpace --sd-ks 3 4 8 --smc 2:4

Prompts: chat requests that are not in the drafter's training corpus (other topics and tasks than
`experiments/data/smollm2_chat.jsonl`), batch 1, stop at the end of turn or `--max-new-tokens`. Every cell is
timed over `--repeats` rounds; each round runs every cell once on every prompt (interleaved, so drift in the
shared machine's speed hits all cells alike) with the round's seed. tokens/s = all new tokens / all wall time
(compile excluded, one warm-up call per cell first). `sd` is exact (same output law as `ar`); `smc` is
consistent, not exact — its finite-N output law is measured in the SMC engine's issue, not here.
Prints a markdown table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from experiments import report  # noqa: E402

# Held out from the drafter's corpus (experiments/train_smollm2_draft.py uses other topics and task templates).
PROMPTS = [
    "Describe how a bicycle works.",
    "What should I pack for a weekend camping trip?",
    "Write a short poem about autumn leaves.",
    "Explain why the sky is blue.",
    "Give me tips for learning a new language.",
    "Write a Python function that returns the largest element of a list.",
]


def parse_cell(spec: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in spec.split(":"))
    except ValueError:
        raise SystemExit(f"--smc cells are N:K pairs of integers (e.g. 2:3), got {spec!r}")
    return n, k


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", nargs="+", default=None,
                    help="drafter names of the pair, each run with every sd / smc cell (default: its best)")
    ap.add_argument("--sd-ks", type=int, nargs="*", default=[2, 3, 4, 6])
    ap.add_argument("--smc", nargs="*", default=["1:3", "2:3", "2:4", "4:3"], help="N:K cells for smc")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the prompts to use")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=report.results_path("bench_smollm2_pair.json"))
    args = ap.parse_args(argv)

    import smcsd

    names = args.drafters or [smcsd.available_drafters("smollm2-135m")[0]]
    target = smcsd.load("smollm2-135m", drafter="prompt-lookup")[0]
    drafters = {name: smcsd.load("smollm2-135m", drafter=name)[1] for name in names}
    stops = list(target.tokenizer.end_of_turn_ids)
    convs = [[{"role": "user", "content": p}] for p in PROMPTS[:args.prompts]]
    cells = [("ar", None, 0, 0)]
    for name, d in drafters.items():
        limit = getattr(d, "max_tokens_per_proposal", None)
        fits = lambda k: limit is None or k <= limit  # noqa: E731
        cells += [("sd", name, 0, k) for k in args.sd_ks if fits(k)]
        cells += [("smc", name, n, k) for n, k in map(parse_cell, args.smc) if fits(k)]

    def run(cell, conv, seed):
        method, name, n, k = cell
        kw = dict(target=target, method=method, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                  eos_id=stops, seed=seed)
        if method != "ar":
            kw.update(draft=drafters[name], num_speculative_tokens=k)
        if method == "smc":
            kw.update(num_particles=n)
        return smcsd.decode(messages=[conv], **kw)

    for cell in cells:  # compile + warm up
        run(cell, convs[0], 0)
    acc = {c: dict(tokens=0, wall_s=0.0, calls=0, accepted=0, drafted=0, resamples=0, cycles=0) for c in cells}
    for r in range(args.repeats):
        for conv in convs:
            for cell in cells:
                st = run(cell, conv, r + 1).stats
                a = acc[cell]
                a["tokens"] += st.num_generated_tokens
                a["wall_s"] += st.wall_time_s
                a["calls"] += st.num_target_calls
                a["accepted"] += st.num_accepted_tokens
                a["drafted"] += st.num_draft_tokens
                a["resamples"] += st.num_resamples or 0
                a["cycles"] += len(st.resampled_per_cycle or [])
        print(f"round {r + 1}/{args.repeats} done", flush=True)

    ar = acc[("ar", None, 0, 0)]
    ar_tps = ar["tokens"] / ar["wall_s"]
    rows, body = [], []
    for (method, name, n, k), a in acc.items():
        tps = a["tokens"] / a["wall_s"]
        row = dict(method=method, drafter=name, N=n or None, K=k or None, **a, tps=tps, speedup=tps / ar_tps,
                   tokens_per_call=a["tokens"] / max(a["calls"], 1),
                   acceptance=a["accepted"] / a["drafted"] if method == "sd" and a["drafted"] else None,
                   resample_rate=a["resamples"] / a["cycles"] if method == "smc" and a["cycles"] else None)
        rows.append(row)
        label = "ar" if method == "ar" else (f"sd K={k}" if method == "sd" else f"smc N={n} K={k}")
        body.append([name or "–", label, f"{tps:.1f}", f"{row['speedup']:.2f}×", f"{row['tokens_per_call']:.2f}",
                     report.fmt(row["acceptance"]), report.fmt(row["resample_rate"]), a["tokens"]])
    table = report.markdown_table(["drafter", "method", "tok/s", "vs ar", "tokens/target call", "acceptance (sd)",
                                   "resampled cycles (smc)", "new tokens"], body)
    print(table)
    result = report.new_result(
        "smcsd.bench_smollm2_pair/1", machine=report.machine_info(),
        model=dict(name="smollm2-135m", params=target.num_params, dtype=target.config.dtype),
        drafters={name: dict(kind=getattr(d, "kind", "ar"), params=getattr(d, "num_params", None))
                  for name, d in drafters.items()},
        settings=dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                      prompts=PROMPTS[:args.prompts], batch=1),
        rows=rows, markdown=table, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
