"""Config-driven decoder-only transformer in Flax (Llama family: Llama 2/3, Mistral, Qwen2, Qwen3).

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP; optional q/k/v bias (Qwen2) and
per-head q/k RMSNorm (Qwen3); tied or untied embeddings. Layers are stacked with `nn.scan` so a
32-layer checkpoint compiles as fast as a 2-layer toy. Parameter names follow Hugging Face's.

Two attention paths share the weights: with a KV cache (tokens are written at each row's own
positions, queries attend to cache slots <= their position), and without one (plain causal
attention over the given tokens, the independent reference used for scoring and tests).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import sharding as _sharding
from .config import ModelConfig
from .rope import apply_rope, inverse_frequencies, rope_tables

_NEG = -1e30
# Attention weights below e^-30 (~1e-13) of a row's largest are set to 0: they change an output by under
# slots x 1e-13 relative (float32 resolves 6e-8), and left alone, peaked rows (attention sinks) produce denormal
# floats (below e^-87), ~100x slower on CPU: batched decoding of SmolLM2 at batch 128 took 13.5 s per 16 steps
# instead of 7.5 s.
_FLUSH = 30.0


def pack_rows(x, pack):
    """`x [B, T, F]` -> `[1, P, F]`: the tokens at flat indices `pack int32[P]` (b * T + t; entries >= B * T are
    padding and read token 0 — their results are dropped by `unpack_rows`)."""
    B, T = x.shape[:2]
    return jnp.take(x.reshape((B * T,) + x.shape[2:]), pack, axis=0, mode="clip")[None]


def unpack_rows(y, pack, B: int, T: int):
    """The inverse of `pack_rows` for `y [1, P, F]`: `[B, T, F]`, zeros where no packed token lands."""
    out = jnp.zeros((B * T,) + y.shape[2:], y.dtype).at[pack].set(y[0], mode="drop")
    return out.reshape((B, T) + y.shape[2:])


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in float32 and cast back."""

    eps: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.dtype)
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return weight * xf.astype(self.dtype)


def dense(features, name, dtype, std, bias=False):
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=dtype, name=name,
                    kernel_init=nn.initializers.normal(std))


class Part(NamedTuple):
    """One set of keys/values for `attend`.

    `k`/`v` are `[Bk, S, Hkv, D]` (or heads-major `[Bk, Hkv, S, D]`), one key row per `group` query rows
    (query row r reads key row r // group). `mask` is bool `[R, T, S]` (per query; group 1 only), or
    `[Bk, S]`: the keys valid for every query that reads them (a shared prompt)."""

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    group: int = 1
    heads_major: bool = False


_FUSED_MIN_MATRICES = 32   # (key row, KV head) pairs from which `attend` multiplies-and-reduces instead of matmuls
_FUSED_MAX_QUERIES = 16    # ... while each of them has at most this many queries


