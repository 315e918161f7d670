"""`EagleDrafter` (EAGLE-3, arXiv 2503.01840; EAGLE, arXiv 2401.15077): one decoder layer over the target's own
features, autoregressive over its own outputs, with a head over a draft vocabulary (FR-Spec, smcsd/drafters/vocab.py).

The network (`EagleNet`, Flax; parameter names follow the EAGLE / SpecForge checkpoints, `save` / `load`):
- `fc`: the hidden states of a low, a middle and a high target layer (`target_layers`, default EAGLE-3's
  (1, L//2 − 1, L − 4): the layers whose outputs SpecForge / SGLang capture), concatenated → Linear(3H → H), no bias;
- `midlayer`: one pre-norm decoder layer whose attention input is 2H wide: [input_layernorm(e); hidden_norm(g)] with
  e the next token's embedding (the target's, frozen, never stored) and g the feature; residual = g;
- `norm` (init: the target's final norm) and `lm_head` over the V′ kept tokens (init: the target's tied embedding /
  LM head rows of those tokens).

Slots. Pair s (s >= 1) is (g_{s−1}, e(x_s)) at RoPE position s: the feature of target position s−1 with the token
at s; its output a_s predicts x_{s+1}. Slot 0 has no pair and is never attended (the drafter's first pair, like
EAGLE's, is (g_0, x_1)). The drafter keeps the K/V of its one layer per slot (`models.KVCache`, one layer) and the
fused feature of the last committed target position. For positions after the committed ones the drafter's own output
stands in for the feature: step k of `propose` feeds (a_{p−1}, x_{k−1}) at position p = committed length + k − 1.

Where features come from (the `hidden_layers` contract, never a second target pass): `init` gets the prompt's hidden
states from the prefill, `observe` those of the verified block from the verification call; `observe` rewrites the
K/V of every verified pair with the target's features (replacing those drafted from the drafter's own) and keeps the
feature of the last committed position for the next `propose`. Length bookkeeping is `ARDrafter`'s (after `propose`
the state is as long as if the fed tokens and x_1..x_{K−1} had been consumed), so every method's rollback arithmetic
applies unchanged; the committed target length is `lengths + feed_count − 1`.

Exactness. Each x_k is drawn from the processed head distribution q′_k over the kept tokens and reported over the
full vocabulary with −inf outside (`vocab.floor_mixture` with ε = 0), so `sd` / `sd-multi` / `sd-tree` verify over
the full vocabulary and stay exact. `smc` runs `importance_proposal()`: the same drafter with ε = `smc_floor` mixed
in, q = (1 − ε)·q′ + ε/V, sampled as that mixture, so its weights p_T/q stay finite wherever p_T > 0.

Training (`eagle_unroll_logits`: the training-time-test unroll, EAGLE-3 / HASS) lives with the losses in
`smcsd/train/eagle.py`; the unroll's iteration i at row s is exactly `propose`'s step i + 1 after a committed length
s, so it is also the cache-free reference the tests check decoding against.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from smcsd.models import KVCache, ModelConfig, init_cache
from smcsd.models.rope import apply_rope, inverse_frequencies, rope_tables
from smcsd.models.transformer import MLP, Part, RMSNorm, attend

from ..sampling import process_logits, sample
from .base import Drafter, Proposal, TreeProposal, check_hidden_layers, top1_confidence
from .tree import product_tree, static_ancestors
from .vocab import DraftVocab, floor_mixture, sample_floor_mixture, stop_ids_of

__all__ = ["EagleConfig", "EagleDrafter", "EagleNet", "EagleState", "default_target_layers", "eagle_hf_config",
           "eagle_unroll_at", "eagle_unroll_logits", "eagle_unroll_outputs", "head_logits"]

ARCHITECTURE = "LlamaForCausalLMEagle3"  # the EAGLE / SpecForge config's architecture name


def _linear(features, name, dtype, std, bias=False):
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=dtype, name=name,
                    kernel_init=nn.initializers.normal(std))


def default_target_layers(num_target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / middle / high feature layers, as indices of layer *outputs*: (1, L//2 − 1, L − 4), what
    SpecForge and SGLang capture (the inputs of layers 2, L//2 and L − 3). Shallow targets (L < 8, where that rule
    repeats a layer): spread over 0..L−1."""
    L = int(num_target_layers)
    if L >= 8:
        return (1, L // 2 - 1, L - 4)
    return tuple(int(round(x)) for x in np.linspace(0, L - 1, 3))


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """Static shape of an EAGLE-3 drafter: `model` the decoder layer's dimensions (hidden size and vocabulary are the
    target's, `num_hidden_layers` 1), `target_layers` the three target layers it reads (None: `default_target_layers`,
    filled in by `bind`), `draft_vocab_size` V′ (None: the full vocabulary)."""

    model: ModelConfig
    target_layers: tuple[int, ...] | None = None
    draft_vocab_size: int | None = None

    def __post_init__(self):
        if self.target_layers is not None:
            layers = tuple(int(i) for i in self.target_layers)
            if len(layers) != 3:
                raise ValueError(f"target_layers must name three target layers (low, middle, high), got {layers}")
            object.__setattr__(self, "target_layers", layers)
        if self.model.num_hidden_layers != 1:
            raise ValueError(f"an EAGLE-3 drafter has one decoder layer, got num_hidden_layers="
                             f"{self.model.num_hidden_layers}")
        V = self.model.vocab_size
        if self.draft_vocab_size is not None and not (isinstance(self.draft_vocab_size, int) and
                                                      1 <= self.draft_vocab_size < V):
            raise ValueError(f"draft_vocab_size must be an int in [1, {V}) or None (the full vocabulary), got "
                             f"{self.draft_vocab_size!r}")

    @property
    def head_size(self) -> int:
        """Rows of the LM head: V′, or V for the full vocabulary."""
        return self.model.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @property
    def feature_size(self) -> int:
        return 3 * self.model.hidden_size


class EagleLayer(nn.Module):
    """EAGLE-3's decoder layer: attention input [input_layernorm(embedding); hidden_norm(feature)] (2H), residual the
    feature, then the usual post-attention norm and SwiGLU MLP."""

    config: ModelConfig
    init_std: float

    def setup(self):
        c, dt, std = self.config, self.config.jnp_dtype, self.init_std
        hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = _linear(hq * hd, "q_proj", dt, std, c.attention_bias)
        self.k_proj = _linear(hk * hd, "k_proj", dt, std, c.attention_bias)
        self.v_proj = _linear(hk * hd, "v_proj", dt, std, c.attention_bias)
        self.o_proj = _linear(c.hidden_size, "o_proj", dt, std)
        self.input_layernorm = RMSNorm(c.rms_norm_eps, dt)
        self.hidden_norm = RMSNorm(c.rms_norm_eps, dt)
        self.post_attention_layernorm = RMSNorm(c.rms_norm_eps, dt)
        self.mlp = MLP(c, std)

    def _input(self, emb, feat):
        return jnp.concatenate([self.input_layernorm(emb), self.hidden_norm(feat)], axis=-1)

    def kv(self, emb, feat, cos, sin):
        """Keys (roped) and values `[R, T, Hkv, D]` of pairs (embedding, feature) `[R, T, H]` each."""
        c = self.config
        R, T, _ = emb.shape
        x = self._input(emb, feat)
        k = self.k_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim)
        return apply_rope(k, cos, sin), v

    def qkv(self, emb, feat, cos, sin):
        c = self.config
        R, T, _ = emb.shape
        x = self._input(emb, feat)
        q = apply_rope(self.q_proj(x).reshape(R, T, c.num_attention_heads, c.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim), cos, sin)
        v = self.v_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim)
        return q, k, v

    def out(self, feat, att):
        """The layer's output (pre-norm hidden state) from the feature (residual) and the attention `[R, T, Hq*D]`."""
        x = feat + self.o_proj(att)
        return x + self.mlp(self.post_attention_layernorm(x))

    def __call__(self, emb, feat, cos, sin):  # parameter init only
        q, k, v = self.qkv(emb, feat, cos, sin)
        R, T = emb.shape[:2]
        mask = jnp.tril(jnp.ones((T, T), bool))[None].repeat(R, 0)
        return self.out(feat, attend(q, [Part(k, v, mask)], self.config.jnp_dtype))


