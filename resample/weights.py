"""Log-weight hygiene shared by every scheme: sanitise, normalise, detect a collapsed population.

All of ``resample`` works on *log*-weights, because SMC-SD importance weights are sums of
per-token log-ratios that easily span thousands of nats; exponentiating them unnormalised
would overflow or underflow float32.
"""

import jax
import jax.numpy as jnp

__all__ = ["normalize", "probabilities", "sanitize"]


def _as_float(log_weights) -> jax.Array:
    """Checks for a 1-D ``[N]`` vector (N ≥ 1) and promotes it to at least float32."""
    x = jnp.asarray(log_weights)
    if x.ndim != 1:
        raise ValueError(
            f"log_weights must be a 1-D array [N], got shape {x.shape}; "
            "use jax.vmap for a batch of requests"
        )
    if x.shape[0] < 1:
        raise ValueError("log_weights must hold at least one particle")
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def sanitize(log_weights) -> tuple[jax.Array, jax.Array]:
    """``(log_weights, degenerate)`` with NaN read as -inf and +inf entries sharing all mass.

    A NaN weight comes from a broken particle (e.g. ``inf - inf`` in a log-ratio), so it is
    dropped rather than allowed to poison the normaliser. If any entry is +inf, those entries
    split the mass equally and the rest get none (the limit of letting them grow without bound).
    ``degenerate`` is True iff every entry is -inf afterwards: no particle has positive weight.
    """
    lw = _as_float(log_weights)
    lw = jnp.where(jnp.isnan(lw), -jnp.inf, lw)
    pos_inf = lw == jnp.inf
    lw = jnp.where(jnp.any(pos_inf), jnp.where(pos_inf, 0.0, -jnp.inf), lw)
    return lw, jnp.all(lw == -jnp.inf)


@jax.jit
def normalize(log_weights) -> jax.Array:
    """Normalised log-weights ``ℓ_i − logsumexp(ℓ)``, so that ``sum(exp(result)) == 1``.

    The maximum is subtracted first (exactly, for entries near it), so float32 keeps full
    precision when log-weights sit far from 0 (e.g. ``[-1e4, -1e4]``). NaN entries count as
    -inf. If every entry is -inf (a degenerate population) the result is uniform, ``−log N``,
    so that callers always get a valid distribution and never a NaN.
    """
    lw, degenerate = sanitize(log_weights)
    lw = jnp.where(degenerate, jnp.zeros_like(lw), lw)
    shifted = lw - jax.lax.stop_gradient(jnp.max(lw))
    return shifted - jax.nn.logsumexp(shifted)


def probabilities(log_weights) -> jax.Array:
    """Normalised linear weights ``w̄_i`` (uniform when degenerate), computed in log space."""
    return jnp.exp(normalize(log_weights))
