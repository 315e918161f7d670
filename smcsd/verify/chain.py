"""Rejection sampling of one drafted chain (Leviathan et al. 2023, Alg. 1; Chen et al. 2023)."""

from __future__ import annotations

import jax.numpy as jnp

from smcsd.sampling import sample


def accept_test(u, p_x, q_x):
    """Accept a drafted token x with probability min(1, p(x)/q(x)), given u ~ U[0, 1).

    Written as u·q(x) < p(x): no division, p(x) = 0 always rejects, and q(x) = 0 (an underflowed
    draft probability) accepts whenever p(x) > 0. Every walk in this package looks it up at trace time
    (`chain.accept_test`), so the tests can swap in a broken rule and check that the exactness tests catch it.
    """
    return u * q_x < p_x


def residual(p, q):
    """norm(max(0, p - q)) over the last axis: the distribution to sample after rejecting a q-draft.

    Its mass is the total variation between p and q; it is 0 only when p == q, in which case a
    rejection cannot happen (every draft is accepted), so fall back to p rather than divide by 0.
    """
    r = jnp.maximum(p - q, 0.0)
    z = jnp.sum(r, axis=-1, keepdims=True)
    ok = z > 0
    return jnp.where(ok, r / jnp.where(ok, z, 1.0), p)


def take(probs, tokens):
    """probs[..., tokens] along the last axis."""
    return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def sample_probs(key, probs):
    """One token per row from probabilities `[..., V]` (unnormalised is fine: the sampler normalises)."""
    return sample(key, jnp.log(probs))


def chain_accept(p, q, x, u, lengths=None):
    """Accept a prefix of one drafted chain per row.

    `x [B, K]` was drafted with `q [B, K, V]` (position k's token from q[:, k]); `p [B, K+1, V]` is the target's
    processed distribution at each drafted position and after the last; `u [B, K]` are uniforms. With `lengths`
    `[B]` only each row's first lengths[r] drafts are tried (FlexDraft's confidence cut), the rest count as
    rejected without a test.

    Returns (n accepted [B] — the leading accepts, the distribution of the correction / bonus token [B, V]): at the
    first rejected position n it is norm(max(0, p_n − q_n)); when every tried draft was accepted (n == K, or
    n == lengths[r]) the "q" is 0 and it is p_n itself, the bonus distribution. The emitted tokens x[:n] + [c] then
    follow p exactly, whatever q is.
    """
    B, K = x.shape
    ok = accept_test(u, take(p[:, :K], x), take(q, x))
    if lengths is not None:
        ok = ok & (jnp.arange(K)[None, :] < lengths[:, None])
    n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
    p_n = jnp.take_along_axis(p, n_acc[:, None, None], axis=1)[:, 0]
    q_n = jnp.take_along_axis(q_pad, n_acc[:, None, None], axis=1)[:, 0]
    if lengths is not None:
        q_n = jnp.where((n_acc < lengths)[:, None], q_n, 0.0)
    return n_acc, residual(p_n, q_n)