def attend(q, parts: Sequence[Part], dt):
    """Grouped-query attention of `q [R, T, Hq, D]` over several parts with one softmax across all of them.

    Each part is attended on its own and the results are merged by their log-sum-exp (cascade attention, as in
    FlashInfer's merge of attention states and Hydragen), so a part shared by `group` rows — a prompt read by
    all of a request's particles — is read once for all of them, and parts are never concatenated (that would
    copy the cache every layer). Heads-major parts run as 3-D batched matmuls over (key row, KV head): on
    XLA:CPU 2x faster than a 4-D einsum (batch 16, 512 slots, 30 layers: 78 ms instead of 157 ms).
    Returns `[R, T, Hq*D]` in `dt`.
    """
    R, T, hq, hd = q.shape
    first = parts[0]
    hk = first.k.shape[1] if first.heads_major else first.k.shape[2]
    g = hq // hk
    outs, maxes, sums = [], [], []
    for part in parts:
        G, S = part.group, part.k.shape[2] if part.heads_major else part.k.shape[1]
        Bk, Q = R // G, G * T * g
        # the queries of the G rows that read one key row, as one [Q, D] matrix per (key row, KV head)
        qp = jnp.transpose(q.reshape(Bk, G, T, hk, g, hd), (0, 3, 1, 2, 4, 5)).reshape(Bk, hk, Q, hd)
        # Many tiny matrices (batched decoding: a few queries per (key row, KV head)): XLA:CPU's batched matmul
        # runs them at ~12 GFLOP/s; a fused multiply-reduce is 2x faster there (batch 64, 304 slots: 3.8 ms instead
        # of 6.9 ms a layer) and slower for one row (0.16 vs 0.09 ms), hence the switch.
        fused = (part.heads_major and Bk * hk >= _FUSED_MIN_MATRICES and Q <= _FUSED_MAX_QUERIES
                 and jax.default_backend() == "cpu")
        if fused:
            s = jnp.sum(qp[:, :, :, None, :].astype(jnp.float32) * part.k[:, :, None].astype(jnp.float32), axis=-1)
        elif part.heads_major:
            s = jnp.einsum("nqd,nsd->nqs", qp.reshape(Bk * hk, Q, hd), part.k.reshape(Bk * hk, S, hd).astype(q.dtype),
                           preferred_element_type=jnp.float32).reshape(Bk, hk, Q, S)
        else:
            s = jnp.einsum("bkqd,bskd->bkqs", qp, part.k.astype(q.dtype), preferred_element_type=jnp.float32)
        s = s * (hd ** -0.5)
        if part.mask.ndim == 3:  # per query [R, T, S] (group 1), against s as [R, hk, T, g, S]
            s = jnp.where(part.mask[:, None, :, None, :], s.reshape(R, hk, T, g, S), _NEG).reshape(R, hk, Q, S)
        else:  # per key row [Bk, S]: the same keys for every query that reads them
            s = jnp.where(part.mask[:, None, None, :], s, _NEG)
        m = jnp.max(s, axis=-1)
        d = s - m[..., None]
        p = jnp.where(d > -_FLUSH, jnp.exp(d), 0.0)  # see _FLUSH
        l = jnp.sum(p, axis=-1)
        if fused:
            o = jnp.sum(p[..., None] * part.v[:, :, None].astype(jnp.float32), axis=-2)
        elif part.heads_major:
            o = jnp.einsum("nqs,nsd->nqd", p.astype(dt).reshape(Bk * hk, Q, S), part.v.reshape(Bk * hk, S, hd).astype(dt),
                           preferred_element_type=jnp.float32)
        else:
            o = jnp.einsum("bkqs,bskd->bkqd", p.astype(dt), part.v.astype(dt), preferred_element_type=jnp.float32)

        def rows(x, *tail):  # [Bk, hk, G*T*g, *tail] -> [R, T, hk, g, *tail]
            x = x.reshape((Bk, hk, G, T, g) + tail)
            return jnp.transpose(x, (0, 2, 3, 1, 4) + tuple(range(5, 5 + len(tail)))).reshape((R, T, hk, g) + tail)

        outs.append(rows(o, hd))
        maxes.append(rows(m))
        sums.append(rows(l))
    if len(parts) == 1:
        out = outs[0] / sums[0][..., None]
    else:  # merge: rescale each part's state to the common max (a fully masked part gets weight exp(-1e30) = 0)
        top = functools.reduce(jnp.maximum, maxes)
        scale = [jnp.exp(m - top) for m in maxes]
        num = sum(o * c[..., None] for o, c in zip(outs, scale))
        out = num / sum(l * c for l, c in zip(sums, scale))[..., None]
    return out.astype(dt).reshape(R, T, hq * hd)


class TreeAttention(NamedTuple):
    """Where a tree forward's tokens go and what they see (`models.lm.forward_tree`): `slots int32[B, T]` the
    buffer slots each token is written to, `mask bool[B, T, S]` the buffer slots each token attends to."""

    slots: jax.Array
    mask: jax.Array


