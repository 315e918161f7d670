"""Writes tests/golden/decode_golden.json: tokens and stats of every method x drafter kind on the shipped toy pairs
(fixed prompts and seeds, greedy and sampled), the reference the house redesign (issue 34) must reproduce exactly.

    python tests/golden/make_decode_golden.py          # regenerate (only when a change of output is intended)
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "decode_golden.json")

# (pair, drafter, method, extra kwargs): every drafter kind once under each method it supports
CASES = [
    ("tiny-code", None, "ar", {}),
    ("tiny-code", "ar-distilled", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "ar-distilled", "sd-multi", {"num_speculative_tokens": 3, "num_particles": 2}),
    ("tiny-code", "ar-distilled", "sd-tree", {"num_speculative_tokens": 3, "tree": "2,1,1"}),
    ("tiny-code", "ar-distilled", "smc", {"num_speculative_tokens": 3, "num_particles": 4}),
    ("tiny-code", "prompt-lookup", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "dflash", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "dflash", "smc", {"num_speculative_tokens": 3, "num_particles": 2}),
    ("tiny-code", "dflash-dpace", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "pard2", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "dels", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "specblock", "sd-tree", {}),
    ("tiny-code", "specblock", "sd", {"num_speculative_tokens": 4}),
    ("tiny-code", "d2sd", "sd-tree", {}),
    ("tiny-code", "flex", "flex", {}),
    ("tiny-arith", None, "ar", {}),
    ("tiny-arith", "ar-distilled", "sd", {"num_speculative_tokens": 4}),
    ("tiny-arith", "ar-distilled", "smc", {"num_speculative_tokens": 3, "num_particles": 4}),
]
PROMPTS = {"tiny-code": ["def fibonacci(n):\n", "class Stack:\n    def push(self, x):"],
           "tiny-arith": ["Q: Sam has 23 apples. Sam buys 12 more and gives 8 to Ann. How many does Sam have?\nA:",
                          "Q: A box holds 7 pens. How many pens are in 4 boxes?\nA:"]}
STATS = ("method", "num_generated_tokens", "num_target_calls", "num_draft_calls", "num_drafts", "num_draft_tokens",
         "num_accepted_tokens", "accepted_per_position", "num_resamples", "log_z", "target_calls_per_request")


def case_id(case) -> str:
    pair, drafter, method, kw = case
    return f"{pair}/{drafter or '-'}/{method}" + "".join(f"/{k}={v}" for k, v in sorted(kw.items()))


def run_case(case, temperature: float) -> dict:
    import smcsd
    pair, drafter, method, kw = case
    target, draft = smcsd.load(pair, drafter=drafter) if drafter else (smcsd.load(pair)[0], None)
    res = smcsd.decode(PROMPTS[pair], target=target, draft=draft, method=method, temperature=temperature,
                       max_new_tokens=24, seed=7, **kw)
    st = res.stats.to_dict()
    stats = {k: st[k] for k in STATS}
    if stats["log_z"] is not None:
        stats["log_z"] = [float(x) for x in stats["log_z"]]
    return {"tokens": [list(map(int, t)) for t in res.tokens], "stats": stats}


def main() -> None:
    out = {}
    for case in CASES:
        for temperature in (0.0, 0.7):
            key = f"{case_id(case)}@T={temperature}"
            out[key] = run_case(case, temperature)
            print(key, out[key]["stats"]["num_target_calls"], "calls", flush=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=0)
    print("wrote", OUT)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    main()
