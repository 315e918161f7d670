"""The processed sampling distribution `p_T`: logits / temperature, then top-k, then top-p.

Temperature, top-k and top-p are traced arrays, so changing them never recompiles. Temperature 0
is greedy: the processed distribution is a point mass on the argmax, which lets every method
(including the speculative ones' acceptance tests) treat greedy decoding as an ordinary case.
All log-probabilities are float32; excluded tokens get -inf.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SamplingParams(NamedTuple):
    """Scalar float32/int32 arrays: temperature (0 = greedy), top_k (0 = off), top_p (1 = off)."""

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def make(cls, temperature=1.0, top_k=0, top_p=1.0) -> "SamplingParams":
        validate(temperature, top_k, top_p)
        return cls(jnp.asarray(temperature, jnp.float32), jnp.asarray(top_k, jnp.int32),
                   jnp.asarray(top_p, jnp.float32))


def validate(temperature, top_k, top_p, prefix: str = "") -> None:
    """Host-side checks with messages that name the argument and the fix."""
    import numbers

    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"{prefix}temperature must be a number >= 0, got {temperature!r}")
    if not temperature >= 0 or temperature != temperature or temperature == float("inf"):
        raise ValueError(f"{prefix}temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"{prefix}top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if top_k < 0:
        raise ValueError(f"{prefix}top_k must be >= 0 (0 disables it), got {top_k}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
        raise TypeError(f"{prefix}top_p must be a number in (0, 1], got {top_p!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"{prefix}top_p must be in (0, 1] (1 disables it), got {top_p!r}")


def process_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Log-probabilities `float32[..., V]` of the processed distribution `p_T`.

    Order as in Hugging Face / vLLM: scale by 1/temperature, keep the top-k logits (ties at the
    k-th value are all kept), then keep the smallest prefix of the sorted distribution whose mass
    reaches top_p (always at least the most likely token). Greedy (temperature 0) -> one-hot.
    """
    logits = logits.astype(jnp.float32)
    V = logits.shape[-1]
    temperature = params.temperature
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)

    sorted_desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(params.top_k > 0, jnp.minimum(params.top_k, V), V)
    kth = jnp.take_along_axis(sorted_desc, jnp.broadcast_to(k - 1, sorted_desc.shape[:-1] + (1,)), axis=-1)
    # Top-p over the top-k-truncated, renormalised distribution, in sorted order.
    in_top_k = jnp.arange(V) < k
    sorted_logp = jax.nn.log_softmax(jnp.where(in_top_k, sorted_desc, -jnp.inf), axis=-1)
    probs = jnp.exp(sorted_logp)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # top_p = 1 is "off": in float32 the running mass can reach 1.0 before the tail, which must not cut it.
    keep_sorted = in_top_k & ((mass_before < params.top_p) | (params.top_p >= 1.0))
    keep_sorted = keep_sorted.at[..., 0].set(True)
    # Threshold = smallest kept sorted logit; mask by value so no scatter back is needed.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    threshold = jnp.maximum(threshold, kth)
    truncated = jnp.where(scaled >= threshold, scaled, -jnp.inf)
    logp = jax.nn.log_softmax(truncated, axis=-1)

    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), V, dtype=bool)
    greedy_logp = jnp.where(onehot, 0.0, -jnp.inf)
    return jnp.where(greedy, greedy_logp, logp)


def sample(key: jax.Array, logp: jax.Array) -> jax.Array:
    """One token per row from log-probabilities (Gumbel-max via `jax.random.categorical`)."""
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def sample_logits(key, logits, params: SamplingParams):
    """Process then sample: `(tokens int32[...], logp float32[..., V])`."""
    logp = process_logits(logits, params)
    return sample(key, logp), logp
