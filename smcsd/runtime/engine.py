"""Shared machinery of the decode programs: static specs, inputs, cache sizing, the compile cache,
and the small traced helpers every method uses (prefill, stop detection, output writes).

A method is registered with `register_method`; its `build(target_cfg, drafter, spec)` returns a
pure function `(target_params, draft_params, inputs: ProgramInputs) -> dict` that runs the whole
decode (prefill + `lax.while_loop`) and is compiled once per (method, target config, drafter, StaticSpec);
`drafter` is a static `smcsd.drafters.Drafter` (or None) and `draft_params` its `drafter_params()`.
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from smcsd.models import KVCache, ModelConfig, forward_cached, init_cache
from smcsd.models.transformer import layers_unstacked

from ..sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class StaticSpec:
    """Everything that fixes the compiled program's shapes or structure."""

    method: str
    batch: int
    prompt_len: int  # padded prompt width
    cache_len: int  # KV slots per row (both models)
    out_len: int  # output buffer width per row (>= max_new_tokens + headroom)
    num_stop: int  # number of stop-token slots
    num_speculative_tokens: int = 0
    num_particles: int = 1
    resampler: str = "systematic"
    select: str = "sample"
    return_particles: bool = False
    tree: object = None  # sd-tree: the tree's shape (smcsd.drafters.tree.TreeSpec)
    confidence_cut: float = 0.0  # sd: verify drafts while their cumulative top-1 confidence stays >= this (0: all K)


class ProgramInputs(NamedTuple):
    """Traced inputs: changing any of these values reuses the compiled program."""

    prompt: jax.Array  # int32[B, Tp], right-padded
    prompt_len: jax.Array  # int32[B]
    key: jax.Array  # PRNG key
    sampling: SamplingParams
    draft_sampling: SamplingParams
    max_new_tokens: jax.Array  # int32[]
    stop_ids: jax.Array  # int32[E], -1 = unused slot
    ess_threshold: jax.Array  # float32[]
    alpha: jax.Array  # float32[]


@dataclasses.dataclass(frozen=True)
class MethodOptions:
    """A decode call's method options once checked generically; a method's `configure` returns them final."""

    num_speculative_tokens: int  # K: the pair's default or the caller's
    num_speculative_tokens_given: bool  # the caller passed num_speculative_tokens=
    num_particles: int
    tree: object = None  # sd-tree: None (the default tree), a string or a TreeSpec; configure makes it a TreeSpec
    resampler: str = "systematic"
    temperature: float = 1.0
    draft_temperature: float = 1.0
    mesh: object = None


@dataclasses.dataclass(frozen=True)
class MethodDef:
    """A decoding method: how to build its program, and everything `decode` needs to shape a call to it. `decode`
    dispatches through these fields only (it never branches on a method's name or a drafter's class)."""

    name: str
    build: Callable  # (target_cfg, drafter: smcsd.drafters.Drafter | None, StaticSpec) -> program
    needs_draft: bool
    headroom: Callable  # (num_speculative_tokens, num_particles, tree=None) -> extra cache/output slots
    exact: bool = True
    uses_particles: bool = False  # num_particles shapes the program (else it is ignored, not compiled in)
    # A method that is not one program (sd-overlap: a host loop over programs on two device groups): called as
    # runner(target_cfg, drafter, spec, mesh=mesh), it returns a callable like a compiled program with a
    # `compile(*args) -> seconds` that compiles ahead of the run.
    runner: Callable | None = None
    # (target) -> (target, drafter) or None: the drafter it takes from the target's pair when draft= is left out
    # (flex: the pair's FlexDraft adapters, raising when none ship; smc: the pair's proposal trained for SMC).
    pair_draft: Callable | None = None
    # The one drafter kind it runs with (None: any), and the sentence that says so when the kinds disagree (also
    # used when a drafter that runs with this method only, `Drafter.only_method`, is given to another method).
    drafter_kind: str | None = None
    drafter_hint: str = ""
    resamples: bool = False  # resampler= / select= / return_particles= shape its program (smc)
    takes_tree: bool = False  # tree= shapes its program (sd-tree)
    takes_cut: bool = False  # confidence_cut= shapes its program (sd)
    passes_feedback: bool = True  # an online-learning drafter gets sd's feedback (sd-overlap does not pass it)
    # (options: MethodOptions, drafter) -> MethodOptions: its own checks and its final K (sd-tree: the tree's depth)
    configure: Callable | None = None
    # (mesh, batch, target, drafter, inputs) -> (meshes, args): a method that places its own arguments (sd-overlap:
    # two device groups); else decode places them on one device or on `mesh` (smcsd.runtime.mesh.place_args)
    place: Callable | None = None
    # (target_cfg, drafter, StaticSpec) -> ProgramParts: a loop method's init / cycle / finish, which `build` runs
    # as one program (`loop_program`) and `smcsd.methods.Method.init/step/finish` one cycle at a time; None for a
    # method that is not one loop (sd-overlap)
    parts: Callable | None = None


