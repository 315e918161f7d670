"""`ARDrafter`: a small autoregressive language model as the drafter (today's draft model).

Its state is its own KV cache (`models.KVCache`); `propose` makes K sequential calls: one on the pending
tokens (feed), then one per sampled token, sampling each x_k from the processed draft distribution
(`sampling`: the draft temperature, and top-k/top-p for the exact methods). A `LanguageModel` passed as
`decode(draft=...)` is wrapped in it, so existing code keeps working.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from smcsd.models import LanguageModel, ModelConfig, forward_cached, forward_tree

from ..runtime.engine import prefill
from ..sampling import process_logits, sample
from .base import Drafter, Proposal, TreeProposal, top1_confidence
from .tree import product_tree, static_ancestors


@dataclasses.dataclass(frozen=True, init=False)
class ARDrafter(Drafter):
    """A small `LanguageModel` sharing the target's vocabulary; `.model` is that model."""

    model_config: ModelConfig
    model: LanguageModel | None = dataclasses.field(compare=False, hash=False, repr=False)

    kind = "ar"
    shares_prefix = True

    def __init__(self, model):
        if isinstance(model, ModelConfig):  # static use only (building programs from configs)
            config, model = model, None
        elif isinstance(model, LanguageModel):
            config = model.config
        else:
            raise TypeError(f"ARDrafter wraps a models.LanguageModel, got {type(model).__name__}")
        object.__setattr__(self, "model_config", config)
        object.__setattr__(self, "model", model)

    def __repr__(self):
        return f"ARDrafter({self.model!r})" if self.model is not None else f"ARDrafter({self.model_config!r})"

    # ------------------------------------------------------------------ host side
    def drafter_params(self):
        if self.model is None:
            raise ValueError("this ARDrafter was built from a config alone and has no params; wrap a LanguageModel")
        return self.model.decode_params()

    def sharded_params(self):
        return self.model.params  # stacked layers: what a mesh shards (decode_params are per-layer buffers)

    @property
    def language_model(self) -> LanguageModel | None:
        return self.model

    @property
    def config(self) -> ModelConfig:
        return self.model_config

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def max_len(self) -> int:
        return self.model_config.max_position_embeddings

    @property
    def dtype(self) -> str:
        return self.model_config.dtype

    @property
    def name(self) -> str:
        return self.model.name if self.model is not None else "ar"

    def bind(self, target) -> "ARDrafter":
        if self.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft and target vocabularies differ (draft vocab_size={self.vocab_size}, "
                             f"target vocab_size={target.config.vocab_size}); they must share one tokenizer")
        return self

    def describe(self) -> str:
        return f"ar:{self.name}"

    # ------------------------------------------------------------------ traced
    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        _, cache = prefill(self.model_config, params, prompt, prompt_len, cache_len, rows_per_prompt,
                           suffix_len=suffix_len)
        return cache

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        """K = `num_tokens` draft calls: one on the pending tokens, then one per sampled token."""
        config = self.model_config
        keys = jax.random.split(key, num_tokens)
        logits, cache = forward_cached(config, params, feed, state, num_valid=feed_count)
        last = jnp.take_along_axis(logits, (feed_count - 1)[:, None, None], axis=1)[:, 0]
        logq0 = process_logits(last, sampling)
        tok0 = sample(keys[0], logq0)
        conf0 = top1_confidence(last)
        if num_tokens == 1:
            return Proposal(tok0[:, None], logq0[:, None], cache, conf0[:, None])

        def step(carry, k):
            tok, cache = carry
            logits, cache = forward_cached(config, params, tok[:, None], cache)
            logq = process_logits(logits[:, 0], sampling)
            nxt = sample(k, logq)
            return (nxt, cache), (nxt, logq, top1_confidence(logits[:, 0]))

        (_, cache), (toks, logqs, confs) = jax.lax.scan(step, (tok0, cache), keys[1:])
        tokens = jnp.concatenate([tok0[:, None], toks.T], axis=1)
        logq = jnp.concatenate([logq0[:, None], jnp.swapaxes(logqs, 0, 1)], axis=1)
        return Proposal(tokens, logq, cache, jnp.concatenate([conf0[:, None], confs.T], axis=1))

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        """A product tree (`tree.branching`) level by level: one call on the pending tokens, then one tree-masked
        call per level over that level's nodes (each node attends to the context and its ancestors; RoPE position
        = depth), so D = tree.depth calls like a chain of D. The deepest level is never fed (as x_K in `sd`)."""
        if tree.branches:
            raise ValueError("D²SD branches (tree '+B') need a D2SDDrafter; an AR drafter builds product trees only")
        config = self.model_config
        logits, cache = forward_cached(config, params, feed, state, num_valid=feed_count)
        root = process_logits(jnp.take_along_axis(logits, (feed_count - 1)[:, None, None], axis=1), sampling)
        base = cache.lengths  # the slot after x_0: node m goes to base + m
        R, widths = feed.shape[0], tree.level_widths
        anc = jnp.asarray(static_ancestors(tree))
        offsets = [sum(widths[:d]) for d in range(tree.depth)]
        box = [cache]

        def level_logq(d, toks):
            if d == 0:
                return root
            o, w = offsets[d - 1], widths[d - 1]
            idx = jnp.broadcast_to(jnp.arange(o, o + w, dtype=jnp.int32), (R, w))
            lg, box[0] = forward_tree(config, params, toks[d - 1], box[0], base, idx, jnp.full((R, w), d - 1),
                                      jnp.broadcast_to(anc[o:o + w], (R, w, anc.shape[1])))
            return process_logits(lg, sampling)

        tokens, logq, valid = product_tree(key, tree, level_logq)
        parents, depths = tree.product_layout()
        M = len(parents)
        return TreeProposal(tokens, jnp.broadcast_to(jnp.asarray(parents), (R, M)),
                            jnp.broadcast_to(jnp.asarray(depths), (R, M)), logq, valid, box[0])
