"""Layouts over a `("data", "model")` device mesh: tensor-parallel weights and data-parallel KV caches.
Device placement only: this module imports nothing from models/ but `config`, so every other module
may import it (`transformer`, `cache` and `lm` call its hooks). The loader that reads a checkpoint
straight into this layout is `models.sharded_load.load_sharded` (also `models.load_sharded`).

Weights (Megatron-style tensor parallelism, Shoeybi et al. 2019), sharded over the "model" axis:

| param | shape | sharded dim |
|---|---|---|
| q_proj kernel / bias | [L, D, Hq·hd] / [L, Hq·hd] | output (heads), when Hq % model == 0 |
| k_proj, v_proj kernel / bias | [L, D, Hkv·hd] / [L, Hkv·hd] | output (KV heads), when Hkv % model == 0 |
| o_proj kernel | [L, Hq·hd, D] | input (heads), when Hq % model == 0 |
| gate_proj, up_proj kernel / bias | [L, D, F] / [L, F] | output (hidden F), when F % model == 0 |
| down_proj kernel | [L, F, D] | input (hidden F), when F % model == 0 |
| embed_tokens, lm_head | [V, D] | vocab V when V % model == 0, else hidden D when D % model == 0 |
| norms, q/k norms, down_proj bias | | replicated |

Whatever does not divide is replicated (correct, only less parallel): e.g. 4 KV heads on a model
axis of 8 keep k/v projections and the cache heads whole on every device (q heads still split).
Vocab-parallel embeddings and head (Megatron's choice) keep the big [V, D] tables split and make
the logits vocab-sharded; the sampler's sort over V then gathers them once per call.

KV caches `[L, B, S, Hkv, hd]` are sharded rows over "data" and KV heads over "model" (when Hkv
divides), `lengths [B]` rows over "data", matching the q/k/v layout so attention needs no
communication. Rows (requests x particles) over "data" are pure data parallelism; row gathers
(resampling, sd-multi's winner copy) run inside each data shard via `per_data_shard`.

The decode engine turns these layouts on while it traces a program (`layout(mesh)`). Then the
hooks in models/ act: `init_cache` and `forward_cached` put `with_sharding_constraint`s on every
cache they produce, so the partitioner (GSPMD) keeps the caches in this layout inside the decode
loop and inserts the collectives (all-reduce after o_proj / down_proj, gathers of vocab-sharded
logits); `KVCache.gather` / `copy_window` run per data shard (`per_data_shard`), and the attention's
cache write is a per-row (vmapped) scatter, both of which GSPMD would otherwise surround with
all-gathers of rows. Outside `layout(...)` every hook is a no-op and the code is unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .config import ModelConfig

DATA, MODEL = "data", "model"

__all__ = ["DATA", "MODEL", "Layout", "active_layout", "axis_size", "cache_spec", "constrain_cache", "per_data_shard",
           "layout", "param_specs", "put", "shard_params"]


def axis_size(mesh: Mesh, name: str) -> int:
    """Size of mesh axis `name` (1 when the mesh has no such axis)."""
    return int(dict(mesh.shape).get(name, 1))


# --------------------------------------------------------------------------------------- weights

def _divides(n: int | None, m: int) -> bool:
    return n is not None and m > 0 and n % m == 0


def _spec_for(path: tuple[str, ...], shape: tuple[int, ...], m: int, config: ModelConfig | None) -> P:
    """PartitionSpec of one param, from its path (HF-style names) and shape; see the module table.

    With `config`, attention is sharded only at head boundaries (Hq / Hkv divisible by m); without
    it, a head dim is sharded whenever its size divides (still correct, heads may then be split)."""
    name = path[-2] if len(path) >= 2 else path[-1]
    leaf = path[-1]
    ndim = len(shape)
    none = (None,) * ndim

    def at(dim):  # shard dim `dim` (negative ok) over "model"
        spec = list(none)
        spec[dim] = MODEL
        return P(*spec)

    if m <= 1:
        return P(*none)
    if leaf == "embedding" or path == ("lm_head",) or leaf == "lm_head":  # [V, D]
        if shape[0] % m == 0:
            return at(0)
        if shape[1] % m == 0:
            return at(1)
        return P(*none)
    heads = None
    if config is not None:
        heads = {"q_proj": config.num_attention_heads, "o_proj": config.num_attention_heads,
                 "k_proj": config.num_key_value_heads, "v_proj": config.num_key_value_heads}.get(name)
    if name in ("q_proj", "k_proj", "v_proj"):  # kernel [L, D, H*hd], bias [L, H*hd]: output dim
        ok = _divides(heads, m) if config is not None else shape[-1] % m == 0
        return at(-1) if ok else P(*none)
    if name == "o_proj":  # kernel [L, H*hd, D]: input dim
        if leaf != "kernel":
            return P(*none)
        ok = _divides(heads, m) if config is not None else shape[-2] % m == 0
        return at(-2) if ok else P(*none)
    if name in ("gate_proj", "up_proj"):  # kernel [L, D, F], bias [L, F]: hidden dim
        return at(-1) if shape[-1] % m == 0 else P(*none)
    if name == "down_proj":  # kernel [L, F, D]: input dim; bias [L, D] replicated
        if leaf == "kernel" and shape[-2] % m == 0:
            return at(-2)
        return P(*none)
    return P(*none)  # norms (RMSNorm weights, q/k norms)


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def param_specs(params, model_size: int, config: ModelConfig | None = None):
    """A pytree of PartitionSpecs matching `params` (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: _spec_for(_path_names(path), tuple(x.shape), model_size, config), params)


