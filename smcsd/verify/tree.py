"""The tree walk: exact acceptance down a token tree, depth by depth (`sd-tree`).

At the accepted node of depth d (first the root x_0) the residual r starts as the target's processed p there; the
candidates of depth d+1 are tried in index order — accept x w.p. min(1, r(x)/q_i(x)), else r <- norm(max(0, r −
q_i)) — with q_i the candidate's *trial distribution* (q for i.i.d. children, q without the earlier siblings for
children drawn without replacement, a point mass for deterministic top-k children; smcsd/drafters/tree.py). When
every candidate fails, the correction token is drawn from r; below an accepted leaf the bonus token from p. Each
step outputs exactly p whatever the candidates were (SpecInfer's multi-round rejection sampling, Miao et al. 2023;
Jeon et al. 2024 for the without-replacement rule), so the output law is `ar`'s; at temperature 0 p is a point mass
and the output is `ar`'s greedy tokens.

Equal tokens merge: after accepting x at depth d, *every* candidate node holding x stays alive, and the next
candidates are the children of all of them (their contexts are the same token path, so p and the drafts' laws
agree). That is `rrs_walk`'s rule for N chains that share a prefix: with `TreeSpec((N, 1, ..., 1))` this walks
`sd-multi`'s draft forest exactly as `sd-multi` does.
"""

from __future__ import annotations

import jax.numpy as jnp

from smcsd.sampling import process_logits

from . import chain
from .chain import residual, take


def tree_walk(tokens, parents, depths, valid, logq, target_logits, sampling, u, max_candidates: int, accept=None):
    """Exact acceptance down a token tree (this module's docstring).

    tokens / parents / depths / valid `[B, M]`, logq `[B, M, V]` trial log-distributions, target_logits
    `[B, M+1, V]` (position 0: the root x_0, m+1: node m), u `[B, D, C]` uniforms with C = `max_candidates` (the
    most nodes of one depth). Returns (accepted count n [B], accepted tokens [B, D] (valid up to n), the node index
    of each accepted token [B, D] (one representative per depth, each a child of the previous one), the
    distribution of the correction/bonus token [B, V])."""
    accept = chain.accept_test if accept is None else accept  # looked up at trace time: tests swap in a broken rule
    B, M = tokens.shape
    D, C = u.shape[1], max_candidates
    bi = jnp.arange(B)
    order_key = jnp.arange(M)[None, :]
    alive = jnp.zeros((B, M + 1), bool).at[:, 0].set(True)  # block positions on the accepted path's depth
    rep = jnp.zeros((B,), jnp.int32)  # a block position holding the accepted path (0: the root)
    active = jnp.ones((B,), bool)
    n_acc = jnp.zeros((B,), jnp.int32)
    path = jnp.zeros((B, D), jnp.int32)
    path_idx = jnp.zeros((B, D), jnp.int32)
    r_final = jnp.zeros((B, target_logits.shape[-1]), jnp.float32)
    parent_pos = jnp.where(parents < 0, 0, parents + 1)
    for d in range(D):
        p = jnp.exp(process_logits(target_logits[bi, rep], sampling))  # [B, V]
        cand = valid & (depths == d + 1) & jnp.take_along_axis(alive, parent_pos, axis=1)  # [B, M]
        order = jnp.argsort(jnp.where(cand, order_key, M + order_key), axis=1)[:, :C]  # first C candidates
        ok = jnp.take_along_axis(cand, order, axis=1)
        r, acc, tok = p, jnp.zeros((B,), bool), jnp.zeros((B,), jnp.int32)
        for i in range(C):
            m = order[:, i]
            x = tokens[bi, m]
            q = jnp.exp(logq[bi, m])
            trial = active & ok[:, i] & ~acc
            a = trial & accept(u[:, d, i], take(r, x), take(q, x))
            tok = jnp.where(a, x, tok)
            acc = acc | a
            r = jnp.where((trial & ~a)[:, None], residual(r, q), r)
        r_final = jnp.where((active & ~acc)[:, None], r, r_final)
        step = active & acc
        same = cand & (tokens == tok[:, None])  # every candidate holding the accepted token stays alive
        first = jnp.argmax(same, axis=1).astype(jnp.int32)
        alive = jnp.where(step[:, None], jnp.concatenate([jnp.zeros((B, 1), bool), same], axis=1), alive)
        rep = jnp.where(step, first + 1, rep)
        path = path.at[:, d].set(tok)
        path_idx = path_idx.at[:, d].set(first)
        n_acc = n_acc + step
        active = step
    bonus = jnp.exp(process_logits(target_logits[bi, rep], sampling))
    r_final = jnp.where(active[:, None], bonus, r_final)
    return n_acc, path, path_idx, r_final
