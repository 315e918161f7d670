"""The acceptance math (`smcsd.verify`) on its own, without models or caches: the accept rule and the residual in
closed form, the chain's output law by Monte Carlo against the p it must reproduce, the confidence cut, and the
multi-draft and tree walks against each other and against p (duplicates and deterministic children included).
Each statistical check is paired with a broken rule that the same check must reject.

Statistical thresholds: a law estimated as the mean of B values in [0, 1] has standard error <= 0.5/sqrt(B) per
coordinate; the checks allow 5 of them (a correct rule fails one coordinate w.p. < 1e-6) and the broken rules miss
by more than 20. The seeds are fixed, so the outcomes are deterministic anyway."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.sampling import SamplingParams, process_logits
from smcsd.verify import accept_test, chain, chain_accept, residual, rrs_walk, tree_walk

# Context-free toy laws over V = 3 tokens, one row per drafted position (and one after the last for p): q favours
# what p likes least, so both the accept and the residual branches run often.
P = jnp.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.6, 0.3]])
Q = jnp.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])
B = 100_000
SE = 0.5 / np.sqrt(B)


def _chain_batch(seed, b=B):
    """Drafts x_k ~ Q[k] and uniforms for b rows: (p [b, 3, V], q [b, 2, V], x [b, 2], u [b, 2])."""
    kx, ku = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.categorical(kx, jnp.log(Q), shape=(b, 2)).astype(jnp.int32)
    u = jax.random.uniform(ku, (b, 2))
    return jnp.broadcast_to(P, (b, 3, 3)), jnp.broadcast_to(Q, (b, 2, 3)), x, u


def _chain_laws(n_acc, r, x):
    """Rao-Blackwellised laws of the first emitted token, and of the second given the first was a draft: a row
    that stops at position k contributes its whole correction distribution r there."""
    first = jnp.where((n_acc >= 1)[:, None], jax.nn.one_hot(x[:, 0], 3), r).mean(0)
    went_on = n_acc >= 1
    second = jnp.where((n_acc >= 2)[:, None], jax.nn.one_hot(x[:, 1], 3), r)
    second = jnp.sum(jnp.where(went_on[:, None], second, 0.0), axis=0) / jnp.sum(went_on)
    return np.asarray(first), np.asarray(second), int(jnp.sum(went_on))


def test_accept_test_closed_form():
    u = jnp.array([0.5, 0.5, 0.0, 0.0, 0.999])
    p = jnp.array([0.2, 0.21, 0.0, 0.3, 0.3])
    q = jnp.array([0.4, 0.4, 0.5, 0.0, 0.3])
    # u·q < p: 0.2 < 0.2 is a reject (the boundary), p = 0 always rejects, q = 0 accepts whenever p > 0.
    np.testing.assert_array_equal(np.asarray(accept_test(u, p, q)), [False, True, False, True, True])


def test_residual_closed_form():
    p, q = jnp.array([0.5, 0.3, 0.2]), jnp.array([0.1, 0.2, 0.7])
    np.testing.assert_allclose(np.asarray(residual(p, q)), [0.8, 0.2, 0.0], rtol=1e-6)
    # p == q: no rejection can happen, the fallback is p itself (no 0/0); batched over leading axes.
    both = residual(jnp.stack([p, q]), jnp.stack([p, jnp.zeros(3)]))
    np.testing.assert_allclose(np.asarray(both), np.asarray(jnp.stack([p, q])), rtol=1e-6)


def test_chain_accept_reproduces_p():
    p, q, x, u = _chain_batch(0)
    n_acc, r = jax.jit(chain_accept)(p, q, x, u)
    first, second, went_on = _chain_laws(n_acc, r, x)
    np.testing.assert_allclose(first, np.asarray(P[0]), atol=5 * SE)
    np.testing.assert_allclose(second, np.asarray(P[1]), atol=5 * 0.5 / np.sqrt(went_on))
    # P(accept x_1) = sum min(p, q) = 0.1 + 0.2 + 0.2 = 0.5, a Bernoulli mean: standard error 0.5/sqrt(B).
    assert abs(went_on / B - 0.5) < 5 * SE
    # Rows that accepted the whole chain draw the bonus from p after the last draft.
    full = np.asarray(n_acc == 2)
    assert full.any()
    np.testing.assert_allclose(np.asarray(r)[full], np.broadcast_to(np.asarray(P[2]), (full.sum(), 3)), rtol=1e-6)


def test_chain_accept_broken_rule_is_detected(monkeypatch):
    """Test of the test: accepting every draft emits q, which the same check must reject by a wide margin."""
    monkeypatch.setattr(chain, "accept_test", lambda u, p_x, q_x: jnp.ones(jnp.shape(u), bool))
    p, q, x, u = _chain_batch(0)
    n_acc, r = chain_accept(p, q, x, u)
    first, _, _ = _chain_laws(n_acc, r, x)
    assert np.max(np.abs(first - np.asarray(P[0]))) > 20 * SE


def test_chain_accept_lengths_cut():
    """Drafts past a row's length are not tried: the row stops there and its next token is the bonus from p at that
    position (not a residual: nothing was rejected)."""
    p, q = jnp.broadcast_to(P, (3, 3, 3)), jnp.broadcast_to(Q, (3, 2, 3))
    x = jnp.zeros((3, 2), jnp.int32)
    u = jnp.zeros((3, 2))  # u = 0 accepts every token with p > 0
    n_acc, r = chain_accept(p, q, x, u, lengths=jnp.array([0, 1, 2]))
    np.testing.assert_array_equal(np.asarray(n_acc), [0, 1, 2])
    np.testing.assert_allclose(np.asarray(r), np.asarray(P), rtol=1e-6)
    n_full, r_full = chain_accept(p, q, x, u)
    np.testing.assert_array_equal(np.asarray(n_full), [2, 2, 2])
    np.testing.assert_allclose(np.asarray(r_full), np.asarray(r[2:]).repeat(3, 0), rtol=1e-6)


def test_rrs_walk_one_draft_is_the_chain():
    """With N = 1 the multi-draft walk is the chain's rejection sampling, token for token."""
    p, q, x, u = _chain_batch(1, b=4096)
    n_chain, r_chain = chain_accept(p, q, x, u)
    n_acc, path, r_final, winner = rrs_walk(x[:, None], p[:, None], q[:, None], u[:, :, None])
    np.testing.assert_array_equal(np.asarray(n_acc), np.asarray(n_chain))
    np.testing.assert_array_equal(np.asarray(winner), 0)
    keep = np.arange(2)[None, :] < np.asarray(n_acc)[:, None]
    np.testing.assert_array_equal(np.asarray(path)[keep], np.asarray(x)[keep])
    np.testing.assert_allclose(np.asarray(r_final), np.asarray(r_chain), rtol=1e-6, atol=1e-7)


