"""`LanguageModel`: a config, its params and an optional tokenizer, with the few pure functions the
decode engine needs (`init_cache`, `apply`, full-sequence scoring)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import sharding as _sharding
from .cache import KVCache, init_cache
from .config import ModelConfig
from .transformer import Transformer, TreeAttention, apply_unrolled, layers_unstacked, unstack_layers, \
    with_transposed_head


@functools.lru_cache(maxsize=None)
def _module(config: ModelConfig) -> Transformer:
    return Transformer(config)


def _apply(config: ModelConfig, params, tokens, positions, kv, hidden_layers, logit_index=None, inputs=None,
           pack=None):
    """The model's forward for either params layout (stacked for nn.scan, or per-layer: `unstack_layers`)."""
    if layers_unstacked(params):
        return apply_unrolled(config, params, tokens, positions, kv, hidden_layers=tuple(hidden_layers),
                              logit_index=logit_index, inputs=inputs, pack=pack)
    return _module(config).apply({"params": params}, tokens, positions, kv, hidden_layers=tuple(hidden_layers),
                                 logit_index=logit_index, inputs=inputs, pack=pack)


def forward_cached(config: ModelConfig, params, tokens, cache: KVCache, num_valid=None,
                   hidden_layers: Sequence[int] = (), logit_index=None, inputs=None, pack=None):
    """Write `tokens [B, T]` at each row's cache length, attend causally to everything before.

    Returns `(logits float32[B, T, V], cache')` — plus hidden states `[len(hidden_layers), B, T, D]`
    when `hidden_layers` is non-empty. With `logit_index int32[B, n]` the logits are only computed at
    those positions of each row (`[B, n, V]`), e.g. a prefill's last prompt token. Each row's length advances by T, or by `num_valid[B]` for
    ragged (right-padded) input: entries written past a row's new length are stale and masked. `inputs`: a
    `models.transformer.InputEdits` (mask-token positions, added features) applied to the input embeddings.

    `pack int32[P]` (ragged rows in a fixed token budget): only the tokens at flat indices `b * T + t` go through
    the per-token work — embeddings, projections, MLPs, norms, LM head, i.e. nearly all of a call's FLOPs — as one
    row of P tokens (entries >= B * T are padding); attention still runs on the `[B, T]` layout. Each row's packed
    tokens must be its first ones (a prefix: a token left out carries zero k/v, which only tokens after it could
    see), and `num_valid` should not count past them. Outputs come back as `[B, T, ...]`, zeros where nothing was
    packed; the packed positions equal the unpacked forward's.
    """
    T = tokens.shape[1]
    if T > cache.max_len:
        raise ValueError(f"cannot write {T} tokens into a cache of max_len {cache.max_len}; "
                         f"allocate a larger cache (init_cache(batch, max_len=...))")
    if pack is not None:
        pack = jnp.asarray(pack, jnp.int32)
        if pack.ndim != 1:
            raise ValueError(f"pack must be int32[P] flat token indices, got shape {pack.shape}")
        if logit_index is not None:
            raise ValueError("pack and logit_index cannot be combined: a packed forward computes the logits of "
                             "the packed tokens only")
    positions = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    kv = (cache.k, cache.v) if cache.prefix is None else (cache.k, cache.v, cache.prefix)
    logits, kv, hidden = _apply(config, params, tokens, positions, kv, hidden_layers, logit_index, inputs, pack)
    advance = T if num_valid is None else jnp.asarray(num_valid, jnp.int32)
    new_cache = _sharding.constrain_cache(cache.replace(k=kv[0], v=kv[1], lengths=cache.lengths + advance))
    if hidden_layers:
        return logits, new_cache, hidden
    return logits, new_cache


def forward_tree(config: ModelConfig, params, tokens, cache: KVCache, base, index, depth, visible,
                 hidden_layers: Sequence[int] = (), logit_index=None, inputs=None):
    """A cached forward over token-tree nodes (tree verification and tree drafting; DESIGN.md, "Trees").

    Row r's tree region starts at sequence slot `base[r]` (everything before it is committed context, seen by every
    node) and is `W = visible.shape[-1]` slots wide. Token t of `tokens [B, T]` is written at slot
    `base + index[r, t]`, takes RoPE position `base + depth[r, t]` (a node's depth, not its slot: siblings share a
    position) and attends to the context and to the region slots j with `visible[r, t, j]` (its ancestors and
    itself: `ancestor_mask`). Several calls may fill one region (a drafter expanding a tree level by level).
    Returns what `forward_cached` does; lengths are left as they were (the caller compacts the accepted path,
    `KVCache.compact`, and sets them). Works on shared-prefix caches (the region lies after the prompt). An empty
    cache with `visible` any attention pattern makes it a forward under that pattern (PARD's COD training).
    `inputs`: see `forward_cached`.
    """
    T, W = tokens.shape[1], visible.shape[-1]
    base = jnp.asarray(base, jnp.int32)
    positions = base[:, None] + jnp.asarray(depth, jnp.int32)
    slots = base[:, None] + jnp.asarray(index, jnp.int32) - (cache.offsets()[:, None] if cache.prefix is not None else 0)
    seq = jnp.arange(cache.slots)[None, :] + (cache.offsets()[:, None] if cache.prefix is not None else 0)  # [B, S]
    rel = seq - base[:, None]
    in_region = (rel >= 0) & (rel < W)
    vis = jnp.take_along_axis(jnp.asarray(visible, bool), jnp.broadcast_to(jnp.clip(rel, 0, W - 1)[:, None, :],
                                                                           (tokens.shape[0], T, cache.slots)), axis=2)
    mask = (rel < 0)[:, None, :] | (in_region[:, None, :] & vis)
    tree = TreeAttention(slots=jnp.where(slots < 0, jnp.iinfo(jnp.int32).max, slots), mask=mask)
    logits, kv, hidden = _apply(config, params, tokens, positions, (cache.k, cache.v, cache.prefix, tree),
                                hidden_layers, logit_index, inputs)
    new_cache = _sharding.constrain_cache(cache.replace(k=kv[0], v=kv[1]))
    return (logits, new_cache, hidden) if hidden_layers else (logits, new_cache)


