"""`DFlashDrafter` (DFlash, arXiv 2602.06036): a whole block of drafts from one forward pass, conditioned on the
target's own hidden states.

The network (`BlockNet`, Flax) is a few decoder layers at the target's width that share the target's token
embedding and LM head (frozen, never stored with the drafter):
- context: the target's hidden states at the layers `target_layers` (concatenated) -> linear (no bias) ->
  RMSNorm; each drafter layer projects this feature with its own k/v projections (RoPE at the token's position)
  into the drafter's own KV cache. Context slots hold target features only, never drafted tokens.
- block: [anchor, MASK x (B-1)] at positions anchor_pos .. anchor_pos+B-1 (the anchor is the pending token,
  which the target has not processed yet; MASK is a learned embedding). Queries attend to every context slot
  before the anchor and, bidirectionally, to the whole block. Position k (1 <= k < B) predicts the token at
  anchor_pos + k. The block always has B positions (what training saw); K <= B-1 of them are used.

Decoding (`Drafter` contract, smcsd/drafters/base.py): `propose` is one forward whatever K; each x_k is drawn
independently from its position's processed distribution q_k, so the joint proposal factorises and the
per-position rejection test of `sd` / `sd-multi` stays exact; `smc` weights with the same q_k. `observe` writes
the context K/V of the verified positions from the hidden states the verification call returned (no second
target pass). Length bookkeeping mirrors `ARDrafter` (after `propose` the state is as long as if the fed tokens
and x_1..x_{K-1} had been consumed), so every method's rollback arithmetic applies unchanged; the context the
block sees is `lengths + feed_count - 1` slots, the committed target length.

Training (`block_logits` over many anchors of a teacher-forced sequence in one pass) lives with the losses in
`smcsd/train/`; `reference_logits` is the cache-free form of a single proposal, used to check decoding.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import KVCache, ModelConfig, init_cache
from smcsd.models.rope import apply_rope, inverse_frequencies, rope_tables
from smcsd.models.transformer import MLP, Part, RMSNorm, dense, attend

from ..sampling import process_logits, sample
from .base import Drafter, Proposal, TreeProposal, check_hidden_layers
from .tree import product_tree



def default_target_layers(num_target_layers: int, count: int = 5) -> tuple[int, ...]:
    """`count` target layers spread from layer 1 to L-3 (DFlash's choice), fewer on shallow targets."""
    L = int(num_target_layers)
    lo, hi = (1, L - 3) if L >= 5 else (0, L - 1)
    count = max(1, min(count, hi - lo + 1))
    return tuple(int(round(x)) for x in np.linspace(lo, hi, count))


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """Static shape of a block drafter: `model` gives its decoder layers' dimensions (hidden size and vocabulary
    are the target's; `num_hidden_layers` is the drafter's depth), `target_layers` the target layers whose hidden
    states form its context, `block_size` B (one anchor + B-1 masks)."""

    model: ModelConfig
    target_layers: tuple[int, ...]
    block_size: int = 16

    def __post_init__(self):
        object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"block_size must be an int >= 2 (an anchor and at least one mask), got {self.block_size!r}")
        if not self.target_layers:
            raise ValueError("target_layers must name at least one target layer")

    @property
    def context_size(self) -> int:
        return len(self.target_layers) * self.model.hidden_size

    def to_dict(self) -> dict:
        return {"model": dataclasses.asdict(self.model), "target_layers": list(self.target_layers),
                "block_size": self.block_size}

    @classmethod
    def from_dict(cls, d: dict) -> "DFlashConfig":
        return cls(model=ModelConfig(**d["model"]), target_layers=tuple(d["target_layers"]),
                   block_size=int(d["block_size"]))


