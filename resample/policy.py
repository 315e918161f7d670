"""When to resample: the ESS-threshold rule applied once per SMC-SD cycle inside the decode loop."""

import functools
from typing import Callable, NamedTuple, Union

import jax
import jax.numpy as jnp

from .ess import ess as _ess
from .registry import get_resampler
from .weights import sanitize

__all__ = ["ResampleResult", "maybe_resample"]


class ResampleResult(NamedTuple):
    """Outcome of ``maybe_resample`` for one request."""

    ancestors: jax.Array  # int32[N]; arange(N) when not resampled
    ess: jax.Array  # float32 scalar; ESS of the incoming weights (0 when degenerate)
    resampled: jax.Array  # bool scalar; whether ancestors come from the scheme
    degenerate: jax.Array  # bool scalar; every log-weight was -inf (or NaN)


def maybe_resample(
    key: jax.Array,
    log_weights: jax.Array,
    threshold,
    scheme: Union[str, Callable] = "systematic",
) -> ResampleResult:
    """Resamples N particles iff ``ESS < threshold · N``; otherwise returns ``arange(N)``.

    ``threshold`` is a (traced) float: ≤ 0 never resamples, ≥ 1 always does — even at
    ESS == N, which a strict ``<`` alone would miss. ``scheme`` is a registered name or any
    ``(key, log_weights, num_samples) -> int32[num_samples]`` callable, resolved in Python.
    NaN log-weights count as -inf. If all are -inf the population is *degenerate*: ESS is 0,
    ``degenerate`` is True, and resampling (when the threshold asks for it) uses uniform
    weights. Branch-free (``jnp.where``; the scheme always runs, which costs O(N log N) and is
    what ``vmap`` of a ``lax.cond`` would do anyway), so it fits in ``lax.while_loop``/``vmap``.
    After resampling the caller resets log-weights to 0 (standard SMC bookkeeping).
    """
    resample_fn = scheme if callable(scheme) else get_resampler(scheme)
    return _maybe_resample(key, log_weights, threshold, resample_fn)


@functools.partial(jax.jit, static_argnums=3)
def _maybe_resample(key, log_weights, threshold, resample_fn) -> ResampleResult:
    log_weights, degenerate = sanitize(log_weights)
    n = log_weights.shape[0]
    ess = _ess(log_weights)
    threshold = jnp.asarray(threshold, ess.dtype)
    resampled = (threshold >= 1.0) | (ess < threshold * n)
    drawn = jnp.asarray(resample_fn(key, log_weights, n), jnp.int32)
    ancestors = jnp.where(resampled, drawn, jnp.arange(n, dtype=jnp.int32))
    return ResampleResult(ancestors, ess, resampled, degenerate)
