"""How close the decode calls come to this machine's memory-bandwidth roofline.

    python -m experiments.studies.roofline                      # shipped tiny-code pair (random pair of its size if absent)
    python -m experiments.studies.roofline --quick --model random

Decoding a small batch is memory-bound: every call streams the weights and the attended KV cache
through the chip, so the attainable time of a call is bytes / bandwidth. This script

1. measures the device's memory bandwidth (`jax.devices()[0]`, whatever it is: CPU, GPU, TPU):
   jitted reductions of a large float32 array (read bandwidth — what a decode step mostly does),
   a jitted donated elementwise update (read + write; the roofline uses the best of the three), and
   numpy's sum / copy for reference; the median of --repeats timed runs each. It also measures a
   square matmul's FLOP rate (float32, plus bfloat16 off CPU) and the per-row cost of turning logits
   into a token (top-k/top-p processing sorts the vocabulary), both used by experiments/studies/cost_model.py;
2. times, with `jax.block_until_ready` and the cache donated (as inside the decode loop), the
   target's one-token cached decode step at batch 1 and at a larger batch, the (K+1)-token verify
   call, the draft's one-token step, and one full SMC cycle (`smcsd.methods.smc.program_parts`: K draft
   calls + 1 target call over B·N rows, weights, bonus, ESS test) with resampling off (τ = 0) and on
   every cycle (τ = 1);
3. reports achieved bandwidth = modelled bytes / measured time and its fraction of the roofline.

Bytes model of one call (`call_bytes`): weight bytes read + KV bytes attended, where
  weight bytes = params bytes, less the untied input-embedding table (a call gathers only its
                 rows × T rows of it; they are counted instead; negligible for the tiny pairs,
                 ~6% of an 8B Llama);
  KV bytes     = rows × cache_len × layers × 2 × kv_heads × head_dim × dtype bytes (the attention
                 reads every slot of the fixed-shape cache buffer; stale slots are masked, not skipped).
Activations, logits and the KV writes of the new tokens are not counted (small at these shapes).
An SMC cycle's bytes are K draft calls + 1 target call; with τ = 1 also the particle gather of both
caches (read + write of each cache buffer). FLOPs (`call_flops`): 2 × matmul params × tokens +
4 × rows × T × cache_len × heads × head_dim × layers (scores and values).

JSON written to --out (default experiments/results/roofline.json):
  schema "smcsd.roofline/1", created, device, platform, jax_version
  model        {name, source ("shipped" | "random"), target {params, param_bytes, layers, hidden, kv_heads,
               head_dim, dtype}, draft {...}}
  bandwidth    {array_mib, repeats, jax_reduce_gbs, jax_reduce_rows_gbs, jax_update_gbs, numpy_sum_gbs,
               numpy_copy_gbs, roofline_gbs (= the best of the three JAX measurements)}
  compute      {matmul_n, float32_gflops, bfloat16_gflops (null on CPU), logits_row_s (seconds per row of
               process_logits + sample over the target's vocabulary: a per-row cost outside the roofline)}
  settings     {context, cache_len, batches, smc_batch, num_particles, num_speculative_tokens, repeats}
  rows         per call: label, kind (decode | verify | draft | smc_cycle), model, rows, tokens_per_row,
               cache_len, bytes, flops, time_s, time_runs_s, achieved_gbs, roofline_time_s,
               fraction_of_roofline, achieved_gflops
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import warnings

from experiments import report

DEFAULT_OUT = report.results_path("roofline.json")
SCHEMA = "smcsd.roofline/1"
TOP_FIELDS = ("schema", "created", "device", "platform", "jax_version", "model", "bandwidth", "compute", "settings",
              "rows")
BANDWIDTH_FIELDS = ("array_mib", "repeats", "jax_reduce_gbs", "jax_reduce_rows_gbs", "jax_update_gbs",
                    "numpy_sum_gbs", "numpy_copy_gbs", "roofline_gbs")
ROW_FIELDS = ("label", "kind", "model", "rows", "tokens_per_row", "cache_len", "bytes", "flops", "time_s",
              "time_runs_s", "achieved_gbs", "roofline_time_s", "fraction_of_roofline", "achieved_gflops")


# ----------------------------------------------------------------------------------- the bytes / FLOPs model

# kv_bytes, weight_bytes, call_bytes, matmul_params, call_flops: the library's cost model (smcsd/cost_model.py).
from smcsd.cost_model import DTYPE_BYTES as _DTYPE_BYTES  # noqa: E402
from smcsd.cost_model import call_bytes, call_flops, kv_bytes, matmul_params, weight_bytes  # noqa: E402,F401


# ----------------------------------------------------------------------------------- timing helpers

@functools.lru_cache(maxsize=None)
def _bw_kernels():
    import jax
    import jax.numpy as jnp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (jax.jit(lambda a: jnp.sum(a)), jax.jit(lambda a: jnp.sum(a.reshape(-1, 4096), axis=1)),
                jax.jit(lambda a: a * 1.0000001 + 1e-7, donate_argnums=0))


def measure_bandwidth(array_mib: int, repeats: int, with_numpy: bool = True) -> dict:
    """Read bandwidth (jitted reductions), read+write bandwidth (donated update) and numpy's, in GB/s."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = array_mib * 1024 * 1024 // 4
    nbytes = 4 * n
    red, red_rows, upd = _bw_kernels()
    x = jax.block_until_ready(jnp.ones((n,), jnp.float32) * 0.5)
    t_red, _ = report.timed(lambda: red(x), repeats, warmup=2)
    t_rows, _ = report.timed(lambda: red_rows(x), repeats, warmup=2)
    with warnings.catch_warnings():  # a backend that cannot donate warns once; the copy is then timed as is
        warnings.simplefilter("ignore")
        buf = {"x": jax.block_until_ready(jnp.ones((n,), jnp.float32))}

        def update():
            buf["x"] = upd(buf["x"])
            return buf["x"]

        t_upd, _ = report.timed(update, repeats, warmup=2)
    x = buf = None  # free the arrays before numpy's
    out = {"array_mib": array_mib, "repeats": repeats,
           "jax_reduce_gbs": nbytes / t_red / 1e9, "jax_reduce_rows_gbs": nbytes / t_rows / 1e9,
           "jax_update_gbs": 2 * nbytes / t_upd / 1e9, "numpy_sum_gbs": None, "numpy_copy_gbs": None}
    if with_numpy:
        xn = np.full(n, 0.5, np.float32)
        dn = np.empty_like(xn)
        t_nsum, _ = report.timed(lambda: xn.sum(), repeats, warmup=2)
        t_ncopy, _ = report.timed(lambda: np.copyto(dn, xn), repeats, warmup=2)
        del xn, dn
        out.update(numpy_sum_gbs=nbytes / t_nsum / 1e9, numpy_copy_gbs=2 * nbytes / t_ncopy / 1e9)
    out["roofline_gbs"] = max(out["jax_reduce_gbs"], out["jax_reduce_rows_gbs"], out["jax_update_gbs"])
    return out


