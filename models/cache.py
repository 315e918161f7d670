"""Fixed-shape key/value cache with per-row lengths.

Buffers never change shape inside a decode loop: progress lives in `lengths`. Rolling a row back
is setting its length (entries past it are masked and later overwritten); resampling particles is
a gather along the batch axis. Both are O(1) Python and trace cleanly inside `jit`.

Shared prefix (`KVCache.share_prefix`): rows that continue one prompt (SMC particles) keep that prompt's
keys/values once per request in a `PrefixKV`, read by all of them through cascade attention
(`models.transformer.attend`); each row's own buffers then hold only what follows the prompt, so resampling
gathers generated tokens only and the prompt is never copied per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from . import sharding as _sharding


@struct.dataclass
class PrefixKV:
    """A prompt's keys/values stored once per request and read by `group` consecutive cache rows.

    `k`/`v` have the owning cache's layout with one row per request; `lengths int32[requests]` are the prompt
    lengths (slots past them are padding and masked)."""

    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    group: int = struct.field(pytree_node=False, default=1)

    @property
    def width(self) -> int:
        return self.k[0].shape[2] if isinstance(self.k, tuple) else self.k.shape[2]

    def row_lengths(self) -> jax.Array:
        """The prompt length of every cache row (request b's for rows b*group .. b*group+group-1)."""
        return jnp.repeat(self.lengths, self.group, total_repeat_length=self.lengths.shape[0] * self.group)


@struct.dataclass
class KVCache:
    """Keys/values `[num_layers, batch, max_len, num_kv_heads, head_dim]` and `lengths int32[batch]`.

    With `per_layer` buffers (`init_cache(..., per_layer=True)`, what decoding on CPU uses alongside
    per-layer weights) k and v are tuples of `num_layers` heads-major arrays
    `[batch, num_kv_heads, max_len, head_dim]`: attention then reads each layer's buffer in place, where
    slicing a layer out of the stacked array, and the [S, H] order, make XLA:CPU copy it first (measured:
    a batch-16 step at 512 slots took 2x the time of one at 128). Every method works on both forms.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    prefix: PrefixKV | None = None  # shared prompt (share_prefix): k/v then hold slots from the prompt's end on

    @property
    def per_layer(self) -> bool:
        return isinstance(self.k, tuple)

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def slots(self) -> int:
        """Width of the row buffers (with a shared prefix: positions after the prompt)."""
        return self.k[0].shape[2] if self.per_layer else self.k.shape[2]

    @property
    def max_len(self) -> int:
        """Longest sequence a row can hold (prompt included when the prompt is a shared prefix)."""
        return self.slots + (0 if self.prefix is None else self.prefix.width)

    def offsets(self) -> jax.Array | int:
        """Position of each row's buffer slot 0: its prompt length with a shared prefix, else 0."""
        return 0 if self.prefix is None else self.prefix.row_lengths()

    def _map(self, fn) -> tuple:
        """(k', v') with `fn(x, lead)` applied to every buffer; `lead` indexes the axes before the batch axis."""
        lead = () if self.per_layer else (slice(None),)
        if self.per_layer:
            return tuple(fn(x, lead) for x in self.k), tuple(fn(x, lead) for x in self.v)
        return fn(self.k, lead), fn(self.v, lead)

    def gather(self, index: jax.Array) -> "KVCache":
        """Rows `index` of the cache (the batch axis), e.g. particles picked by their ancestors."""
        index = jnp.asarray(index, jnp.int32)
        sharded = _sharding.per_data_shard(KVCache.gather, self, index, global_rows=(0,))  # on a mesh
        if sharded is not None:
            return sharded
        k, v = self._map(lambda x, lead: jnp.take(x, index, axis=len(lead)))
        return self.replace(k=k, v=v, lengths=jnp.take(self.lengths, index, axis=0))

    def copy_window(self, src: jax.Array, start: jax.Array, width: int) -> "KVCache":
        """Row r's slots [start[r], start[r] + width) become row src[r]'s (lengths untouched).

        When rows share everything before `start` (e.g. N drafts of one request after verification),
        this moves only the `width` new slots per row instead of gathering whole rows: O(width), not
        O(max_len). Slots past max_len are dropped. `start` is a position (with a shared prefix: after the prompt).
        """
        src = jnp.asarray(src, jnp.int32)
        sharded = _sharding.per_data_shard(lambda c, s, t: c.copy_window(s, t, width), self, src,
                                           jnp.asarray(start, jnp.int32), global_rows=(0,))  # on a mesh
        if sharded is not None:
            return sharded
        start = jnp.asarray(start, jnp.int32) - self.offsets()
        pos = start[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]  # [R, W] buffer slots
        pos = jnp.where(pos < 0, self.slots, pos)  # inside a shared prompt: never written (dropped)
        rows = jnp.arange(self.batch_size)[:, None]
        clipped = jnp.clip(pos, 0, self.slots - 1)

        def move(x, lead):  # row r's window <- row src[r]'s; x[L, R, S, H, D] or per layer x[R, H, S, D]
            if self.per_layer:
                return x.at[rows, :, pos].set(x[src[:, None], :, clipped], mode="drop")
            return x.at[lead + (rows, pos)].set(x[lead + (src[:, None], clipped)], mode="drop")

        k, v = self._map(move)
        return _sharding.constrain_cache(self.replace(k=k, v=v))

    def compact(self, start: jax.Array, index: jax.Array, count: jax.Array) -> "KVCache":
        """Within each row, slot `start + j` <- slot `start + index[r, j]` for j < count[r] (lengths untouched).

        After tree verification: the accepted path's nodes sit at scattered tree slots; this moves their keys/values
        into consecutive slots (all reads happen before the writes, so overlapping moves are safe). `start` is a
        position (with a shared prefix: after the prompt); `index int32[B, D]`."""
        index = jnp.asarray(index, jnp.int32)
        D = index.shape[1]
        start = jnp.asarray(start, jnp.int32) - self.offsets()
        rows = jnp.arange(self.batch_size)[:, None]
        src = jnp.clip(start[:, None] + index, 0, self.slots - 1)
        dst = start[:, None] + jnp.arange(D, dtype=jnp.int32)[None, :]
        dst = jnp.where((jnp.arange(D)[None, :] < jnp.asarray(count)[:, None]) & (dst >= 0), dst, self.slots)

        def move(x, lead):
            if self.per_layer:
                return x.at[rows, :, dst].set(x[rows, :, src], mode="drop")
            return x.at[lead + (rows, dst)].set(x[lead + (rows, src)], mode="drop")

        k, v = self._map(move)
        return _sharding.constrain_cache(self.replace(k=k, v=v))

    def set_lengths(self, lengths: jax.Array) -> "KVCache":
        """Roll rows back (or forward over already-written entries) by setting their lengths."""
        return self.replace(lengths=jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), self.lengths.shape))

    def repeat(self, n: int) -> "KVCache":
        """Each row repeated `n` times consecutively (row b -> rows b*n .. b*n+n-1): prefill once, fan out."""
        if self.prefix is not None:
            raise ValueError("a cache with a shared prefix is already fanned out; repeat the prefilled cache")
        return self.gather(jnp.repeat(jnp.arange(self.batch_size), n))

    def share_prefix(self, n: int, slots: int) -> "KVCache":
        """Fan a prefilled cache (one row per prompt, `lengths` = prompt lengths) out to `n` rows per prompt that
        share it: the prompt's keys/values become a `PrefixKV` stored once, and each row gets empty buffers of
        `slots` slots for the positions after its prompt. Rows of one prompt may then be gathered among each
        other (resampling) without moving the prompt."""
        if self.prefix is not None:
            raise ValueError("this cache already has a shared prefix")
        if n < 1 or slots < 1:
            raise ValueError(f"share_prefix needs n >= 1 and slots >= 1, got n={n}, slots={slots}")
        R = self.batch_size * n

        def empty(x, lead):
            shape = list(x.shape)
            shape[len(lead)] = R  # the batch axis
            shape[2] = slots  # the slot axis of both layouts ([B, Hkv, S, D] and [L, B, S, Hkv, D])
            return jnp.zeros(shape, x.dtype)

        k, v = self._map(empty)
        prefix = PrefixKV(k=self.k, v=self.v, lengths=self.lengths, group=n)
        return KVCache(k=k, v=v, lengths=prefix.row_lengths(), prefix=prefix)

    @property
    def nbytes(self) -> int:
        parts = (self.k, self.v) + (() if self.prefix is None else (self.prefix.k, self.prefix.v))
        return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(parts)))


def init_cache(num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
               dtype=jnp.float32, per_layer: bool = False) -> KVCache:
    """An empty cache: zeros and every row at length 0 (`per_layer`: one buffer per layer, see KVCache)."""
    if batch < 1 or max_len < 1:
        raise ValueError(f"cache needs batch >= 1 and max_len >= 1, got batch={batch}, max_len={max_len}")
    if per_layer:
        shape = (batch, num_kv_heads, max_len, head_dim)
        k = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
        v = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
        return KVCache(k=k, v=v, lengths=jnp.zeros((batch,), jnp.int32))
    shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
    cache = KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32))
    return _sharding.constrain_cache(cache)  # no-op unless a mesh layout is active (models/sharding.py)