def test_rrs_walk_duplicates_exact():
    """One depth, N = 3 i.i.d. drafts from a q that favours the token p likes least (many rejections, many
    duplicate children): the output law, averaged over random drafts and uniforms (Rao-Blackwellised: a rejection
    contributes its whole residual), equals p."""
    b, Nd = 50_000, 3
    p = jnp.array([0.5, 0.3, 0.2])
    q = jnp.array([0.1, 0.2, 0.7])
    kx, ku = jax.random.split(jax.random.PRNGKey(0))
    X = jax.random.categorical(kx, jnp.log(q), shape=(b, Nd, 1)).astype(jnp.int32)
    u = jax.random.uniform(ku, (b, 1, Nd))
    pp = jnp.broadcast_to(p, (b, Nd, 2, 3))
    qq = jnp.broadcast_to(q, (b, Nd, 1, 3))
    n_acc, path, r_final, _ = jax.jit(rrs_walk)(X, pp, qq, u)
    law = jnp.where((n_acc == 1)[:, None], jax.nn.one_hot(path[:, 0], 3), r_final).mean(0)
    # Standard error <= 0.5/sqrt(5e4) ~ 2.2e-3, so 1.2e-2 is > 5 of them. Inexact variants are far off: accepting
    # always gives q itself, skipping already-tried tokens (dedup without the residual update) ~[0.38, 0.41, 0.20].
    np.testing.assert_allclose(np.asarray(law), np.asarray(p), atol=1.2e-2)


def _forest(X):
    """N chains of depth K as one tree: node i*K + k is chain i's token k, a child of node i*K + k - 1."""
    b, N, K = X.shape
    parents = np.array([-1 if k == 0 else i * K + k - 1 for i in range(N) for k in range(K)], np.int32)
    depths = np.array([k + 1 for _ in range(N) for k in range(K)], np.int32)
    bc = lambda a: jnp.broadcast_to(jnp.asarray(a), (b, N * K))  # noqa: E731
    return X.reshape(b, N * K), bc(parents), bc(depths), jnp.ones((b, N * K), bool)