class Attention(nn.Module):
    """Grouped-query attention; `kv` is `(k_all, v_all, layer, prefix, tree)`, the whole cache `[L, B, S, Hkv, D]`
    (or per-layer heads-major buffers), this layer's index, the cache's shared prefix (a `PrefixKV` or None) and
    a `TreeAttention` (or None: token t at position p is written at p and attends to slots <= p), or None for the
    cache-free path. With `pack` (`forward_cached(..., pack=)`), `x` is `[1, P, H]`: the projections run on the P
    packed tokens, attention on the `[B, T]` layout `positions` has (tokens left out carry zero q/k/v)."""

    config: ModelConfig
    init_std: float

    @nn.compact
    def __call__(self, x, cos, sin, positions, key_mask, kv, pack=None):
        c, dt = self.config, self.config.jnp_dtype
        hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        B, T = positions.shape
        spread = (lambda y: y) if pack is None else (lambda y: unpack_rows(y, pack, B, T))
        q = spread(dense(hq * hd, "q_proj", dt, self.init_std, c.attention_bias)(x)).reshape(B, T, hq, hd)
        k = spread(dense(hk * hd, "k_proj", dt, self.init_std, c.attention_bias)(x)).reshape(B, T, hk, hd)
        v = spread(dense(hk * hd, "v_proj", dt, self.init_std, c.attention_bias)(x)).reshape(B, T, hk, hd)
        if c.qk_norm:
            q = RMSNorm(c.rms_norm_eps, dt, name="q_norm")(q)
            k = RMSNorm(c.rms_norm_eps, dt, name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if kv is None:  # cache-free: keys are this call's tokens
            mask = (positions[:, None, :] <= positions[:, :, None]) & key_mask[:, None, :]  # [B, T, T]
            return dense(c.hidden_size, "o_proj", dt, self.init_std)(attend(q, [Part(k, v, mask)], dt)), None

        # write this call's k/v at each row's slots, attend over the whole slot range (and the shared prefix)
        # Scatter straight into the whole cache (in place in the scan carry: no per-layer copy).
        k_all, v_all, layer, prefix, tree = kv
        slot = positions if tree is None else tree.slots
        if prefix is not None and tree is None:  # buffer slots after the prompt; a position inside the prompt is never written
            slot = positions - prefix.row_lengths()[:, None]
            slot = jnp.where(slot < 0, jnp.iinfo(jnp.int32).max, slot)
        heads_major = isinstance(k_all, tuple)
        if heads_major:  # per-layer [B, Hkv, S, D] buffers (unrolled layers): this layer's own, in place
            idx = (jnp.arange(B)[:, None, None], jnp.arange(hk)[None, :, None], slot[:, None, :])
            put = lambda buf, new: buf.at[idx].set(jnp.swapaxes(new, 1, 2).astype(buf.dtype), mode="drop")
            k_l, v_l = put(k_all[layer], k), put(v_all[layer], v)
            k_all = k_all[:layer] + (k_l,) + k_all[layer + 1:]
            v_all = v_all[:layer] + (v_l,) + v_all[layer + 1:]
            keys, values = k_l, v_l
        elif _sharding.active_layout() is None:
            rows = jnp.arange(B)[:, None]
            k_all = k_all.at[layer, rows, slot].set(k.astype(k_all.dtype), mode="drop")
            v_all = v_all.at[layer, rows, slot].set(v.astype(v_all.dtype), mode="drop")
        else:  # on a mesh: the same scatter vmapped over rows, which GSPMD keeps on each row's data
            # shard (the form above makes it all-gather the new k/v of every row first).
            def put(cache, new, pos):
                return cache.at[layer, pos].set(new.astype(cache.dtype), mode="drop")

            k_all = jax.vmap(put, in_axes=(1, 0, 0), out_axes=1)(k_all, k, slot)
            v_all = jax.vmap(put, in_axes=(1, 0, 0), out_axes=1)(v_all, v, slot)
        if not heads_major:
            keys, values = k_all[layer], v_all[layer]
        slots = jnp.arange(keys.shape[2 if heads_major else 1])
        own = slots[None, None, :] <= slot[:, :, None] if tree is None else tree.mask  # [B, T, S]
        parts = [Part(keys, values, own, 1, heads_major)]
        if prefix is not None:  # the prompt: every query follows all of it
            pk, pv = prefix.k[layer], prefix.v[layer]
            pmask = jnp.arange(prefix.width)[None, :] < prefix.lengths[:, None]
            parts.insert(0, Part(pk, pv, pmask, prefix.group, heads_major))
        att = attend(q, parts, dt)
        out = dense(c.hidden_size, "o_proj", dt, self.init_std)(att if pack is None else pack_rows(att, pack))
        return out, (k_all, v_all)


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    config: ModelConfig
    init_std: float

    @nn.compact
    def __call__(self, x):
        c, dt = self.config, self.config.jnp_dtype
        gate = dense(c.intermediate_size, "gate_proj", dt, self.init_std, c.mlp_bias)(x)
        up = dense(c.intermediate_size, "up_proj", dt, self.init_std, c.mlp_bias)(x)
        return dense(c.hidden_size, "down_proj", dt, self.init_std, c.mlp_bias)(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm residual block; scanned over layers, the whole cache rides in the carry."""

    config: ModelConfig
    init_std: float
    keep_hidden: bool

    @nn.compact
    def __call__(self, carry, layer, cos, sin, positions, key_mask, prefix=None, tree=None, pack=None):
        x, k_all, v_all = carry
        c, dt = self.config, self.config.jnp_dtype
        kv = None if k_all is None else (k_all, v_all, layer, prefix, tree)
        h = RMSNorm(c.rms_norm_eps, dt, name="input_layernorm")(x)
        h, kv = Attention(c, self.init_std, name="self_attn")(h, cos, sin, positions, key_mask, kv, pack)
        x = x + h
        x = x + MLP(c, self.init_std, name="mlp")(RMSNorm(c.rms_norm_eps, dt, name="post_attention_layernorm")(x))
        if kv is not None:
            k_all, v_all = kv
        return (x, k_all, v_all), (x if self.keep_hidden else None)


class Transformer(nn.Module):
    """Embeddings -> scanned decoder layers -> final norm -> float32 logits."""

    config: ModelConfig
    init_std: float = 0.02

    @nn.compact
    def __call__(self, tokens, positions, kv=None, key_mask=None, hidden_layers: Sequence[int] = (),
                 logit_index=None, inputs=None, pack=None):
        c, dt = self.config, self.config.jnp_dtype
        embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=dt, param_dtype=dt, name="embed_tokens",
                         embedding_init=nn.initializers.normal(self.init_std))
        x = edit_inputs(embed(tokens), inputs)
        if pack is not None:
            x = pack_rows(x, pack)
        cos, sin = rope_tables(positions, inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
        if key_mask is None:
            key_mask = jnp.ones(tokens.shape, bool)
        Layers = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                         in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast,
                                  nn.broadcast, nn.broadcast),
                         length=c.num_hidden_layers)
        k_all, v_all, prefix, tree = _split_kv(kv)
        (x, k_all, v_all), hidden = Layers(c, self.init_std, bool(hidden_layers), name="layers")(
            (x, k_all, v_all), jnp.arange(c.num_hidden_layers), cos, sin, positions, key_mask, prefix, tree, pack)
        x = RMSNorm(c.rms_norm_eps, dt, name="norm")(x)
        if c.tie_word_embeddings:
            w = embed.embedding  # [V, D]
        else:
            w = self.param("lm_head", nn.initializers.normal(self.init_std), (c.vocab_size, c.hidden_size), dt)
        logits = _head(x, w, logit_index)
        if hidden_layers:
            hidden = hidden[jnp.asarray(hidden_layers)]
        if pack is not None:
            logits, hidden = _unpack_outputs(logits, hidden if hidden_layers else None, pack, *positions.shape)
        new_kv = None if kv is None else (k_all, v_all)
        return logits.astype(jnp.float32), new_kv, (hidden if hidden_layers else None)


class InputEdits(NamedTuple):
    """Changes to a forward's input embeddings (mask-token drafters, PARD-2): positions with `is_mask [B, T]` take
    `mask_embedding [H]` instead of their token's embedding, then `add [B, T, H]` (or None) is added (e.g. projected
    target features)."""

    is_mask: jax.Array | None = None
    mask_embedding: jax.Array | None = None
    add: jax.Array | None = None


def edit_inputs(x, inputs: InputEdits | None):
    if inputs is None:
        return x
    if inputs.is_mask is not None:
        x = jnp.where(inputs.is_mask[..., None], inputs.mask_embedding.astype(x.dtype), x)
    if inputs.add is not None:
        x = x + inputs.add.astype(x.dtype)
    return x


def _split_kv(kv):
    """`(k_all, v_all, prefix, tree)` of a forward's `kv`: None, `(k, v)`, `(k, v, prefix)` (a shared-prefix cache)
    or `(k, v, prefix, tree)` (a tree forward: `TreeAttention`)."""
    if kv is None:
        return None, None, None, None
    return kv[0], kv[1], (kv[2] if len(kv) > 2 else None), (kv[3] if len(kv) > 3 else None)


def _unpack_outputs(logits, hidden, pack, B: int, T: int):
    """A packed forward's logits `[1, P, V]` and hidden states `[n, 1, P, H]` back to `[B, T, ...]` (zeros where
    no token was packed)."""
    logits = unpack_rows(logits, pack, B, T)
    if hidden is not None:
        hidden = jnp.stack([unpack_rows(h, pack, B, T) for h in hidden])
    return logits, hidden


def _head(x, w, logit_index):
    """float32 logits of the final hidden states `x [B, T, D]`; only at `logit_index [B, n]` when given
    (a prefill needs the last prompt position's: the LM head over every position is ~20% of its FLOPs)."""
    if logit_index is not None:
        x = jnp.take_along_axis(x, logit_index[:, :, None], axis=1)
    return jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)