def ancestor_mask(parents) -> jax.Array:
    """bool `[..., M, M]`: node m sees node j iff j is m or one of its ancestors, for `parents int32[..., M]`
    (the parent's index in the same array, < m; −1: a root). Computed by repeated squaring of the reachability."""
    parents = jnp.asarray(parents, jnp.int32)
    M = parents.shape[-1]
    eye = jnp.eye(M, dtype=bool)
    reach = eye | (parents[..., :, None] == jnp.arange(M))  # self or parent
    for _ in range(max(1, (M - 1).bit_length())):
        r = reach.astype(jnp.float32)
        reach = reach | (jnp.einsum("...ij,...jk->...ik", r, r) > 0)
    return reach


def forward_full(config: ModelConfig, params, tokens, hidden_layers: Sequence[int] = (), inputs=None):
    """Full-sequence logits `float32[B, T, V]` with plain causal attention and no cache (`inputs`: see
    `forward_cached`)."""
    T = tokens.shape[1]
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tokens.shape)
    logits, _, hidden = _apply(config, params, tokens, positions, None, hidden_layers, inputs=inputs)
    return (logits, hidden) if hidden_layers else logits


@functools.lru_cache(maxsize=None)
def _jitted_full(config: ModelConfig):
    return jax.jit(functools.partial(forward_full, config))


@dataclasses.dataclass(eq=False)
class LanguageModel:
    """A decoder-only LM: `config`, `params` (a pytree), optional `tokenizer` and a `name`."""

    config: ModelConfig
    params: Any
    tokenizer: Any = None
    name: str = "model"

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """Empty fixed-shape cache for `batch` rows of `max_len` slots (dtype of the params)."""
        c = self.config
        return init_cache(c.num_hidden_layers, batch, max_len, c.num_key_value_heads, c.head_dim, c.jnp_dtype)

    def apply(self, params, tokens, cache: KVCache, num_valid=None, hidden_layers: Sequence[int] = ()):
        """Pure cached forward; see `forward_cached`. Pass `params` explicitly so jit sees them as inputs."""
        return forward_cached(self.config, params, tokens, cache, num_valid, hidden_layers)

    def logits(self, params, tokens, hidden_layers: Sequence[int] = ()):
        """Pure full-sequence forward without a cache; see `forward_full`."""
        return forward_full(self.config, params, tokens, hidden_layers)

    def __call__(self, tokens) -> jax.Array:
        """Full-sequence logits `float32[B, T, V]` of this model's params (jitted, no cache)."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
        return _jitted_full(self.config)(self.params, tokens)

    def astype(self, dtype: str) -> "LanguageModel":
        """The same model with params (and KV cache) in `dtype` ("float32", "bfloat16", "float16")."""
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {dtype!r}")
        config = dataclasses.replace(self.config, dtype=dtype)
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, config.jnp_dtype), self.params)
        return dataclasses.replace(self, config=config, params=params)

    def decode_params(self):
        """The params as the compiled decode programs take them on this backend (cached per params object).

        On CPU the layers are unstacked into per-layer buffers (`unstack_layers`: XLA:CPU copies each
        layer's weights out of stacked arrays on every call, ~2.5x a step's memory traffic) and the LM head gets a
        [D, V] copy (`with_transposed_head`: XLA:CPU's faster layout for it); this keeps a second copy of the layer
        weights and the head while the model lives. Elsewhere: `params` as they are.
        """
        if jax.default_backend() != "cpu" or layers_unstacked(self.params):
            return self.params
        cached = self.__dict__.get("_decode_params")
        if cached is None or cached[0] is not self.params:
            cached = (self.params, with_transposed_head(self.config, unstack_layers(self.params)))
            self.__dict__["_decode_params"] = cached
        return cached[1]

    @property
    def num_params(self) -> int:
        return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(self.params)))

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def __repr__(self):
        c = self.config
        return (f"LanguageModel({self.name!r}, {self.num_params / 1e6:.2f}M params, layers={c.num_hidden_layers}, "
                f"hidden={c.hidden_size}, vocab={c.vocab_size}, dtype={c.dtype})")


def init_model(config: ModelConfig, seed: int = 0, *, tokenizer=None, init_std: float = 0.02,
               name: str = "random") -> LanguageModel:
    """A randomly initialised model (normal(0, init_std) weights, unit norms), for tests and toys."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a models.ModelConfig, got {type(config).__name__}")
    module = Transformer(config, init_std=init_std)
    tokens = jnp.zeros((1, 1), jnp.int32)
    params = jax.jit(module.init)(jax.random.PRNGKey(seed), tokens, jnp.zeros((1, 1), jnp.int32))["params"]
    return LanguageModel(config=config, params=params, tokenizer=tokenizer, name=name)
