"""The cost model: what one model call, and one decoding cycle of each method, costs on a device.

Every accelerator figure the project states is a projection of this model (experiments/studies/cost_model.py,
experiments/studies/projections.py, experiments/studies/paper_check.py build on it); `smcsd.device_check` measures the same calls and
cycles on a real backend and refits the model's constants (`fit_device`).

A call is a roofline call (Williams et al. 2009):

    time = max(bytes / bandwidth, FLOPs / peak FLOP rate) + (layers + 1) x per-layer overhead
           + logit rows x per-row sampling cost

(on a CPU the sum bytes / bandwidth + FLOPs / peak: its cores do not overlap streaming with arithmetic).
bytes = weights read (an untied input embedding: only its gathered rows) + the KV buffer attended (rows x cache_len x
layers x 2 x kv_heads x head_dim x dtype bytes: a fixed-shape buffer is attended whole); FLOPs = 2 x matmul params x
tokens + 4 x tokens x cache_len x heads x head_dim x layers. Activations and logits are not counted.

A cycle is a list of calls with how often each runs (`cycle_calls`): `ar` one target call on B rows x 1 token; `sd`
K draft calls + one target call on B rows x (K+1) tokens; `sd-multi` and `smc` the same on B·N rows, `smc` reading
each request's prompt KV once (shared prefix) and, on the fraction of cycles that resample, gathering the particles'
own KV slots of both models (read + write); `sd-tree` one draft call per tree level over that level's nodes and one
target call over the tree's M + 1 tokens; a block drafter (DFlash) one call over rows x block tokens instead of K.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ----------------------------------------------------------------------------------- bytes and FLOPs of a call

def kv_bytes(cfg, rows: int, cache_len: int) -> int:
    """KV bytes attended by one call: rows × cache_len × layers × 2 (k, v) × kv_heads × head_dim × dtype bytes."""
    per_slot = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * DTYPE_BYTES[cfg.dtype]
    return rows * cache_len * per_slot


def weight_bytes(cfg, rows: int = 1, tokens_per_row: int = 1) -> int:
    """Weight bytes one call reads: all params except the untied input-embedding table, of which only
    the rows × T gathered rows are read."""
    b = DTYPE_BYTES[cfg.dtype]
    total = cfg.num_params * b
    if not cfg.tie_word_embeddings:
        total -= cfg.vocab_size * cfg.hidden_size * b
        total += min(rows * tokens_per_row, cfg.vocab_size) * cfg.hidden_size * b
    return int(total)


def call_bytes(cfg, rows: int, tokens_per_row: int, cache_len: int) -> int:
    return weight_bytes(cfg, rows, tokens_per_row) + kv_bytes(cfg, rows, cache_len)


def matmul_params(cfg) -> int:
    """Params that take part in a matmul per token: everything but the input embedding and the norms
    (the LM head is a matmul, also when tied)."""
    return cfg.num_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def call_flops(cfg, rows: int, tokens_per_row: int, cache_len: int) -> int:
    tokens = rows * tokens_per_row
    attn = 4 * tokens * cache_len * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    return int(2 * matmul_params(cfg) * tokens + attn)


# ----------------------------------------------------------------------------------- devices

@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s
    overhead_s: float  # fixed overhead per call per (layer + 1): a call of an L-layer model pays (L + 1) x this
    logits_row_s: float = 0.0  # turning one row's logits into a token (top-k/top-p sort + sample)
    # Accelerators overlap weight/KV streaming with arithmetic (roofline: max of the two); a CPU core
    # does one after the other, so there a call costs their sum.
    overlap: bool = True
    link_bw: float = 0.0  # device-to-device bytes/s (sd-overlap's transfers between its two groups)
    link_latency_s: float = 0.0  # per transfer


# The projection presets (vendor datasheets; 1 µs per layer + 1 per call).
DEVICES = {
    "h100": Device("H100 SXM (3.35 TB/s, 989 TFLOP/s bf16)", 3.35e12, 989e12, 1e-6, link_bw=450e9,
                   link_latency_s=10e-6),
    "tpu-v5e": Device("TPU v5e (819 GB/s, 197 TFLOP/s bf16)", 819e9, 197e12, 1e-6, link_bw=100e9,
                      link_latency_s=10e-6),
}
# Chips a device check recognises by `jax.Device.device_kind`: the presets, and the H200 (the H100's arithmetic,
# 4.8 TB/s HBM3e).
CHIPS = {**DEVICES,
         "h200": Device("H200 SXM (4.8 TB/s, 989 TFLOP/s bf16)", 4.8e12, 989e12, 1e-6, link_bw=450e9,
                        link_latency_s=10e-6)}
_KINDS = (("h200", "h200"), ("h100", "h100"), ("v5 lite", "tpu-v5e"), ("v5e", "tpu-v5e"), ("v5litepod", "tpu-v5e"))


def chip_preset(device_kind: str) -> str | None:
    """The preset name of a `jax.Device.device_kind` ("NVIDIA H200" -> "h200", "TPU v5 lite" -> "tpu-v5e"), or None."""
    kind = (device_kind or "").lower()
    for needle, name in _KINDS:
        if needle in kind:
            return name
    return None


def tensor_parallel(dev: Device, chips: int, allreduce_s: float) -> Device:
    """`dev` x `chips` in tensor parallel (experiments/studies/paper_check.py's 4xH100): the chips' summed HBM bandwidth and
    FLOP rate, and per layer the fixed overhead plus two all-reduces (after attention and after the MLP) of
    `allreduce_s` each. One chip: `dev` unchanged."""
    if chips <= 1:
        return dev
    return dataclasses.replace(dev, name=f"{chips}x {dev.name} tensor-parallel", bandwidth=chips * dev.bandwidth,
                               flops=chips * dev.flops, overhead_s=dev.overhead_s + 2 * allreduce_s)


# ----------------------------------------------------------------------------------- real model shapes

def real_configs(dtype: str = "bfloat16") -> dict:
    """The real pairs' shapes as `models.ModelConfig`s: {pair: ((target name, config), (draft name, config))}."""
    from smcsd.models import ModelConfig
    common = dict(dtype=dtype, max_position_embeddings=131072)
    llama8 = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, **common)
    llama1 = ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, **common)
    qwen8 = ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, qk_norm=True, **common)
    qwen06 = ModelConfig(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, qk_norm=True,
                         tie_word_embeddings=True, **common)
    smol = smollm2_config(dtype)
    block = smol.replace(num_hidden_layers=1)  # the shipped DFlash drafter: one layer at the target's width + head
    return {"llama3.1-8b+llama3.2-1b": (("Llama-3.1-8B", llama8), ("Llama-3.2-1B", llama1)),
            "qwen3-8b+qwen3-0.6b": (("Qwen3-8B", qwen8), ("Qwen3-0.6B", qwen06)),
            "smollm2-135m+dflash": (("SmolLM2-135M", smol), ("dflash-dpace (1 layer, block 16)", block))}


