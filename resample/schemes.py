"""Resampling schemes: ``(key, log_weights[N], num_samples) -> ancestors int32[num_samples]``.

Every scheme is unbiased — particle i gets ``num_samples · w̄ᵢ`` offspring in expectation — and
they differ in the variance of those offspring counts. Douc & Cappé (2005), "Comparison of
resampling schemes for particle filtering", show residual and stratified never do worse than
multinomial; systematic has the smallest per-particle count variance (counts are always
⌊M·w̄ᵢ⌋ or ⌈M·w̄ᵢ⌉) but no general ordering for estimator variance.

Conventions shared by all schemes:
  * ``log_weights`` are unnormalised log-weights; they are normalised stably (logsumexp).
  * -inf (and NaN, read as -inf) entries are never picked; +inf entries, if any, share all
    the mass. All -inf falls back to uniform weights (``maybe_resample`` reports that case as
    ``degenerate``), so the output is always valid and never depends on a NaN.
  * ``num_samples`` is a static Python int ≥ 1, checked before tracing; it may differ from N.
  * Shapes are static, so each scheme works under ``jax.jit``, ``jax.vmap`` and inside
    ``lax.while_loop``; ancestors are returned sorted ascending.
"""

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from .weights import probabilities

__all__ = ["multinomial", "residual", "stratified", "systematic"]


def _check_num_samples(num_samples) -> int:
    """Python-level check that ``num_samples`` is a static int ≥ 1 (raises before any tracing)."""
    if isinstance(num_samples, (bool, np.bool_)) or not isinstance(num_samples, (int, np.integer)):
        raise TypeError(
            f"num_samples must be a static Python int, got {type(num_samples).__name__} "
            f"{num_samples!r}; under jax.jit mark it static (static_argnums) or close over it"
        )
    num_samples = operator.index(num_samples)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return num_samples


def _resampler(impl):
    """Makes ``impl(key, log_weights, num_samples)`` a public scheme: validated, jitted per M."""
    jitted = jax.jit(impl, static_argnums=2)

    @functools.wraps(impl)
    def scheme(key, log_weights, num_samples):
        return jitted(key, log_weights, _check_num_samples(num_samples))

    return scheme


def _inverse_cdf(weights: jax.Array, positions: jax.Array) -> jax.Array:
    """Index of the CDF interval holding each position in [0, 1); zero weights are never hit.

    The running maximum over positive-weight entries makes a zero-weight particle's interval
    exactly empty even if ``cumsum`` is evaluated in a reassociated (parallel) order, and the
    final clip sends a position that rounds onto the total mass to the last positive particle.
    """
    positive = weights > 0
    cdf = jax.lax.cummax(jnp.where(positive, jnp.cumsum(weights), 0.0))
    index = jnp.searchsorted(cdf, positions * cdf[-1], side="right")
    last_positive = weights.shape[0] - 1 - jnp.argmax(positive[::-1])
    return jnp.minimum(index, last_positive).astype(jnp.int32)


def _counts_to_ancestors(counts: jax.Array, num_samples: int) -> jax.Array:
    """Expands offspring counts ``[N]`` (summing to ``num_samples``) into sorted ancestors."""
    ends = jnp.cumsum(counts)
    index = jnp.searchsorted(ends, jnp.arange(num_samples, dtype=ends.dtype), side="right")
    return jnp.minimum(index, counts.shape[0] - 1).astype(jnp.int32)


def _sorted_uniforms(key, num_samples: int, dtype) -> jax.Array:
    """The order statistics of M i.i.d. U(0, 1), in O(M) without a sort.

    Normalised partial sums of M + 1 i.i.d. Exp(1) variables have exactly this law
    (Devroye 1986, "Non-Uniform Random Variate Generation", ch. V); the running maximum keeps
    them sorted even if ``cumsum`` is evaluated in a reassociated order.
    """
    gaps = jax.random.exponential(key, (num_samples + 1,), dtype=dtype)
    partial_sums = jax.lax.cummax(jnp.cumsum(gaps))
    return partial_sums[:-1] / partial_sums[-1]


@_resampler
def multinomial(key, log_weights, num_samples):
    """Multinomial resampling: ``num_samples`` i.i.d. draws from w̄ (the baseline scheme).

    Offspring counts are Multinomial(M, w̄), variance ``M·w̄ᵢ(1 − w̄ᵢ)``. The draws are
    exchangeable, so they are returned sorted: inverting the CDF at sorted uniforms.
    """
    weights = probabilities(log_weights)
    return _inverse_cdf(weights, _sorted_uniforms(key, num_samples, weights.dtype))


@_resampler
def stratified(key, log_weights, num_samples):
    """Stratified resampling: one uniform in each stratum ``[j/M, (j+1)/M)``, independently.

    Never worse than multinomial (Douc & Cappé 2005).
    """
    weights = probabilities(log_weights)
    uniforms = jax.random.uniform(key, (num_samples,), dtype=weights.dtype)
    positions = (jnp.arange(num_samples, dtype=weights.dtype) + uniforms) / num_samples
    return _inverse_cdf(weights, positions)


@_resampler
def systematic(key, log_weights, num_samples):
    """Systematic resampling: a single uniform shifted through the M strata ``(u + j)/M``.

    Particle i always gets ⌊M·w̄ᵢ⌋ or ⌈M·w̄ᵢ⌉ offspring (Douc & Cappé 2005), the
    smallest per-particle variance any unbiased scheme can reach; the default of SMC-SD.
    """
    weights = probabilities(log_weights)
    uniform = jax.random.uniform(key, (), dtype=weights.dtype)
    positions = (jnp.arange(num_samples, dtype=weights.dtype) + uniform) / num_samples
    return _inverse_cdf(weights, positions)


@_resampler
def residual(key, log_weights, num_samples):
    """Residual resampling: ⌊M·w̄ᵢ⌋ copies of each particle, the rest multinomial on the residuals.

    The R = M − Σ⌊M·w̄ᵢ⌋ remaining offspring are i.i.d. draws ∝ ``M·w̄ᵢ − ⌊M·w̄ᵢ⌋`` (residual-
    multinomial, as analysed by Douc & Cappé 2005), so counts are ≥ ⌊M·w̄ᵢ⌋ but may exceed
    ⌈M·w̄ᵢ⌉. R is data-dependent, so M draws are made and only the first R kept (static shapes).
    """
    weights = probabilities(log_weights)
    scaled = num_samples * weights
    floors = jnp.floor(scaled)
    copies = floors.astype(jnp.int32)
    remaining = jnp.maximum(num_samples - jnp.sum(copies), 0)
    uniforms = jax.random.uniform(key, (num_samples,), dtype=weights.dtype)
    draws = _inverse_cdf(scaled - floors, uniforms)
    kept = (jnp.arange(num_samples) < remaining).astype(jnp.int32)
    extra = jnp.zeros_like(copies).at[draws].add(kept)
    return _counts_to_ancestors(copies + extra, num_samples)
