"""Recursive rejection sampling over N independent drafted chains (SpecTr, Sun et al. 2023; SpecInfer, Miao et al.
2023): `sd-multi`'s acceptance."""

from __future__ import annotations

import jax.numpy as jnp

from . import chain
from .chain import residual, take


def rrs_walk(X, p, q, u, accept=None):
    """Recursive rejection sampling down the tree of N independent drafts per request.

    X int32[B, N, K] drafts, p float32[B, N, K+1, V] target probabilities at each draft's positions,
    q float32[B, N, K, V] draft probabilities, u float32[B, K, N] uniforms. Returns (n accepted [B],
    accepted path int32[B, K] (valid up to n), distribution of the correction/bonus token [B, V],
    winning draft index [B] whose caches hold the accepted path).

    At depth k the surviving drafts (prefix == accepted path) share one context, so p and q at depth
    k are the same for all of them: take them from the first survivor. Their depth-k tokens are
    i.i.d. q given the history, so trying each in index order — accept x w.p. min(1, r(x)/q(x)),
    else r <- norm(max(0, r - q)) — and sampling from the final residual if all fail yields exactly
    p (SpecTr, Sun et al. 2023, "multi-round" RRS; SpecInfer, Miao et al. 2023). Duplicates need no
    special case: x can only be rejected if r(x) < q(x), after which the residual has r(x) = 0, so a
    later copy of x is rejected for sure; the residual update must still be applied for that trial
    (the proof treats every i.i.d. trial alike; skipping duplicates would bias the output).
    """
    accept = chain.accept_test if accept is None else accept  # looked up at trace time: tests swap in a broken rule
    B, N, K = X.shape
    bi = jnp.arange(B)
    alive = jnp.ones((B, N), bool)
    active = jnp.ones((B,), bool)  # still walking (no rejection yet)
    n_acc = jnp.zeros((B,), jnp.int32)
    path = jnp.zeros((B, K), jnp.int32)
    r_final = jnp.zeros(p.shape[:1] + p.shape[-1:], p.dtype)
    for k in range(K):
        rep = jnp.argmax(alive, axis=1)  # first survivor
        p_k, q_k = p[bi, rep, k], q[bi, rep, k]  # [B, V]
        r = p_k
        acc = jnp.zeros((B,), bool)
        tok_k = jnp.zeros((B,), jnp.int32)
        for i in range(N):
            x = X[:, i, k]
            trial = alive[:, i] & ~acc
            a = trial & accept(u[:, k, i], take(r, x), take(q_k, x))
            tok_k = jnp.where(a, x, tok_k)
            acc = acc | a
            r = jnp.where((trial & ~a)[:, None], residual(r, q_k), r)
        r_final = jnp.where((active & ~acc)[:, None], r, r_final)
        step = active & acc
        n_acc = n_acc + step
        path = path.at[:, k].set(tok_k)
        alive = jnp.where(step[:, None], alive & (X[:, :, k] == tok_k[:, None]), alive)
        active = step
    winner = jnp.argmax(alive, axis=1)  # a draft holding the accepted path (the last acceptor if n == K)
    r_final = jnp.where(active[:, None], p[bi, winner, K], r_final)
    return n_acc, path, r_final, winner