def test_tree_walk_forest_is_rrs_walk():
    """The tree walk over a forest of N chains (`TreeSpec((N, 1, ..., 1))`) accepts exactly what `rrs_walk` accepts
    from the same drafts and uniforms. p comes from the same processed logits on both sides."""
    b, N, K = 4096, 3, 2
    sampling = SamplingParams.make(1.0)
    kx, ku = jax.random.split(jax.random.PRNGKey(2))
    X = jax.random.categorical(kx, jnp.log(Q), shape=(b, N, K)).astype(jnp.int32)
    # One uniform per depth, shared by its trials: the tree walk gives its i-th *remaining* candidate u[:, d, i],
    # `rrs_walk` its i-th chain u[:, k, i] (the same law, other pairings once a chain has died), so equal columns
    # make the two comparable token for token.
    u = jnp.broadcast_to(jax.random.uniform(ku, (b, K, 1)), (b, K, N))
    logits = jnp.broadcast_to(jnp.log(P), (b, K + 1, 3))
    p = jnp.exp(process_logits(logits, sampling))
    n_rrs, path_rrs, r_rrs, _ = rrs_walk(X, jnp.broadcast_to(p[:, None], (b, N, K + 1, 3)),
                                         jnp.broadcast_to(Q, (b, N, K, 3)), u)
    tokens, parents, depths, valid = _forest(X)
    logq = jnp.broadcast_to(jnp.log(jnp.tile(Q, (N, 1))), (b, N * K, 3))
    # Block position 0 is the root, m + 1 node m: node m's logits are those of its depth.
    tree_logits = jnp.concatenate([logits[:, :1], logits[:, depths[0]]], axis=1)
    n_acc, path, path_idx, r_final = tree_walk(tokens, parents, depths, valid, logq, tree_logits, sampling, u, N)
    np.testing.assert_array_equal(np.asarray(n_acc), np.asarray(n_rrs))
    keep = np.arange(K)[None, :] < np.asarray(n_acc)[:, None]
    np.testing.assert_array_equal(np.asarray(path)[keep], np.asarray(path_rrs)[keep])
    # Each accepted node holds its path's token at its depth.
    np.testing.assert_array_equal(np.asarray(jnp.take_along_axis(tokens, path_idx, axis=1))[keep],
                                  np.asarray(path)[keep])
    np.testing.assert_allclose(np.asarray(r_final), np.asarray(r_rrs), rtol=1e-6, atol=1e-7)


def _deterministic_children_law(accept=None):
    """The root's two children are fixed tokens 0 and 1 with point-mass trial distributions (deterministic top-k
    children): the law of the first emitted token over random uniforms, Rao-Blackwellised."""
    b = B
    tokens = jnp.broadcast_to(jnp.array([0, 1], jnp.int32), (b, 2))
    parents = jnp.full((b, 2), -1, jnp.int32)
    depths = jnp.ones((b, 2), jnp.int32)
    logq = jnp.broadcast_to(jnp.log(jax.nn.one_hot(jnp.array([0, 1]), 3)), (b, 2, 3))
    logits = jnp.broadcast_to(jnp.log(P), (b, 3, 3))  # the root, then the two children
    u = jax.random.uniform(jax.random.PRNGKey(3), (b, 1, 2))
    n_acc, path, _, r = tree_walk(tokens, parents, depths, jnp.ones((b, 2), bool), logq, logits,
                                  SamplingParams.make(1.0), u, 2, accept=accept)
    return np.asarray(jnp.where((n_acc == 1)[:, None], jax.nn.one_hot(path[:, 0], 3), r).mean(0))


def test_tree_walk_deterministic_children_reproduce_p():
    """Token 0 is accepted w.p. p(0); else token 1 w.p. p(1)/(1 - p(0)) from the residual; else the last residual
    is δ_2: the emitted law is p exactly, and accepting the first candidate always gives δ_0 instead."""
    np.testing.assert_allclose(_deterministic_children_law(), np.asarray(P[0]), atol=5 * SE)
    broken = _deterministic_children_law(accept=lambda u, p_x, q_x: jnp.ones(jnp.shape(u), bool))
    assert np.max(np.abs(broken - np.asarray(P[0]))) > 20 * SE