class BlockLayer(nn.Module):
    """Pre-norm decoder layer whose attention reads the context K/V (projected target features) and the block."""

    config: ModelConfig
    init_std: float

    def setup(self):
        c, dt, std = self.config, self.config.jnp_dtype, self.init_std
        hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = dense(hq * hd, "q_proj", dt, std, c.attention_bias)
        self.k_proj = dense(hk * hd, "k_proj", dt, std, c.attention_bias)
        self.v_proj = dense(hk * hd, "v_proj", dt, std, c.attention_bias)
        self.o_proj = dense(c.hidden_size, "o_proj", dt, std)
        self.input_layernorm = RMSNorm(c.rms_norm_eps, dt)
        self.post_attention_layernorm = RMSNorm(c.rms_norm_eps, dt)
        self.mlp = MLP(c, std)

    def kv(self, x, cos, sin):
        """Keys (roped) and values `[R, T, Hkv, D]` of features `x [R, T, H]`."""
        c = self.config
        R, T, _ = x.shape
        k = self.k_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).reshape(R, T, c.num_key_value_heads, c.head_dim)
        return apply_rope(k, cos, sin), v

    def __call__(self, x, cos, sin, ctx: Sequence[Part], blk_mask):
        """`ctx`: the context's key/value parts (`models.transformer.Part`: the drafter's own cache, and the
        prompt's shared prefix when its rows share one); `blk_mask [R, T, T]` within the block."""
        c, dt = self.config, self.config.jnp_dtype
        R, T, _ = x.shape
        h = self.input_layernorm(x)
        q = apply_rope(self.q_proj(h).reshape(R, T, c.num_attention_heads, c.head_dim), cos, sin)
        k, v = self.kv(h, cos, sin)
        a = attend(q, list(ctx) + [Part(k, v, blk_mask)], dt)  # one softmax over context and block
        x = x + self.o_proj(a)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockNet(nn.Module):
    """The block drafter's own weights: context projection, mask embedding, decoder layers, final norm."""

    config: DFlashConfig
    init_std: float = 0.02

    def setup(self):
        c = self.config.model
        dt = c.jnp_dtype
        self.fc = dense(c.hidden_size, "fc", dt, self.init_std)
        self.context_norm = RMSNorm(c.rms_norm_eps, dt)
        self.mask_embedding = self.param("mask_embedding", nn.initializers.normal(self.init_std), (c.hidden_size,), dt)
        self.layers = [BlockLayer(c, self.init_std, name=f"layers_{i}") for i in range(c.num_hidden_layers)]
        self.norm = RMSNorm(c.rms_norm_eps, dt)

    def _rope(self, positions):
        c = self.config.model
        return rope_tables(positions, inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))

    def context_kv(self, hidden, positions):
        """Per drafter layer `(k, v) [R, T, Hkv, D]` of target hidden states `hidden [R, T, n*H]` at `positions`."""
        f = self.context_norm(self.fc(hidden.astype(self.config.model.jnp_dtype)))
        cos, sin = self._rope(positions)
        return [layer.kv(f, cos, sin) for layer in self.layers]

    def block_hidden(self, x, positions, ctx, blk_mask):
        """Final-normed hidden states of block inputs `x [R, T, H]` at `positions [R, T]`; `ctx` per layer a list
        of context `Part`s, `blk_mask [R, T, T]`."""
        cos, sin = self._rope(positions)
        for layer, parts in zip(self.layers, ctx):
            x = layer(x, cos, sin, parts, blk_mask)
        return self.norm(x)

    def __call__(self, hidden, positions, x, block_positions, ctx_mask, blk_mask):
        """Context (`ctx_mask [R, T, S]`) and block in one call (training, the reference, parameter init)."""
        ctx = [[Part(k, v, ctx_mask)] for k, v in self.context_kv(hidden, positions)]
        return self.block_hidden(x, block_positions, ctx, blk_mask)


def head_params(target) -> dict:
    """The target's token embedding and LM head (the same array when tied): what a block drafter shares."""
    p, c = target.params, target.config
    embed = p["embed_tokens"]["embedding"]
    return {"embed": embed, "head": embed if c.tie_word_embeddings else p["lm_head"]}


