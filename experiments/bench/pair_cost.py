"""Per-token cost of the shipped draft vs target: a jitted, cached one-token forward (decode step).

    python -m experiments.bench.pair_cost --pair tiny-code --batch 1 8

Each call writes one token per row into a cache already holding --context tokens; the median
wall time over --reps calls (after warm-up) is reported for each model and the ratio draft/target.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments import report
from smcsd.models import forward_cached
from smcsd.models.shipped import load_shipped


def step_time(model, batch: int, context: int, cache_len: int, reps: int) -> float:
    cache = model.init_cache(batch, cache_len).set_lengths(context)
    fn = jax.jit(lambda p, t, c: forward_cached(model.config, p, t, c))
    tokens = jnp.full((batch, 1), 97, jnp.int32)
    return report.timed(lambda: fn(model.params, tokens, cache), reps, warmup=3)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", nargs="+", default=["tiny-code", "tiny-arith"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--cache-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default=report.results_path("pair_cost.json"))
    args = ap.parse_args(argv)
    results = {"device": str(jax.devices()[0]), "context": args.context, "cache_len": args.cache_len,
               "reps": args.reps, "pairs": {}}
    for name in args.pair:
        target, draft = load_shipped(name)
        r = {"target_params": target.num_params, "draft_params": draft.num_params}
        for b in args.batch:
            tt = step_time(target, b, args.context, args.cache_len, args.reps)
            td = step_time(draft, b, args.context, args.cache_len, args.reps)
            r[f"batch{b}"] = {"target_ms": tt * 1e3, "draft_ms": td * 1e3, "draft_over_target": td / tt}
            print(f"{name} batch {b}: target {tt * 1e3:.3f} ms, draft {td * 1e3:.3f} ms, "
                  f"draft/target {td / tt:.3f}", flush=True)
        results["pairs"][name] = r
    report.write_json(args.out, results)


if __name__ == "__main__":
    main()
