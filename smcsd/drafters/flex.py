"""`FlexDrafter` (FlexDraft, arXiv 2605.20022): the target drafts for itself through attention-tuned mask tokens.

Holds what FlexDraft adds to a target: mask-token adapters (own q/k/v/o projections in the last
`adapter_layers` layers, everything else shared and frozen), the mask vector, and the bonus-guided calibration MLP.
It does not propose on its own: method `flex` (smcsd/methods/flex.py) drafts and verifies in one target forward with it.
`FlexDrafter.create(target, adapter_layers=2, group_size=4)` starts from the target's own attention weights;
training (`smcsd.train.train_flex`) fits the adapters and the calibration MLP with the target frozen.

FlexDraft's forward lives here, beside the drafter that holds its weights (the models package knows no decoding
method): the target drafts for itself through mask tokens with their own attention projections in the last few
layers, in the same forward that verifies the previous drafts.

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
import json
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import KVCache, ModelConfig
from smcsd.models.rope import apply_rope, inverse_frequencies, rope_tables
from smcsd.models.transformer import DecoderLayer, Part, attend, layers_unstacked

from .base import Drafter


# ----------------------------------------------------------------------------- the forward

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


# ----------------------------------------------------------------------------- the drafter

MODES = ("parallel", "sequential", "auto")


@dataclasses.dataclass(frozen=True, init=False)
class FlexDrafter(Drafter):
    """FlexDraft's mask adapters for one target (module docstring)."""

    flex_config: FlexConfig
    target_config: ModelConfig
    params: FlexParams | None = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="flex")
    mode: str = "auto"  # "parallel" | "sequential" | "auto" (parallel up to `switch_batch` requests)
    switch_batch: int = 4
    tau: float = 0.0  # confidence cut: verify drafts while their cumulative top-1 probability stays >= tau (0: off)
    token_budget: int | None = None  # sequential mode: drafts verified per call across the batch, packed (None: B·K)

    kind = "flex"
    supports_mesh = False
    only_method = "flex"  # its adapters draft inside the target's own forward (smcsd/methods/flex.py)

    def __init__(self, flex_config: FlexConfig, target_config: ModelConfig, params: FlexParams | None = None,
                 name: str = "flex", mode: str = "auto", switch_batch: int = 4, tau: float = 0.0,
                 token_budget: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(switch_batch, int) or isinstance(switch_batch, bool) or switch_batch < 1:
            raise ValueError(f"switch_batch must be an int >= 1, got {switch_batch!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau < 1:
            raise ValueError(f"tau (the confidence cut) must be in [0, 1), got {tau!r}")
        if token_budget is not None and (not isinstance(token_budget, int) or isinstance(token_budget, bool)
                                         or token_budget < 1):
            raise ValueError(f"token_budget (drafts verified per call across the batch) must be an int >= 1 or None, "
                             f"got {token_budget!r}")
        if token_budget is not None and mode == "parallel":
            raise ValueError("token_budget packs the sequential mode's verify pass; the parallel mode does not pack "
                             "(use mode='sequential' or 'auto', or token_budget=None)")
        object.__setattr__(self, "token_budget", token_budget)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "switch_batch", switch_batch)
        object.__setattr__(self, "tau", float(tau))
        if not isinstance(flex_config, FlexConfig):
            raise TypeError(f"FlexDrafter takes a smcsd.drafters.flex.FlexConfig, got {type(flex_config).__name__}")
        flex_config.check(target_config)
        object.__setattr__(self, "flex_config", flex_config)
        object.__setattr__(self, "target_config", target_config)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "name", name)

    def __repr__(self):
        f = self.flex_config
        return (f"FlexDrafter({self.name!r}, adapter_layers={f.adapter_layers}, group_size={f.group_size}, "
                f"mode={self.mode!r}, tau={self.tau}, token_budget={self.token_budget})")

    @classmethod
    def create(cls, target, *, adapter_layers: int = 2, group_size: int = 4, calib_hidden: int = 256, seed: int = 0,
               std: float = 0.02, name: str = "flex") -> "FlexDrafter":
        fc = FlexConfig(adapter_layers, group_size, calib_hidden)
        return cls(fc, target.config, init_flex_params(target.config, target.params, fc, seed, std), name)

    def with_params(self, params: FlexParams) -> "FlexDrafter":
        return FlexDrafter(self.flex_config, self.target_config, params, self.name, self.mode, self.switch_batch,
                           self.tau, self.token_budget)

    _UNSET = object()

    def with_options(self, mode: str | None = None, switch_batch: int | None = None,
                     tau: float | None = None, token_budget=_UNSET) -> "FlexDrafter":
        """The same adapters run in another mode ("parallel": draft and verify in one forward; "sequential": a
        draft pass, then a verify pass; "auto": parallel up to `switch_batch` requests), with a confidence cut
        `tau` (verify drafts only while the product of their top-1 probabilities stays >= tau), or with a
        `token_budget`: the sequential mode's verify pass then packs the batch's ragged rows into one call of that
        many tokens (the most confident drafts across rows, each row's first draft before any second one; None:
        no packing)."""
        return FlexDrafter(self.flex_config, self.target_config, self.params, self.name,
                           self.mode if mode is None else mode,
                           self.switch_batch if switch_batch is None else switch_batch, self.tau if tau is None else tau,
                           self.token_budget if token_budget is FlexDrafter._UNSET else token_budget)

    def mode_for(self, batch: int) -> str:
        if self.mode != "auto":
            return self.mode
        return "parallel" if batch <= self.switch_batch else "sequential"

    @property
    def num_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(self.params)))

    # ------------------------------------------------------------------ host side
    def bind(self, target) -> "FlexDrafter":
        tc, mine = target.config, self.target_config
        same = dataclasses.replace(tc, dtype=mine.dtype) == mine
        if not same:
            raise ValueError("these FlexDraft adapters were made for another target (model configs differ); train "
                             "adapters for this target (smcsd.train.train_flex) or load the pair's own")
        if self.params is None:
            raise ValueError("this FlexDrafter has no params; build it with FlexDrafter.create or FlexDrafter.load")
        return self

    def drafter_params(self):
        return self.params

    @property
    def vocab_size(self) -> int:
        return self.target_config.vocab_size

    @property
    def max_tokens_per_proposal(self) -> int:
        return self.flex_config.group_size

    def describe(self) -> str:
        return f"flex:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 0  # drafts come out of the target's own verification forward

    def init(self, *args, **kwargs):
        raise ValueError("a FlexDrafter drafts inside the target's forward: use method='flex'")

    # ------------------------------------------------------------------ files
    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        """`config.json` (the FlexConfig and the target's config) + `flex.safetensors` (+ `training.json`)."""
        from safetensors.numpy import save_file

        from ..models.shipped import flatten_params
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        os.makedirs(path, exist_ok=True)
        tree = {"layers": {str(i): p for i, p in enumerate(self.params.layers)},
                "mask_vector": self.params.mask_vector, "calib": self.params.calib}
        flat = {k: np.asarray(v, np.float32) for k, v in flatten_params(tree).items()}
        if dtype == "bfloat16":
            import ml_dtypes
            flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in flat.items()}
        save_file(flat, os.path.join(path, "flex.safetensors"), metadata={"format": "smcsd-flex"})
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"drafter": "flex", "flex": dataclasses.asdict(self.flex_config),
                       "target": self.target_config.to_dict()}, f, indent=2)
        if info is not None:
            with open(os.path.join(path, "training.json"), "w") as f:
                json.dump(info, f, indent=2)

    @classmethod
    def load(cls, path: str, name: str | None = None) -> "FlexDrafter":
        from smcsd.models.shipped import read_tensors, unflatten
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"no FlexDraft adapters at {path!r} (config.json missing)")
        with open(cfg_path) as f:
            d = json.load(f)
        if d.get("drafter") != "flex":
            raise ValueError(f"{cfg_path} is not a FlexDraft adapters' config")
        fc, tc = FlexConfig(**d["flex"]), ModelConfig.from_dict(d["target"])
        t = unflatten({k: jnp.asarray(np.asarray(v, np.float32))
                        for k, v in read_tensors(os.path.join(path, "flex.safetensors")).items()})
        layers = tuple(t["layers"][str(i)] for i in range(fc.adapter_layers))
        return cls(fc, tc, FlexParams(layers, t["mask_vector"], t["calib"]), name or os.path.basename(os.path.normpath(path)))
