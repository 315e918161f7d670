"""FlexDraft's forward (arXiv 2605.20022): the target drafts for itself through mask tokens with their own attention
projections in the last few layers, in the same forward that verifies the previous drafts.

`forward_flex(config, params, flex, tokens, cache, anchors, ...)` runs the clean tokens `tokens [B, T]` exactly as
`forward_cached` would (same weights, same cache writes: their logits do not depend on the masks at all) and, beside
them, G groups of S mask positions per row:
- masks exist only in the last `flex.adapter_layers` layers (from layer s = L - L_a on); they enter the hidden stream
  there as one learned vector (`mask_vector`);
- in those layers a mask's query, key, value and output projections are its own (`FlexParams.layers[i]`: the
  adapters, initialised from the target's); the layer norms and MLPs are the target's, shared and frozen;
- group g follows clean token `anchors[b, g]` (the candidate after which it assumes acceptance stops): it attends to
  the cache up to and including that token and, bidirectionally, to its own S masks — never to other groups; clean
  tokens never attend to masks, and masks never write the cache;
- mask j of group g sits at position pos(anchor) + 1 + j (j = 1..S): the j-th token after the token that will follow
  the anchor (the bonus, unknown during the forward). The final norm is shared; the caller turns the masks' hidden
  states into draft logits (the shared LM head, plus bonus-guided calibration, `calibration_logits`).

The masks' MLPs run as a second matmul over the shared weights (a fused kernel would read those weights once for
clean and mask rows together); the clean path is the plain model's, so verification stays lossless.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from .cache import KVCache
from .config import ModelConfig
from .rope import apply_rope, inverse_frequencies, rope_tables
from .transformer import DecoderLayer, Part, attend, layers_unstacked


@dataclasses.dataclass(frozen=True)
class FlexConfig:
    """`adapter_layers` L_a (masks run in the last L_a layers), `group_size` S (masks per group: drafts per round),
    `calib_hidden` (the bonus-guided calibration MLP's width)."""

    adapter_layers: int = 2
    group_size: int = 4
    calib_hidden: int = 256

    def __post_init__(self):
        for k in ("adapter_layers", "group_size", "calib_hidden"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"FlexConfig.{k} must be a positive int, got {v!r}")

    def check(self, config: ModelConfig) -> None:
        if self.adapter_layers > config.num_hidden_layers:
            raise ValueError(f"adapter_layers={self.adapter_layers} exceeds the target's {config.num_hidden_layers} "
                             "layers")


class FlexParams(NamedTuple):
    layers: tuple  # per adapter layer: {"q_proj", "k_proj", "v_proj", "o_proj"} (+ q_norm / k_norm)
    mask_vector: jax.Array  # [H]
    calib: dict  # {"w1" [2H, C], "b1" [C], "w2" [C, V]}


def _layer_params(params, i: int):
    if layers_unstacked(params):
        return params["layers"][i]
    return jax.tree_util.tree_map(lambda a: a[i], params["layers"])


def init_flex_params(config: ModelConfig, params, fc: FlexConfig, seed: int = 0, std: float = 0.02) -> FlexParams:
    """Adapters copied from the target's own attention weights of the last L_a layers (masks start as ordinary
    tokens), a random mask vector and a calibration MLP whose output starts at zero (no correction before
    training)."""
    fc.check(config)
    L = config.num_hidden_layers
    layers = []
    for i in range(L - fc.adapter_layers, L):
        attn = _layer_params(params, i)["self_attn"]
        layers.append(jax.tree_util.tree_map(lambda a: jnp.array(a, jnp.float32), dict(attn)))
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    H, C = config.hidden_size, fc.calib_hidden
    calib = {"w1": jax.random.normal(k1, (2 * H, C), jnp.float32) * std, "b1": jnp.zeros((C,), jnp.float32),
             "w2": jnp.zeros((C, config.vocab_size), jnp.float32)}
    return FlexParams(tuple(layers), jax.random.normal(k2, (H,), jnp.float32) * std, calib)


def _dense(p, x):
    y = x @ p["kernel"].astype(x.dtype)
    return y + p["bias"].astype(x.dtype) if "bias" in p else y


def _rms(p, x, eps):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)
    return (y * p["weight"].astype(jnp.float32)).astype(x.dtype)