class EagleNet(nn.Module):
    """The EAGLE-3 drafter's own weights: `fc`, `midlayer`, `norm`, `lm_head` (module docstring)."""

    config: EagleConfig
    init_std: float = 0.02

    def setup(self):
        c = self.config.model
        dt = c.jnp_dtype
        self.fc = _linear(c.hidden_size, "fc", dt, self.init_std)
        self.midlayer = EagleLayer(c, self.init_std)
        self.norm = RMSNorm(c.rms_norm_eps, dt)
        self.lm_head = self.param("lm_head", nn.initializers.normal(self.init_std),
                                  (self.config.head_size, c.hidden_size), dt)

    def rope(self, positions):
        c = self.config.model
        return rope_tables(positions, inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))

    def fuse(self, hidden):
        """Fused features `[R, T, H]` of the target's concatenated hidden states `[R, T, 3H]`."""
        return self.fc(hidden.astype(self.config.model.jnp_dtype))

    def kv(self, emb, feat, positions):
        return self.midlayer.kv(emb, feat, *self.rope(positions))

    def qkv(self, emb, feat, positions):
        return self.midlayer.qkv(emb, feat, *self.rope(positions))

    def out(self, feat, att):
        return self.midlayer.out(feat, att)

    def logits(self, a):
        """float32 logits over the head's V′ tokens of the layer's outputs `a [..., H]` (after the final norm)."""
        h = self.norm(a)
        return jnp.einsum("...d,vd->...v", h, self.lm_head.astype(h.dtype), preferred_element_type=jnp.float32)

    def __call__(self, hidden, emb, positions):  # parameter init only
        f = self.fuse(hidden)
        return self.logits(self.midlayer(emb, f, *self.rope(positions)))


def _net_apply(config: EagleConfig, net_params, method, *args):
    return EagleNet(config).apply({"params": net_params}, *args, method=method)


def head_logits(config: EagleConfig, net_params, a):
    """float32 logits `[..., V′]` of the layer's outputs `a [..., H]` (final norm, then the draft-vocabulary head)."""
    return _net_apply(config, net_params, EagleNet.logits, a)


def _embed(params, tokens, dt):
    return jnp.take(params["embed"], tokens, axis=0).astype(dt)


def eagle_unroll_logits(config: EagleConfig, net_params, embed, tokens, hidden, steps: int):
    """Logits `[steps, B, T−1, V′]` of the training-time-test unroll (`eagle_unroll_outputs`)."""
    a = eagle_unroll_outputs(config, net_params, embed, tokens, hidden, steps)
    return _net_apply(config, net_params, EagleNet.logits, a)


def eagle_unroll_outputs(config: EagleConfig, net_params, embed, tokens, hidden, steps: int):
    """The training-time-test unroll (EAGLE-3 "training-time test"; HASS's multi-step alignment), cache-free: the
    layer's outputs `[steps, B, T−1, H]` (before the final norm and head) for rows s = 1..T−1 of `tokens [B, T]` with
    the target's hidden states `hidden [B, T, 3H]` (`eagle_unroll_at` with every row at every step)."""
    return jnp.stack(eagle_unroll_at(config, net_params, embed, tokens, hidden, steps))