def smollm2_config(dtype: str = "bfloat16"):
    """SmolLM2-135M's shape."""
    from smcsd.models import ModelConfig
    return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                       dtype=dtype, max_position_embeddings=8192)


def smollm2_drafter_configs(dtype: str = "bfloat16") -> dict:
    """SmolLM2-135M's drafter shapes: {kind: (name, config)}. `ar`: the shipped ar-distilled draft (3 layers, width
    256); `eagle`: an EAGLE-like head, one decoder layer at the target's width + the vocabulary head, drafting
    autoregressively (its cost is one small AR call per token); `block`: the shipped DFlash drafter (1 layer at the
    target's width, block 16)."""
    from smcsd.models import ModelConfig
    smol = smollm2_config(dtype)
    ar = ModelConfig(vocab_size=49152, hidden_size=256, intermediate_size=768, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                     dtype=dtype, max_position_embeddings=8192)
    return {"ar": ("ar-distilled (3 layers, width 256)", ar),
            "eagle": ("EAGLE-like head (1 layer, width 576)", smol.replace(num_hidden_layers=1)),
            "block": ("dflash (1 layer, block 16)", smol.replace(num_hidden_layers=1))}


PAIR_NAMES = ("llama3.1-8b+llama3.2-1b", "qwen3-8b+qwen3-0.6b", "smollm2-135m+dflash")
DRAFT_BLOCK = {"smollm2-135m+dflash": 16}  # pairs whose drafter is a block drafter: its block size


