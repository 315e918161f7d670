"""`smcsd device-check`: every method measured at real model shapes on whatever backend this machine has, against the
cost model (smcsd/cost_model.py), with the model's constants refitted from the measurement.

    smcsd device-check --out device_check.json                      # real shapes, 6-minute budget
    smcsd device-check --toy --out toy.json                         # tiny shapes on CPU, under 2 minutes
    smcsd device-check --fit device_check.json                      # refit the cost model's constants from a run

Models are randomly initialised at real shapes (nothing is downloaded), in the backend's dtype (bfloat16 on GPU/TPU,
float32 on CPU): Llama-3.1-8B with a Llama-3.2-1B draft, and SmolLM2-135M with its drafter shapes (the ar-distilled AR
draft, an EAGLE-like one-layer head, a DFlash block drafter). Measured, most valuable first, until the budget (compile
time included) is spent:

1. the device's constants: memory bandwidth (the best of a jitted reduction and a donated update over a large array),
   the matmul rate in the backend's dtype, the cost of turning one row of logits into a token;
2. one target call against tokens per call (1 … 512; the toy: 1 … 64), a forward over a fixed KV buffer;
3. one cycle of `ar`, `sd`, `sd-tree` and `smc` over an N × K grid. Random weights accept nothing useful, so what is
   measured is the cost per cycle: the compiled decode program runs to two output lengths and the difference in wall
   time is divided by the difference in target calls (prefill and start-up cancel). Throughput is then the cost
   model's acceptance (--acceptance) × the measured cycle.

Per row: `method`, shapes, `measured_ms`, `predicted_ms` (the cost model on the detected chip's preset, or on this run's
measured constants for a chip without one), the bytes and FLOPs modelled, achieved bandwidth and its fraction of the
measured roofline, compile seconds, peak device memory ("n/a" where the backend does not report it), backend and
device. The JSON is rewritten after every row, so a run cut short keeps what it measured; a plot is written beside it
(when matplotlib is installed). `fit` refits bandwidth, FLOP rate, per-layer overhead and per-row sampling cost to the
rows (`smcsd.cost_model.fit_device`), so a measured run tightens every projection.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import sys
import time
import warnings
from typing import Callable

SCHEMA = "smcsd.device_check/1"
FIT_SCHEMA = "smcsd.device_check_fit/1"
DEFAULT_BUDGET_S = 360.0  # real shapes: 6 minutes on one H200, compile time included
TOY_BUDGET_S = 110.0  # the toy: under 2 minutes on a 2-core CPU, start-up included
DEFAULT_ACCEPTANCE = 0.81  # the per-token acceptance every Llama-8B/1B projection assumes (experiments/studies/projections.py)
BACKENDS = ("gpu", "tpu", "cpu")
WEIGHTS_FRACTION = 0.6  # a pair is built only if its weights take at most this fraction of the device's memory
TOP_FIELDS = ("schema", "created", "finished", "toy", "backend", "requested_backend", "fallback", "device",
              "device_kind", "platform", "jax_version", "dtype", "budget_s", "elapsed_s", "acceptance", "constants",
              "prediction_device", "prediction_source", "microbench_device", "peak_memory_bytes", "compile_s_total",
              "rows", "skipped", "fit", "plot")
ROW_FIELDS = ("kind", "method", "pair", "target", "draft", "drafter", "batch", "num_particles",
              "num_speculative_tokens", "tree", "tokens_per_call", "rows", "prompt_len", "cache_len", "measured_ms",
              "predicted_ms", "predicted_ms_microbench", "rel_error", "bound", "bytes", "flops", "achieved_gbs",
              "fraction_of_roofline", "achieved_tflops", "refit_ms", "compile_s", "cycles_measured",
              "tokens_per_cycle_measured",
              "resample_rate", "model_tokens_per_cycle", "projected_tokens_per_s", "predicted_tokens_per_s",
              "peak_memory_bytes", "backend", "device", "calls")


# ----------------------------------------------------------------------------------- arguments and backend

def _check_budget(budget_s):
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real):
        raise TypeError(f"budget_s must be a number of seconds > 0, got {budget_s!r}")
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise ValueError(f"budget_s must be a finite number of seconds > 0, got {budget_s!r}; e.g. budget_s=360")
    return float(budget_s)


def check_out(out, what: str = "out") -> str:
    """`out` as a path whose directory exists (a clear error naming `what` and the fix otherwise)."""
    if not isinstance(out, (str, os.PathLike)) or not str(out):
        raise TypeError(f"{what} must be a file path such as 'device_check.json', got {out!r}")
    out = os.fspath(out)
    if os.path.isdir(out):
        raise ValueError(f"{what} {out!r} is a directory; give a file path such as "
                         f"{os.path.join(out, 'device_check.json')!r}")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ValueError(f"{what} {out!r}: directory {parent!r} does not exist; create it first or choose another path")
    return out


def backend_available(platform: str) -> bool:
    import jax
    try:
        return len(jax.devices(platform)) > 0
    except RuntimeError:
        return False


def resolve_backend(requested: str | None, warn: Callable[[str], None] | None = None) -> tuple[str, str | None]:
    """(platform to run on, why it is not the requested one or None). Without a request: JAX's default backend. A
    requested backend this machine lacks is reported in one line (on stderr by default) and the default is used."""
    import jax
    if requested is not None and requested not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None: whatever JAX finds), got "
                         f"{requested!r}")
    default = jax.default_backend()
    if requested is None or requested == default:
        return default, None
    if backend_available(requested):
        return requested, None
    have = sorted({d.platform for d in jax.devices()})
    note = (f"no {requested} backend on this machine (JAX sees only: {', '.join(have)}); running on {default} "
            "instead")
    (warn or (lambda m: print(f"smcsd device-check: warning: {m}", file=sys.stderr, flush=True)))(note)
    return default, note


# ----------------------------------------------------------------------------------- what is measured

@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    kind: str  # "ar" | "eagle" (AR over a one-layer head) | "block" (DFlash)
    name: str
    config: object  # models.ModelConfig of its network
    block_size: int | None = None


@dataclasses.dataclass(frozen=True)
class PairSpec:
    name: str
    target_name: str
    target: object  # models.ModelConfig
    drafters: tuple  # DrafterSpec, ...


@dataclasses.dataclass(frozen=True)
class Item:
    """One measurement: the device constants, one target call (`T` tokens), or one cycle of `method`."""

    kind: str  # "constants" | "call" | "cycle"
    pair: str = ""
    method: str = ""
    drafter: str = ""
    B: int = 1
    N: int = 1
    K: int = 0
    T: int = 0
    tree: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    pairs: tuple  # PairSpec, ...
    items: tuple  # Item, ...
    prompt_len: int
    call_cache_len: int
    cycles: int  # cycles between the two output lengths of a cycle measurement
    repeats: int
    call_loop: int  # calls between the two loop lengths of a target-call measurement
    bandwidth_mib: int
    matmul_n: int
    min_diff_s: float  # the least wall-time difference a measurement by differences accepts before lengthening


def toy_pairs(dtype: str = "float32") -> tuple:
    """A tiny pair with the three drafter kinds (byte-sized vocabulary), for `--toy` and tests."""
    from smcsd.models import ModelConfig
    common = dict(vocab_size=512, max_position_embeddings=1024, dtype=dtype)
    target = ModelConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, **common)
    ar = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, **common)
    return (PairSpec("toy", "toy target (4 layers, width 128)", target,
                     (DrafterSpec("ar", "toy ar draft (2 layers, width 64)", ar),
                      DrafterSpec("eagle", "toy EAGLE-like head (1 layer, width 128)",
                                  target.replace(num_hidden_layers=1)),
                      DrafterSpec("block", "toy block drafter (1 layer, block 8)", target.replace(num_hidden_layers=1),
                                  8))),)


def real_pairs(dtype: str) -> tuple:
    """Llama-3.1-8B + Llama-3.2-1B, and SmolLM2-135M with its AR, EAGLE-like and block drafter shapes."""
    from .cost_model import real_configs, smollm2_config, smollm2_drafter_configs
    (l8n, l8), (l1n, l1) = real_configs(dtype)["llama3.1-8b+llama3.2-1b"]
    smol = smollm2_drafter_configs(dtype)
    return (PairSpec("llama3.1-8b+llama3.2-1b", l8n, l8, (DrafterSpec("ar", l1n, l1),)),
            PairSpec("smollm2-135m", "SmolLM2-135M", smollm2_config(dtype),
                     (DrafterSpec("ar", *smol["ar"]), DrafterSpec("eagle", *smol["eagle"]),
                      DrafterSpec("block", *smol["block"], 16))))


def make_plan(toy: bool, platform: str, dtype: str) -> Plan:
    """The measurements in order of value: the constants; per pair one cycle of `ar`, `sd` and `smc` with the AR draft
    at the projections' settings (K=4, smc N=4), the target call at a few widths, the other drafters, `sd-tree`
    (tree 3,1,1,1); then the N x K grid; then the other widths."""
    pairs = toy_pairs(dtype) if toy else real_pairs(dtype)
    items = [Item("constants")]
    first_T, more_T = ((1, 16, 64), (4,)) if toy else ((1, 16, 128, 512), (2, 4, 8, 32, 64, 256))
    grid_smc = ((2, 2), (8, 8)) if toy else ((8, 8), (16, 4), (4, 8), (16, 8), (8, 2))
    grid_sd = (2, 8)
    core, grid, rest = [], [], []
    for p in pairs:
        ar = p.drafters[0].kind
        core += [Item("cycle", p.name, "ar"), Item("cycle", p.name, "sd", ar, K=4),
                 Item("cycle", p.name, "smc", ar, N=4, K=4)]
        core += [Item("call", p.name, "target-call", T=T) for T in first_T]
        for d in p.drafters[1:]:
            core += [Item("cycle", p.name, "sd", d.kind, K=4), Item("cycle", p.name, "smc", d.kind, N=4, K=4)]
        for d in p.drafters:
            if d.kind != "eagle":  # the eagle head drafts trees like the AR draft: one tree row per drafter family
                core.append(Item("cycle", p.name, "sd-tree", d.kind, K=4,
                                 tree="3,1,1,1:distinct" if d.kind == "block" else "3,1,1,1:sample"))
        grid += [Item("cycle", p.name, "smc", ar, N=n, K=k) for n, k in grid_smc]
        grid += [Item("cycle", p.name, "sd", ar, K=k) for k in grid_sd]
        rest += [Item("call", p.name, "target-call", T=T) for T in more_T]
    items += core + grid + rest
    if toy:
        return Plan(pairs, tuple(items), prompt_len=32, call_cache_len=128, cycles=8, repeats=5, call_loop=16,
                    bandwidth_mib=64, matmul_n=256, min_diff_s=0.03)
    accel = platform != "cpu"
    return Plan(pairs, tuple(items), prompt_len=256, call_cache_len=1024, cycles=16, repeats=3,
                call_loop=10 if accel else 4, bandwidth_mib=2048 if accel else 256,
                matmul_n=8192 if accel else 1024, min_diff_s=0.005 if accel else 0.03)


# ----------------------------------------------------------------------------------- timing

def _timed(fn, repeats: int, warmup: int = 1, reset=None) -> float:
    """Best seconds of `fn()` (blocked until ready) over `repeats` runs after `warmup` (the minimum: contention on a
    shared machine only ever adds time); `reset(out)` after each."""
    import jax
    for _ in range(warmup):
        out = jax.block_until_ready(fn())
        if reset:
            reset(out)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        runs.append(time.perf_counter() - t0)
        if reset:
            reset(out)
    return min(runs)


def measure_constants(platform: str, dtype: str, bandwidth_mib: int, matmul_n: int, vocab: int) -> dict:
    """Memory bandwidth (best of a jitted float32 reduction and a donated read+write update), the matmul rate in
    `dtype` ([n, n] @ [n, n], 2n³ FLOPs) and the seconds per row of turning logits into a token (process_logits:
    a sort over the vocabulary for top-k/top-p, then sample)."""
    import jax
    import jax.numpy as jnp

    from .sampling import SamplingParams, process_logits, sample
    n = bandwidth_mib * 1024 * 1024 // 4
    x = jax.block_until_ready(jnp.full((n,), 0.5, jnp.float32))
    red = jax.jit(lambda a: jnp.sum(a))
    t_red = _timed(lambda: red(x), 5, warmup=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a backend that cannot donate says so once; the copy is then timed as is
        upd = jax.jit(lambda a: a * 1.0000001 + 1e-7, donate_argnums=0)
        box = {"x": x}

        def update():
            box["x"] = upd(box["x"])
            return box["x"]

        t_upd = _timed(update, 5, warmup=2)
    x = box = None
    bw = max(4 * n / t_red, 2 * 4 * n / t_upd)
    dt = jnp.dtype(dtype)
    a = jax.block_until_ready(jax.random.normal(jax.random.PRNGKey(0), (matmul_n, matmul_n), jnp.float32).astype(dt))
    mm = jax.jit(lambda u: u @ u)
    t_mm = _timed(lambda: mm(a), 5, warmup=2)
    a = None
    sp = SamplingParams.make(1.0, 0, 1.0)
    rows = 64
    logits = jax.random.normal(jax.random.PRNGKey(1), (rows, vocab), jnp.float32)
    fn = jax.jit(lambda k, v, p: sample(k, process_logits(v, p)))
    key = jax.random.PRNGKey(2)
    t_lg = _timed(lambda: fn(key, logits, sp), 5, warmup=2)
    return {"bandwidth_gbs": bw / 1e9, "reduce_gbs": 4 * n / t_red / 1e9, "update_gbs": 8 * n / t_upd / 1e9,
            "bandwidth_mib": bandwidth_mib, "matmul_n": matmul_n, "matmul_dtype": dtype,
            "matmul_tflops": 2 * matmul_n ** 3 / t_mm / 1e12, "logits_row_s": t_lg / rows, "logits_vocab": vocab}


# ----------------------------------------------------------------------------------- models

def random_model(config, seed: int, name: str, platform: str):
    """A `models.LanguageModel` of `config`'s shape with normal(0, 0.02) weights and unit norms, as `init_model` makes
    them, but without compiling flax's init (tens of seconds per model on a loaded CPU): the shapes come from
    `jax.eval_shape`, the values from numpy on CPU and from one jitted generator on an accelerator."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from smcsd.models import LanguageModel
    from smcsd.models.transformer import Transformer
    module = Transformer(config, init_std=0.02)
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(seed), tokens, tokens)["params"]
    paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    norm = [jax.tree_util.keystr(p).endswith("['weight']") for p, _ in paths]
    leaves = [leaf for _, leaf in paths]
    if platform == "cpu":
        rng = np.random.default_rng(seed)
        vals = [jnp.ones(leaf.shape, leaf.dtype) if is_norm else
                jnp.asarray(0.02 * rng.standard_normal(leaf.shape, np.float32), leaf.dtype)
                for leaf, is_norm in zip(leaves, norm)]
    else:
        def gen(key):
            keys = jax.random.split(key, len(leaves))
            return [jnp.ones(leaf.shape, leaf.dtype) if is_norm else
                    (0.02 * jax.random.normal(k, leaf.shape, jnp.float32)).astype(leaf.dtype)
                    for k, leaf, is_norm in zip(keys, leaves, norm)]
        vals = jax.jit(gen)(jax.random.PRNGKey(seed))
    params = jax.tree_util.tree_unflatten(treedef, vals)
    return LanguageModel(config=config, params=params, tokenizer=None, name=name)