def embed_block(net_params, shared, anchors, block_size: int, dt, prefix=None, prefix_len=None):
    """Block inputs `[R, B, H]`: the anchor token's embedding, then the mask embedding B-1 times.

    With `prefix [R, B-1]` and `prefix_len [R]` (a variable-prefix drafter, D²SD) block positions 1..prefix_len[r]
    hold the embeddings of the given tokens `prefix[r, :prefix_len[r]]` instead of the mask."""
    a = jnp.take(shared["embed"], anchors, axis=0).astype(dt)[:, None, :]
    m = jnp.broadcast_to(net_params["mask_embedding"].astype(dt), (anchors.shape[0], block_size - 1, a.shape[-1]))
    if prefix is not None:  # [R, <= B-1]: tokens past its width are never shown
        prefix = jnp.pad(prefix, ((0, 0), (0, block_size - 1 - prefix.shape[1])))
        given = jnp.arange(1, block_size)[None, :] <= prefix_len[:, None]  # [R, B-1]
        m = jnp.where(given[..., None], jnp.take(shared["embed"], prefix, axis=0).astype(dt), m)
    return jnp.concatenate([a, m], axis=1)


def shared_head_logits(h, shared):
    return jnp.einsum("rtd,vd->rtv", h, shared["head"].astype(h.dtype), preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True, init=False)