# ----------------------------------------------------------------------------------- acceptance

def solve_acceptance(mean_len: float, K: int) -> float:
    """a with 1 + a + ... + a^K = mean_len (i.i.d. per-token acceptance), by bisection; in [0, 1]."""
    target = min(max(mean_len, 1.0), K + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if sum(mid ** k for k in range(K + 1)) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def expected_tokens(a: float, K: int) -> float:
    """Expected tokens per speculative cycle, (1 − a^{K+1}) / (1 − a): accepted prefix + correction/bonus."""
    return K + 1.0 if a >= 1.0 else (1.0 - a ** (K + 1)) / (1.0 - a)


# ----------------------------------------------------------------------------------- calls

@dataclasses.dataclass(frozen=True)
class Call:
    """One call's features, all the model needs to cost it on any device: bytes moved, FLOPs, overhead units
    (layers + 1), logit rows turned into tokens, and how often it runs per cycle (`count`, may be fractional:
    `smc`'s resampling gather runs on a fraction of cycles)."""

    bytes: float
    flops: float
    units: int
    logit_rows: int
    count: float = 1.0
    what: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Call":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def call_features(cfg, rows: int, T: int, cache_len: int, logit_rows: int | None = None,
                  prefix: tuple[int, int] | None = None, count: float = 1.0, what: str = "") -> Call:
    """The features of one call on `rows` rows x `T` tokens over a `cache_len` KV buffer. `prefix = (requests,
    prompt_len)`: the first prompt_len slots are a prompt shared by the rows of each request (cascade attention),
    read once per request; each row reads only its own cache_len − prompt_len slots (attention FLOPs unchanged).
    `logit_rows` (default rows x T): rows of logits turned into tokens."""
    if prefix is None:
        kv = kv_bytes(cfg, rows, cache_len)
    else:
        kv = kv_bytes(cfg, prefix[0], prefix[1]) + kv_bytes(cfg, rows, cache_len - prefix[1])
    return Call(bytes=weight_bytes(cfg, rows, T) + kv, flops=call_flops(cfg, rows, T, cache_len),
                units=cfg.num_hidden_layers + 1, logit_rows=rows * T if logit_rows is None else logit_rows,
                count=count, what=what)


def memory_features(nbytes: float, count: float = 1.0, what: str = "") -> Call:
    """A pure memory move (no FLOPs, no call overhead): e.g. `smc`'s resampling gather."""
    return Call(bytes=nbytes, flops=0, units=0, logit_rows=0, count=count, what=what)


def call_seconds(call: Call, dev: Device) -> tuple[float, str]:
    """(seconds, bound) of one run of `call` on `dev` (its count not applied)."""
    mem = call.bytes / dev.bandwidth
    comp = call.flops / dev.flops
    t = (max(mem, comp) if dev.overlap else mem + comp) + call.units * dev.overhead_s \
        + call.logit_rows * dev.logits_row_s
    return t, ("memory" if mem >= comp else "compute")


def predict_calls(calls: Sequence[Call], dev: Device) -> float:
    """Seconds of a cycle given as calls: Σ count × call seconds."""
    return sum(c.count * call_seconds(c, dev)[0] for c in calls)


def call_overhead(cfg, dev: Device) -> float:
    """Fixed overhead of one call: (layers + 1) x the device's per-layer overhead (the layer loop, plus
    the embedding / head / sampling steps counted as one more)."""
    return (cfg.num_hidden_layers + 1) * dev.overhead_s


def call_time(cfg, rows: int, T: int, cache_len: int, dev: Device, logit_rows: int | None = None,
              prefix: tuple[int, int] | None = None):
    """(seconds, bound) of one call: max(bytes / bandwidth, FLOPs / peak) + fixed overhead + the logits of
    `logit_rows` (default rows x T) turned into tokens; `prefix` as in `call_features`."""
    return call_seconds(call_features(cfg, rows, T, cache_len, logit_rows, prefix), dev)


