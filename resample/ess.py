"""Effective sample size of a weighted particle population, computed in log space.

ESS = 1 / Σ w̄ᵢ² (Kong, Liu & Wong 1994) ranges from 1 (one particle holds all the mass) to N
(uniform weights); SMC-SD resamples a request when it drops below τ·N.
"""

import jax
import jax.numpy as jnp

from .weights import sanitize, normalize

__all__ = ["ess", "log_ess"]


@jax.jit
def log_ess(log_weights) -> jax.Array:
    """``log ESS = −logsumexp(2·log w̄)``, clipped to ``≤ log N`` against float rounding.

    NaN entries count as -inf. A degenerate population (all -inf: no particle has positive
    weight) has ``log ESS = −inf``, i.e. ESS = 0; never NaN.
    """
    lw, degenerate = sanitize(log_weights)
    log_n = jnp.log(jnp.asarray(lw.shape[0], lw.dtype))
    value = jnp.minimum(-jax.nn.logsumexp(2.0 * normalize(lw)), log_n)
    return jnp.where(degenerate, -jnp.inf, value)


@jax.jit
def ess(log_weights) -> jax.Array:
    """``ESS = 1 / Σ w̄ᵢ²`` in [1, N]; 0 for a degenerate (all -inf) population. See ``log_ess``."""
    return jnp.exp(log_ess(log_weights))