_JITTED: dict = {}


def _jitted(fn, name: str):
    """One jitted function per name, so repeated measurements reuse its compiled programs."""
    import jax
    if name not in _JITTED:
        _JITTED[name] = jax.jit(fn)
    return _JITTED[name]


def measure_logits(vocab: int, repeats: int, rows: int = 64) -> float:
    """Seconds per row of turning logits into a sampled token (`process_logits` — a sort over the vocabulary
    for top-k/top-p — then `sample`) on [rows, vocab]: a per-row cost outside the roofline, large on CPU."""
    import jax
    import jax.numpy as jnp

    from smcsd.sampling import SamplingParams, process_logits, sample
    sp = SamplingParams.make(1.0, 0, 1.0)
    fn = _jitted(lambda k, x, p: sample(k, process_logits(x, p)), "logits")
    x = jax.random.normal(jax.random.PRNGKey(0), (rows, vocab), jnp.float32)
    key = jax.random.PRNGKey(1)
    t, _ = report.timed(lambda: fn(key, x, sp), repeats, warmup=2)
    return t / rows


def measure_matmul(n: int, repeats: int, platform: str) -> dict:
    """FLOP rate of a jitted [n, n] @ [n, n] matmul (2n³ FLOPs): float32, and bfloat16 off CPU."""
    import jax
    import jax.numpy as jnp
    out = {"matmul_n": n, "float32_gflops": None, "bfloat16_gflops": None}
    dtypes = [("float32", jnp.float32)] + ([] if platform == "cpu" else [("bfloat16", jnp.bfloat16)])
    for name, dt in dtypes:
        a = jax.block_until_ready(jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dt))
        mm = _jitted(lambda u: u @ u, "matmul")
        t, _ = report.timed(lambda: mm(a), repeats, warmup=2)
        out[f"{name}_gflops"] = 2 * n ** 3 / t / 1e9
    return out