class Built:
    """A pair's models, each built on first use (random weights): the target LanguageModel and its drafters."""

    def __init__(self, spec: PairSpec, platform: str):
        import jax
        t0 = time.perf_counter()
        self.spec, self.platform = spec, platform
        self.target = random_model(spec.target, 0, spec.target_name, platform)
        jax.block_until_ready(jax.tree_util.tree_leaves(self.target.params))
        self._drafters: dict = {}
        self.build_s = time.perf_counter() - t0

    def drafter(self, kind: str):
        """The drafter of this kind (a LanguageModel for AR kinds, a DFlashDrafter for `block`), built now if new."""
        if kind not in self._drafters:
            import jax
            from .drafters import DFlashDrafter
            t0 = time.perf_counter()
            i, d = next((i, d) for i, d in enumerate(self.spec.drafters) if d.kind == kind)
            if d.kind == "block":
                self._drafters[kind] = DFlashDrafter.create(self.target, num_layers=d.config.num_hidden_layers,
                                                           block_size=d.block_size, seed=10 + i, name=d.name)
            else:
                self._drafters[kind] = random_model(d.config, 10 + i, d.name, self.platform)
                jax.block_until_ready(jax.tree_util.tree_leaves(self._drafters[kind].params))
            self.build_s += time.perf_counter() - t0
        return self._drafters[kind]

    def drafter_spec(self, kind: str) -> DrafterSpec:
        return next(d for d in self.spec.drafters if d.kind == kind)


