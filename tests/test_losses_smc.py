"""smcsd.train.losses, the SMC-proposal losses: reverse KL, Rényi-α, their mix, the block-level forms and the
draft-vocabulary floor mixture, against closed forms on small explicit distributions (numpy, float64), their
α → 1 limit, log-space stability, gradients against central finite differences, the clear errors, and exact resume of
a training run that uses them."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smcsd.train import losses, train

# two explicit categorical distributions over 4 tokens, and a second pair, as a batch of 2 positions
P = np.array([[0.5, 0.25, 0.15, 0.10], [0.05, 0.05, 0.6, 0.3]])
Q = np.array([[0.25, 0.25, 0.25, 0.25], [0.4, 0.1, 0.3, 0.2]])


def kl_np(p, q):
    return (p * np.log(p / q)).sum(-1)


def renyi_np(p, q, a):
    return np.log((p ** a * q ** (1 - a)).sum(-1)) / (a - 1)


def logits_of(q, shift=0.0):
    """Unnormalised draft logits of q (log q plus a per-row constant: the losses must not depend on it)."""
    return np.log(q) + shift


def central_diff(f, x, h=1e-6):
    """∂f/∂x by (f(x + h e_i) − f(x − h e_i)) / 2h for every i, float64, all 2n points in one vmapped call:
    `f` maps x to a vector [C], the result is [C, *x.shape] (truncation O(h²), rounding O(ε_64/h) ≈ 1e-10)."""
    x = np.asarray(x, np.float64)
    n = x.size
    steps = (h * np.eye(n)).reshape((n,) + x.shape)
    F = np.asarray(jax.jit(jax.vmap(f))(jnp.asarray(np.concatenate([x + steps, x - steps]))), np.float64)
    return np.moveaxis((F[:n] - F[n:]) / (2 * h), 0, -1).reshape(F.shape[1:] + x.shape)


# ----------------------------------------------------------------------------------------------- closed forms

def test_reverse_kl_matches_closed_form():
    got = losses.token_reverse_kl(np.log(P), logits_of(Q, shift=3.0))
    np.testing.assert_allclose(got, kl_np(Q, P), rtol=1e-5)  # KL(q ‖ p): the arguments swap
    assert not np.allclose(kl_np(Q, P), kl_np(P, Q), rtol=1e-2)  # ... and the direction matters on these
    np.testing.assert_allclose(losses.token_reverse_kl(np.log(P), np.log(P)), [0, 0], atol=1e-6)
    mask = np.array([1.0, 0.0])
    np.testing.assert_allclose(losses.reverse_kl(np.log(P), logits_of(Q), mask), kl_np(Q, P)[0], rtol=1e-5)
    # a token the drafter proposes but the target never emits: infinitely bad (p must cover q's support)
    p0 = np.array([0.5, 0.5, 0.0])
    assert np.isinf(float(losses.token_reverse_kl(np.log(p0), np.log([0.4, 0.4, 0.2]))))
    # a token neither has: contributes nothing
    np.testing.assert_allclose(losses.token_reverse_kl(np.log(p0), np.log([0.4, 0.6, 0.0])),
                               kl_np(np.array([0.4, 0.6]), np.array([0.5, 0.5])), rtol=1e-5)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0])
def test_renyi_matches_closed_form(alpha):
    got = losses.token_renyi(np.log(P), logits_of(Q, shift=-2.0), alpha)
    np.testing.assert_allclose(got, renyi_np(P, Q, alpha), rtol=1e-5)
    np.testing.assert_allclose(losses.renyi(np.log(P), logits_of(Q), alpha, np.array([0, 1])),
                               renyi_np(P, Q, alpha)[1], rtol=1e-5)
    np.testing.assert_allclose(losses.token_renyi(np.log(P), np.log(P), alpha), [0, 0], atol=1e-6)
    # D_α is non-decreasing in α and above D_1 = KL (van Erven & Harremoës 2014, Thm 3)
    assert np.all(np.asarray(got) >= kl_np(P, Q) - 1e-6)


def test_renyi2_is_log_one_plus_chi2():
    chi2 = ((P - Q) ** 2 / Q).sum(-1)  # Pearson's χ²(p ‖ q) = Σ (p − q)² / q, written directly
    np.testing.assert_allclose(losses.token_renyi(np.log(P), logits_of(Q), 2.0), np.log1p(chi2), rtol=1e-5)
    d = [float(losses.token_renyi(np.log(P[0]), logits_of(Q[0]), a)) for a in (1.2, 1.5, 2.0, 3.0, 5.0)]
    assert all(a < b for a, b in zip(d, d[1:]))  # strictly increasing in α here (p ≠ q)


def test_alpha_to_one_recovers_kl():
    """D_{1+δ} = κ1 + δ·κ2/2 + δ²·κ3/6 + ... with κ_i the cumulants of Y = log(p/q) under p (the expansion of
    (1/δ)·log E_p[e^{δY}]), κ1 = KL. So (D_{1+δ} − KL)/δ → Var_p(Y)/2, with a relative error O(δ·κ3/κ2) ≈ 1e-4 at
    δ = 1e-4; float64 keeps the rounding (≈ 1e-16/δ² relative) far below that: rtol 1e-3."""
    delta = 1e-4
    Y = np.log(P / Q)
    half_var = 0.5 * ((P * Y ** 2).sum(-1) - kl_np(P, Q) ** 2)
    with jax.enable_x64(True):
        d = np.asarray(losses.token_renyi(np.log(P), logits_of(Q), 1 + delta))
        assert d.dtype == np.float64
        np.testing.assert_allclose((d - kl_np(P, Q)) / delta, half_var, rtol=1e-3)
        ids = np.argsort(-P, axis=-1)[:, :3]  # top-3 target: α → 1 gives forward_kl_topk's renormalised KL
        dk = losses.token_renyi_topk(ids, np.take_along_axis(np.log(P), ids, -1), logits_of(Q), 1 + delta)
        p3 = np.take_along_axis(P, ids, -1) / np.take_along_axis(P, ids, -1).sum(-1, keepdims=True)
        np.testing.assert_allclose(dk, kl_np(p3, np.take_along_axis(Q, ids, -1)), rtol=1e-3)
    # float32 (the training dtype): at δ = 1e-3 the bias is δ·κ2/2 < 4e-4 and the rounding of a logsumexp of O(1)
    # terms (a few ulp of 1, ~5e-7) divided by δ is ~5e-4: within 2e-3 of KL, far from D_2.
    d32 = np.asarray(losses.token_renyi(np.log(P).astype(np.float32), logits_of(Q).astype(np.float32), 1.001))
    assert d32.dtype == np.float32
    np.testing.assert_allclose(d32, kl_np(P, Q), atol=2e-3)
    assert np.all(np.abs(renyi_np(P, Q, 2.0) - kl_np(P, Q)) > 2e-2)  # (so 2e-3 does discriminate)


def test_topk_forms_match_closed_forms():
    k = 2
    ids = np.argsort(-P, axis=-1)[:, :k]
    tlp = np.take_along_axis(np.log(P), ids, -1)
    pk, qk = np.take_along_axis(P, ids, -1), np.take_along_axis(Q, ids, -1)
    # Rényi: renormalised top-k target against the draft's full softmax (as token_forward_kl_topk)
    pt = pk / pk.sum(-1, keepdims=True)
    for a in (1.5, 2.0):
        np.testing.assert_allclose(losses.token_renyi_topk(ids, tlp, logits_of(Q, 1.0), a),
                                   np.log((pt ** a * qk ** (1 - a)).sum(-1)) / (a - 1), rtol=1e-5)
        np.testing.assert_allclose(losses.renyi_topk(ids, tlp, logits_of(Q), a, np.array([1, 0])),
                                   np.log((pt[0] ** a * qk[0] ** (1 - a)).sum()) / (a - 1), rtol=1e-5)
    # reverse KL: k + 1 cells {top-k, rest}, the rest holding 1 − Σ p and 1 − Σ q
    pr, qr = 1 - pk.sum(-1), 1 - qk.sum(-1)
    want = (qk * np.log(qk / pk)).sum(-1) + qr * np.log(qr / pr)
    got = np.asarray(losses.token_reverse_kl_topk(ids, tlp, logits_of(Q, -1.0)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(losses.reverse_kl_topk(ids, tlp, logits_of(Q)), want.mean(), rtol=1e-5)
    assert np.all(got <= kl_np(Q, P) + 1e-6)  # data processing: a lower bound of the full KL(q ‖ p)
    # k = V: both equal the full-vocabulary forms
    full = np.argsort(-P, axis=-1)
    flp = np.take_along_axis(np.log(P), full, -1)
    np.testing.assert_allclose(losses.token_renyi_topk(full, flp, logits_of(Q), 2.0), renyi_np(P, Q, 2.0), rtol=1e-5)
    np.testing.assert_allclose(losses.token_reverse_kl_topk(full, flp, logits_of(Q)), kl_np(Q, P), rtol=1e-4)


def test_mix_is_the_weighted_sum_of_its_parts():
    lp, lg = np.log(P), logits_of(Q, 0.5)
    r, f = losses.token_renyi(lp, lg, 1.5), losses.token_forward_kl(lp, lg)
    np.testing.assert_allclose(losses.token_renyi_kl_mix(lp, lg), r + 0.5 * f, rtol=1e-6)  # defaults: 1.5, 1, 0.5
    np.testing.assert_allclose(losses.token_renyi_kl_mix(lp, lg, alpha=2.0, renyi_weight=0.3, kl_weight=2.0),
                               0.3 * renyi_np(P, Q, 2.0) + 2.0 * kl_np(P, Q), rtol=1e-5)
    np.testing.assert_allclose(losses.token_renyi_kl_mix(lp, lg, kl_weight=0.0), r, rtol=1e-6)
    ids = np.argsort(-P, -1)[:, :3]
    tl = np.take_along_axis(lp, ids, -1)
    np.testing.assert_allclose(losses.token_renyi_kl_mix_topk(ids, tl, lg, alpha=2.0, kl_weight=0.25),
                               losses.token_renyi_topk(ids, tl, lg, 2.0)
                               + 0.25 * losses.token_forward_kl_topk(ids, tl, lg), rtol=1e-6)
    ce = losses.token_cross_entropy(lg, np.array([0, 2]))
    np.testing.assert_allclose(losses.mix((1.0, r), (0.5, f), (0.1, ce)), r + 0.5 * f + 0.1 * ce, rtol=1e-6)
    # a zero weight drops its term: an infinite divergence against a q with a zero does not become NaN
    inf_term = losses.token_renyi(np.log([0.5, 0.5]), np.log([1.0, 0.0]), 2.0)
    assert np.isinf(float(inf_term))
    assert float(losses.mix((1.0, 2.0), (0.0, inf_term))) == 2.0


# ----------------------------------------------------------------------------------------------- stability

def test_no_overflow_at_extreme_log_ratios():
    p = np.array([0.5, 0.25, 0.25])
    # two positions: q(0) = 1e-30 (representable in float32) and q(0) ∝ e^-200 (not: it underflows to 0)
    logq = np.stack([np.log([1e-30, 0.5, 0.5 - 1e-30]), np.array([-200.0, 0.0, 0.0])])
    logq32 = logq.astype(np.float32)
    logq_n = logq - np.logaddexp.reduce(logq, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        naive = (np.float32(p) ** 2 / np.exp(logq32[1].astype(np.float64)).astype(np.float32)).sum()
    for a in (1.5, 2.0, 4.0):
        got = np.asarray(losses.token_renyi(np.log(p).astype(np.float32), logq32, a))
        assert np.all(np.isfinite(got))
        want = np.logaddexp.reduce(a * np.log(p) + (1 - a) * logq_n, axis=-1) / (a - 1)  # float64, log space
        np.testing.assert_allclose(got, want, rtol=1e-5)
    fns = {
        "renyi": lambda z: losses.token_renyi(np.log(p), z, 2.0),
        "reverse_kl": lambda z: losses.token_reverse_kl(np.log(p), z),
        "mix": lambda z: losses.token_renyi_kl_mix(np.log(p), z),
        "renyi_topk": lambda z: losses.token_renyi_topk(np.array([[0, 1]] * 2), np.log([p[:2]] * 2), z, 3.0),
        "reverse_kl_topk": lambda z: losses.token_reverse_kl_topk(np.array([[0, 1]] * 2), np.log([p[:2]] * 2), z),
        "floor": lambda z: losses.token_renyi(np.log([0.5, 0.3, 0.1, 0.1]),
                                              losses.floor_mixture_logq(z, np.array([2, 0, 3]), 4, 1e-3), 2.0),
    }
    names = list(fns)

    def all_fns(z):
        return jnp.stack([fns[k](z) for k in names])  # [6 losses, 2 positions]

    v, J = jax.jit(lambda z: (all_fns(z), jax.jacrev(all_fns)(z)))(jnp.asarray(logq32))
    for i, name in enumerate(names):
        assert np.all(np.isfinite(np.asarray(v[i]))) and np.all(np.isfinite(np.asarray(J[i]))), name
    assert np.isinf(naive)  # at e^-200, p²/q itself overflows float32: the log-space form is what stays finite
    # the reverse direction: p tiny where q is not
    np.testing.assert_allclose(float(losses.token_reverse_kl(np.log([1e-30, 1.0]), np.log([0.5, 0.5]))),
                               0.5 * np.log(0.5 / 1e-30) + 0.5 * np.log(0.5), rtol=1e-5)
    # block weights with summed log-ratios of hundreds of nats per sample
    lp = np.full((4, 3), -1.0, np.float32)
    lq = np.array([[-120.0] * 3, [-1.0] * 3, [-2.0] * 3, [-0.5] * 3], np.float32)
    v, g = jax.jit(jax.value_and_grad(lambda x: losses.block_renyi_mc(lp, x, 2.0)))(jnp.asarray(lq))
    assert math.isfinite(float(v)) and np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_allclose(float(v), np.logaddexp.reduce(2 * (lp - lq).sum(-1)) - np.log(4),
                               rtol=1e-5)  # on policy the terms are α·Δℓ


# ----------------------------------------------------------------------------------------------- gradients

def test_gradients_match_finite_differences():
    """jax.grad against central differences in float64 on tiny cases: with h = 1e-6 the difference quotient is off
    by O(h²·f''') ≈ 1e-12 plus rounding ε_64·|f|/h ≈ 1e-10, hence atol 1e-7 (the gradients are O(0.1–1))."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        lp = np.log(P)
        z = rng.normal(size=Q.shape)
        ids = np.argsort(-P, -1)[:, :2]
        tl = np.take_along_axis(lp, ids, -1)
        d2t = np.array([3, 0, 2])
        cases = {
            "renyi 1.5": lambda x: losses.token_renyi(lp, x, 1.5).sum(),
            "renyi 2": lambda x: losses.token_renyi(lp, x, 2.0).sum(),
            "renyi 3": lambda x: losses.token_renyi(lp, x, 3.0).sum(),
            "reverse_kl": lambda x: losses.token_reverse_kl(lp, x).sum(),
            "renyi_topk": lambda x: losses.token_renyi_topk(ids, tl, x, 2.0).sum(),
            "reverse_kl_topk": lambda x: losses.token_reverse_kl_topk(ids, tl, x).sum(),
            "floor + renyi": lambda x: losses.token_renyi(lp, losses.floor_mixture_logq(x[:, :3], d2t, 4, 0.05),
                                                          2.0).sum(),
            "floor + reverse_kl": lambda x: losses.token_reverse_kl(
                lp, losses.floor_mixture_logq(x[:, :3], d2t, 4, 0.05)).sum(),
        }
        names = list(cases)

        def all_cases(x):  # one vector, so that the test compiles one Jacobian and one batch of evaluations
            return jnp.stack([cases[k](x) for k in names])

        J = np.asarray(jax.jit(jax.jacrev(all_cases))(jnp.asarray(z)))
        assert J.dtype == np.float64
        fd = central_diff(all_cases, z)
        for i, name in enumerate(names):
            np.testing.assert_allclose(J[i], fd[i], atol=1e-7, err_msg=name)
            assert np.abs(J[i]).max() > 1e-2, name  # not vacuous
        # the block-level estimate, all 9 blocks of K = 2, V = 3 enumerated off policy (exact, see below)
        t = TinyBlocks(seed=1)
        theta = np.concatenate([t.z1, t.z2.ravel()])
        f = lambda th: t.estimate(th, alpha=2.0)[None]  # noqa: E731
        np.testing.assert_allclose(np.asarray(jax.jit(jax.jacrev(f))(jnp.asarray(theta))), central_diff(f, theta),
                                   atol=1e-7)
    assert jnp.zeros(1).dtype == jnp.float32  # the x64 context did not leak


# ----------------------------------------------------------------------------------------------- blocks

class TinyBlocks:
    """Blocks of K = 2 tokens over V = 3 with autoregressive conditionals: target p1[x1], p2[x1, x2] and a drafter
    q1 = softmax(z1), q2[x1] = softmax(z2[x1]) whose second token depends on the first (so the joint does not
    factorise into per-position distributions)."""
    V, K = 3, 2

    def __init__(self, seed=0, independent=False):
        rng = np.random.default_rng(seed)
        self.p1 = rng.dirichlet(np.ones(3))
        self.p2 = np.repeat(rng.dirichlet(np.ones(3))[None], 3, 0) if independent else rng.dirichlet(np.ones(3), 3)
        self.z1 = rng.normal(size=3)
        self.z2 = np.repeat(rng.normal(size=3)[None], 3, 0) if independent else rng.normal(size=(3, 3))
        self.blocks = np.array(list(itertools.product(range(3), repeat=2)))  # all 9, [9, 2]

    def q(self, theta=None):
        th = np.concatenate([self.z1, self.z2.ravel()]) if theta is None else theta
        lq1 = jax.nn.log_softmax(th[:3])
        lq2 = jax.nn.log_softmax(jnp.reshape(th[3:], (3, 3)), -1)
        return lq1, lq2

    def token_logps(self, blocks, theta=None):
        """(log p, log q) of each block's two tokens, [S, 2]."""
        lq1, lq2 = self.q(theta)
        x1, x2 = blocks[:, 0], blocks[:, 1]
        lp = np.stack([np.log(self.p1[x1]), np.log(self.p2[x1, x2])], -1)
        lq = jnp.stack([lq1[x1], lq2[x1, x2]], -1)
        return lp, lq

    def estimate(self, theta, alpha):
        """block_renyi_mc over all V^K blocks with a uniform behaviour distribution: the expectation, exactly."""
        lp, lq = self.token_logps(self.blocks, theta)
        behavior = np.full(lq.shape, -np.log(self.V))
        return losses.block_renyi_mc(lp, lq, alpha, behavior_logq_tokens=behavior)

    def joint(self):
        """P and Q of every block [9], by the chain rule."""
        q1, q2 = np.exp(np.asarray(self.q()[0])), np.exp(np.asarray(self.q()[1]))
        x1, x2 = self.blocks[:, 0], self.blocks[:, 1]
        return self.p1[x1] * self.p2[x1, x2], q1[x1] * q2[x1, x2]


def test_block_renyi_enumerated_equals_its_definition():
    t = TinyBlocks(seed=2)
    Pj, Qj = t.joint()
    assert abs(Pj.sum() - 1) < 1e-9 and abs(Qj.sum() - 1) < 1e-6
    for a in (1.5, 2.0, 3.0):
        want = np.log((Pj ** a * Qj ** (1 - a)).sum()) / (a - 1)  # D_α(P ‖ Q) over the 9 blocks
        np.testing.assert_allclose(t.estimate(None, a), want, rtol=1e-5)
    chi2 = ((Pj - Qj) ** 2 / Qj).sum()
    np.testing.assert_allclose(t.estimate(None, 2.0), np.log1p(chi2), rtol=1e-5)  # block Rényi-2 = log(1 + χ²)
    # the per-position decomposition: exact for independent positions, only a surrogate otherwise
    for independent in (True, False):
        t = TinyBlocks(seed=3, independent=independent)
        Pj, Qj = t.joint()
        joint = np.log((Pj ** 2 / Qj).sum())
        lq1, lq2 = t.q()
        x1 = 0  # the per-position distributions along one (gold) prefix
        per_pos = losses.token_renyi(np.log(np.stack([t.p1, t.p2[x1]])), jnp.stack([lq1, lq2[x1]]), 2.0)
        if independent:
            np.testing.assert_allclose(losses.block_sum(per_pos), joint, rtol=1e-5)
        else:
            assert abs(float(losses.block_sum(per_pos)) - joint) > 1e-2
    # the chain rules block_sum's docstring relies on: forward KL along target prefixes, reverse KL along the drafter's
    t = TinyBlocks(seed=4)
    Pj, Qj = t.joint()
    lq1, lq2 = (np.asarray(x, np.float64) for x in t.q())
    q1 = np.exp(lq1)
    fkl = sum(t.p1[x] * losses.token_forward_kl(np.log(t.p2[x]), lq2[x]) for x in range(3))
    np.testing.assert_allclose(losses.token_forward_kl(np.log(t.p1), lq1) + fkl, kl_np(Pj, Qj), rtol=1e-5)
    rkl = sum(q1[x] * losses.token_reverse_kl(np.log(t.p2[x]), lq2[x]) for x in range(3))
    np.testing.assert_allclose(losses.token_reverse_kl(np.log(t.p1), lq1) + rkl, kl_np(Qj, Pj), rtol=1e-5)


def test_block_log_weight_and_mask():
    lp = np.log(np.array([[0.5, 0.2, 0.9], [0.1, 0.3, 0.4]]))
    lq = np.log(np.array([[0.25, 0.4, 0.3], [0.2, 0.3, 0.1]]))
    np.testing.assert_allclose(losses.block_log_weight(lp, lq), (lp - lq).sum(-1), rtol=1e-6)
    mask = np.array([[1, 1, 0], [1, 0, 0]])  # after EOS: nothing
    np.testing.assert_allclose(losses.block_log_weight(lp, lq, mask), ((lp - lq) * mask).sum(-1), rtol=1e-6)
    # a masked position with an infinite log-ratio adds nothing (no 0·inf)
    lq_inf = lq.copy()
    lq_inf[0, 2] = -np.inf
    np.testing.assert_allclose(losses.block_log_weight(lp, lq_inf, mask), ((lp - lq) * mask).sum(-1), rtol=1e-6)
    # and block_renyi_mc honours the mask: masked tokens change nothing
    lp3, lq3 = np.stack([lp, lp[::-1]]), np.stack([lq, lq[::-1]])  # [2 contexts, S = 2, K = 3]
    m3 = np.stack([mask, mask[::-1]])
    moved = lq3.copy()
    moved[m3 == 0] -= 5.0
    np.testing.assert_allclose(losses.block_renyi_mc(lp3, moved, 2.0, m3), losses.block_renyi_mc(lp3, lq3, 2.0, m3),
                               rtol=1e-6)


def test_block_renyi_on_policy_samples_converge_to_the_exact_value_and_gradient():
    """S blocks drawn from the drafter itself (numpy, fixed seed): the estimate and its gradient against the exact
    enumerated D_2(P ‖ Q) and ∇D_2. Tolerance: 5 standard errors of the self-normalised estimates (delta method;
    a 5σ miss has probability < 1e-6 per coordinate), plus the O(1/S) bias of the log and of self-normalisation."""
    t = TinyBlocks(seed=5)
    S = 20000
    Pj, Qj = t.joint()
    rng = np.random.default_rng(0)
    idx = rng.choice(9, size=S, p=Qj / Qj.sum())
    blocks = t.blocks[idx]
    theta = jnp.asarray(np.concatenate([t.z1, t.z2.ravel()]), jnp.float32)

    def on_policy(th):
        lp, lq = t.token_logps(blocks, th)
        return losses.block_renyi_mc(lp[None], lq[None], 2.0)[0]  # one context with S samples

    value, grad = jax.jit(jax.value_and_grad(on_policy))(theta)
    exact = jax.jit(jax.value_and_grad(lambda th: t.estimate(th, 2.0)))(theta)  # enumeration (exact, tested above)
    W2 = (Pj / Qj)[idx] ** 2  # w² of each sample
    se_value = W2.std() / np.sqrt(S) / W2.mean()  # of log mean(w²), delta method
    assert abs(float(value) - float(exact[0])) < 5 * se_value + 1.0 / S
    # per-sample score ∇log Q(x) in θ = (z1, z2): one-hot minus softmax, in the row of the first token for z2
    q1, q2 = (np.exp(np.asarray(x, np.float64)) for x in t.q())
    score = np.zeros((S, 12))
    score[np.arange(S), blocks[:, 0]] += 1
    score[:, :3] -= q1
    rows = 3 + 3 * blocks[:, 0]
    score[np.arange(S), rows + blocks[:, 1]] += 1
    for j in range(3):
        score[np.arange(S), rows + j] -= q2[blocks[:, 0], j]
    wbar = W2 / W2.sum()
    g_hat = -(wbar[:, None] * score).sum(0)
    # the estimator's gradient is this SNIS form (float32 sums over S = 2e4 samples: ~1e-4 relative rounding)
    np.testing.assert_allclose(np.asarray(grad), g_hat, rtol=2e-4, atol=2e-5)
    se_grad = np.sqrt((wbar[:, None] ** 2 * (-score - g_hat) ** 2).sum(0))
    assert np.all(np.abs(np.asarray(grad) - np.asarray(exact[1])) < 5 * se_grad + 1e-3), \
        (np.asarray(grad), np.asarray(exact[1]), se_grad)
    assert np.abs(np.asarray(exact[1])).max() > 20 * se_grad.max()  # the check is sharp: errors ≪ the gradient


# ----------------------------------------------------------------------------------------------- draft vocabulary

def test_floor_mixture_over_the_draft_vocabulary():
    V, eps = 6, 0.1
    d2t = np.array([4, 1, 2])
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3))  # the drafter's head over V′ = 3 kept tokens (logits: normalised inside)
    qd = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    out = np.asarray(losses.floor_mixture_logq(logits, d2t, V, eps))
    q = np.exp(out)
    assert out.shape == (2, V)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-6)
    assert np.all(q > 0)
    np.testing.assert_allclose(q[:, d2t], (1 - eps) * qd + eps / V, rtol=1e-6)
    outside = np.setdiff1d(np.arange(V), d2t)
    np.testing.assert_allclose(q[:, outside], eps / V, rtol=1e-6)
    np.testing.assert_allclose(losses.floor_mixture_logq(np.log(qd), d2t, V, eps), out, rtol=1e-6, atol=1e-7)
    # jit-traceable (d2t a constant, logits traced)
    np.testing.assert_allclose(jax.jit(lambda x: losses.floor_mixture_logq(x, d2t, V, eps))(logits), out, rtol=1e-6)
    # the target's mass outside the draft vocabulary is counted: finite, and equal to the closed form over q
    p = np.array([0.3, 0.1, 0.2, 0.05, 0.3, 0.05])  # 0.4 of it on tokens 0, 3, 5, outside the draft vocabulary
    for a in (1.5, 2.0):
        got = float(losses.token_renyi(np.log(p), out[0], a))
        np.testing.assert_allclose(got, renyi_np(p, q[0], a), rtol=1e-5)
    np.testing.assert_allclose(losses.token_forward_kl(np.log(p), out[0]), kl_np(p, q[0]), rtol=1e-5)
    # ... where against the head alone (q = 0 outside) the divergence is infinite
    bare = np.full(V, -np.inf)
    bare[d2t] = np.log(qd[0])
    assert np.isinf(float(losses.token_renyi(np.log(p), bare, 2.0)))


# ----------------------------------------------------------------------------------------------- errors

def test_clear_errors():
    lp, lg = np.log(P), logits_of(Q)
    for bad in (1.0, 0.5, -2.0):
        with pytest.raises(ValueError, match=r"alpha must be > 1.*token_forward_kl"):
            losses.token_renyi(lp, lg, bad)
    for fn in (lambda a: losses.token_renyi_topk(np.array([[0], [1]]), np.array([[-1.0], [-1.0]]), lg, a),
               lambda a: losses.token_renyi_kl_mix(lp, lg, alpha=a),
               lambda a: losses.token_renyi_kl_mix(lp, lg, alpha=a, renyi_weight=0.0),
               lambda a: losses.block_renyi_mc(np.zeros((2, 2)), np.zeros((2, 2)), a)):
        with pytest.raises(ValueError, match="alpha must be > 1"):
            fn(1.0)
    with pytest.raises(ValueError, match="inf"):
        losses.token_renyi(lp, lg, float("inf"))
    with pytest.raises(ValueError, match="alpha must be > 1"):
        losses.token_renyi(lp, lg, float("nan"))
    with pytest.raises(TypeError, match="alpha must be a Python number"):
        losses.token_renyi(lp, lg, jnp.array(2.0))
    # loss weights
    for bad in (float("nan"), -0.5, float("inf")):
        with pytest.raises(ValueError, match="kl_weight"):
            losses.token_renyi_kl_mix(lp, lg, kl_weight=bad)
        with pytest.raises(ValueError, match="renyi_weight"):
            losses.token_renyi_kl_mix_topk(np.array([[0], [1]]), np.array([[-1.0], [-1.0]]), lg, renyi_weight=bad)
        with pytest.raises(ValueError, match="of term 1"):
            losses.mix((1.0, 1.0), (bad, 1.0))
    with pytest.raises(ValueError, match="NaN"):
        losses.check_weights(position_weights=np.array([1.0, np.nan, 0.5]))
    with pytest.raises(ValueError, match="negative"):
        losses.check_weights(position_weights=np.array([1.0, -0.1]))
    losses.check_weights(position_weights=losses.dflash_weights(4, 2.0), kl_weight=0.0)  # fine ones pass
    with pytest.raises(TypeError, match="kl_weight"):
        losses.check_weights(kl_weight="0.5")
    with pytest.raises(ValueError, match="both 0"):
        losses.token_renyi_kl_mix(lp, lg, renyi_weight=0.0, kl_weight=0.0)
    with pytest.raises(ValueError, match="every weight is 0"):
        losses.mix((0.0, 1.0))
    # a proposal over another vocabulary
    for fn in (lambda: losses.token_renyi(lp, lg[:, :3], 2.0), lambda: losses.token_reverse_kl(lp, lg[:, :3]),
               lambda: losses.renyi(lp, lg[:, :3], 2.0), lambda: losses.token_renyi_kl_mix(lp, lg[:, :3])):
        with pytest.raises(ValueError, match=r"covers 4 tokens but draft_logits covers 3.*floor_mixture_logq"):
            fn()
    with pytest.raises(ValueError, match="same shape"):
        losses.token_renyi_topk(np.zeros((2, 2), int), np.zeros((2, 3)), lg, 2.0)
    with pytest.raises(TypeError, match="integer"):
        losses.token_reverse_kl_topk(np.zeros((2, 2)), np.zeros((2, 2)), lg)
    # the floor
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"eps must be in \(0, 1\)"):
            losses.floor_mixture_logq(np.zeros(3), np.array([0, 1, 2]), 5, bad)
    with pytest.raises(TypeError, match="eps"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0, 1, 2]), 5, "0.1")
    with pytest.raises(ValueError, match=r"int\[V′\]"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0, 1]), 5, 0.1)
    with pytest.raises(ValueError, match="repeated"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0, 1, 1]), 5, 0.1)
    with pytest.raises(ValueError, match="outside"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0, 1, 5]), 5, 0.1)
    with pytest.raises(ValueError, match="more than"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0, 1, 2]), 2, 0.1)
    with pytest.raises(TypeError, match="integer"):
        losses.floor_mixture_logq(np.zeros(3), np.array([0.0, 1.0, 2.0]), 5, 0.1)
    # blocks
    with pytest.raises(ValueError, match="S >= 2"):
        losses.block_renyi_mc(np.zeros((3, 1, 4)), np.zeros((3, 1, 4)), 2.0)
    with pytest.raises(ValueError, match="same shape"):
        losses.block_renyi_mc(np.zeros((3, 2, 4)), np.zeros((3, 2, 3)), 2.0)
    with pytest.raises(ValueError, match="same shape"):
        losses.block_log_weight(np.zeros((2, 4)), np.zeros((2, 3)))


# ----------------------------------------------------------------------------------------------- resume
# The generic loop (`train`) with an SMC objective: a bigram drafter over a draft vocabulary of V′ = 24 of V = 32 tokens
# (its logits table is the params), mixed with the ε floor, against a fixed bigram target's top-8. No transformer, so
# the test compiles one small step (a few seconds) and checks what it is about: the loss is deterministic and the
# loop's exact resume carries over to it.

V_R, VD_R, EPS_R = 32, 24, 0.05
D2T_R = np.random.default_rng(1).permutation(V_R)[:VD_R]
TARGET_R = 3.0 * np.random.default_rng(2).normal(size=(V_R, V_R))  # the target's next-token logits after each token


def _bigram_batch(step):
    """A TeacherStream-like batch, a pure function of the step: tokens [4, 12] and the target's top-8 at each."""
    tokens = np.random.default_rng([7, step]).integers(0, V_R, (4, 12)).astype(np.int32)
    logp = TARGET_R[tokens] - np.logaddexp.reduce(TARGET_R[tokens], axis=-1, keepdims=True)
    ids = np.argsort(-logp, axis=-1)[..., :8].astype(np.int32)
    return {"tokens": tokens, "topk_ids": ids, "topk_logp": np.take_along_axis(logp, ids, -1).astype(np.float32)}


def _smc_bigram_loss(params, batch):
    """Rényi-2 + 0.5·KL against the top-k, plus 0.1·reverse KL, of the floor mixture over the full vocabulary."""
    logq = losses.floor_mixture_logq(params["table"][batch["tokens"]], D2T_R, V_R, EPS_R)
    per = losses.token_renyi_kl_mix_topk(batch["topk_ids"], batch["topk_logp"], logq, alpha=2.0)
    rev = losses.token_reverse_kl_topk(batch["topk_ids"], batch["topk_logp"], logq)
    return losses.masked_mean(per + 0.1 * rev), {"mix": losses.masked_mean(per)}


def test_training_with_the_smc_loss_resumes_exactly(tmp_path):
    params = {"table": jnp.asarray(0.1 * np.random.default_rng(3).normal(size=(V_R, VD_R)), jnp.float32)}
    run = dict(steps=8, lr=5e-2, warmup=2, progress=False, ckpt_every=100, meta={"loss": "renyi2+0.5kl+0.1rkl"})
    full = train(_smc_bigram_loss, params, _bigram_batch, ckpt_dir=str(tmp_path / "a"), **run)
    part = train(_smc_bigram_loss, params, _bigram_batch, ckpt_dir=str(tmp_path / "b"), stop_after=3, **run)
    assert part.step == 3 and not part.history["finished"]
    resumed = train(_smc_bigram_loss, params, _bigram_batch, ckpt_dir=str(tmp_path / "b"), resume=True, **run)
    assert resumed.history["finished"]
    assert resumed.history["train"] == full.history["train"]  # bitwise: loss, mix, grad norm of every step
    for a, b in zip(jax.tree_util.tree_leaves(full.params), jax.tree_util.tree_leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    held = _bigram_batch(10_000)  # a batch the run never saw: the objective went down, so the run trained
    held_loss = jax.jit(lambda p: _smc_bigram_loss(p, held)[0])
    before, after = float(held_loss(params)), float(held_loss(full.params))
    assert math.isfinite(after) and after < before - 0.1, (before, after)