# ----------------------------------------------------------------------------------- cycles

CYCLE_METHODS = ("ar", "sd", "sd-multi", "sd-tree", "smc")


def cycle_calls(method: str, tcfg, dcfg, B: int, N: int, K: int, cache_len: int, prompt_len: int | None = None,
                draft_block: int | None = None, tree_widths: Sequence[int] | None = None,
                resample_rate: float = 0.0) -> list[Call]:
    """The calls of one cycle of `method` (module docstring), the target's verification last but one (before any
    memory move). `tree_widths`: `sd-tree`'s nodes per depth (`TreeSpec.level_widths`; depth = its length); `K` is
    then ignored. `prompt_len`: `smc` shares each request's prompt KV among its particles; its resampling (on a
    fraction `resample_rate` of cycles) gathers the particles' own cache_len − prompt_len slots of both models."""
    if method not in CYCLE_METHODS:
        raise ValueError(f"unknown method {method!r}; the cost model knows {', '.join(CYCLE_METHODS)}")
    if method == "ar":
        return [call_features(tcfg, B, 1, cache_len, what="target")]
    if method == "sd-tree":
        if not tree_widths:
            raise ValueError("sd-tree needs tree_widths (the tree's nodes per depth, TreeSpec.level_widths)")
        D, M = len(tree_widths), sum(tree_widths)
        if draft_block:
            drafts = [call_features(dcfg, B, draft_block, cache_len, logit_rows=B * D, what="draft")]
        else:  # one call on the pending token, then one tree-masked call per level (the deepest is never fed)
            drafts = [call_features(dcfg, B, 1, cache_len, what="draft")]
            drafts += [call_features(dcfg, B, w, cache_len, what="draft") for w in tree_widths[:-1]]
        return drafts + [call_features(tcfg, B, M + 1, cache_len, what="target")]
    rows = B if method == "sd" else B * N
    prefix = (B, prompt_len) if method == "smc" and prompt_len else None
    if draft_block:
        calls = [call_features(dcfg, rows, draft_block, cache_len, logit_rows=rows * K, prefix=prefix, what="draft")]
    else:
        calls = [call_features(dcfg, rows, 1, cache_len, prefix=prefix, count=K, what="draft")]
    calls.append(call_features(tcfg, rows, K + 1, cache_len, prefix=prefix, what="target"))
    if method == "smc":
        own = cache_len - (prompt_len or 0)  # the particles' own slots (all of them without a shared prefix)
        gather = 2 * (kv_bytes(tcfg, rows, own) + kv_bytes(dcfg, rows, own))
        calls.append(memory_features(gather, count=resample_rate or 0.0, what="resample"))
    return calls


def tokens_per_cycle(method: str, K: int, stats: dict, tree_widths: Sequence[int] | None = None) -> float:
    """Expected tokens per cycle per request: `ar` 1, `smc` K+1, `sd` / `sd-multi` from their per-token acceptance
    (`stats["acceptance_sd"]`, `stats["acceptance_sd_multi"]`), `sd-tree` a chain of its depth at `sd`'s acceptance
    (a lower bound: a tree's extra candidates are not modelled)."""
    if method == "ar":
        return 1.0
    if method == "smc":
        return K + 1.0
    if method == "sd":
        return expected_tokens(stats["acceptance_sd"], K)
    if method == "sd-multi":
        return expected_tokens(stats["acceptance_sd_multi"], K)
    if method == "sd-tree":
        return expected_tokens(stats["acceptance_sd"], len(tree_widths) if tree_widths else K)
    raise ValueError(f"unknown method {method!r}; the cost model knows {', '.join(CYCLE_METHODS)}")