def eagle_unroll_at(config: EagleConfig, net_params, embed, tokens, hidden, steps: int, rows=None):
    """The training-time-test unroll, cache-free: a list of the layer's outputs per step, `[B, T−1, H]` at step 1
    (rows s = 1..T−1 of `tokens [B, T]`, with the target's hidden states `hidden [B, T, 3H]`) and `[B, A, H]` at steps
    2..K for the rows s = `rows [B, A]` (None: every row, A = T−1).

    Iteration 0, row s: the pair (g_{s−1}, e(x_s)) at position s, causal over the pairs 1..s; it predicts x_{s+1}.
    Iteration i >= 1, row s: the pair (a^{i−1}_s, e(x_{s+i})) at position s + i, where a^{i−1}_s is row s's output
    of iteration i−1 (the drafter's own feature), attending to the pairs 1..s of iteration 0 and to row s's own pairs
    of iterations 1..i; it predicts x_{s+i+1}. That is what `EagleDrafter.propose`'s step i + 1 computes after a
    committed length s with x_{s+1..s+i} drafted, so training sees exactly what decoding runs. A row's later
    iterations depend on the other rows only through iteration 0's keys, so steps 2..K can run on a subset of rows
    (training's cost is mostly the head over every row at every step). Rows whose tokens run past T (s + i > T − 1)
    read token 0: their outputs are meaningless and a loss must mask them."""
    c = config.model
    dt = c.jnp_dtype
    B, T = tokens.shape
    S = T - 1
    hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    g = hq // hk
    scale = hd ** -0.5
    f = _net_apply(config, net_params, EagleNet.fuse, hidden)
    all_rows = jnp.broadcast_to(jnp.arange(1, T, dtype=jnp.int32), (B, S))
    rows = all_rows if rows is None else jnp.asarray(rows, jnp.int32)
    emb = lambda pos: jnp.take(embed, jnp.take_along_axis(tokens, jnp.minimum(pos, T - 1), axis=1) * (pos < T),  # noqa: E731
                               axis=0).astype(dt)

    # iteration 0: every row, causal
    q, k0, v0 = _net_apply(config, net_params, EagleNet.qkv, emb(all_rows), f[:, :-1], all_rows)
    att = attend(q, [Part(k0, v0, jnp.broadcast_to(jnp.tril(jnp.ones((S, S), bool)), (B, S, S)))], dt)
    a = _net_apply(config, net_params, EagleNet.out, f[:, :-1], att)
    outs = [a]
    if steps == 1:
        return outs
    feat = jnp.take_along_axis(a, (rows - 1)[:, :, None], axis=1)  # [B, A, H]
    A = rows.shape[1]
    ctx = jnp.arange(S)[None, None, :] <= (rows - 1)[:, :, None]  # [B, A, S]: pairs 1..s of iteration 0
    diag_k, diag_v = [], []
    for i in range(1, steps):
        q, k, v = _net_apply(config, net_params, EagleNet.qkv, emb(rows + i), feat, rows + i)
        diag_k.append(k)
        diag_v.append(v)
        qg = q.reshape(B, A, hk, g, hd)
        s0 = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k0, preferred_element_type=jnp.float32) * scale
        s0 = jnp.where(ctx[:, None, None], s0, -1e30)
        extra = [jnp.einsum("bqhgd,bqhd->bhgq", qg, kj, preferred_element_type=jnp.float32) * scale for kj in diag_k]
        scores = jnp.concatenate([s0] + [e[..., None] for e in extra], axis=-1)  # [B, hk, g, A, S + i]
        p = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhgqk,bkhd->bqhgd", p[..., :S].astype(dt), v0, preferred_element_type=jnp.float32)
        for j, vj in enumerate(diag_v):
            o = o + jnp.transpose(p[..., S + j], (0, 3, 1, 2))[..., None] * vj[:, :, :, None, :].astype(jnp.float32)
        a = _net_apply(config, net_params, EagleNet.out, feat, o.astype(dt).reshape(B, A, hq * hd))
        outs.append(a)
        feat = a
    return outs


@struct.dataclass
class EagleState:
    """The drafter's state: its layer's K/V per slot (`cache`, per-row `lengths`) and the fused target feature of each
    row's last committed position (`feature [R, H]`)."""

    cache: KVCache
    feature: jax.Array

    @property
    def lengths(self):
        return self.cache.lengths

    def set_lengths(self, lengths) -> "EagleState":
        return self.replace(cache=self.cache.set_lengths(lengths))

    def gather(self, index) -> "EagleState":
        index = jnp.asarray(index, jnp.int32)
        return EagleState(self.cache.gather(index), jnp.take(self.feature, index, axis=0))

    def copy_window(self, src, start, width: int) -> "EagleState":
        src = jnp.asarray(src, jnp.int32)
        return EagleState(self.cache.copy_window(src, start, width), jnp.take(self.feature, src, axis=0))

    def repeat(self, n: int) -> "EagleState":
        return EagleState(self.cache.repeat(n), jnp.repeat(self.feature, n, axis=0))


def _slot_positions(cache: KVCache):
    """Position of each own buffer slot `[R, S]` (a shared prefix shifts them by the row's prompt length)."""
    return jnp.asarray(cache.offsets())[..., None] * jnp.ones((cache.batch_size, 1), jnp.int32) + \
        jnp.arange(cache.slots, dtype=jnp.int32)[None, :]


def _write(cache: KVCache, k, v, positions) -> KVCache:
    """K/V `[R, T, Hkv, D]` written at `positions [R, T]` (with a shared prefix: at positions − prompt length;
    positions inside the prompt, or past the buffer, are dropped)."""
    slots = positions - (jnp.asarray(cache.offsets())[:, None] if cache.prefix is not None else 0)
    slots = jnp.where(slots < 0, jnp.iinfo(jnp.int32).max, slots)
    rows = jnp.arange(positions.shape[0])[:, None]
    return cache.replace(k=cache.k.at[0, rows, slots].set(k.astype(cache.k.dtype), mode="drop"),
                         v=cache.v.at[0, rows, slots].set(v.astype(cache.v.dtype), mode="drop"))


def _parts(cache: KVCache, own_mask):
    """Attention parts over the drafter's slots: its own buffer with `own_mask [R, T, S]`, and the prompt's shared
    prefix (if any) with slot 0 left out."""
    parts = [Part(cache.k[0], cache.v[0], own_mask)]
    if cache.prefix is not None:
        pre = cache.prefix
        idx = jnp.arange(pre.width)[None, :]
        parts.insert(0, Part(pre.k[0], pre.v[0], (idx >= 1) & (idx < pre.lengths[:, None]), pre.group))
    return parts