def apply_unrolled(config: ModelConfig, params, tokens, positions, kv=None, key_mask=None,
                   hidden_layers: Sequence[int] = (), logit_index=None, inputs=None, pack=None):
    """`Transformer(config).apply` for params whose "layers" is a tuple of per-layer trees (`unstack_layers`).

    Same math and outputs; the layers are unrolled, so every weight matmul reads its own parameter
    buffer. Under `nn.scan` each layer's weights are first dynamic-sliced out of the stacked arrays, which
    XLA:CPU materialises as a copy before the dot: ~2.5x the memory traffic of a decode step there.
    """
    c, dt = config, config.jnp_dtype
    embedding = params["embed_tokens"]["embedding"]
    x = edit_inputs(jnp.take(embedding, tokens, axis=0).astype(dt), inputs)
    if pack is not None:
        x = pack_rows(x, pack)
    cos, sin = rope_tables(positions, inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
    if key_mask is None:
        key_mask = jnp.ones(tokens.shape, bool)
    layer = DecoderLayer(c, 0.02, False)
    k_all, v_all, prefix, tree = _split_kv(kv)
    hidden = [None] * len(hidden_layers)
    for i, p in enumerate(params["layers"]):
        (x, k_all, v_all), _ = layer.apply({"params": p}, (x, k_all, v_all), i, cos, sin, positions, key_mask,
                                           prefix, tree, pack)
        for n, j in enumerate(hidden_layers):
            if int(j) % c.num_hidden_layers == i:
                hidden[n] = x
    x = RMSNorm(c.rms_norm_eps, dt).apply({"params": params["norm"]}, x)
    if HEAD_T in params:  # the head's [D, V] copy (`with_transposed_head`): XLA:CPU's faster layout for x @ W
        xs = x if logit_index is None else jnp.take_along_axis(x, logit_index[:, :, None], axis=1)
        logits = jnp.einsum("btd,dv->btv", xs, params[HEAD_T], preferred_element_type=jnp.float32)
    else:
        logits = _head(x, embedding if c.tie_word_embeddings else params["lm_head"], logit_index)
    hidden = jnp.stack(hidden) if hidden_layers else None
    if pack is not None:
        logits, hidden = _unpack_outputs(logits, hidden, pack, *positions.shape)
    new_kv = None if kv is None else (k_all, v_all)
    return logits.astype(jnp.float32), new_kv, hidden


HEAD_T = "head_t"  # a per-layer (CPU decode) layout's transposed LM head


def with_transposed_head(config: ModelConfig, params):
    """Per-layer params (`unstack_layers`) plus a [D, V] copy of the LM head (the tied embedding or lm_head) under
    `HEAD_T`, which `apply_unrolled` multiplies by instead: on XLA:CPU x [T, D] @ W [D, V] runs ~15 % faster than
    against the [V, D] table at T = 1 and ~15-30 % at T = 2-5 (a verification call), ~0.6 ms of SmolLM2's ~25 ms
    step. Costs one more copy of the head (113 MB for SmolLM2 in float32)."""
    w = params["embed_tokens"]["embedding"] if config.tie_word_embeddings else params["lm_head"]
    return {**params, HEAD_T: jnp.array(w.T)}


def unstack_layers(params):
    """Params with "layers" as a tuple of per-layer trees, each leaf its own buffer (a copy)."""
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):
        return params
    n = jax.tree_util.tree_leaves(layers)[0].shape[0]
    per_layer = tuple(jax.tree_util.tree_map(lambda a, i=i: jnp.array(a[i]), layers) for i in range(n))
    return {**params, "layers": per_layer}


def stack_layers(params):
    """The inverse of `unstack_layers`: "layers" as one tree of [L, ...] arrays (the checkpoint layout)."""
    layers = params["layers"]
    if not isinstance(layers, (tuple, list)):
        return params
    params = {k: v for k, v in params.items() if k != HEAD_T}
    return {**params, "layers": jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers)}


def layers_unstacked(params) -> bool:
    return isinstance(params.get("layers"), (tuple, list))