class ProgramParts(NamedTuple):
    """A loop method's program in three parts: `program = finish(while_loop(not all done, cycle, init(...)))`.

    init(target_params, draft_params, inputs) -> state   (prefill, first token; `state.done` is bool[B] or [R])
    cycle(target_params, draft_params, inputs, state) -> state   (one target call and what it commits)
    finish(inputs, state) -> the program's output dict (tokens, lengths, stats; as `decode` unpacks it)

    The compiled program (`loop_program`) and a caller stepping through cycles (`smcsd.methods.Method.step`) run
    the same three functions."""

    init: Callable
    cycle: Callable
    finish: Callable


def loop_program(parts: ProgramParts) -> Callable:
    """The whole decode as one pure function: init, cycles in a `lax.while_loop` until every row is done, finish."""

    def program(target_params, draft_params, inp: ProgramInputs):
        state = parts.init(target_params, draft_params, inp)
        state = jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                                   lambda s: parts.cycle(target_params, draft_params, inp, s), state)
        return parts.finish(inp, state)

    return program


METHODS: dict[str, MethodDef] = {}


def register_method(method: MethodDef) -> MethodDef:
    METHODS[method.name] = method
    return method


def bucket(n: int, minimum: int = 16) -> int:
    """Round up to the next of 16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x them).

    Nearby sizes share one compiled program while wasting at most a third of the slots.
    """
    n = max(int(n), minimum)
    p = 1 << (n - 1).bit_length()  # next power of two >= n
    three_quarters = 3 * p // 4
    return three_quarters if three_quarters >= n and three_quarters >= minimum else p


# ----------------------------------------------------------------------------- compile cache

_COMPILED: dict = {}


def compiled_program(method: MethodDef, target_cfg: ModelConfig, drafter, spec: StaticSpec, args, mesh=None):
    """The compiled program for this (method, target config, drafter, spec[, mesh]), and the seconds spent
    compiling now. `drafter` is a static (hashable) `Drafter` or None.

    With a `mesh` (args already placed by `smcsd.runtime.mesh.place_args`) it is compiled with sharded
    in/out shardings and cache constraints (`smcsd.runtime.mesh.compile_sharded`)."""
    layout = jax.tree_util.tree_structure(args[:2])  # stacked or per-layer params compile differently
    key = (method.name, target_cfg, drafter, spec, layout) + ((mesh,) if mesh is not None else ())
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    if method.runner is not None:
        runner = method.runner(target_cfg, drafter, spec, mesh=mesh)
        elapsed = runner.compile(*args)
        _COMPILED[key] = runner
        return runner, elapsed
    fn = method.build(target_cfg, drafter, spec)
    start = time.perf_counter()
    if mesh is not None:
        from .mesh import compile_sharded
        compiled = compile_sharded(fn, mesh, target_cfg, getattr(drafter, "config", None), args)
    else:
        compiled = jax.jit(fn).lower(*args).compile()
    elapsed = time.perf_counter() - start
    _COMPILED[key] = compiled
    return compiled, elapsed


def compiled_programs() -> Mapping:
    """A read-only view of the compile cache: key (method name, target config, drafter, StaticSpec, params layout[,
    mesh]) -> the compiled program (a `jax.stages.Compiled`, or a runner for methods that are not one program), for
    tools that inspect what was compiled (the collectives of a sharded program: tests/mesh_check.py)."""
    return types.MappingProxyType(_COMPILED)


def clear_compile_cache() -> None:
    _COMPILED.clear()


def release_programs() -> None:
    """Drop every compiled program of this process (smcsd's and JAX's caches): each XLA:CPU executable holds memory
    mappings of its own, and a long run that compiles many (a benchmark matrix, a golden check) exhausts the
    kernel's per-process map limit (vm.max_map_count, 65530 here: LLVM 'Cannot allocate memory')."""
    import gc
    clear_compile_cache()
    jax.clear_caches()
    gc.collect()