def forward_flex(config: ModelConfig, params, flex: FlexParams, tokens, cache: KVCache, anchors, group_size: int,
                 num_valid=None, hidden_layers: Sequence[int] = (), logit_index=None, anchor_positions=None):
    """Clean tokens `tokens [B, T]` written at each row's cache length (as `forward_cached`), plus `G` groups of
    `group_size` masks after the clean tokens `anchors [B, G]` (indices into `tokens`) — or, with
    `anchor_positions [B, G]`, after the tokens at those sequence positions (already in the cache or in `tokens`;
    `anchors` is then ignored: the sequential mode's draft pass anchors a group on a committed token). Returns `(logits [B, T, V], cache',
    mask_hidden [B, G, S, H] (final-normed), hidden)` — `hidden` the clean tokens' states of `hidden_layers`
    (`[len, B, T, H]`, or None)."""
    c, dt = config, config.jnp_dtype
    if cache.prefix is not None:
        raise ValueError("forward_flex needs a cache without a shared prefix")
    B, T = tokens.shape
    G = (anchors if anchor_positions is None else anchor_positions).shape[1]
    La, S = len(flex.layers), int(group_size)
    L = c.num_hidden_layers
    split = L - La
    hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    inv = inverse_frequencies(hd, c.rope_theta, c.rope_scaling)
    positions = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    cos, sin = rope_tables(positions, inv)
    key_mask = jnp.ones(tokens.shape, bool)
    embedding = params["embed_tokens"]["embedding"]
    x = jnp.take(embedding, tokens, axis=0).astype(dt)
    k_all, v_all = cache.k, cache.v
    layer = DecoderLayer(c, 0.02, False)
    heads_major = isinstance(k_all, tuple)
    anchor_pos = (jnp.take_along_axis(positions, anchors, axis=1) if anchor_positions is None
                  else jnp.asarray(anchor_positions, jnp.int32))  # [B, G]
    j = jnp.arange(1, S + 1, dtype=jnp.int32)
    mpos = (anchor_pos[:, :, None] + 1 + j).reshape(B, G * S)
    mcos, msin = rope_tables(mpos, inv)
    xm = jnp.broadcast_to(flex.mask_vector.astype(dt), (B, G * S, c.hidden_size))
    group = jnp.repeat(jnp.arange(G), S)
    own_group = jnp.broadcast_to(group[:, None] == group[None, :], (B, G * S, G * S))
    hidden = [None] * len(hidden_layers)
    for i in range(L):
        p = _layer_params(params, i)
        (x, k_all, v_all), _ = layer.apply({"params": p}, (x, k_all, v_all), i, cos, sin, positions, key_mask)
        for n, hl in enumerate(hidden_layers):
            if int(hl) % L == i:
                hidden[n] = x
        if i < split:
            continue
        a = flex.layers[i - split]
        h = _rms(p["input_layernorm"], xm, c.rms_norm_eps)
        q = _dense(a["q_proj"], h).reshape(B, G * S, hq, hd)
        k = _dense(a["k_proj"], h).reshape(B, G * S, hk, hd)
        v = _dense(a["v_proj"], h).reshape(B, G * S, hk, hd)
        if c.qk_norm:
            q, k = _rms(a["q_norm"], q, c.rms_norm_eps), _rms(a["k_norm"], k, c.rms_norm_eps)
        q, k = apply_rope(q, mcos, msin), apply_rope(k, mcos, msin)
        keys, values = (k_all[i], v_all[i])
        slots = jnp.arange(keys.shape[2 if heads_major else 1])
        upto = jnp.repeat(anchor_pos, S, axis=1)  # [B, G*S]: the anchor's position = its cache slot
        ctx = slots[None, None, :] <= upto[:, :, None]
        att = attend(q, [Part(keys, values, ctx, 1, heads_major), Part(k, v, own_group)], dt)
        xm = xm + _dense(a["o_proj"], att)
        mlp = p["mlp"]
        hm = _rms(p["post_attention_layernorm"], xm, c.rms_norm_eps)
        gate, up = _dense(mlp["gate_proj"], hm), _dense(mlp["up_proj"], hm)
        xm = xm + _dense(mlp["down_proj"], jax.nn.silu(gate) * up)
    x = _rms(params["norm"], x, c.rms_norm_eps)
    xm = _rms(params["norm"], xm, c.rms_norm_eps)
    w = embedding if c.tie_word_embeddings else params["lm_head"]
    xl = x if logit_index is None else jnp.take_along_axis(x, logit_index[:, :, None], axis=1)
    logits = jnp.einsum("btd,vd->btv", xl, w, preferred_element_type=jnp.float32)
    advance = T if num_valid is None else jnp.asarray(num_valid, jnp.int32)
    new_cache = cache.replace(k=k_all, v=v_all, lengths=cache.lengths + advance)
    return (logits, new_cache, xm.reshape(B, G, S, c.hidden_size),
            jnp.stack(hidden) if hidden_layers else None)


def draft_logits(config: ModelConfig, params, flex: FlexParams, mask_hidden, bonus):
    """Draft logits `[B, S, V]` of one group's normed mask states `mask_hidden [B, S, H]` once the bonus token `bonus
    [B]` is known: the shared LM head plus bonus-guided calibration MLP([embed(bonus); h])."""
    embedding = params["embed_tokens"]["embedding"]
    w = embedding if config.tie_word_embeddings else params["lm_head"]
    base = jnp.einsum("bsd,vd->bsv", mask_hidden, w, preferred_element_type=jnp.float32)
    e = jnp.take(embedding, bonus, axis=0).astype(jnp.float32)
    z = jnp.concatenate([jnp.broadcast_to(e[:, None, :], mask_hidden.shape).astype(jnp.float32),
                         mask_hidden.astype(jnp.float32)], -1)
    cal = jax.nn.silu(z @ flex.calib["w1"] + flex.calib["b1"]) @ flex.calib["w2"]
    return base + cal
