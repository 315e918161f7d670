"""The drafter seam: turn (draft cache, pending tokens, key) into K proposed tokens per row with the
processed log-probabilities they were sampled from, plus the new cache.

Today's drafter is a small autoregressive model. Parallel/block drafters (PARD, DFlash) and tree
drafters slot in behind the same signature without touching the samplers.

Pending tokens: after a cycle, a row's draft cache may lag its sequence by one or two tokens (the
last drafted token x_K was never fed, plus the new pending token). So each row hands in up to two
tokens `feed [R, 2]` with a count `feed_count [R]` in {1, 2}; they are written in the first draft
call, whose prediction at position `feed_count - 1` proposes the first token.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import KVCache, ModelConfig, forward_cached

from .sampling import SamplingParams, process_logits, sample


class Proposal(NamedTuple):
    tokens: jax.Array  # int32[R, K]: proposed x_1..x_K
    logq: jax.Array  # float32[R, K, V]: processed draft log-probs each token was sampled from
    cache: KVCache  # draft cache holding the fed tokens and x_1..x_{K-1} (x_K is not yet fed)


def propose(config: ModelConfig, params, cache: KVCache, feed, feed_count, key, sampling: SamplingParams,
            num_tokens: int) -> Proposal:
    """K = `num_tokens` draft calls: one on the pending tokens, then one per sampled token."""
    keys = jax.random.split(key, num_tokens)
    logits, cache = forward_cached(config, params, feed, cache, num_valid=feed_count)
    last = jnp.take_along_axis(logits, (feed_count - 1)[:, None, None], axis=1)[:, 0]
    logq0 = process_logits(last, sampling)
    tok0 = sample(keys[0], logq0)
    if num_tokens == 1:
        return Proposal(tok0[:, None], logq0[:, None], cache)

    def step(carry, k):
        tok, cache = carry
        logits, cache = forward_cached(config, params, tok[:, None], cache)
        logq = process_logits(logits[:, 0], sampling)
        nxt = sample(k, logq)
        return (nxt, cache), (nxt, logq)

    (_, cache), (toks, logqs) = jax.lax.scan(step, (tok0, cache), keys[1:])
    tokens = jnp.concatenate([tok0[:, None], toks.T], axis=1)
    logq = jnp.concatenate([logq0[:, None], jnp.swapaxes(logqs, 0, 1)], axis=1)
    return Proposal(tokens, logq, cache)


def initial_feed(first_token):
    """`(feed [R, 2], feed_count [R])` for rows whose draft cache holds exactly the prompt."""
    R = first_token.shape[0]
    feed = jnp.stack([first_token, jnp.zeros_like(first_token)], axis=1)
    return feed, jnp.ones((R,), jnp.int32)