# ----------------------------------------------------------------------------- traced helpers

def prefill(config: ModelConfig, params, prompt, prompt_len, cache_len: int, rows_per_prompt: int = 1,
            hidden_layers: tuple[int, ...] = (), suffix_len: int | None = None):
    """Run the padded prompts through the model once; returns (last-token logits [B, V], cache), plus the
    hidden states `[B, Tp, len(hidden_layers) * D]` of every prompt position when `hidden_layers` is given
    (per request, not fanned out: what a drafter's `init` reads).

    With `rows_per_prompt = n`, the cache is then fanned out so prompt b fills rows b*n .. b*n+n-1
    (particles share the prompt: one prefill per request, broadcast to N rows). With `suffix_len` the prompt's
    KV is not copied but stored once as the rows' shared prefix (`KVCache.share_prefix`), and each row gets
    `suffix_len` slots of its own for the positions after its prompt (`cache_len` is then unused).
    """
    B, Tp = prompt.shape
    width = cache_len if suffix_len is None else Tp
    cache = init_cache(config.num_hidden_layers, B, width, config.num_key_value_heads, config.head_dim,
                       config.jnp_dtype, per_layer=layers_unstacked(params))
    out = forward_cached(config, params, prompt, cache, num_valid=prompt_len, hidden_layers=hidden_layers,
                         logit_index=(prompt_len - 1)[:, None])  # the LM head at the last token only
    logits, cache = out[0], out[1]
    last = logits[:, 0]
    if suffix_len is not None:
        cache = cache.share_prefix(rows_per_prompt, suffix_len)
    elif rows_per_prompt > 1:
        cache = cache.repeat(rows_per_prompt)
    if rows_per_prompt > 1:
        last = jnp.repeat(last, rows_per_prompt, axis=0)
    if hidden_layers:
        return last, cache, hidden_concat(out[2])
    return last, cache


def verify_call(config: ModelConfig, params, block, cache: KVCache, num_valid=None, hidden_layers=()):
    """The target's verification forward over `block [R, T]`: `(logits [R, T, V], cache', hidden)` with
    `hidden [R, T, len(hidden_layers) * D]` from the same forward (None when no layers are asked for)."""
    out = forward_cached(config, params, block, cache, num_valid=num_valid, hidden_layers=hidden_layers)
    return out[0], out[1], (hidden_concat(out[2]) if hidden_layers else None)


def hidden_concat(hidden):
    """`[L, R, T, D]` (what the models return) -> `[R, T, L*D]` (what drafters read)."""
    L, R, T, D = hidden.shape
    return jnp.transpose(hidden, (1, 2, 0, 3)).reshape(R, T, L * D)


def is_stop(tokens, stop_ids):
    """True where a token is one of the stop ids (`-1` slots never match)."""
    return jnp.any((tokens[..., None] == stop_ids) & (stop_ids >= 0), axis=-1)


def first_stop_count(tokens, count, stop_ids):
    """Clip each row's `count` of valid tokens in `tokens [R, M]` to end at (and include) its first
    stop token. Returns (new count, whether a stop token was among the kept tokens)."""
    M = tokens.shape[-1]
    idx = jnp.arange(M)
    hit = is_stop(tokens, stop_ids) & (idx < count[..., None])
    first = jnp.min(jnp.where(hit, idx, M), axis=-1)
    stopped = first < M
    return jnp.where(stopped, first + 1, count), stopped


def write_tokens(out, n, new_tokens, count):
    """Write the first `count[r]` of `new_tokens[r]` into `out[r]` starting at column `n[r]`."""
    R, M = new_tokens.shape[:2]  # trailing axes (e.g. features per token) ride along
    cols = n[:, None] + jnp.arange(M)[None, :]
    cols = jnp.where(jnp.arange(M)[None, :] < count[:, None], cols, out.shape[1])  # out of range -> dropped
    return out.at[jnp.arange(R)[:, None], cols].set(new_tokens, mode="drop")


def split_key(key, num: int = 2):
    return jax.random.split(key, num)


__all__ = ["KVCache", "METHODS", "MethodDef", "MethodOptions", "ProgramInputs", "ProgramParts", "StaticSpec", "bucket",
           "loop_program", "clear_compile_cache",
           "compiled_program", "compiled_programs", "first_stop_count", "hidden_concat", "is_stop", "prefill",
           "register_method", "release_programs", "verify_call", "write_tokens"]