# ----------------------------------------------------------------------------------- models

def random_pair_like(name: str = "tiny-code"):
    """A randomly initialised pair with the shipped pair's architecture (vocab 259, byte tokenizer)."""
    from smcsd.models import ByteTokenizer, ModelConfig, init_model
    tok = ByteTokenizer()
    sizes = {"tiny-code": ((256, 896, 6, 4, 2), (128, 384, 2, 2, 1)),
             "tiny-arith": ((128, 512, 4, 4, 2), (64, 192, 2, 2, 1))}[name if name != "random" else "tiny-code"]

    def cfg(h, f, layers, heads, kv):
        return ModelConfig(vocab_size=tok.vocab_size, hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024,
                           bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)

    (t, d) = sizes
    return (init_model(cfg(*t), seed=0, tokenizer=tok, name=f"random-{name}-target"),
            init_model(cfg(*d), seed=1, tokenizer=tok, name=f"random-{name}-draft"))


def load_pair(name: str):
    """(target, draft, source): the shipped pair `name` if installed, else a random pair of its size."""
    from smcsd.models.registry import FETCHABLE, load_pair as load_named
    from smcsd.models.shipped import available_shipped, load_shipped
    if name in FETCHABLE:  # a real model from the user cache (fetched once); its draft may be None
        t, d = load_named(name)
        return t, d, "fetched"
    if name != "random" and name in available_shipped():
        t, d = load_shipped(name)
        return t, d, "shipped"
    if name not in ("random", "tiny-code", "tiny-arith"):
        raise ValueError(f"unknown --model {name!r}: use tiny-code, tiny-arith, random or one of "
                         f"{', '.join(sorted(FETCHABLE))}")
    t, d = random_pair_like(name)
    return t, d, "random"


def _model_info(m) -> dict | None:
    if m is None:
        return None
    c = m.config
    return {"name": m.name, "params": c.num_params, "param_bytes": c.num_params * _DTYPE_BYTES[c.dtype],
            "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab": c.vocab_size, "dtype": c.dtype}


# ----------------------------------------------------------------------------------- call timings