def cycle_cost(method: str, tcfg, dcfg, B: int, N: int, K: int, cache_len: int, dev: Device, stats: dict,
               prompt_len: int | None = None, draft_block: int | None = None, tree_widths=None):
    """(cycle seconds, tokens per cycle per request, target call s, draft call s, bound) of one cycle/step.

    `prompt_len`: `smc` keeps each request's prompt KV once, shared by its particles (smcsd/methods/smc.py), and
    resampling gathers the particles' own slots only (cache_len − prompt_len of them). `draft_block`: the drafter
    is a block drafter (DFlash) of that block size: one call over rows x block tokens per cycle, not K calls."""
    calls = cycle_calls(method, tcfg, dcfg, B, N, K, cache_len, prompt_len, draft_block, tree_widths,
                        (stats.get("resample_rate") or 0.0) if method == "smc" else 0.0)
    target = next(c for c in calls if c.what == "target")
    tt, bound = call_seconds(target, dev)
    drafts = [c for c in calls if c.what == "draft"]
    td = call_seconds(drafts[0], dev)[0] if drafts else 0.0
    return predict_calls(calls, dev), tokens_per_cycle(method, K, stats, tree_widths), tt, td, bound


def steady_state(method, tcfg, dcfg, B, N, K, context, dev, stats, prompt_len=None, draft_block=None) -> dict:
    cache_len = context + K + 1
    cycle, tokens, tt, td, bound = cycle_cost(method, tcfg, dcfg, B, N, K, cache_len, dev, stats, prompt_len,
                                              draft_block)
    return {"tokens_per_cycle": tokens, "cycle_s": cycle, "target_call_s": tt, "draft_call_s": td, "bound": bound,
            "tokens_per_s": B * tokens / cycle}


# ----------------------------------------------------------------------------------- refitting the constants

FIT_CONSTANTS = ("bandwidth", "flops", "overhead_s", "logits_row_s")


def _design(rows_calls, bounds, overlap):
    """Per row: Σ count × [bytes, FLOPs, units, logit rows], the bytes (FLOPs) column counting only the calls that
    are memory- (compute-) bound under `bounds` when the device overlaps the two."""
    import numpy as np
    X = np.zeros((len(rows_calls), 4))
    for i, calls in enumerate(rows_calls):
        for j, c in enumerate(calls):
            mem = 1.0 if (not overlap or bounds[i][j]) else 0.0
            comp = 1.0 if (not overlap or not bounds[i][j]) else 0.0
            X[i] += c.count * np.array([mem * c.bytes, comp * c.flops, c.units, c.logit_rows], float)
    return X