@dataclasses.dataclass(frozen=True, init=False)
class EagleDrafter(Drafter):
    """EAGLE-3 drafter. `EagleDrafter(config, params, vocab)`; `.bind(target)` (what `decode` does) attaches the
    target's token embedding. Build one with `EagleDrafter.create(target, ...)` or `EagleDrafter.load(path)` (an EAGLE /
    SpecForge checkpoint directory, or one `save` wrote).

    vocab: the `DraftVocab` the head drafts over (None: the full vocabulary). smc_floor: ε of the floor mixture `smc`
    proposes from when the vocabulary is reduced (q = (1 − ε)·q′ + ε/V; 0 makes smc refuse this drafter). floor: the
    ε in use (0 for the exact methods; `importance_proposal()` sets it to smc_floor)."""

    eagle_config: EagleConfig
    params: Any = dataclasses.field(compare=False, hash=False, repr=False)
    vocab: DraftVocab | None = dataclasses.field(compare=False, hash=False, repr=False)
    shared: Any = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="eagle")
    smc_floor: float = 0.02
    floor: float = 0.0

    kind = "eagle"
    shares_prefix = True
    supports_mesh = False

    def __init__(self, eagle_config: EagleConfig, params=None, vocab: DraftVocab | None = None, shared=None,
                 name: str = "eagle", smc_floor: float = 0.02, floor: float = 0.0):
        if not isinstance(eagle_config, EagleConfig):
            raise TypeError(f"EagleDrafter takes an EagleConfig, got {type(eagle_config).__name__}")
        if vocab is not None and not isinstance(vocab, DraftVocab):
            raise TypeError(f"vocab must be a smcsd.drafters.DraftVocab or None (the full vocabulary), got "
                            f"{type(vocab).__name__}")
        want = eagle_config.draft_vocab_size
        if (vocab is None) != (want is None) or (vocab is not None and len(vocab) != want):
            raise ValueError(f"the draft vocabulary ({'full' if vocab is None else len(vocab)}) does not match the "
                             f"config's draft_vocab_size ({'full' if want is None else want})")
        if vocab is not None and vocab.vocab_size != eagle_config.model.vocab_size:
            raise ValueError(f"the draft vocabulary is over {vocab.vocab_size} target ids, the drafter's vocab_size "
                             f"is {eagle_config.model.vocab_size}")
        for field, value in (("smc_floor", smc_floor), ("floor", floor)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{field} must be a number in [0, 1) (the uniform floor's share of q), got {value!r}")
        for k, v in (("eagle_config", eagle_config), ("params", params), ("vocab", vocab), ("shared", shared),
                     ("name", name), ("smc_floor", float(smc_floor)), ("floor", float(floor))):
            object.__setattr__(self, k, v)

    def __repr__(self):
        c = self.eagle_config
        return (f"EagleDrafter({self.name!r}, hidden={c.model.hidden_size}, target_layers={c.target_layers}, "
                f"draft_vocab={'full' if c.draft_vocab_size is None else c.draft_vocab_size})")

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, target, *, draft_vocab: DraftVocab | None = None, target_layers: Sequence[int] | None = None,
               seed: int = 0, init_std: float = 0.02, from_target: bool = True, intermediate_size: int | None = None,
               smc_floor: float = 0.02, name: str = "eagle") -> "EagleDrafter":
        """A new drafter for `target` (a `models.LanguageModel`), bound to it.

        draft_vocab: a `DraftVocab` (e.g. `DraftVocab.from_counts(corpus.answer_frequencies(V), 16384,
        required_ids=stop_ids_of(target))`), or None for the full vocabulary. target_layers: the three feature layers
        (default `default_target_layers`). from_target: initialise, where shapes allow, from the target: the decoder
        layer from its last layer (the feature half of q/k/v, o_proj, MLP, post-attention norm; hidden_norm from its
        input norm; input_layernorm from its first layer's), `fc` as the identity on the high layer, `norm` from its
        final norm, `lm_head` from its LM head's rows of the kept tokens. The rest (the embedding half of q/k/v) is
        normal(init_std)."""
        tc = target.config
        layers = check_hidden_layers(default_target_layers(tc.num_hidden_layers) if target_layers is None
                                     else target_layers, tc.num_hidden_layers, "EagleDrafter")
        if len(layers) != 3:
            raise ValueError(f"target_layers must name three target layers (low, middle, high), got {layers}")
        if draft_vocab is not None and not isinstance(draft_vocab, DraftVocab):
            raise TypeError(f"draft_vocab must be a DraftVocab or None, got {type(draft_vocab).__name__}")
        model = dataclasses.replace(tc, num_hidden_layers=1, qk_norm=False,
                                    intermediate_size=intermediate_size or tc.intermediate_size)
        config = EagleConfig(model, layers, None if draft_vocab is None else len(draft_vocab))
        params = cls._init_params(config, seed, init_std)
        if from_target:
            params = _from_target(config, params, target, draft_vocab)
        return cls(config, params, draft_vocab, name=name, smc_floor=smc_floor).bind(target)

    @staticmethod
    def _init_params(config: EagleConfig, seed: int, init_std: float):
        return _init_program(config, float(init_std))(jax.random.PRNGKey(seed))

    @property
    def num_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(self.params)))

    def astype(self, dtype: str) -> "EagleDrafter":
        config = dataclasses.replace(self.eagle_config, model=dataclasses.replace(self.eagle_config.model, dtype=dtype))
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, config.model.jnp_dtype), self.params)
        shared = None if self.shared is None else {k: jnp.asarray(v, config.model.jnp_dtype)
                                                   for k, v in self.shared.items()}
        return dataclasses.replace(self, eagle_config=config, params=params, shared=shared)

    def with_params(self, params) -> "EagleDrafter":
        """This drafter with other network weights (e.g. trained ones)."""
        return dataclasses.replace(self, params=params)

    def with_draft_vocab(self, vocab: DraftVocab) -> "EagleDrafter":
        """This drafter over a smaller draft vocabulary inside its own (e.g. `drafter.vocab.top(counts, 8192,
        required_ids=stop_ids_of(target))`): the head keeps the rows of `vocab`'s tokens, nothing is retrained.
        A drafter step's cost falls with V′ (the head is most of it, `experiments/bench/draft_vocab_cost.py`); its
        proposals lose the mass of the dropped tokens. Exactness is unaffected (q = 0 outside the kept tokens)."""
        if not isinstance(vocab, DraftVocab):
            raise TypeError(f"vocab must be a smcsd.drafters.DraftVocab, got {type(vocab).__name__}")
        if self.params is None:
            raise ValueError("this EagleDrafter has no params to cut")
        V = self.eagle_config.model.vocab_size
        if vocab.vocab_size != V:
            raise ValueError(f"vocab is over {vocab.vocab_size} target ids, this drafter's target has {V}")
        old = np.arange(V, dtype=np.int32) if self.vocab is None else self.vocab.target_to_draft
        rows = old[vocab.draft_to_target]
        if np.any(rows < 0):
            raise ValueError(f"vocab keeps {int(np.sum(rows < 0))} tokens this drafter's head has no row for (e.g. "
                             f"{vocab.draft_to_target[rows < 0][:5].tolist()}): cut from its own vocabulary "
                             "(drafter.vocab.top(counts, size))")
        params = dict(self.params)
        params["lm_head"] = jnp.take(jnp.asarray(params["lm_head"]), jnp.asarray(rows), axis=0)
        config = dataclasses.replace(self.eagle_config, draft_vocab_size=len(vocab))
        return dataclasses.replace(self, eagle_config=config, params=params, vocab=vocab)

    # ------------------------------------------------------------------ checkpoints (EAGLE / SpecForge layout)
    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        """`config.json` (LlamaForCausalLMEagle3, with `draft_vocab_size` and `eagle_config.
        eagle_aux_hidden_state_layer_ids`) + `model.safetensors` with the EAGLE / SpecForge tensor names (`fc.weight`,
        `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; the target's embedding is not stored) in `dtype`
        (float32 or bfloat16) + `training.json` (`info`, if given)."""
        from safetensors.numpy import save_file
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        if self.params is None:
            raise ValueError("this EagleDrafter has no params to save")
        os.makedirs(path, exist_ok=True)
        tensors = to_eagle_tensors(self.params)
        if dtype == "bfloat16":
            import ml_dtypes
            tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
        V = self.eagle_config.model.vocab_size
        if self.vocab is None:
            d2t, t2d = np.zeros((V,), np.int64), np.ones((V,), bool)
        else:
            d2t, t2d = self.vocab.to_eagle()
        tensors.update(d2t=d2t, t2d=t2d)
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        os.chmod(os.path.join(path, "model.safetensors"), 0o644)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(eagle_hf_config(self.eagle_config, dtype, self.smc_floor), f, indent=2)
        if info is not None:
            with open(os.path.join(path, "training.json"), "w") as f:
                json.dump(info, f, indent=2)

    @classmethod
    def load(cls, path: str, dtype: str | None = None, name: str | None = None,
             target_layers: Sequence[int] | None = None) -> "EagleDrafter":
        """An EAGLE-3 drafter from a checkpoint directory in the EAGLE / SpecForge layout (`config.json` with
        `draft_vocab_size`, `model.safetensors` with `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`,
        `t2d`; an `embed_tokens.weight` there is ignored: the target's is used). Unbound (`decode` binds it).
        dtype: compute dtype (default the config's torch_dtype, float32 for float16). target_layers: override the
        config's `eagle_config.eagle_aux_hidden_state_layer_ids` (default: those, else EAGLE-3's choice at bind)."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"no EAGLE-3 drafter at {path!r} (config.json missing)")
        with open(cfg_path) as f:
            d = json.load(f)
        config = eagle_config_from_hf(d, dtype, target_layers)
        wpath = os.path.join(path, "model.safetensors")
        if not os.path.isfile(wpath):
            raise ValueError(f"no model.safetensors in {path!r}")
        from safetensors.numpy import load_file
        try:
            tensors = load_file(wpath)
        except Exception as e:  # noqa: BLE001 - safetensors raises several kinds on a bad file
            raise ValueError(f"cannot read {wpath}: {type(e).__name__}: {e}") from None
        vocab = None
        if config.draft_vocab_size is not None:
            if "d2t" not in tensors or "t2d" not in tensors:
                raise ValueError(f"{wpath} has draft_vocab_size {config.draft_vocab_size} < vocab_size but no d2t / t2d "
                                 "maps")
            vocab = DraftVocab.from_eagle(tensors["d2t"], tensors["t2d"])
        params = from_eagle_tensors(config, tensors, wpath)
        smc_floor = float(d.get("smcsd", {}).get("smc_floor", 0.02))
        return cls(config, params, vocab, name=name or os.path.basename(os.path.normpath(path)), smc_floor=smc_floor)

    # ------------------------------------------------------------------ host side
    @property
    def hidden_layers(self) -> tuple[int, ...]:
        layers = self.eagle_config.target_layers
        if layers is None:
            raise ValueError("this EagleDrafter does not know its target layers yet: bind it to its target "
                             "(drafter.bind(target)) or pass target_layers")
        return layers

    @property
    def config(self):
        return None  # no mesh sharding rules for an EAGLE drafter's params (decode refuses a mesh)

    @property
    def vocab_size(self) -> int:
        return self.eagle_config.model.vocab_size

    @property
    def dtype(self) -> str:
        return self.eagle_config.model.dtype

    @property
    def max_len(self) -> int:
        return self.eagle_config.model.max_position_embeddings

    @property
    def full_support(self) -> bool:
        """The proposal smc runs covers every token: the full vocabulary, or a floor (`smc_floor` > 0)."""
        return self.vocab is None or self.floor > 0 or self.smc_floor > 0

    def importance_proposal(self) -> "EagleDrafter":
        if self.vocab is None or self.floor > 0 or self.smc_floor <= 0:
            return self
        return dataclasses.replace(self, floor=self.smc_floor)

    def describe(self) -> str:
        v = self.eagle_config.draft_vocab_size
        return f"eagle:{self.name}" + ("" if v is None else f"(V'={v})")

    def bind(self, target) -> "EagleDrafter":
        c, tc = self.eagle_config.model, target.config
        if c.vocab_size != tc.vocab_size:
            raise ValueError(f"EAGLE drafter and target vocabularies differ (drafter vocab_size={c.vocab_size}, "
                             f"target {tc.vocab_size}); an EAGLE drafter is trained for one target")
        if c.hidden_size != tc.hidden_size:
            raise ValueError(f"EAGLE drafter width {c.hidden_size} != target hidden_size {tc.hidden_size}: it reads "
                             "the target's features and embedding, so it must be trained for this target")
        layers = self.eagle_config.target_layers
        layers = default_target_layers(tc.num_hidden_layers) if layers is None else layers
        check_hidden_layers(layers, tc.num_hidden_layers, "this EAGLE drafter")
        if self.params is None:
            raise ValueError("this EagleDrafter has no params; build it with EagleDrafter.create or EagleDrafter.load")
        if self.vocab is not None:
            stops = stop_ids_of(target)
            missing = [i for i in stops if not self.vocab.contains([i])]
            if missing:
                raise ValueError(f"the draft vocabulary misses the target's stop (EOS / end-of-turn) ids {missing}: "
                                 "the drafter could never propose the end of an answer; rebuild it with "
                                 "DraftVocab.from_counts(counts, size, required_ids=stop_ids_of(target))")
        embed = target.params["embed_tokens"]["embedding"]
        config = self.eagle_config if layers == self.eagle_config.target_layers else \
            dataclasses.replace(self.eagle_config, target_layers=layers)
        return dataclasses.replace(self, eagle_config=config, shared={"embed": embed})

    def drafter_params(self):
        if self.shared is None:
            raise ValueError("bind the EAGLE drafter to its target first (drafter.bind(target))")
        out = {"net": self.params, "embed": self.shared["embed"]}
        if self.vocab is not None:
            out["d2t"] = jnp.asarray(self.vocab.draft_to_target, jnp.int32)
        return out

    # ------------------------------------------------------------------ traced
    def _dt(self):
        return self.eagle_config.model.jnp_dtype

    def _net(self, params, method, *args):
        return _net_apply(self.eagle_config, params["net"], method, *args)

    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        c = self.eagle_config.model
        B, Tp = prompt.shape
        f = self._net(params, EagleNet.fuse, target_hidden)  # [B, Tp, H]
        width = Tp if suffix_len is not None else cache_len
        cache = init_cache(1, B, width, c.num_key_value_heads, c.head_dim, c.jnp_dtype)
        if Tp > 1:  # pairs s = 1..Tp-1: (g_{s-1}, x_s)
            positions = jnp.broadcast_to(jnp.arange(1, Tp, dtype=jnp.int32), (B, Tp - 1))
            k, v = self._net(params, EagleNet.kv, _embed(params, prompt[:, 1:], self._dt()), f[:, :-1], positions)
            cache = _write(cache, k, v, positions)
        cache = cache.set_lengths(prompt_len)
        last = jnp.take_along_axis(f, jnp.maximum(prompt_len - 1, 0)[:, None, None], axis=1)[:, 0]
        state = EagleState(cache, last)
        if suffix_len is not None:
            return EagleState(cache.share_prefix(rows_per_prompt, suffix_len), jnp.repeat(last, rows_per_prompt, 0))
        return state.repeat(rows_per_prompt) if rows_per_prompt > 1 else state

    def _step(self, params, cache: KVCache, feat, tok, pos):
        """One drafter call: the pair (feat [R, H], token [R]) written at position pos [R], its query attending to the
        slots 1..pos. Returns (the layer's output a [R, H], cache)."""
        positions = pos[:, None]
        emb = _embed(params, tok[:, None], self._dt())
        q, k, v = self._net(params, EagleNet.qkv, emb, feat[:, None], positions)
        cache = _write(cache, k, v, positions)
        sp = _slot_positions(cache)
        own = ((sp >= 1) & (sp <= pos[:, None]))[:, None, :]
        att = attend(q, _parts(cache, own), self._dt())
        return self._net(params, EagleNet.out, feat[:, None], att)[:, 0], cache

    def _head_logq(self, params, a, sampling, raw=None):
        """(processed log q′ over the head's tokens `[..., V′]`, full-vocabulary log q `[..., V]`) of outputs a (`raw`:
        the head's logits of a, when the caller has them)."""
        lq = process_logits(self._net(params, EagleNet.logits, a) if raw is None else raw, sampling)
        if self.vocab is None:
            return lq, lq
        return lq, floor_mixture(lq, params["d2t"], self.vocab_size, self.floor)

    def _draw(self, params, key, lq_kept):
        """Target ids drawn from the proposal whose kept-token law is `lq_kept` (the floor mixture when floor > 0)."""
        if self.vocab is None:
            return sample(key, lq_kept)
        k_in, k_mix = jax.random.split(key)
        return sample_floor_mixture(k_mix, sample(k_in, lq_kept), params["d2t"], self.vocab_size, self.floor)

    def propose(self, params, state: EagleState, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        """K = `num_tokens` drafter calls: the pending token with the last committed feature, then each drafted token
        with the drafter's own output as its feature."""
        tl = state.lengths + feed_count - 1  # the committed target length: the pending token sits there
        pending = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]

        def step(carry, k):
            cache, feat, tok, pos = carry
            a, cache = self._step(params, cache, feat, tok, pos)
            raw = self._net(params, EagleNet.logits, a)
            lq, logq = self._head_logq(params, a, sampling, raw)
            nxt = self._draw(params, k, lq)
            conf = top1_confidence(raw)
            return (cache, a, nxt, pos + 1), (nxt, logq, conf)

        (cache, _, _, _), (toks, logqs, conf) = jax.lax.scan(step, (state.cache, state.feature, pending, tl),
                                                             jax.random.split(key, num_tokens))
        new = EagleState(cache.set_lengths(tl + num_tokens), state.feature)
        return Proposal(toks.T, jnp.swapaxes(logqs, 0, 1), new, conf.T)

    def propose_tree(self, params, state: EagleState, feed, feed_count, key, sampling, tree) -> TreeProposal:
        """A product tree level by level: one call on the pending token, then one call per level over its nodes, each
        node the pair (its parent's output, its token) at position committed + depth, attending to the committed
        slots and its ancestors' slots (node m sits at slot committed + 1 + m). D = tree.depth calls like a chain."""
        if tree.branches:
            raise ValueError("D²SD branches (tree '+B') need a D2SDDrafter; an EAGLE drafter builds product trees only")
        tl = state.lengths + feed_count - 1
        pending = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        a_root, cache = self._step(params, state.cache, state.feature, pending, tl)
        R, widths = feed.shape[0], tree.level_widths
        anc = jnp.asarray(static_ancestors(tree))  # [Mp, Mp]
        Mp = anc.shape[0]
        offsets = [sum(widths[:d]) for d in range(tree.depth)]
        box = {"cache": cache, "a": a_root[:, None]}  # the outputs of the last level's nodes [R, w, H]
        base = tl + 1

        def level_logq(d, toks):
            if d == 0:
                return self._head_logq(params, box["a"], sampling)[1]
            o, w, b = offsets[d - 1], widths[d - 1], tree.branching[d - 1]
            feat = jnp.repeat(box["a"], b, axis=1)  # node j's parent is node j // b of the level above
            positions = jnp.broadcast_to((tl + d)[:, None], (R, w))
            emb = _embed(params, toks[d - 1], self._dt())
            q, k, v = self._net(params, EagleNet.qkv, emb, feat, positions)
            slots = base[:, None] + jnp.arange(o, o + w, dtype=jnp.int32)[None, :]
            c = _write(box["cache"], k, v, slots)
            sp = _slot_positions(c)  # [R, S]
            ctx = (sp >= 1) & (sp <= tl[:, None])
            rel = sp - base[:, None]
            inside = (rel >= 0) & (rel < Mp)
            vis = jnp.take(anc[o:o + w], jnp.clip(rel, 0, Mp - 1), axis=1)  # [w, R, S]
            own = ctx[:, None, :] | (inside[:, None, :] & jnp.transpose(vis, (1, 0, 2)))
            att = attend(q, _parts(c, own), self._dt())
            a = self._net(params, EagleNet.out, feat, att)
            box["cache"], box["a"] = c, a
            return self._head_logq(params, a, sampling)[1]

        tokens, logq, valid = product_tree(key, tree, level_logq)
        parents, depths = tree.product_layout()
        M = len(parents)
        new = EagleState(box["cache"].set_lengths(tl + tree.depth), state.feature)
        return TreeProposal(tokens, jnp.broadcast_to(jnp.asarray(parents), (R, M)),
                            jnp.broadcast_to(jnp.asarray(depths), (R, M)), logq, valid, new)

    def compact(self, state, start, index, count):
        del start, index, count  # `observe` rewrites the accepted path's pairs from the target's features
        return state

    def observe(self, params, state: EagleState, tokens, target_hidden, start, num_valid):
        """The verified block `tokens [R, T]` at positions start..start+T−1 with the target's hidden states there:
        pairs start+1..start+T−1 get the target's features (slots past the committed length are masked later by the
        lengths the method sets), and the feature of the last committed position (start + num_valid − 1) is kept."""
        f = self._net(params, EagleNet.fuse, target_hidden)  # [R, T, H]
        R, T = tokens.shape
        cache = state.cache
        if T > 1:
            positions = start[:, None] + jnp.arange(1, T, dtype=jnp.int32)[None, :]
            k, v = self._net(params, EagleNet.kv, _embed(params, tokens[:, 1:], self._dt()), f[:, :-1], positions)
            cache = _write(cache, k, v, positions)
        last = jnp.take_along_axis(f, jnp.clip(num_valid - 1, 0, T - 1)[:, None, None], axis=1)[:, 0]
        feature = jnp.where((num_valid > 0)[:, None], last.astype(state.feature.dtype), state.feature)
        return EagleState(cache, feature)


# ----------------------------------------------------------------------------------------------- init from target

@functools.lru_cache(maxsize=16)
def _init_program(config: EagleConfig, init_std: float):
    """jit(key) -> fresh `EagleNet` params (one compiled program instead of many small eager ones)."""
    c, dt = config.model, config.model.jnp_dtype

    def init(key):
        return EagleNet(config, init_std).init(key, jnp.zeros((1, 2, config.feature_size), dt),
                                               jnp.zeros((1, 2, c.hidden_size), dt), jnp.zeros((1, 2), jnp.int32))["params"]
    return jax.jit(init)


def _from_target(config: EagleConfig, params, target, vocab: DraftVocab | None):
    """`params` with the parts whose shapes allow it taken from the target (see `EagleDrafter.create`)."""
    tc = target.config
    rows = np.arange(tc.vocab_size) if vocab is None else vocab.draft_to_target
    tp = {k: target.params[k] for k in ("layers", "norm", "embed_tokens", "lm_head") if k in target.params}
    return _from_target_program(config, tc)(params, tp, jnp.asarray(rows, jnp.int32))


@functools.lru_cache(maxsize=16)
def _from_target_program(config: EagleConfig, tc: ModelConfig):
    return jax.jit(functools.partial(_from_target_arrays, config, tc))


def _from_target_arrays(config: EagleConfig, tc: ModelConfig, params, tp, rows):
    dt = config.model.jnp_dtype
    H = tc.hidden_size
    layers = tp["layers"]
    pick = (lambda i: layers[i]) if isinstance(layers, (tuple, list)) else \
        (lambda i: jax.tree_util.tree_map(lambda a: a[i], layers))
    last, first = pick(tc.num_hidden_layers - 1), pick(0)
    p = jax.tree_util.tree_map(lambda a: a, params)  # a copy of the dict structure
    mid = dict(p["midlayer"])
    cast = lambda a: jnp.asarray(a, dt)  # noqa: E731
    for name in ("q_proj", "k_proj", "v_proj"):
        proj = dict(mid[name])
        kern = proj["kernel"]  # [2H, out]: rows 0..H-1 read the embedding, H..2H-1 the feature
        proj["kernel"] = kern.at[H:].set(cast(last["self_attn"][name]["kernel"]))
        if "bias" in proj and "bias" in last["self_attn"][name]:
            proj["bias"] = cast(last["self_attn"][name]["bias"])
        mid[name] = proj
    mid["o_proj"] = {k: cast(v) for k, v in last["self_attn"]["o_proj"].items()}
    same = jax.tree_util.tree_structure(mid["mlp"]) == jax.tree_util.tree_structure(last["mlp"]) and all(
        a.shape == b.shape for a, b in zip(jax.tree_util.tree_leaves(mid["mlp"]), jax.tree_util.tree_leaves(last["mlp"])))
    if same:  # not when the drafter's intermediate_size differs from the target's
        mid["mlp"] = jax.tree_util.tree_map(cast, last["mlp"])
    mid["post_attention_layernorm"] = {"weight": cast(last["post_attention_layernorm"]["weight"])}
    mid["hidden_norm"] = {"weight": cast(last["input_layernorm"]["weight"])}
    mid["input_layernorm"] = {"weight": cast(first["input_layernorm"]["weight"])}
    p["midlayer"] = mid
    fc = jnp.zeros((3 * H, H), dt).at[2 * H:].set(jnp.eye(H, dtype=dt))  # fused = the high layer's state
    p["fc"] = {"kernel": fc}
    p["norm"] = {"weight": cast(tp["norm"]["weight"])}
    head = tp["embed_tokens"]["embedding"] if tc.tie_word_embeddings else tp["lm_head"]
    p["lm_head"] = cast(jnp.take(head, rows, axis=0))
    return p


# ----------------------------------------------------------------------------------------------- EAGLE checkpoint I/O

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _flat(params, prefix=()):
    for k, v in params.items():
        if isinstance(v, dict) or hasattr(v, "items"):
            yield from _flat(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def _hf_name(path: tuple) -> tuple[str, bool]:
    """(EAGLE / SpecForge tensor name, whether the array is transposed) of a Flax parameter path."""
    if path == ("lm_head",):
        return "lm_head.weight", False
    *mods, leaf = path
    if len(mods) >= 2 and mods[0] == "midlayer" and mods[1] in _ATTN:
        mods = ["midlayer", "self_attn"] + mods[1:]
    if leaf == "kernel":
        return ".".join(mods) + ".weight", True
    return ".".join(mods) + "." + leaf, False


def to_eagle_tensors(params) -> dict[str, np.ndarray]:
    """float32 numpy tensors of the drafter's weights under the EAGLE / SpecForge names (`[out, in]` matrices)."""
    out = {}
    for path, v in _flat(params):
        name, transpose = _hf_name(path)
        a = np.asarray(v, np.float32)
        out[name] = np.ascontiguousarray(a.T if transpose else a)
    return out


def from_eagle_tensors(config: EagleConfig, tensors: dict, where: str = "the checkpoint"):
    """The Flax params of `config` from EAGLE / SpecForge tensors (extra tensors `d2t`, `t2d`, `embed_tokens.weight`
    are not weights of the network); raises ValueError naming missing or misshapen tensors."""
    expected = jax.eval_shape(lambda: EagleDrafter._init_params(config, 0, 0.02))
    dt = config.model.jnp_dtype
    flat, missing, shapes = {}, [], []
    for path, leaf in _flat(expected):
        name, transpose = _hf_name(path)
        if name not in tensors:
            missing.append(name)
            continue
        a = np.asarray(tensors[name], np.float32)
        a = a.T if transpose else a
        if a.shape != leaf.shape:
            shapes.append(f"{name}: {tuple(np.asarray(tensors[name]).shape)}, expected "
                          f"{leaf.shape[::-1] if transpose else leaf.shape}")
            continue
        flat[path] = jnp.asarray(a, dt)
    if missing or shapes:
        raise ValueError(f"{where} does not hold an EAGLE-3 drafter of its config: "
                         + (f"missing tensors {missing[:8]}" if missing else "")
                         + ("; " if missing and shapes else "") + (f"shapes differ: {shapes[:4]}" if shapes else ""))
    known = {_hf_name(p)[0] for p, _ in _flat(expected)} | {"d2t", "t2d", "embed_tokens.weight"}
    extra = sorted(set(tensors) - known)
    if extra:
        raise ValueError(f"{where} has tensors this EAGLE-3 drafter does not know: {extra[:8]} (fc_norm or several "
                         "layers are not supported)")
    tree: dict = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


def eagle_hf_config(config: EagleConfig, dtype: str = "float32", smc_floor: float = 0.02) -> dict:
    """The `config.json` of an EAGLE-3 checkpoint (LlamaForCausalLMEagle3) for `config`."""
    m = config.model
    d = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
         "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_key_value_heads,
         "head_dim": m.head_dim, "num_hidden_layers": 1, "max_position_embeddings": m.max_position_embeddings,
         "rms_norm_eps": m.rms_norm_eps, "rope_theta": m.rope_theta,
         "rope_scaling": None if m.rope_scaling is None else dict(m.rope_scaling),
         "attention_bias": m.attention_bias, "tie_word_embeddings": False, "vocab_size": m.vocab_size,
         "draft_vocab_size": config.head_size, "target_hidden_size": m.hidden_size, "torch_dtype": dtype,
         "bos_token_id": m.bos_token_id, "eos_token_id": m.eos_token_id, "pad_token_id": m.pad_token_id,
         "smcsd": {"drafter": "eagle", "smc_floor": smc_floor}}
    if config.target_layers is not None:
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.target_layers),
                             "use_aux_hidden_state": True}
    return d