def time_forward(model, rows: int, tokens_per_row: int, context: int, cache_len: int, repeats: int):
    """Median time of one cached forward of `tokens_per_row` tokens on `rows` rows whose cache holds
    `context` tokens (cache donated and its lengths reset after each call, as in the decode loop)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from smcsd.models import forward_cached
    cfg = model.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = jax.jit(lambda p, t, c: forward_cached(cfg, p, t, c), donate_argnums=2)
        params = model.decode_params()  # the layout decode runs (per-layer weight buffers on CPU)
        tokens = jnp.full((rows, tokens_per_row), 7 % cfg.vocab_size, jnp.int32)
        lengths = np.full((rows,), context, np.int32)  # host template: the device copies are donated
        box = {"cache": model.init_cache(rows, cache_len).replace(lengths=jnp.asarray(lengths))}

        def call():
            logits, box["cache"] = fn(params, tokens, box["cache"])
            return logits

        def reset(_):
            box["cache"] = box["cache"].replace(lengths=jnp.asarray(lengths))

        return report.timed(call, repeats, warmup=2, reset=reset)


def time_smc_cycle(target, draft, batch: int, particles: int, K: int, context: int, cache_len: int,
                   ess_threshold: float, repeats: int, seed: int = 0):
    """Median time of one SMC cycle (`smcsd.methods.smc.program_parts`) on batch × particles rows whose caches
    hold `context` tokens; the state is donated and its lengths reset after each cycle."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from smcsd import sampling as _sampling
    from smcsd.runtime.engine import ProgramInputs, StaticSpec
    from smcsd.methods.smc import program_parts

    out_len = 8 * math.ceil((2 * (K + 1) + 1) / 8)
    spec = StaticSpec(method="smc", batch=batch, prompt_len=context, cache_len=cache_len, out_len=out_len,
                      num_stop=1, num_speculative_tokens=K, num_particles=particles, resampler="systematic",
                      select="sample")
    V = target.config.vocab_size
    prompt = (np.arange(batch * context).reshape(batch, context) * 7 + 3) % V
    inp = ProgramInputs(prompt=jnp.asarray(prompt, jnp.int32), prompt_len=jnp.full((batch,), context, jnp.int32),
                        key=jax.random.PRNGKey(seed), sampling=_sampling.SamplingParams.make(1.0, 0, 1.0),
                        draft_sampling=_sampling.SamplingParams.make(1.0, 0, 1.0),
                        max_new_tokens=jnp.asarray(out_len - K, jnp.int32),
                        stop_ids=jnp.asarray([-1], jnp.int32),
                        ess_threshold=jnp.asarray(ess_threshold, jnp.float32), alpha=jnp.asarray(1.0, jnp.float32))
    init, cycle, _ = program_parts(target.config, draft.config, spec)
    s0 = jax.block_until_ready(jax.jit(init)(target.decode_params(), draft.decode_params(), inp))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyc = jax.jit(cycle, donate_argnums=3)
        keep = {k: np.asarray(v) for k, v in (("lt", s0.cache_t.lengths), ("ld", s0.cache_d.lengths), ("n", s0.n),
                                              ("done", s0.done), ("feed_count", s0.feed_count))}  # host templates
        box = {"s": s0}

        def call():
            box["s"] = cyc(target.decode_params(), draft.decode_params(), inp, box["s"])
            return box["s"]

        def reset(s):  # back to the post-prefill lengths so every timed cycle attends the same cache
            f = {k: jnp.asarray(v) for k, v in keep.items()}  # the state is donated: fresh device arrays
            box["s"] = s._replace(cache_t=s.cache_t.replace(lengths=f["lt"]),
                                  cache_d=s.cache_d.replace(lengths=f["ld"]),
                                  n=f["n"], done=f["done"], feed_count=f["feed_count"])

        return report.timed(call, repeats, warmup=2, reset=reset)


def smc_cycle_bytes(target_cfg, draft_cfg, rows: int, K: int, cache_len: int, resample: bool) -> int:
    b = K * call_bytes(draft_cfg, rows, 1, cache_len) + call_bytes(target_cfg, rows, K + 1, cache_len)
    if resample:  # gather both caches by ancestor: read + write every buffer
        b += 2 * (kv_bytes(target_cfg, rows, cache_len) + kv_bytes(draft_cfg, rows, cache_len))
    return b


def smc_cycle_flops(target_cfg, draft_cfg, rows: int, K: int, cache_len: int) -> int:
    return K * call_flops(draft_cfg, rows, 1, cache_len) + call_flops(target_cfg, rows, K + 1, cache_len)