def shard_params(params, mesh: Mesh, config: ModelConfig | None = None):
    """`params` placed on `mesh` in the tensor-parallel layout (a no-op for arrays already there).

    Pass `config` for head-aware rules (recommended); `params` may also be a `LanguageModel` (any
    dataclass with `params` and `config`), whose config is then used and a copy with placed params
    is returned."""
    if dataclasses.is_dataclass(params) and hasattr(params, "params") and hasattr(params, "config"):
        return dataclasses.replace(params, params=shard_params(params.params, mesh, params.config))
    specs = param_specs(params, axis_size(mesh, MODEL), config)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    return jax.tree_util.tree_map(put, params, shardings)


def put(x, sharding: NamedSharding):
    """`x` on `sharding`: unchanged if already there; `jax.device_put` on one host; across hosts, built
    from this process's host copy (every process must hold the same value: same seed, same prompts)
    with `jax.make_array_from_callback`, so each process only transfers its own devices' blocks."""
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
        return x
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


# --------------------------------------------------------------------------------------- caches

def cache_spec(num_kv_heads: int, mesh: Mesh) -> tuple[P, P]:
    """(spec of k/v `[L, B, S, Hkv, hd]`, spec of lengths `[B]`): rows over data, KV heads over model."""
    heads = MODEL if _divides(num_kv_heads, axis_size(mesh, MODEL)) and axis_size(mesh, MODEL) > 1 else None
    rows = DATA if axis_size(mesh, DATA) > 1 else None
    return P(None, rows, None, heads, None), P(rows)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The mesh a program is being traced for, plus an optional debug callback
    `inspect(name, sharding)` that receives the partitioner's sharding of every constrained cache."""

    mesh: Mesh
    inspect: Callable[[str, Any], None] | None = None

    @property
    def data(self) -> int:
        return axis_size(self.mesh, DATA)


_ACTIVE: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("smcsd_mesh_layout", default=None)


@contextlib.contextmanager
def layout(mesh: Mesh | None, inspect: Callable[[str, Any], None] | None = None):
    """Within this block, traced caches are constrained to `mesh`'s layout (None: no-op)."""
    token = _ACTIVE.set(None if mesh is None else Layout(mesh, inspect))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_layout() -> Layout | None:
    return _ACTIVE.get()


def constrain_cache(cache):
    """`cache` with its k/v/lengths constrained to the active layout; unchanged outside `layout`.
    The layout's debug `inspect` gets ("k[L,B,S,Hkv,hd]", the partitioner's sharding of k)."""
    lay = _ACTIVE.get()
    if lay is None or getattr(cache, "prefix", None) is not None:  # shared-prefix caches run unsharded
        return cache
    kv_spec, len_spec = cache_spec(cache.k.shape[3], lay.mesh)
    if cache.k.shape[1] % lay.data:  # rows don't split evenly: leave this one to the partitioner
        return cache
    k = jax.lax.with_sharding_constraint(cache.k, NamedSharding(lay.mesh, kv_spec))
    v = jax.lax.with_sharding_constraint(cache.v, NamedSharding(lay.mesh, kv_spec))
    lengths = jax.lax.with_sharding_constraint(cache.lengths, NamedSharding(lay.mesh, len_spec))
    if lay.inspect is not None:
        name = "k" + str(list(cache.k.shape)).replace(" ", "")
        jax.debug.inspect_array_sharding(k, callback=lambda s: lay.inspect(name, s))
    return cache.replace(k=k, v=v, lengths=lengths)


def per_data_shard(fn, cache, *row_args, global_rows: tuple[int, ...] = ()):
    """`fn(cache, *row_args) -> KVCache` evaluated on each data shard separately under the active
    layout (`jax.shard_map` over the cache's own layout: rows over data, KV heads over model), so a
    row gather runs on each device's own rows and nothing is communicated. None when no layout is
    active or rows don't split evenly (the caller then runs `fn` as usual).

    `row_args` are per-row arrays (leading dim = output rows, split over data like the cache);
    those at positions `global_rows` hold global row indices and are made shard-local.
    Rows split into G = data-axis-size contiguous blocks, on input and output alike, and output rows
    of block g may only read input rows of block g. That holds for every row gather the methods do —
    resampling, sd-multi's winner broadcast, fanning a prompt out to its particles — as long as each
    data shard holds whole requests (B % G == 0, checked by `smcsd.decode`): particles are only ever
    gathered from their own request. (GSPMD, left to itself, all-gathers rows or heads around such
    gathers.) An index outside its block reads out of range — NaN rows, never another shard's rows.
    """
    lay = _ACTIVE.get()
    if lay is None or getattr(cache, "prefix", None) is not None:
        return None
    G = lay.data
    if cache.k.shape[1] % G or any(a.shape[0] % G for a in row_args):
        return None
    kv_spec, len_spec = cache_spec(cache.k.shape[3], lay.mesh)
    row_specs = tuple(P(DATA if G > 1 else None, *([None] * (a.ndim - 1))) for a in row_args)

    def local(k, v, lengths, *args):
        if G > 1:
            offset = jax.lax.axis_index(DATA) * k.shape[1]  # first global row of this shard's block
            args = tuple(a - offset if i in global_rows else a for i, a in enumerate(args))
        with layout(None):  # plain single-device code inside
            out = fn(cache.replace(k=k, v=v, lengths=lengths), *args)
        return out.k, out.v, out.lengths

    k, v, lengths = _shard_map(local, lay.mesh, (kv_spec, kv_spec, len_spec) + row_specs,
                               (kv_spec, kv_spec, len_spec))(cache.k, cache.v, cache.lengths, *row_args)
    return constrain_cache(cache.replace(k=k, v=v, lengths=lengths))


def _shard_map(fn, mesh, in_specs, out_specs):
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map  # jax < 0.7

    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