def eagle_config_from_hf(d: dict, dtype: str | None = None, target_layers=None) -> EagleConfig:
    """An `EagleConfig` from an EAGLE-3 `config.json` dict (raises ValueError on what this drafter cannot run)."""
    arch = d.get("architectures") or []
    if arch and not any("Eagle3" in a or "Eagle" in a for a in arch):
        raise ValueError(f"config.json describes {arch}, not an EAGLE-3 drafter ({ARCHITECTURE})")
    for key in ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size"):
        if key not in d:
            raise ValueError(f"EAGLE-3 config.json lacks {key!r}")
    if int(d.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"this EAGLE-3 drafter has num_hidden_layers={d['num_hidden_layers']}; only 1 is supported")
    if d.get("fc_norm"):
        raise ValueError("EAGLE-3 drafters with fc_norm are not supported")
    th = d.get("target_hidden_size")
    if th is not None and int(th) != int(d["hidden_size"]):
        raise ValueError(f"target_hidden_size {th} != hidden_size {d['hidden_size']}: a drafter narrower than its "
                         "target is not supported (it shares the target's embedding)")
    if dtype is None:
        dtype = d.get("torch_dtype") if d.get("torch_dtype") in ("float32", "bfloat16") else "float32"
    fields = {k: d[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta",
                                "rope_scaling", "rms_norm_eps", "attention_bias", "bos_token_id", "eos_token_id",
                                "pad_token_id") if d.get(k) is not None}
    if isinstance(fields.get("eos_token_id"), (list, tuple)):
        fields["eos_token_id"] = fields["eos_token_id"][0]
    model = ModelConfig(num_hidden_layers=1, dtype=dtype, tie_word_embeddings=False, **fields)
    if target_layers is None:
        target_layers = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    dv = int(d.get("draft_vocab_size", model.vocab_size))
    return EagleConfig(model, None if target_layers is None else tuple(target_layers),
                       None if dv == model.vocab_size else dv)
