"""Main job: decode a few prompts with the shipped, trained `tiny-code` pair and print texts and stats.

    python experiments/demo.py                      # decode's default method
    python experiments/demo.py --method sd --temperature 0
"""

import argparse

import smcsd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default=None, choices=smcsd.available_methods(),
                    help="default: smcsd.decode's default method")
    ap.add_argument("--model", default="tiny-code", choices=smcsd.available_models())
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    target, draft = smcsd.load(args.model)
    print(f"target: {target}\ndraft:  {draft}")
    prompts = ["def fibonacci(n):", "import os\n\n\ndef main():"] if args.model == "tiny-code" else \
        ["Q: Sam has 23 apples. He buys 15 more. How many apples does Sam have?\nA:"]
    kw = {} if args.method is None else {"method": args.method}
    for attempt in range(2):  # the second call reuses the compiled program: its speed is the steady state
        res = smcsd.decode(prompts, target=target, draft=draft, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed, **kw)
    for p, t in zip(prompts, res.texts):
        print("-" * 60)
        print(p + t)
    print("-" * 60)
    print(res.stats.summary())


if __name__ == "__main__":
    main()
