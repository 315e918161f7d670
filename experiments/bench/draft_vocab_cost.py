"""A drafter step's cost against its draft vocabulary size V′ (FR-Spec): one EAGLE-3 drafter call (`propose` of one
token: the decoder layer, the final norm, the head over V′ rows, processing, sampling and the full-vocabulary log q
the exact methods verify against) at V′ = 4k, 8k, 16k, 32k and the full vocabulary, next to the target's one-token
decode step, for the SmolLM2-135M shape (the real target when it is fetched, else a random one of its shape).

    python -m experiments.bench.draft_vocab_cost                        # batch 1, ~1-2 minutes
    python -m experiments.bench.draft_vocab_cost --batch-sizes 1 8 --repeats 50

Each call is jitted alone and timed (median of --repeats after warm-up) from a state holding a --context-token
context; the drafter's weights are random (cost does not depend on them). Prints a table; JSON: --out (default
experiments/results/draft_vocab_cost.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from experiments import report
from experiments.common import RESULTS

SCHEMA = "smcsd.draft_vocab_cost/1"
SIZES = (4096, 8192, 16384, 32768, 0)  # 0: the full vocabulary


def _target(dtype: str):
    """(target, where it came from): SmolLM2-135M-Instruct when fetched, else a random model of its shape."""
    import smcsd
    from smcsd.models import ModelConfig, init_model
    try:
        target, _ = smcsd.load("smollm2-135m", drafter=None, dtype=dtype)
        return target, "smollm2-135m (fetched)"
    except Exception as e:  # noqa: BLE001 - not fetched here: the shape is what matters
        cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, dtype=dtype, eos_token_id=2)
        return init_model(cfg, 0, name="smollm2-shape"), f"random SmolLM2 shape ({type(e).__name__})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="V′ values (0: full vocabulary)")
    ap.add_argument("--context-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=os.path.join(RESULTS, "draft_vocab_cost.json"))
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from smcsd.models import forward_cached
    from smcsd.drafters import DraftVocab, EagleDrafter
    from smcsd.runtime.engine import prefill
    from smcsd.sampling import SamplingParams

    t_start = time.time()
    target, source = _target(args.dtype)
    tc = target.config
    V = tc.vocab_size
    counts = np.random.default_rng(0).zipf(1.3, 200_000) % V  # a ranking; the kept ids do not change the cost
    counts = np.bincount(counts, minlength=V)
    sampling = SamplingParams.make(1.0)
    C = args.context_tokens
    tparams = target.decode_params()
    rows = []
    for B in args.batch_sizes:
        prompt = jnp.asarray(np.random.default_rng(1).integers(3, V, (B, C)), jnp.int32)
        plen = jnp.full((B,), C, jnp.int32)
        cache_len = C + 64
        # the target's one-token decode step from a C-token context
        _, tcache = jax.jit(lambda p, x: prefill(tc, p, x, plen, cache_len))(tparams, prompt)
        step_t = jax.jit(lambda p, x, c: forward_cached(tc, p, x, c)[0])
        tok = prompt[:, -1:]
        calls = {"target": lambda: step_t(tparams, tok, tcache)}
        feats = jax.random.normal(jax.random.PRNGKey(0), (B, C, 3 * tc.hidden_size), jnp.float32)
        info = {}
        for size in args.sizes:
            vocab = None if size == 0 or size >= V else DraftVocab.from_counts(counts, size, required_ids=[2])
            d = EagleDrafter.create(target, draft_vocab=vocab, from_target=False)
            p = d.drafter_params()
            state = jax.jit(lambda p, x, f, d=d: d.init(p, x, plen, cache_len, 1, f))(p, prompt, feats)
            feed = jnp.stack([prompt[:, -1], jnp.zeros((B,), jnp.int32)], 1)
            one = jnp.ones((B,), jnp.int32)
            prop = jax.jit(lambda p, s, k, d=d: d.propose(p, s, feed, one, k, sampling, 1)[:2])
            key = jax.random.PRNGKey(2)
            t0 = time.perf_counter()
            jax.block_until_ready(prop(p, state, key))
            info[size] = {"compile_s": time.perf_counter() - t0, "params": d.num_params}
            calls[size] = (lambda prop=prop, p=p, state=state, key=key: prop(p, state, key))
        # interleaved rounds, so the drift of a shared machine hits every size alike; median over all calls
        times = {k: [] for k in calls}
        rounds = 3
        for _, name in report.round_robin(list(calls), rounds):
            times[name] += report.timed(calls[name], max(1, args.repeats // rounds), warmup=1)[1]
        t_target = float(np.median(times["target"]))
        for size in args.sizes:
            t_draft = float(np.median(times[size]))
            n = size or V
            rows.append({"batch": B, "draft_vocab": n, "full": size == 0, "draft_ms": 1e3 * t_draft,
                         "target_ms": 1e3 * t_target, "draft_over_target": t_draft / t_target,
                         "drafter_params_m": info[size]["params"] / 1e6,
                         "head_param_share": n * tc.hidden_size / info[size]["params"],
                         "compile_s": info[size]["compile_s"]})
            print(f"B={B} V'={n:>6}: drafter step {1e3 * t_draft:7.2f} ms = {t_draft / t_target:.3f} x the "
                  f"target step ({1e3 * t_target:.1f} ms)", flush=True)
    table = report.markdown_table(
        ["batch", "V′", "drafter step (ms)", "/ target step", "drafter params (M)", "head share of params"],
        [[r["batch"], r["draft_vocab"], report.fmt(r["draft_ms"]), report.fmt(r["draft_over_target"], ".3f"),
          report.fmt(r["drafter_params_m"]), report.fmt(r["head_param_share"], ".2f")] for r in rows], "---:")
    print(table)
    report.write_json(args.out, {"schema": SCHEMA, "command": report.command(__file__, argv), "target": source,
                                 "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
                                 "context_tokens": C, "repeats": args.repeats, "dtype": args.dtype,
                                 "wall_s": round(time.time() - t_start, 1), "rows": rows, "table": table})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
