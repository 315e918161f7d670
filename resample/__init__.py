"""Resampling over log-weights for SMC: schemes, effective sample size, and the ESS policy.

Schemes follow Douc & Cappé (2005), "Comparison of resampling schemes for particle filtering".
All functions are pure, static-shape, and usable under ``jax.jit`` and ``jax.vmap``.
"""

from .ess import ess, log_ess
from .policy import ResampleResult, maybe_resample
from .registry import RESAMPLERS, Resampler, available_resamplers, get_resampler
from .schemes import multinomial, residual, stratified, systematic
from .weights import normalize

__all__ = [
    "RESAMPLERS",
    "ResampleResult",
    "Resampler",
    "available_resamplers",
    "ess",
    "get_resampler",
    "log_ess",
    "maybe_resample",
    "multinomial",
    "normalize",
    "residual",
    "stratified",
    "systematic",
]
