"""`PARD2Drafter` (PARD / PARD-2, arXiv 2504.18583, 2605.08632): a small causal LM that drafts K tokens in one
forward by appending K−1 mask tokens to what it has been fed.

propose: one forward over [pending tokens (1–2, the method's feed), MASK × (K−1)] at consecutive positions; the
output at the last pending token gives q_1 and the output at mask j gives q_{j+1} (a mask attends to the context and
to the masks before it, causally, as in training). Each x_k is drawn independently from its own q_k, so the joint
proposal factorises given the context and per-position rejection (`sd`, `sd-multi`) stays exact; `smc` weights with
the same q_k. Only the pending tokens are committed to the drafter's KV cache (its length advances by the feed
count); mask slots past the length are stale. `observe` writes the committed tokens of the verified block (one
more forward over K + 1 tokens), so the cache holds accepted tokens only and the method's rollback arithmetic
(`ARDrafter`'s) applies unchanged.

Dual mode (PARD-2): with `feature_layers`, the target's hidden states at those layers, shifted right by one token
(the token at position t sees the target's state at t − 1) and projected (Linear(n·H_T → H), × 0.02), are added to
the input embeddings of real tokens (masks get none). The drafter keeps the target features it was given per
position (`observe` hands them over from the verification call) so every fed token finds its feature. A drafter
trained with features dropped at random runs with or without them: `use_features=False` is the
target-independent mode (no target hidden states are computed at all).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from smcsd.models import KVCache, LanguageModel, ModelConfig, forward_cached
from smcsd.models.transformer import InputEdits

from ..runtime.engine import prefill
from ..sampling import process_logits, sample
from .base import Drafter, Proposal, TokenHistory, check_hidden_layers

FEATURE_SCALE = 0.02  # PARD-2's scale on the projected target features


@dataclasses.dataclass(frozen=True, init=False)
class PARD2Drafter(Drafter):
    """`PARD2Drafter(model, extra, feature_layers=(), use_features=True)`: `model` a small `LanguageModel` on the
    target's vocabulary, `extra` its PARD params: `mask_embedding [H]` and (dual mode) `feature_proj [n·H_T, H]`."""

    model_config: ModelConfig
    feature_layers: tuple[int, ...]
    use_features: bool
    model: LanguageModel | None = dataclasses.field(compare=False, hash=False, repr=False)
    extra: dict | None = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="pard2")

    kind = "pard2"

    def __init__(self, model: LanguageModel, extra: dict, feature_layers=(), use_features: bool = True,
                 name: str = "pard2"):
        if not isinstance(model, LanguageModel):
            raise TypeError(f"PARD2Drafter wraps a models.LanguageModel, got {type(model).__name__}")
        if not isinstance(extra, dict) or "mask_embedding" not in extra:
            raise ValueError("PARD2Drafter needs extra={'mask_embedding': [H], ...} (PARD2Drafter.create makes one)")
        layers = tuple(int(i) for i in feature_layers)
        if layers and "feature_proj" not in extra:
            raise ValueError("feature_layers are given but extra has no 'feature_proj'")
        object.__setattr__(self, "model_config", model.config)
        object.__setattr__(self, "feature_layers", layers)
        object.__setattr__(self, "use_features", bool(use_features) and bool(layers))
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "extra", extra)
        object.__setattr__(self, "name", name)

    @classmethod
    def create(cls, model: LanguageModel, *, target=None, feature_layers=(), seed: int = 0,
               name: str = "pard2") -> "PARD2Drafter":
        """A mask drafter around `model` (e.g. a pair's AR draft) with a fresh mask embedding; with
        `feature_layers` (and the `target`, for its width) a zero-initialised feature projection (dual mode)."""
        H = model.config.hidden_size
        rng = np.random.default_rng(seed)
        extra = {"mask_embedding": jnp.asarray(rng.normal(0, 0.02, H), model.config.jnp_dtype)}
        if feature_layers:
            if target is None:
                raise ValueError("dual mode (feature_layers) needs the target, for its hidden size")
            check_hidden_layers(feature_layers, target.config.num_hidden_layers, "this mask drafter")
            extra["feature_proj"] = jnp.zeros((len(feature_layers) * target.config.hidden_size, H),
                                              model.config.jnp_dtype)
        return cls(model, extra, feature_layers, True, name)

    def __repr__(self):
        return (f"PARD2Drafter({self.name!r}, {self.model!r}, feature_layers={self.feature_layers}, "
                f"use_features={self.use_features})")

    def with_features(self, on: bool) -> "PARD2Drafter":
        """The same drafter in dual (`on`) or target-independent mode."""
        return PARD2Drafter(self.model, self.extra, self.feature_layers, on, self.name)

    def with_params(self, params: dict) -> "PARD2Drafter":
        """The same drafter with `params` = {"lm": ..., "mask_embedding": ..., ["feature_proj": ...]} (training)."""
        model = dataclasses.replace(self.model, params=params["lm"])
        return PARD2Drafter(model, {k: v for k, v in params.items() if k != "lm"}, self.feature_layers,
                           self.use_features, self.name)

    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        """`config.json` + `model.safetensors` (the small LM, `models.shipped` layout) + `pard2.safetensors` (mask
        embedding, feature projection) + `pard2.json` (feature layers) + `training.json` (`info`)."""
        import json
        import os

        from safetensors.numpy import save_file

        from ..models.shipped import export_model
        export_model(self.model_config, self.model.params, path, dtype, info)
        extra = {k: np.asarray(v, np.float32) for k, v in self.extra.items()}
        if dtype == "bfloat16":
            import ml_dtypes
            extra = {k: v.astype(ml_dtypes.bfloat16) for k, v in extra.items()}
        save_file(extra, os.path.join(path, "pard2.safetensors"), metadata={"format": "smcsd-pard2"})
        with open(os.path.join(path, "pard2.json"), "w") as f:
            json.dump({"drafter": "pard2", "feature_layers": list(self.feature_layers)}, f, indent=2)

    @classmethod
    def load(cls, path: str, dtype: str | None = None, name: str | None = None, tokenizer=None) -> "PARD2Drafter":
        import json
        import os

        from smcsd.models.shipped import read_tensors, load_model_dir
        meta_path = os.path.join(path, "pard2.json")
        if not os.path.isfile(meta_path):
            raise ValueError(f"no mask (pard2) drafter at {path!r} (pard2.json missing)")
        with open(meta_path) as f:
            meta = json.load(f)
        model = load_model_dir(path, name=name or os.path.basename(os.path.normpath(path)))
        if dtype is not None and model.config.dtype != dtype:
            model = model.astype(dtype)
        if tokenizer is not None:
            model = dataclasses.replace(model, tokenizer=tokenizer)
        extra = {k: jnp.asarray(np.asarray(v, np.float32), model.config.jnp_dtype)
                 for k, v in read_tensors(os.path.join(path, "pard2.safetensors")).items()}
        return cls(model, extra, meta.get("feature_layers", ()), True, name or "pard2")

    # ------------------------------------------------------------------ host side
    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.feature_layers if self.use_features else ()

    def drafter_params(self):
        return {"lm": self.model.decode_params(), **self.extra}

    @property
    def config(self):
        return None  # no mesh sharding rules for the extra params yet

    supports_mesh = False

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def max_len(self) -> int:
        return self.model_config.max_position_embeddings

    @property
    def dtype(self) -> str:
        return self.model_config.dtype

    def describe(self) -> str:
        return f"pard2:{self.name}" + ("" if self.use_features else " (no target features)")

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 2  # the masked proposal, and observe's forward over the verified block

    def bind(self, target) -> "PARD2Drafter":
        if self.vocab_size != target.config.vocab_size:
            raise ValueError(f"mask drafter and target vocabularies differ (drafter vocab_size={self.vocab_size}, "
                             f"target {target.config.vocab_size}); they must share one tokenizer")
        if self.use_features:
            check_hidden_layers(self.feature_layers, target.config.num_hidden_layers, "this mask drafter")
            need = len(self.feature_layers) * target.config.hidden_size
            if self.extra["feature_proj"].shape[0] != need:
                raise ValueError(f"this mask drafter's feature projection takes {self.extra['feature_proj'].shape[0]} "
                                 f"features, the target gives {need}: it was trained for another target; use "
                                 "drafter.with_features(False)")
        return self

    # ------------------------------------------------------------------ traced
    def _features(self, params, feats):
        """Projected target features `[R, T, H]` of raw features `[R, T, F]`."""
        return FEATURE_SCALE * jnp.einsum("rtf,fh->rth", feats.astype(jnp.float32),
                                          params["feature_proj"].astype(jnp.float32))

    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        B, Tp = prompt.shape
        inputs, feats = None, None
        if self.use_features:  # token t sees the target's state at t - 1 (none at t = 0)
            shifted = jnp.concatenate([jnp.zeros_like(target_hidden[:, :1]), target_hidden[:, :-1]], axis=1)
            inputs = InputEdits(add=self._features(params, shifted))
            feats = TokenHistory(tokens=jnp.zeros((B, cache_len) + target_hidden.shape[2:], jnp.float32),
                                 lengths=jnp.zeros((B,), jnp.int32)).write(target_hidden.astype(jnp.float32),
                                                                           prompt_len)
        _, cache = _prefill(self.model_config, params["lm"], prompt, prompt_len, cache_len, inputs)
        if rows_per_prompt > 1:
            cache = cache.repeat(rows_per_prompt)
            feats = None if feats is None else feats.repeat(rows_per_prompt)
        return cache, feats

    def _feed_inputs(self, params, feats: TokenHistory | None, tokens, start, is_mask):
        """InputEdits for `tokens [R, T]` at positions start..: mask flags, and the features of positions − 1."""
        add = None
        if feats is not None:
            pos = start[:, None] + jnp.arange(tokens.shape[1])[None, :] - 1
            f = jnp.take_along_axis(feats.tokens, jnp.clip(pos, 0, feats.max_len - 1)[:, :, None], axis=1)
            f = jnp.where(((pos >= 0) & ~is_mask)[:, :, None], f, 0.0)
            add = self._features(params, f)
        return InputEdits(is_mask=is_mask, mask_embedding=params["mask_embedding"], add=add)

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        cache, feats = state
        K = num_tokens
        width = 2 + K - 1
        j = jnp.arange(width)[None, :]
        tokens = jnp.where(j < feed_count[:, None], jnp.pad(feed, ((0, 0), (0, K - 1))), 0)
        is_mask = (j >= feed_count[:, None]) & (j < feed_count[:, None] + K - 1)
        inputs = self._feed_inputs(params, feats, tokens, cache.lengths, is_mask)
        at = (feed_count - 1)[:, None] + jnp.arange(K)[None, :]  # the last fed token, then the K-1 masks
        logits, cache = forward_cached(self.model_config, params["lm"], tokens, cache, num_valid=feed_count,
                                       logit_index=at, inputs=inputs)
        logq = process_logits(logits, sampling)  # [R, K, V]
        x = sample(key, logq)
        # as if the fed tokens and x_1..x_{K-1} were consumed (ARDrafter's arithmetic; see the module docstring)
        moved = cache.lengths + K - 1
        return Proposal(x, logq, (cache.set_lengths(moved), None if feats is None else feats.set_lengths(moved)))

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        """Write the verified block's committed tokens (their features first, so each token sees its
        predecessor's) with one forward at `start`; lengths are set by the method afterwards."""
        cache, feats = state
        if feats is not None:
            feats = feats.set_lengths(start).write(target_hidden.astype(jnp.float32), num_valid)
        inputs = self._feed_inputs(params, feats, tokens, start, jnp.zeros(tokens.shape, bool))
        _, cache = forward_cached(self.model_config, params["lm"], tokens, cache.set_lengths(start),
                                  num_valid=num_valid, logit_index=jnp.zeros((tokens.shape[0], 1), jnp.int32),
                                  inputs=inputs)
        return cache, feats

    # ------------------------------------------------------------------ row operations on (cache, features)
    def lengths(self, state):
        return state[0].lengths

    def set_lengths(self, state, lengths):
        cache, feats = state
        return cache.set_lengths(lengths), None if feats is None else feats.set_lengths(lengths)

    def copy_window(self, state, src, start, width: int):
        cache, feats = state
        return cache.copy_window(src, start, width), None if feats is None else feats.copy_window(src, start, width)

    def gather(self, state, index):
        cache, feats = state
        return cache.gather(index), None if feats is None else feats.gather(index)


def _prefill(config, params, prompt, prompt_len, cache_len, inputs):
    """`engine.prefill` with input edits (the dual mode's prompt features); one row per prompt."""
    if inputs is None:
        return prefill(config, params, prompt, prompt_len, cache_len)
    from smcsd.models import init_cache
    from smcsd.models.transformer import layers_unstacked
    B = prompt.shape[0]
    cache = init_cache(config.num_hidden_layers, B, cache_len, config.num_key_value_heads, config.head_dim,
                       config.jnp_dtype, per_layer=layers_unstacked(params))
    logits, cache = forward_cached(config, params, prompt, cache, num_valid=prompt_len,
                                   logit_index=(prompt_len - 1)[:, None], inputs=inputs)
    return logits[:, 0], cache


__all__ = ["FEATURE_SCALE", "KVCache", "PARD2Drafter"]