def _nnls(A, b):
    """min ||A x − b|| with x ≥ 0, exactly, for a handful of columns: the best unconstrained least-squares solution
    over every subset of columns that comes out non-negative (the optimum is one of them)."""
    import itertools

    import numpy as np
    n = A.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b ** 2))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            z = np.linalg.lstsq(A[:, cols], b, rcond=None)[0]
            if np.any(z < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = z
            res = float(np.sum((A @ x - b) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def fit_device(rows_calls: Sequence[Sequence[Call]], measured_s: Sequence[float], base: Device,
               fit: Sequence[str] = FIT_CONSTANTS, iterations: int = 50) -> tuple[Device, dict]:
    """Refit `base`'s constants to measured cycle / call times: minimise Σ ((predicted − measured) / measured)² over
    1/bandwidth, 1/FLOP rate, the per-layer overhead and the per-row sampling cost (all ≥ 0), the constants not in
    `fit` held at `base`'s. Where the device overlaps memory and arithmetic, a call costs the max of the two, so each
    call's bound is fixed, the (then linear, non-negative) least squares solved, the bounds recomputed, until they no
    longer change. A constant no row depends on (say, the FLOP rate when no call is compute-bound) keeps `base`'s
    value and is reported as unconstrained. Returns (the fitted Device, a report)."""
    import numpy as np
    bad = sorted(set(fit) - set(FIT_CONSTANTS))
    if bad:
        raise ValueError(f"fit: unknown constant(s) {', '.join(bad)}; choose from {', '.join(FIT_CONSTANTS)}")
    rows_calls = [list(cs) for cs in rows_calls]
    y = np.asarray(measured_s, float)
    if len(rows_calls) != len(y) or len(y) == 0:
        raise ValueError(f"fit: need as many measured times as rows, and at least one ({len(rows_calls)} rows, "
                         f"{len(y)} times)")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("fit: every measured time must be a finite number > 0")
    free = [k in fit for k in FIT_CONSTANTS]

    def theta_of(dev):
        return np.array([1.0 / dev.bandwidth, 1.0 / dev.flops, dev.overhead_s, dev.logits_row_s])

    def device_of(theta):
        return dataclasses.replace(base, bandwidth=1.0 / theta[0] if theta[0] > 0 else math.inf,
                                   flops=1.0 / theta[1] if theta[1] > 0 else math.inf,
                                   overhead_s=float(theta[2]), logits_row_s=float(theta[3]))

    def bounds_of(dev):
        return [[c.bytes / dev.bandwidth >= c.flops / dev.flops for c in cs] for cs in rows_calls]

    def objective(dev):
        pred = np.array([predict_calls(cs, dev) for cs in rows_calls])
        return float(np.sum(((pred - y) / y) ** 2))

    def solve(bounds, theta0):
        X = _design(rows_calls, bounds, base.overlap) / y[:, None]  # relative errors: every row weighs the same
        fixed = ~np.array(free)
        rhs = np.ones(len(y)) - X[:, fixed] @ theta0[fixed]
        cols = np.array(free) & (np.abs(X).sum(axis=0) > 0)
        theta = theta0.copy()
        if cols.any():
            scale = np.abs(X[:, cols]).max(axis=0)  # columns of very different magnitudes: solve in unit scale
            theta[cols] = _nnls(X[:, cols] / scale, rhs) / scale
        return theta, cols

    theta0 = theta_of(base)
    best = None
    starts = [base, dataclasses.replace(base, flops=base.flops * 1e6),  # as given; all memory-bound; all compute-bound
              dataclasses.replace(base, bandwidth=base.bandwidth * 1e6)]
    for start in starts:
        bounds, theta, cols = bounds_of(start), theta0, None
        for _ in range(iterations):
            theta, cols = solve(bounds, theta0)
            dev = device_of(theta)
            nb = bounds_of(dev)
            if nb == bounds:
                break
            bounds = nb
        dev = device_of(theta)
        obj = objective(dev)
        if best is None or obj < best[0]:
            best = (obj, dev, cols)
    obj, dev, cols = best
    pred_before = np.array([predict_calls(cs, base) for cs in rows_calls])
    pred_after = np.array([predict_calls(cs, dev) for cs in rows_calls])
    err_b, err_a = pred_before / y - 1, pred_after / y - 1
    constrained = {k: bool(cols[i]) for i, k in enumerate(FIT_CONSTANTS) if free[i]}
    report = {"rows": len(y), "fitted": [k for k in FIT_CONSTANTS if k in fit], "constrained": constrained,
              "median_abs_rel_error_before": float(np.median(np.abs(err_b))),
              "max_abs_rel_error_before": float(np.max(np.abs(err_b))),
              "median_abs_rel_error_after": float(np.median(np.abs(err_a))),
              "max_abs_rel_error_after": float(np.max(np.abs(err_a))),
              "rel_errors_after": [float(e) for e in err_a]}
    return dev, report


def device_to_dict(dev: Device) -> dict:
    return dataclasses.asdict(dev)


def device_from_dict(d: dict) -> Device:
    """A `Device` from `device_to_dict`'s form (e.g. the `fitted_device` of a device-check fit)."""
    return Device(**{f.name: d[f.name] for f in dataclasses.fields(Device) if f.name in d})


__all__ = ["CHIPS", "CYCLE_METHODS", "Call", "DEVICES", "DRAFT_BLOCK", "DTYPE_BYTES", "Device", "FIT_CONSTANTS",
           "PAIR_NAMES", "call_bytes", "call_features", "call_flops", "call_overhead", "call_seconds", "call_time",
           "chip_preset", "cycle_calls", "cycle_cost", "device_from_dict", "device_to_dict", "expected_tokens",
           "fit_device", "kv_bytes", "matmul_params", "memory_features", "predict_calls", "real_configs",
           "smollm2_config", "smollm2_drafter_configs", "solve_acceptance", "steady_state", "tensor_parallel",
           "tokens_per_cycle", "weight_bytes"]