def _row(label, kind, model, rows, T, cache_len, nbytes, flops, t, runs, bw_gbs) -> dict:
    return {"label": label, "kind": kind, "model": model, "rows": rows, "tokens_per_row": T, "cache_len": cache_len,
            "bytes": int(nbytes), "flops": int(flops), "time_s": t, "time_runs_s": runs,
            "achieved_gbs": nbytes / t / 1e9, "roofline_time_s": nbytes / (bw_gbs * 1e9),
            "fraction_of_roofline": nbytes / t / 1e9 / bw_gbs, "achieved_gflops": flops / t / 1e9}


def measure_calls(target, draft, *, batches, smc_batch, particles, K, context, cache_len, repeats, bw_gbs,
                  progress=True) -> list[dict]:
    rows = []
    tc = target.config
    R = smc_batch * particles

    def log(r):
        rows.append(r)
        if progress:
            print(f"  {r['label']:<34} {r['time_s'] * 1e3:8.3f} ms  {r['achieved_gbs']:8.2f} GB/s  "
                  f"{100 * r['fraction_of_roofline']:5.1f}% of roofline", flush=True)

    for b in batches:
        t, runs = time_forward(target, b, 1, context, cache_len, repeats)
        log(_row(f"target decode step B={b}", "decode", "target", b, 1, cache_len, call_bytes(tc, b, 1, cache_len),
                 call_flops(tc, b, 1, cache_len), t, runs, bw_gbs))
    for r in dict.fromkeys([1, R]):
        t, runs = time_forward(target, r, K + 1, context, cache_len, repeats)
        log(_row(f"target verify K+1={K + 1} rows={r}", "verify", "target", r, K + 1, cache_len,
                 call_bytes(tc, r, K + 1, cache_len), call_flops(tc, r, K + 1, cache_len), t, runs, bw_gbs))
    if draft is None:  # a target alone (e.g. a fetched model without a drafter): no draft or SMC rows
        return rows
    dc = draft.config
    for r in dict.fromkeys([1, R]):
        t, runs = time_forward(draft, r, 1, context, cache_len, repeats)
        log(_row(f"draft decode step rows={r}", "draft", "draft", r, 1, cache_len, call_bytes(dc, r, 1, cache_len),
                 call_flops(dc, r, 1, cache_len), t, runs, bw_gbs))
    for tau in (0.0, 1.0):
        t, runs = time_smc_cycle(target, draft, smc_batch, particles, K, context, cache_len, tau, repeats)
        what = "no resampling" if tau == 0 else "resample every cycle"
        log(_row(f"smc cycle B={smc_batch} N={particles} K={K} ({what})", "smc_cycle", "pair", R, K + 1, cache_len,
                 smc_cycle_bytes(tc, dc, R, K, cache_len, tau > 0), smc_cycle_flops(tc, dc, R, K, cache_len),
                 t, runs, bw_gbs))
    return rows


# ----------------------------------------------------------------------------------- reporting