def _param_bytes(spec: PairSpec) -> int:
    from .cost_model import DTYPE_BYTES
    b = DTYPE_BYTES[spec.target.dtype]
    return b * (spec.target.num_params + sum(d.config.num_params for d in spec.drafters))


def _device_memory(device) -> int | None:
    """Bytes this device can hold: its allocator's limit (accelerators), or the machine's available RAM (CPU)."""
    stats = _memory_stats(device)
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def _memory_stats(device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001  (backends without allocator stats raise or return None)
        return None


def _peak(device):
    stats = _memory_stats(device)
    if not stats or "peak_bytes_in_use" not in stats:
        return "n/a"
    return int(stats["peak_bytes_in_use"])


# ----------------------------------------------------------------------------------- one call

def measure_call(model, T: int, cache_len: int, repeats: int, calls: int, min_diff_s: float = 0.01):
    """(seconds per call, compile seconds) of one cached forward of T tokens on one row whose cache holds
    cache_len − T tokens. The calls run inside one compiled loop, as in the decode programs (no host dispatch per
    call): the loop runs 2 and 2 + `calls` times, and the wall-time difference is divided by `calls`. Each iteration
    writes its T tokens and resets the row's length, so every call attends the same buffer."""
    import jax
    import jax.numpy as jnp

    from smcsd.models import forward_cached, init_cache
    from smcsd.models.transformer import layers_unstacked
    cfg = model.config
    params = model.decode_params()
    context = cache_len - T
    cache = init_cache(cfg.num_hidden_layers, 1, cache_len, cfg.num_key_value_heads, cfg.head_dim, cfg.jnp_dtype,
                       per_layer=layers_unstacked(params)).set_lengths(context)
    tokens = jnp.full((1, T), 7 % cfg.vocab_size, jnp.int32)

    def loop(p, toks, c, n):
        def body(_, carry):
            c, acc = carry
            logits, c = forward_cached(cfg, p, toks, c)[:2]
            return c.set_lengths(context), acc + logits[0, -1, 0]  # the logits are used: the call is not dropped
        return jax.lax.fori_loop(0, n, body, (c, jnp.float32(0.0)))[1]

    t0 = time.perf_counter()
    fn = jax.jit(loop).lower(params, tokens, cache, jnp.int32(0)).compile()
    compile_s = time.perf_counter() - t0
    lo = jnp.int32(2)
    t_lo = _timed(lambda: fn(params, tokens, cache, lo), repeats, warmup=1)
    for _ in range(4):  # lengthen the loop until the difference stands out of the timing noise
        hi = jnp.int32(2 + calls)
        t_hi = _timed(lambda: fn(params, tokens, cache, hi), repeats, warmup=1)
        if t_hi - t_lo >= max(min_diff_s, 0.25 * t_lo):
            break
        calls *= 4
    return max(t_hi - t_lo, 1e-9) / calls, compile_s


# ----------------------------------------------------------------------------------- one cycle

def measure_cycle(built: Built, item: Item, prompt_len: int, cycles: int, repeats: int, seed: int = 0,
                  min_diff_s: float = 0.01) -> dict:
    """Seconds per cycle of `item.method`: the compiled decode program (`smcsd.decode.prepare` + the method's build,
    compiled as `smcsd.runtime.engine.compiled_program` does, without its cache) runs to two output lengths, lo and hi, with
    the same seed; cycle = (best wall at hi − best wall at lo) / (target calls at hi − at lo). hi is 4x further out
    when the first difference is within `min_diff_s` or a quarter of the short run (the program is compiled for it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .decode import prepare
    target = built.target
    draft = built.drafter(item.drafter) if item.method != "ar" else None
    per_cycle = {"ar": 1}.get(item.method, item.K + 1)
    m_lo = 1 + 2 * per_cycle
    m_hi, m_max = m_lo + cycles * per_cycle, m_lo + 4 * cycles * per_cycle  # m_max: if the difference is in the noise
    V = target.config.vocab_size
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, V, prompt_len).tolist() for _ in range(item.B)]
    kw = dict(target=target, draft=draft, method=item.method, max_new_tokens=m_max, temperature=1.0, eos_id=[],
              seed=seed)
    if item.method != "ar":
        kw["num_speculative_tokens"] = item.K
    if item.method in ("smc", "sd-multi"):
        kw["num_particles"] = item.N
    if item.method == "sd-tree":
        kw["tree"] = item.tree
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = prepare(prompts, **kw)
        t0 = time.perf_counter()
        program = jax.jit(p.method.build(p.target.config, p.draft, p.spec)).lower(*p.args).compile()
        compile_s = time.perf_counter() - t0
    tp, dp, inp = p.args
    runs = {}

    def measure(m):
        args = (tp, dp, inp._replace(max_new_tokens=jnp.asarray(m, jnp.int32)))
        box = {}

        def go(args=args, box=box):
            box["raw"] = program(*args)
            return box["raw"]

        t = _timed(go, repeats, warmup=1)
        stats = jax.device_get(box["raw"]["stats"])
        calls = int(np.max(np.asarray(stats["num_target_calls"])))
        resampled = None
        if "resampled_per_cycle" in stats:
            resampled = int(np.asarray(stats["resampled_per_cycle"])[:calls].any(axis=1).sum())
        lengths = np.asarray(jax.device_get(box["raw"]["lengths"]))
        runs[m] = (t, calls, resampled, int(lengths.sum()))
        return runs[m]

    measure(m_lo)
    measure(m_hi)
    if runs[m_hi][0] - runs[m_lo][0] < max(min_diff_s, 0.25 * runs[m_lo][0]):
        m_hi = m_max
        measure(m_hi)
    (t_lo, c_lo, r_lo, n_lo), (t_hi, c_hi, r_hi, n_hi) = runs[m_lo], runs[m_hi]
    if c_hi <= c_lo:
        raise RuntimeError(f"{item.method}: no more target calls at {m_hi} new tokens than at {m_lo}")
    spec = p.spec
    tree_widths = spec.tree.level_widths if spec.tree is not None else None
    return {"cycle_s": max(t_hi - t_lo, 1e-9) / (c_hi - c_lo), "compile_s": compile_s, "cycles": c_hi - c_lo,
            "tokens_per_cycle": (n_hi - n_lo) / (c_hi - c_lo) / item.B,
            "resample_rate": None if r_hi is None else (r_hi - r_lo) / (c_hi - c_lo),
            "cache_len": spec.cache_len, "prompt_width": spec.prompt_len, "out_len": spec.out_len,
            "tree_widths": tree_widths, "tree": str(spec.tree) if spec.tree is not None else None,
            "K": spec.num_speculative_tokens, "N": spec.num_particles}


def cycle_model_calls(built: Built, item: Item, m: dict) -> list:
    """The cost model's calls for the cycle just measured, at its exact shapes (smc: the prompt's KV stored once per
    request and out_len slots of each particle's own; the others: the whole cache buffer attended)."""
    from .cost_model import cycle_calls
    tcfg = built.target.config
    d = built.drafter_spec(item.drafter) if item.method != "ar" else None
    dcfg = d.config if d is not None else tcfg
    block = d.block_size if d is not None else None
    if item.method == "smc":
        cache_len, prompt_len = m["prompt_width"] + m["out_len"], m["prompt_width"]
    else:
        cache_len, prompt_len = m["cache_len"], None
    return cycle_calls(item.method, tcfg, dcfg, item.B, m["N"], m["K"], cache_len, prompt_len, block,
                       m["tree_widths"], m["resample_rate"] or 0.0)


# ----------------------------------------------------------------------------------- the run

class _Budget:
    """Seconds left, and guesses of what the next measurement costs (compiles dominate: the largest seen so far for
    the same pair and kind, x 1.3; before any, a per-backend guess)."""

    def __init__(self, budget_s: float, platform: str, toy: bool, start: float | None = None):
        self.start, self.budget = time.perf_counter() if start is None else start, budget_s
        accel = platform != "cpu"
        # first-compile guesses (s): a forward, a whole decode program, building a pair's random weights
        self.guess = {"constants": 2.0, "call": 1.0, "cycle": 3.0, "build": 1.0} if toy else \
            ({"constants": 10.0, "call": 10.0, "cycle": 30.0, "build": 25.0} if accel else
             {"constants": 8.0, "call": 5.0, "cycle": 25.0, "build": 10.0})
        self.seen: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def estimate(self, kind: str, pair: str, run_s: float = 0.0) -> float:
        seen = self.seen.get((kind, pair)) or self.seen.get((kind, None))
        return 1.3 * (seen if seen is not None else self.guess[kind]) + run_s

    def record(self, kind: str, pair: str, seconds: float):
        for key in ((kind, pair), (kind, None)):
            self.seen[key] = max(self.seen.get(key, 0.0), seconds)


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def run(toy: bool = False, budget_s: float | None = None, out: str = "device_check.json", backend: str | None = None,
        acceptance: float = DEFAULT_ACCEPTANCE, plot: bool = True, progress: bool = True,
        dtype: str | None = None) -> dict:
    """Measure this machine against the cost model (module docstring); returns the result written to `out`.

    toy: tiny shapes on CPU (under 2 minutes). budget_s: stop before this many seconds (default 360, toy 110),
    compile time included. backend: "gpu" | "tpu" | "cpu" | None (whatever JAX finds); one this machine lacks is
    reported on stderr and the available one used. acceptance: the per-token acceptance a the throughput columns
    assume (tokens per cycle (1 − a^{K+1}) / (1 − a) for sd, K+1 for smc). dtype: override the backend's dtype
    (bfloat16 on GPU/TPU, float32 on CPU)."""
    import jax
    if not isinstance(toy, bool):
        raise TypeError(f"toy must be True or False, got {toy!r}")
    budget_s = _check_budget(TOY_BUDGET_S if budget_s is None and toy else
                             DEFAULT_BUDGET_S if budget_s is None else budget_s)
    out = check_out(out)
    if isinstance(acceptance, bool) or not isinstance(acceptance, numbers.Real) or not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be a number in [0, 1] (per-token acceptance), got {acceptance!r}")
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'float32', 'bfloat16', 'float16' or None (the backend's), got {dtype!r}")
    start = time.perf_counter()  # the budget counts from here: backend start-up and model building included
    platform, note = resolve_backend("cpu" if toy and backend is None else backend)
    device = jax.devices(platform)[0]
    budget = _Budget(budget_s, platform, toy, start)
    dtype = dtype or ("float32" if platform == "cpu" else "bfloat16")
    plan = make_plan(toy, platform, dtype)
    say = (lambda m: print(m, flush=True)) if progress else (lambda m: None)
    from . import cost_model as cm
    preset = cm.chip_preset(device.device_kind)
    result = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "finished": False, "toy": toy,
              "backend": platform, "requested_backend": backend, "fallback": note, "device": str(device),
              "device_kind": device.device_kind, "platform": platform, "jax_version": jax.__version__, "dtype": dtype,
              "budget_s": budget_s, "elapsed_s": 0.0, "acceptance": acceptance, "constants": None,
              "prediction_device": None, "prediction_source": None, "microbench_device": None,
              "peak_memory_bytes": _peak(device), "compile_s_total": 0.0, "build_s": {}, "rows": [], "skipped": [],
              "fit": None, "plot": None,
              "settings": {"prompt_len": plan.prompt_len, "call_cache_len": plan.call_cache_len, "cycles": plan.cycles,
                           "repeats": plan.repeats, "call_loop": plan.call_loop}}
    say(f"device-check on {device.device_kind} ({platform}, {dtype}), budget {budget_s:g} s"
        + (" [toy]" if toy else "") + f": {len(plan.items)} measurements planned, most valuable first")
    built: dict = {}
    pairs = {p.name: p for p in plan.pairs}
    dev_pred = dev_micro = None
    limit = _device_memory(device)

    def save():
        result["elapsed_s"] = budget.elapsed()
        result["peak_memory_bytes"] = _peak(device)
        _write_json(out, result)

    said = set()

    def skip(item: Item, why: str, once: str | None = None):
        """Record a skipped measurement; say so, except for the budget's (counted at the end) and repeats of `once`."""
        result["skipped"].append({**dataclasses.asdict(item), "reason": why})
        if why.startswith("budget"):
            return
        if once is None or once not in said:
            say(f"  skip {_label(item) if once is None else 'every ' + once + ' measurement'}: {why}")
        if once is not None:
            said.add(once)

    save()
    with jax.default_device(device):
        for item in plan.items:
            if item.kind == "constants":
                est = budget.estimate("constants", "")
                if est > budget.left():
                    skip(item, f"budget: needs ~{est:.0f} s, {budget.left():.1f} s left")
                    continue
                t_c = time.perf_counter()
                fits = [p for p in plan.pairs if limit is None or _param_bytes(p) <= WEIGHTS_FRACTION * limit]
                vocab = max(p.target.vocab_size for p in fits or plan.pairs)  # the largest vocabulary that runs
                c = measure_constants(platform, dtype, plan.bandwidth_mib, plan.matmul_n, vocab)
                budget.record("constants", "", time.perf_counter() - t_c)
                result["constants"] = c
                dev_micro = cm.Device(f"{device.device_kind} (this run's microbenchmarks)", c["bandwidth_gbs"] * 1e9,
                                      c["matmul_tflops"] * 1e12, 1e-6,
                                      c["logits_row_s"] if platform == "cpu" else 0.0, overlap=platform != "cpu")
                if preset is not None:
                    dev_pred, src = cm.CHIPS[preset], f"preset {preset!r} (datasheet; smcsd/cost_model.py)"
                else:
                    dev_pred, src = dev_micro, ("this run's microbenchmarks (bandwidth, matmul rate, sampling cost), "
                                                "1 µs per layer + 1 per call: no preset for this chip")
                result.update(prediction_device=cm.device_to_dict(dev_pred), prediction_source=src,
                              microbench_device=cm.device_to_dict(dev_micro))
                say(f"  constants: {c['bandwidth_gbs']:.1f} GB/s, {c['matmul_tflops']:.2f} TFLOP/s ({dtype}), "
                    f"logits -> token {c['logits_row_s'] * 1e6:.1f} µs/row; predictions from {src}")
                save()
                continue
            spec = pairs[item.pair]
            if spec.name not in built:
                need = _param_bytes(spec)
                if limit is not None and need > WEIGHTS_FRACTION * limit:
                    skip(item, f"{spec.target_name} and its drafters need {need / 2**30:.1f} GiB of weights in "
                               f"{dtype}, more than {100 * WEIGHTS_FRACTION:.0f}% of the {limit / 2**30:.1f} GiB "
                               "this device has", once=spec.name)
                    continue
                if budget.estimate("build", spec.name) > budget.left():
                    skip(item, f"budget: building {spec.name} would not fit in the {budget.left():.0f} s left")
                    continue
                say(f"  building {spec.name} (random weights, {need / 2**30:.2f} GiB)")
                built[spec.name] = Built(spec, platform)
                budget.record("build", spec.name, built[spec.name].build_s)
                result["build_s"][spec.name] = built[spec.name].build_s
            b = built[spec.name]
            try:
                row = _measure(item, b, plan, budget, dev_pred, dev_micro, platform, device, acceptance, skip)
            except Exception as e:  # noqa: BLE001  (one failed measurement must not lose the others)
                skip(item, f"failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
                save()
                continue
            if row is None:
                continue
            result["rows"].append(row)
            result["compile_s_total"] += row["compile_s"]
            say(f"  {_label(item):<44} measured {row['measured_ms']:9.3f} ms  predicted {row['predicted_ms']:9.3f} ms"
                f"  ({100 * row['rel_error']:+.0f}%)  compile {row['compile_s']:.1f} s  [{budget.elapsed():.0f} s]")
            save()
    result["finished"] = True
    if result["rows"] and result["prediction_device"]:
        try:
            result["fit"] = fit_rows(result["rows"], cm.device_from_dict(result["prediction_device"]))
        except ValueError as e:
            result["fit"] = {"error": str(e)}
        else:  # each row's time under the refitted constants (the fit's own residual)
            fitted = cm.device_from_dict(result["fit"]["fitted_device"])
            for r in result["rows"]:
                r["refit_ms"] = 1e3 * cm.predict_calls([cm.Call.from_dict(c) for c in r["calls"]], fitted)
    if plot and result["rows"]:
        result["plot"] = write_plot(result, os.path.splitext(out)[0] + ".png")
    save()
    for_budget = sum(1 for k in result["skipped"] if k["reason"].startswith("budget"))
    say(f"wrote {out}: {len(result['rows'])} rows in {budget.elapsed():.0f} s of a {budget_s:g} s budget, "
        f"{len(result['skipped'])} measurements skipped ({for_budget} for the budget; reasons in the JSON)"
        + (f"; plot {result['plot']}" if result["plot"] else ""))
    return result


def _label(item: Item) -> str:
    if item.kind == "constants":
        return "device constants"
    if item.kind == "call":
        return f"{item.pair} target call T={item.T}"
    s = f"{item.pair} {item.method}"
    if item.method != "ar":
        s += f" [{item.drafter}]"
    if item.method == "smc":
        s += f" N={item.N}"
    if item.method == "sd-tree":
        s += f" tree {item.tree}"
    elif item.method != "ar":
        s += f" K={item.K}"
    return s


def _measure(item: Item, b: Built, plan: Plan, budget: _Budget, dev_pred, dev_micro, platform, device, acceptance,
             skip) -> dict | None:
    from . import cost_model as cm
    if dev_pred is None:  # the constants were not measured (budget): predict on the microbenchmark-free fallback
        dev_pred = dev_micro = cm.Device("unmeasured (1 TB/s, 100 TFLOP/s)", 1e12, 1e14, 1e-6,
                                         overlap=platform != "cpu")
    tcfg = b.target.config
    base = {k: None for k in ROW_FIELDS}
    base.update(kind=item.kind, method=item.method, pair=item.pair, target=b.spec.target_name, batch=item.B,
                backend=platform, device=device.device_kind)
    if item.kind == "call":
        T, cache_len = item.T, plan.call_cache_len
        calls = [cm.call_features(tcfg, 1, T, cache_len, logit_rows=0, what="target")]
        pred = cm.predict_calls(calls, dev_pred)
        est = budget.estimate("call", item.pair, 2 * (1 + plan.repeats) * (2 + plan.call_loop) * 3 * pred)
        if est > budget.left():
            skip(item, f"budget: needs ~{est:.0f} s, {budget.left():.0f} s left")
            return None
        t, compile_s = measure_call(b.target, T, cache_len, plan.repeats, plan.call_loop, plan.min_diff_s)
        budget.record("call", item.pair, compile_s)
        base.update(tokens_per_call=T, rows=1, cache_len=cache_len, prompt_len=cache_len - T)
    else:
        d = b.drafter_spec(item.drafter) if item.method != "ar" else None
        base.update(drafter=item.drafter or None, draft=d.name if d else None,
                    num_particles=item.N if item.method == "smc" else None,
                    num_speculative_tokens=item.K if item.method != "ar" else None, tree=item.tree)
        # a rough guess of the runs' time: (warmup + repeats) x the three lengths' cycles (lo, hi, maybe 4x hi),
        # at 3x the predicted cycle
        guess_calls = cm.cycle_calls(item.method, tcfg, d.config if d else tcfg, item.B, item.N, item.K or 1,
                                     plan.prompt_len + (4 * plan.cycles + 3) * (item.K + 1),
                                     tree_widths=(3, 3, 3, 3) if item.method == "sd-tree" else None)
        run_guess = (1 + plan.repeats) * (5 * plan.cycles + 9) * 3 * cm.predict_calls(guess_calls, dev_pred)
        est = budget.estimate("cycle", item.pair, run_guess)
        if est > budget.left():
            skip(item, f"budget: needs ~{est:.0f} s, {budget.left():.0f} s left")
            return None
        m = measure_cycle(b, item, plan.prompt_len, plan.cycles, plan.repeats, min_diff_s=plan.min_diff_s)
        budget.record("cycle", item.pair, m["compile_s"])
        t, compile_s = m["cycle_s"], m["compile_s"]
        calls = cycle_model_calls(b, item, m)
        pred = cm.predict_calls(calls, dev_pred)
        stats = {"acceptance_sd": acceptance, "acceptance_sd_multi": acceptance}
        tokens = cm.tokens_per_cycle(item.method, m["K"], stats, m["tree_widths"])
        per_row = 1 if item.method == "ar" else (sum(m["tree_widths"]) + 1 if m["tree_widths"] else m["K"] + 1)
        base.update(num_speculative_tokens=m["K"] if item.method != "ar" else None, tree=m["tree"],
                    tokens_per_call=per_row,
                    rows=item.B * (m["N"] if item.method == "smc" else 1), cache_len=m["cache_len"],
                    prompt_len=m["prompt_width"], cycles_measured=m["cycles"],
                    tokens_per_cycle_measured=m["tokens_per_cycle"], resample_rate=m["resample_rate"],
                    model_tokens_per_cycle=tokens, projected_tokens_per_s=item.B * tokens / t,
                    predicted_tokens_per_s=item.B * tokens / pred)
    nbytes = sum(c.count * c.bytes for c in calls)
    flops = sum(c.count * c.flops for c in calls)
    bw = dev_micro.bandwidth
    bound = cm.call_seconds(next(c for c in calls if c.what == "target"), dev_pred)[1]
    base.update(measured_ms=1e3 * t, predicted_ms=1e3 * pred, predicted_ms_microbench=1e3 * cm.predict_calls(calls,
                dev_micro), rel_error=pred / t - 1.0, bound=bound, bytes=nbytes, flops=flops,
                achieved_gbs=nbytes / t / 1e9, fraction_of_roofline=nbytes / t / bw, achieved_tflops=flops / t / 1e12,
                compile_s=compile_s, peak_memory_bytes=_peak(device), calls=[c.to_dict() for c in calls])
    return base


# ----------------------------------------------------------------------------------- refit

def fit_rows(rows: list[dict], base) -> dict:
    """The cost model's constants refitted to `rows` (those with calls and a measured time), starting from `base`."""
    from . import cost_model as cm
    use = [r for r in rows if r.get("calls") and r.get("measured_ms")]
    if not use:
        raise ValueError("fit: no rows with a measured time and the cost model's calls (a device-check results file "
                         "has them under 'rows')")
    calls = [[cm.Call.from_dict(c) for c in r["calls"]] for r in use]
    dev, rep = cm.fit_device(calls, [r["measured_ms"] / 1e3 for r in use], base)
    rep["fitted_device"] = cm.device_to_dict(dev)
    rep["base_device"] = cm.device_to_dict(base)
    rep["constants"] = {"bandwidth_gbs": dev.bandwidth / 1e9, "tflops": dev.flops / 1e12,
                        "overhead_us_per_layer": dev.overhead_s * 1e6, "logits_row_us": dev.logits_row_s * 1e6}
    rep["labels"] = [_row_label(r) for r in use]
    return rep


def _row_label(r: dict) -> str:
    if r["kind"] == "call":
        return f"{r['pair']} call T={r['tokens_per_call']}"
    s = f"{r['pair']} {r['method']}"
    if r.get("drafter"):
        s += f" [{r['drafter']}]"
    if r.get("num_particles"):
        s += f" N={r['num_particles']}"
    if r.get("tree"):
        s += f" {r['tree']}"
    elif r.get("num_speculative_tokens"):
        s += f" K={r['num_speculative_tokens']}"
    return s


def fit(results, out: str | None = None, progress: bool = True) -> dict:
    """Refit the cost model's constants from a device-check results file (or its dict); write them to `out` (JSON)
    if given and print a table. The fitted device (`fitted_device`) loads with `smcsd.cost_model.device_from_dict`;
    `python -m experiments.studies.cost_model --fitted FILE` projects with it."""
    from . import cost_model as cm
    if isinstance(results, (str, os.PathLike)):
        path = os.fspath(results)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"fit: results file {path!r} not found; give the JSON a device-check run wrote")
        try:
            with open(path) as f:
                results = json.load(f)
        except ValueError as e:
            raise ValueError(f"fit: {path!r} is not valid JSON ({e})") from None
    if not isinstance(results, dict) or results.get("schema") != SCHEMA:
        raise ValueError(f"fit: not a device-check results file (schema {SCHEMA!r} expected, got "
                         f"{results.get('schema') if isinstance(results, dict) else type(results).__name__!r})")
    if out is not None:
        out = check_out(out)
    base = results.get("prediction_device")
    base = cm.device_from_dict(base) if base else cm.Device("unmeasured", 1e12, 1e14, 1e-6,
                                                            overlap=results.get("platform") != "cpu")
    rep = fit_rows(results.get("rows", []), base)
    res = {"schema": FIT_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": results.get("device_kind"),
           "backend": results.get("backend"), **rep}
    if progress:
        c, b = rep["constants"], rep["base_device"]
        print(f"refit on {rep['rows']} rows of {results.get('device_kind')} ({results.get('backend')}):")
        print(f"  bandwidth {b['bandwidth'] / 1e9:.1f} -> {c['bandwidth_gbs']:.1f} GB/s, FLOP rate "
              f"{b['flops'] / 1e12:.2f} -> {c['tflops']:.2f} TFLOP/s, overhead {b['overhead_s'] * 1e6:.2f} -> "
              f"{c['overhead_us_per_layer']:.2f} µs per layer, sampling {b['logits_row_s'] * 1e6:.2f} -> "
              f"{c['logits_row_us']:.2f} µs per row")
        unc = [k for k, v in rep["constrained"].items() if not v]
        if unc:
            print(f"  not constrained by these rows (kept): {', '.join(unc)}")
        print(f"  |relative error| median {100 * rep['median_abs_rel_error_before']:.0f}% -> "
              f"{100 * rep['median_abs_rel_error_after']:.0f}%, max {100 * rep['max_abs_rel_error_before']:.0f}% -> "
              f"{100 * rep['max_abs_rel_error_after']:.0f}%")
    if out is not None:
        _write_json(out, res)
        if progress:
            print(f"wrote {out}")
    return res


# ----------------------------------------------------------------------------------- plot

def write_plot(result: dict, path: str) -> str | None:
    """Measured vs predicted: the target call against tokens per call (log-log, per model), and every cycle. Returns
    the path, or None (with a note on stderr) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("smcsd device-check: note: matplotlib is not installed, so no plot was written "
              "(pip install matplotlib; the JSON has every figure)", file=sys.stderr)
        return None
    rows = result["rows"]
    calls = [r for r in rows if r["kind"] == "call"]
    cycles = [r for r in rows if r["kind"] == "cycle"]
    fig, (a, c) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 1.6]})
    for pair in dict.fromkeys(r["pair"] for r in calls):
        rs = sorted((r for r in calls if r["pair"] == pair), key=lambda r: r["tokens_per_call"])
        x = [r["tokens_per_call"] for r in rs]
        line, = a.plot(x, [r["measured_ms"] for r in rs], "o-", label=f"{rs[0]['target']} measured")
        a.plot(x, [r["predicted_ms"] for r in rs], "--", color=line.get_color(), label=f"{rs[0]['target']} predicted")
        if all(r.get("refit_ms") for r in rs):
            a.plot(x, [r["refit_ms"] for r in rs], ":", color=line.get_color(), label=f"{rs[0]['target']} refit")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("tokens per call (1 row)")
    a.set_ylabel("ms per target call")
    a.set_title("target call cost vs tokens per call")
    a.legend(fontsize=7)
    a.grid(True, which="both", alpha=0.3)
    if cycles:
        labels = [_row_label(r) for r in cycles]
        xs = range(len(cycles))
        c.bar([i - 0.2 for i in xs], [r["measured_ms"] for r in cycles], 0.4, label="measured")
        c.bar([i + 0.2 for i in xs], [r["predicted_ms"] for r in cycles], 0.4, label="predicted (cost model)")
        if all(r.get("refit_ms") for r in cycles):
            c.plot(list(xs), [r["refit_ms"] for r in cycles], "k_", markersize=14, mew=2,
                   label="refit (constants fitted to this run)")
        c.set_xticks(list(xs))
        c.set_xticklabels(labels, rotation=70, ha="right", fontsize=6)
        c.set_yscale("log")
        c.set_ylabel("ms per cycle")
        c.set_title("one cycle per method (N, K, drafter)")
        c.legend(fontsize=7)
    fig.suptitle(f"smcsd device-check: {result['device_kind']} ({result['backend']}, {result['dtype']})"
                 + (" — toy shapes" if result["toy"] else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["DEFAULT_BUDGET_S", "SCHEMA", "fit", "fit_rows", "make_plan", "resolve_backend", "run", "write_plot"]
