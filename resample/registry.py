"""Resampling schemes by name, so configs and CLIs can say ``resampler="systematic"``."""

from typing import Callable

from .schemes import multinomial, residual, stratified, systematic

__all__ = ["RESAMPLERS", "Resampler", "available_resamplers", "get_resampler"]

Resampler = Callable  # (key, log_weights[N], num_samples: int) -> int32[num_samples]

RESAMPLERS: dict[str, Resampler] = {
    "multinomial": multinomial,
    "residual": residual,
    "stratified": stratified,
    "systematic": systematic,
}


def available_resamplers() -> tuple[str, ...]:
    """Names accepted by ``get_resampler``, sorted."""
    return tuple(sorted(RESAMPLERS))


def get_resampler(name: str) -> Resampler:
    """The scheme registered under ``name``; ``ValueError`` listing the valid names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"resampler name must be a str, got {type(name).__name__} {name!r}")
    try:
        return RESAMPLERS[name]
    except KeyError:
        choices = ", ".join(available_resamplers())
        raise ValueError(f"unknown resampler {name!r}; choose one of: {choices}") from None