def markdown_table(rows: list[dict]) -> str:
    return report.markdown_table(
        ["call", "rows × tokens", "MB moved", "time (ms)", "roofline time (ms)", "achieved GB/s", "% of roofline",
         "GFLOP/s"],
        [[r["label"], f"{r['rows']} × {r['tokens_per_row']}", f"{r['bytes'] / 1e6:.2f}", f"{r['time_s'] * 1e3:.3f}",
          f"{r['roofline_time_s'] * 1e3:.3f}", f"{r['achieved_gbs']:.2f}", f"{100 * r['fraction_of_roofline']:.1f}%",
          f"{r['achieved_gflops']:.2f}"] for r in rows])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-code", help="tiny-code | tiny-arith (shipped if installed, else a "
                                                          "random pair of that size) | random | smollm2-135m "
                                                          "(the real target, from the user cache)")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="decode-step batch sizes (default 1 32)")
    ap.add_argument("--smc-batch", type=int, default=1, help="requests B of the SMC cycle")
    ap.add_argument("--num-particles", type=int, default=8, help="particles N of the SMC cycle")
    ap.add_argument("--num-speculative-tokens", "-K", type=int, default=4)
    ap.add_argument("--context", type=int, default=64, help="tokens already in each row's cache")
    ap.add_argument("--cache-len", type=int, default=128, help="KV slots per row (the attended buffer)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (default 30; quick 7)")
    ap.add_argument("--array-mib", type=int, default=None,
                    help="bandwidth test array size in MiB (default 512 on accelerators, 256 on CPU; quick 128)")
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul size (default 1024 on CPU, 8192 otherwise)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller bandwidth array, batches 1 8")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.context >= args.cache_len - args.num_speculative_tokens:
        ap.error("argument --context: must leave room for K+1 tokens in --cache-len")
    import jax
    device, platform = report.device_info()
    repeats = args.repeats or (7 if args.quick else 30)
    batches = args.batches or ([1, 8] if args.quick else [1, 32])
    array_mib = args.array_mib or (128 if args.quick else (256 if platform == "cpu" else 512))
    matmul_n = args.matmul_n or (1024 if platform == "cpu" else 8192)
    target, draft, source = load_pair(args.model)
    print(f"roofline on {device}; model {args.model} ({source}): target {target.num_params / 1e6:.2f}M"
          + (f", draft {draft.num_params / 1e6:.2f}M params" if draft is not None else " params, no draft"),
          flush=True)
    bw = measure_bandwidth(array_mib, max(repeats, 5))
    print(f"bandwidth ({array_mib} MiB float32): jax reduce {bw['jax_reduce_gbs']:.1f} GB/s, rows-reduce "
          f"{bw['jax_reduce_rows_gbs']:.1f}, donated update (r+w) {bw['jax_update_gbs']:.1f}; numpy sum "
          f"{bw['numpy_sum_gbs']:.1f}, copy (r+w) {bw['numpy_copy_gbs']:.1f} -> roofline {bw['roofline_gbs']:.1f} GB/s",
          flush=True)
    compute = measure_matmul(matmul_n, max(repeats // 2, 3), platform)
    compute["logits_row_s"] = measure_logits(target.config.vocab_size, max(repeats, 5))
    print(f"matmul {matmul_n}^3: float32 {compute['float32_gflops']:.1f} GFLOP/s"
          + (f", bfloat16 {compute['bfloat16_gflops']:.1f} GFLOP/s" if compute["bfloat16_gflops"] else "")
          + f"; logits -> token {compute['logits_row_s'] * 1e6:.1f} µs per row (vocab {target.config.vocab_size})",
          flush=True)
    rows = measure_calls(target, draft, batches=batches, smc_batch=args.smc_batch, particles=args.num_particles,
                         K=args.num_speculative_tokens, context=args.context, cache_len=args.cache_len,
                         repeats=repeats, bw_gbs=bw["roofline_gbs"], progress=not args.no_progress)
    result = report.new_result(
        SCHEMA, device=device, platform=platform, jax_version=jax.__version__,
        model={"name": args.model, "source": source, "target": _model_info(target), "draft": _model_info(draft)},
        bandwidth=bw, compute=compute,
        settings={"context": args.context, "cache_len": args.cache_len, "batches": batches,
                  "smc_batch": args.smc_batch, "num_particles": args.num_particles,
                  "num_speculative_tokens": args.num_speculative_tokens, "repeats": repeats},
        rows=rows)
    print(f"\nroofline: {bw['roofline_gbs']:.1f} GB/s on {device}; context {args.context} of {args.cache_len} "
          f"cache slots; median of {repeats}")
    print(markdown_table(rows))
    print("wrote", report.write_json(args.out, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
