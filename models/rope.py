"""Rotary position embeddings (Su et al. 2021), with Llama-3 and linear frequency scaling.

Follows Hugging Face's "rotate half" layout (the two halves of each head are the rotated pairs),
so checkpoints load without permuting q/k weights.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, theta: float, rope_scaling=None) -> np.ndarray:
    """Per-pair rotation frequencies `float32[head_dim // 2]`, after the configured scaling."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not rope_scaling:
        return inv_freq.astype(np.float32)
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "linear":
        return (inv_freq / float(rope_scaling["factor"])).astype(np.float32)
    if rope_type == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend smoothly between.
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        old_len = float(rope_scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq.astype(np.float32)


def rope_tables(positions, inv_freq):
    """cos/sin tables `float32[B, T, head_dim]` for integer positions `[B, T]`."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate `x [B, T, H, D]` by the tables `[B, T, D]` (computed in float32, cast back)."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