class DFlashDrafter(Drafter):
    """DFlash block drafter. `DFlashDrafter(config, params)`; `.bind(target)` (what `decode` does) attaches the
    target's embedding and LM head. Build one with `DFlashDrafter.create(target, ...)` or `DFlashDrafter.load(path)`."""

    block_config: DFlashConfig
    params: dict | None = dataclasses.field(compare=False, hash=False, repr=False)
    shared: dict | None = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="dflash")

    kind = "dflash"
    shares_prefix = True
    # what a subclass (another block-style network, e.g. SpecBlock) swaps: its config class, Flax network and the
    # "drafter" tag of its config.json
    _config_cls = DFlashConfig
    _net_cls = BlockNet
    _format = "dflash"

    def __init__(self, config: DFlashConfig, params=None, shared=None, name: str = "dflash"):
        if not isinstance(config, self._config_cls):
            raise TypeError(f"{type(self).__name__} takes a {self._config_cls.__name__}, got {type(config).__name__}")
        object.__setattr__(self, "block_config", config)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "shared", shared)
        object.__setattr__(self, "name", name)

    def __repr__(self):
        c = self.block_config
        return (f"DFlashDrafter({self.name!r}, layers={c.model.num_hidden_layers}, hidden={c.model.hidden_size}, "
                f"block_size={c.block_size}, target_layers={c.target_layers})")

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, target, *, num_layers: int = 1, block_size: int = 16, target_layers: Sequence[int] | None = None,
             intermediate_size: int | None = None, seed: int = 0, init_std: float = 0.02,
             name: str = "dflash") -> "DFlashDrafter":
        """A randomly initialised block drafter for `target` (a `models.LanguageModel`): its width, heads and
        RoPE are the target's; `target_layers` defaults to `default_target_layers`."""
        tc = target.config
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
        layers = check_hidden_layers(default_target_layers(tc.num_hidden_layers) if target_layers is None
                                     else target_layers, tc.num_hidden_layers, "DFlashDrafter")
        model = dataclasses.replace(tc, num_hidden_layers=num_layers,
                                    intermediate_size=intermediate_size or tc.intermediate_size)
        config = cls._config_cls(model=model, target_layers=layers, block_size=block_size)
        return cls(config, cls._init_params(config, seed, init_std), name=name).bind(target)

    @classmethod
    def _init_params(cls, config: DFlashConfig, seed: int, init_std: float):
        model, B = config.model, config.block_size
        dt = model.jnp_dtype
        return cls._net_cls(config, init_std).init(
            jax.random.PRNGKey(seed), jnp.zeros((1, 1, config.context_size), dt), jnp.zeros((1, 1), jnp.int32),
            jnp.zeros((1, B, model.hidden_size), dt), jnp.zeros((1, B), jnp.int32), jnp.ones((1, B, 1), bool),
            jnp.ones((1, B, B), bool))["params"]

    @property
    def num_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(self.params)))

    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        """`config.json` + `model.safetensors` (the drafter's own weights in `dtype`, float32 or bfloat16; the
        shared embedding / LM head are the target's and not stored) + `training.json` (`info`, if given)."""
        from safetensors.numpy import save_file

        from ..models.shipped import flatten_params
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        os.makedirs(path, exist_ok=True)
        flat = {k: np.asarray(v, np.float32) for k, v in flatten_params(self.params).items()}
        if dtype == "bfloat16":
            import ml_dtypes
            flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in flat.items()}
        save_file(flat, os.path.join(path, "model.safetensors"), metadata={"format": f"smcsd-{self._format}"})
        os.chmod(os.path.join(path, "model.safetensors"), 0o644)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"drafter": self._format, **self.block_config.to_dict()}, f, indent=2)
        if info is not None:
            with open(os.path.join(path, "training.json"), "w") as f:
                json.dump(info, f, indent=2)

    @classmethod
    def load(cls, path: str, dtype: str | None = None, name: str | None = None) -> "DFlashDrafter":
        """A block drafter saved by `save` (unbound: `decode` binds it to the target). `dtype` overrides the
        compute dtype (default: the config's, float32)."""
        from smcsd.models.shipped import read_tensors, unflatten
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"no block drafter at {path!r} (config.json missing)")
        with open(cfg_path) as f:
            d = json.load(f)
        if d.get("drafter") != cls._format:
            raise ValueError(f"{cfg_path} is not a {cls._format} drafter's config (it says {d.get('drafter')!r})")
        config = cls._config_cls.from_dict(d)
        if dtype is not None:
            config = dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype))
        tensors = read_tensors(os.path.join(path, "model.safetensors"))
        params = unflatten({k: jnp.asarray(np.asarray(v, np.float32), config.model.jnp_dtype)
                             for k, v in tensors.items()})
        expected = jax.eval_shape(lambda: cls._expected_params(config, params))
        if jax.tree_util.tree_structure(expected) != jax.tree_util.tree_structure(params) or any(
                a.shape != b.shape for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(params))):
            raise ValueError(f"the weights in {path} do not match its config.json (tensor names or shapes differ)")
        return cls(config, params, name=name or os.path.basename(os.path.normpath(path)))

    def _rebuild(self, config=None, params=None, shared=None) -> "DFlashDrafter":
        """This drafter with some of config / params / shared replaced (subclasses carry their extra fields)."""
        return type(self)(self.block_config if config is None else config, self.params if params is None else params,
                          self.shared if shared is None else shared, self.name)

    @classmethod
    def _expected_params(cls, config, loaded):
        """The params a checkpoint of `config` must hold (shapes checked by `load`; `loaded` for optional parts)."""
        del loaded
        return cls._init_params(config, 0, 0.02)

    def astype(self, dtype: str) -> "DFlashDrafter":
        config = dataclasses.replace(self.block_config, model=dataclasses.replace(self.block_config.model, dtype=dtype))
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, config.model.jnp_dtype), self.params)
        return self._rebuild(config=config, params=params)

    # ------------------------------------------------------------------ host side
    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.block_config.target_layers

    @property
    def config(self):
        return None  # no mesh sharding rules for a block drafter's params yet (decode refuses a mesh)

    @property
    def vocab_size(self) -> int:
        return self.block_config.model.vocab_size

    @property
    def dtype(self) -> str:
        return self.block_config.model.dtype

    @property
    def max_len(self) -> int:
        return self.block_config.model.max_position_embeddings

    def describe(self) -> str:
        return f"dflash:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 1

    @property
    def max_tokens_per_proposal(self) -> int:
        return self.block_config.block_size - 1

    supports_mesh = False

    def bind(self, target) -> "DFlashDrafter":
        c, tc = self.block_config.model, target.config
        if c.vocab_size != tc.vocab_size:
            raise ValueError(f"block drafter and target vocabularies differ (drafter vocab_size={c.vocab_size}, "
                             f"target {tc.vocab_size}); a block drafter is trained for one target")
        if c.hidden_size != tc.hidden_size:
            raise ValueError(f"block drafter width {c.hidden_size} != target hidden_size {tc.hidden_size}: it shares "
                             "the target's embedding and LM head, so it must be trained for this target")
        check_hidden_layers(self.block_config.target_layers, tc.num_hidden_layers, "this block drafter")
        if self.params is None:
            raise ValueError(f"this {type(self).__name__} has no params; build it with {type(self).__name__}.create "
                             f"or {type(self).__name__}.load")
        return self._rebuild(shared=head_params(target))

    def drafter_params(self):
        if self.shared is None:
            raise ValueError("bind the block drafter to its target first (drafter.bind(target))")
        return {"net": self.params, **self.shared}

    def _net(self) -> BlockNet:
        return self._net_cls(self.block_config)

    # ------------------------------------------------------------------ traced
    def _context_kv(self, params, hidden, positions):
        return self._net().apply({"params": params["net"]}, hidden, positions, method=BlockNet.context_kv)

    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        c = self.block_config.model
        B, Tp = prompt.shape
        width = Tp if suffix_len is not None else cache_len
        state = init_cache(c.num_hidden_layers, B, width, c.num_key_value_heads, c.head_dim, c.jnp_dtype)
        state = self.write_context(params, state, target_hidden, jnp.zeros((B,), jnp.int32))
        state = state.set_lengths(prompt_len)
        if suffix_len is not None:
            return state.share_prefix(rows_per_prompt, suffix_len)
        return state.repeat(rows_per_prompt) if rows_per_prompt > 1 else state

    def write_context(self, params, state: KVCache, hidden, start) -> KVCache:
        """Context K/V of `hidden [R, T, n*H]` written at positions `start[r] .. start[r]+T-1` (lengths untouched)."""
        T = hidden.shape[1]
        positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
        kv = self._context_kv(params, hidden, positions)
        rows = jnp.arange(hidden.shape[0])[:, None]
        slots = positions - (state.offsets()[:, None] if state.prefix is not None else 0)
        k, v = state.k, state.v
        for i, (k_, v_) in enumerate(kv):  # scatter into the stacked buffers in place (no per-layer copy + stack)
            k = k.at[i, rows, slots].set(k_.astype(k.dtype), mode="drop")
            v = v.at[i, rows, slots].set(v_.astype(v.dtype), mode="drop")
        return state.replace(k=k, v=v)

    def block_logits_at(self, params, state: KVCache, anchors, ctx_len, num_tokens: int, prefix=None, prefix_len=None,
                        repeat: int = 1):
        """Logits `[R, num_tokens, V]` of block positions 1..num_tokens for `anchors [R]` at positions `ctx_len`,
        attending to the first `ctx_len[r]` context slots of `state`.

        A variable-prefix network (D²SD) also takes `prefix [R, B-1]` / `prefix_len [R]`: positions 1..prefix_len
        show those tokens. With `repeat = n` there are n blocks per state row (rows r*n .. r*n+n-1 read state row r,
        `ctx_len` per state row): D²SD's branches re-anchored on one context, read once for all of them."""
        c, B = self.block_config.model, self.block_config.block_size
        R, S = anchors.shape[0], state.slots
        x = embed_block(params["net"], params, anchors, B, c.jnp_dtype, prefix, prefix_len)
        positions = jnp.repeat(ctx_len, repeat)[:, None] + jnp.arange(B, dtype=jnp.int32)[None, :]
        own = ctx_len - state.offsets()  # context slots in the rows' own buffers
        ctx_mask = jnp.arange(S)[None, :] < own[:, None]  # [state rows, S]: the same for every query of a row
        ctx = [[Part(state.k[i], state.v[i], ctx_mask, repeat)] for i in range(c.num_hidden_layers)]
        if state.prefix is not None:  # the prompt's context, stored once per request
            pre = state.prefix
            pmask = jnp.arange(pre.width)[None, :] < pre.lengths[:, None]
            ctx = [[Part(pre.k[i], pre.v[i], pmask, pre.group * repeat)] + parts for i, parts in enumerate(ctx)]
        blk_mask = jnp.ones((R, B, B), bool)
        h = self._net().apply({"params": params["net"]}, x, positions, ctx, blk_mask, method=BlockNet.block_hidden)
        return shared_head_logits(h[:, 1:num_tokens + 1], params)

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        self._check_depth(num_tokens)
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        ctx_len = state.lengths + feed_count - 1
        logq = process_logits(self.block_logits_at(params, state, anchors, ctx_len, num_tokens), sampling)
        tokens = sample(key, logq)
        # as if the fed tokens and x_1..x_{K-1} were consumed (ARDrafter's arithmetic; see the module docstring)
        return Proposal(tokens, logq, state.set_lengths(state.lengths + feed_count + num_tokens - 1))

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        del tokens, num_valid  # slots past the committed length are masked by the lengths the method sets
        return self.write_context(params, state, target_hidden, start)

    def _check_depth(self, num_tokens):
        B = self.block_config.block_size
        if num_tokens > B - 1:
            raise ValueError(f"num_speculative_tokens={num_tokens} exceeds what this block drafter predicts in one "
                             f"pass (block_size - 1 = {B - 1}); use K <= {B - 1}")

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        """A product tree from one block forward: every node at depth d draws its children from the block's
        position-(d+1) distribution (a block position does not depend on the tokens drafted before it, so all
        nodes of a depth share it)."""
        if tree.branches:
            raise ValueError("D²SD branches (tree '+B') need a D2SDDrafter (a variable-prefix network); a plain "
                             "block drafter builds product trees only")
        self._check_depth(tree.depth)
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        logq = process_logits(self.block_logits_at(params, state, anchors, state.lengths + feed_count - 1,
                                                   tree.depth), sampling)  # [R, D, V]
        widths = (1,) + tree.level_widths
        R, V = logq.shape[0], logq.shape[-1]
        tokens, trial, valid = product_tree(
            key, tree, lambda d, _: jnp.broadcast_to(logq[:, d:d + 1], (R, widths[d], V)))
        parents, depths = tree.product_layout()
        M = len(parents)
        return TreeProposal(tokens, jnp.broadcast_to(jnp.asarray(parents), (R, M)),
                            jnp.broadcast_to(jnp.asarray(depths), (R, M)), trial, valid,
                            state.set_lengths(state.lengths + feed_count + tree.depth - 1))

    def compact(self, state, start, index, count):
        del start, index, count  # the state holds target features only, written by observe along the path
        return state


def reference_logits(drafter: DFlashDrafter, target_hidden, anchor_pos: int, anchor_token, num_tokens: int):
    """Cache-free reference of one proposal: logits `[R, num_tokens, V]` of a block anchored at `anchor_pos`
    (the same for every row) with `anchor_token [R]`, from the target's hidden states `target_hidden [R, T, n*H]`
    of positions 0..T-1 (only those before `anchor_pos` are context)."""
    c, B = drafter.block_config.model, drafter.block_config.block_size
    params = drafter.drafter_params()
    R, T, _ = target_hidden.shape
    net = BlockNet(drafter.block_config)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (R, T))
    x = embed_block(params["net"], params, jnp.asarray(anchor_token, jnp.int32), B, c.jnp_dtype)
    bpos = jnp.broadcast_to(anchor_pos + jnp.arange(B, dtype=jnp.int32), (R, B))
    ctx_mask = jnp.broadcast_to((jnp.arange(T) < anchor_pos)[None, None, :], (R, B, T))
    h = net.apply({"params": params["net"]}, target_hidden, pos, x, bpos, ctx_mask, jnp.ones((R, B, B), bool))
    return shared_head_logits(h[:, 1:num_tokens + 1], params)
