"""Tests for the ``resample`` package: statistics of every scheme, ESS, the policy, edge cases.

Statistical tests use fixed seeds (so they are deterministic) and thresholds derived from the
sampling error of D independent draws; each derivation is stated next to the assertion.
"""

import functools
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
    from smcsd import resample
except ImportError:  # plain `pytest` does not put the repo root on sys.path without a config
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from smcsd import resample

from smcsd.resample import (
    RESAMPLERS,
    ResampleResult,
    available_resamplers,
    ess,
    get_resampler,
    log_ess,
    maybe_resample,
    multinomial,
    normalize,
    residual,
    stratified,
    systematic,
)

SCHEMES = ("multinomial", "residual", "stratified", "systematic")
N = 8
NUM_DRAWS = 8000  # D: independent resampling draws per (scheme, weight vector, M)
SAMPLE_SIZES = (N, 5, 13)  # M = N, fewer than N, more than N
Z = 5.0  # per-comparison threshold in standard errors, see _tolerance
# float32 slack: w̄ and the CDF are float32 (relative error ~1e-7), which can move a stratum
# boundary by ~M·1e-7 in probability; 1e-3 is far above that and far below any real bug.
FLOAT_SLACK = 1e-3
NEG_INF = -np.inf

# Test weight vectors (log scale, unnormalised). Every non-zero weight is ≥ 0.01, so with
# D = 8000 and M ≥ 5 every reachable particle is expected ≥ 400 times: the CLT applies.
LOG_WEIGHTS = np.array(
    [
        np.log([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.01]),  # skewed, some M·w̄ ≥ 1
        [NEG_INF, 1.3, -0.4, 2.0, NEG_INF, 0.1, -1.5, NEG_INF],  # -inf first, middle, last
        [0.05, -0.1, 0.12, 0.0, -0.07, 0.09, -0.03, 0.02],  # nearly uniform
        [3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # one dominant particle
    ]
)


def _true_weights(log_weights):
    """Normalised weights in float64, computed independently of the package."""
    w = np.exp(log_weights - np.max(log_weights))
    return w / w.sum()


# --- exact offspring-count variances (cf. Douc & Cappé 2005), in float64 --------------------


def _var_multinomial(w, m):
    return m * w * (1 - w)  # count_i ~ Binomial(M, w̄_i)


def _var_systematic(w, m):
    f = m * w - np.floor(m * w)  # count_i ∈ {⌊Mw̄_i⌋, ⌈Mw̄_i⌉} with mean Mw̄_i
    return f * (1 - f)


def _var_residual(w, m):
    floors = np.floor(m * w)
    remaining = m - floors.sum()
    r = m * w - floors  # count_i − ⌊Mw̄_i⌋ ~ Binomial(R, r_i / R)
    return r * (1 - r / remaining) if remaining > 0 else np.zeros_like(w)


def _var_stratified(w, m):
    # Stratum j draws one uniform in [j/M, (j+1)/M); it lands on particle i with probability
    # p_ij = M·|stratum_j ∩ [C_{i−1}, C_i)|, independently across strata, so
    # count_i = Σ_j Bernoulli(p_ij) and Var = Σ_j p_ij (1 − p_ij).
    cdf = np.concatenate([[0.0], np.cumsum(w)])
    lo, hi = np.arange(m) / m, np.arange(1, m + 1) / m
    overlap = np.minimum(cdf[1:, None], hi) - np.maximum(cdf[:-1, None], lo)
    p = m * np.clip(overlap, 0.0, None)
    return (p * (1 - p)).sum(axis=1)


EXACT_VARIANCE = {
    "multinomial": _var_multinomial,
    "residual": _var_residual,
    "stratified": _var_stratified,
    "systematic": _var_systematic,
}


@functools.lru_cache(maxsize=None)
def _draws(scheme):
    """Ancestors ``{M: int32[W, D, M]}``: D draws per weight vector and sample size, cached.

    One jitted program per scheme covers all sample sizes (compilation dominates the cost).
    """
    fn = get_resampler(scheme)

    def all_sizes(key, log_weights):
        return tuple(fn(key, log_weights, m) for m in SAMPLE_SIZES)

    over_draws = jax.vmap(all_sizes, in_axes=(0, None))
    over_weights = jax.jit(jax.vmap(over_draws, in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(1234), NUM_DRAWS)
    ancestors = over_weights(keys, jnp.asarray(LOG_WEIGHTS, jnp.float32))
    return {m: np.asarray(a) for m, a in zip(SAMPLE_SIZES, ancestors)}


@functools.lru_cache(maxsize=None)
def _offspring_counts(scheme, num_samples):
    """Offspring counts ``int[W, D, N]`` of the cached draws."""
    ancestors = _draws(scheme)[num_samples]
    return (ancestors[..., None] == np.arange(N)).sum(axis=-2)


def _moments(counts):
    mean = counts.mean(axis=1)
    var = counts.var(axis=1, ddof=1)
    m4 = ((counts - mean[:, None, :]) ** 4).mean(axis=1)
    return mean, var, m4


# --- unbiasedness and variance ---------------------------------------------------------------


@pytest.mark.parametrize("num_samples", SAMPLE_SIZES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_unbiased(scheme, num_samples):
    # The mean of D i.i.d. counts has standard error sqrt(Var/D) (Var estimated from the draws);
    # by the CLT z = (mean − M·w̄_i)/SE is ≈ N(0, 1) under correct sampling, and
    # P(|z| > 5) ≈ 5.7e-7. Over 4 schemes × 3 sizes × 4 vectors × 8 particles = 384 comparisons
    # a Bonferroni bound gives a family-wise false-alarm rate ≤ 2.2e-4, while a bias of
    # 5·SE ≤ 5·sqrt(M/4 / 8000) < 0.1 offspring (M ≤ 13) is detected. Deterministic counts
    # (Var = 0, e.g. -inf particles) must equal M·w̄_i up to FLOAT_SLACK.
    counts = _offspring_counts(scheme, num_samples)
    assert (counts.sum(axis=-1) == num_samples).all()
    mean, var, _ = _moments(counts)
    for w_log, m, v in zip(LOG_WEIGHTS, mean, var):
        expected = num_samples * _true_weights(w_log)
        bound = Z * np.sqrt(v / NUM_DRAWS) + FLOAT_SLACK
        np.testing.assert_array_less(np.abs(m - expected), bound)


@pytest.mark.parametrize("num_samples", SAMPLE_SIZES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_variance_matches_theory(scheme, num_samples):
    # The sample variance s² of D i.i.d. counts has SE ≈ sqrt((μ₄ − σ⁴)/D), with the fourth
    # central moment μ₄ estimated from the draws; asymptotically normal, so the same 5-sigma /
    # Bonferroni reasoning as test_unbiased applies (384 comparisons, ≤ 2.2e-4 family-wise).
    counts = _offspring_counts(scheme, num_samples)
    _, var, m4 = _moments(counts)
    for w_log, v, f4 in zip(LOG_WEIGHTS, var, m4):
        exact = EXACT_VARIANCE[scheme](_true_weights(w_log), num_samples)
        bound = Z * np.sqrt(np.maximum(f4 - v**2, 0.0) / NUM_DRAWS) + FLOAT_SLACK
        np.testing.assert_array_less(np.abs(v - exact), bound)


@pytest.mark.parametrize("num_samples", SAMPLE_SIZES)
@pytest.mark.parametrize("scheme", ["residual", "stratified", "systematic"])
def test_variance_not_above_multinomial(scheme, num_samples):
    # Douc & Cappé (2005): residual and stratified never exceed multinomial; for a
    # single particle's count systematic's f(1−f) ≤ M·w̄(1−w̄) too (any integer count with mean x
    # has variance ≥ f(1−f), and M·w̄(1−w̄) ≥ f(1−f) on every [k, k+1]). First the theory itself:
    for w_log in LOG_WEIGHTS:
        w = _true_weights(w_log)
        exact = EXACT_VARIANCE[scheme](w, num_samples)
        assert (exact <= _var_multinomial(w, num_samples) + 1e-12).all()
    # Then the draws, against the *exact* multinomial variance (no estimation error on that
    # side): one-sided 5-sigma on s² with the SE of test_variance_matches_theory, P ≈ 2.9e-7
    # per comparison. Equality is allowed (e.g. residual when every ⌊M·w̄_i⌋ = 0).
    counts = _offspring_counts(scheme, num_samples)
    _, var, m4 = _moments(counts)
    for w_log, v, f4 in zip(LOG_WEIGHTS, var, m4):
        multinomial_var = _var_multinomial(_true_weights(w_log), num_samples)
        bound = Z * np.sqrt(np.maximum(f4 - v**2, 0.0) / NUM_DRAWS) + FLOAT_SLACK
        np.testing.assert_array_less(v, multinomial_var + bound)


def test_low_variance_schemes_beat_multinomial_strictly():
    # On the skewed vector with M = N the exact total variances are far apart (multinomial
    # 6.31, residual 2.43, systematic 1.30, stratified ≤ residual here), so a sum of 8 estimates
    # with SE < 0.05 each cannot cross 0.6 × 6.31 by chance; a scheme that silently fell back to
    # multinomial would.
    w = _true_weights(LOG_WEIGHTS[0])
    reference = _var_multinomial(w, N).sum()
    for scheme in ("residual", "stratified", "systematic"):
        total = _moments(_offspring_counts(scheme, N))[1][0].sum()
        assert total < 0.6 * reference, (scheme, total, reference)


@pytest.mark.parametrize("num_samples", SAMPLE_SIZES)
def test_systematic_counts_are_floor_or_ceil(num_samples):
    # Guaranteed for every draw (Douc & Cappé 2005); tolerance only where M·w̄_i is an
    # integer in exact arithmetic and float32 may land on either side.
    x = num_samples * np.stack([_true_weights(w) for w in LOG_WEIGHTS])[:, None, :]
    counts = _offspring_counts("systematic", num_samples)
    assert (counts >= np.floor(x - 1e-4)).all()
    assert (counts <= np.ceil(x + 1e-4)).all()


@pytest.mark.parametrize("num_samples", SAMPLE_SIZES)
def test_residual_counts_at_least_floor(num_samples):
    # Residual guarantees ⌊M·w̄_i⌋ copies plus at most R = M − Σ⌊M·w̄_j⌋ more; because the
    # remainder is multinomial, ⌈M·w̄_i⌉ is *not* an upper bound.
    x = num_samples * np.stack([_true_weights(w) for w in LOG_WEIGHTS])[:, None, :]
    floors = np.floor(x - 1e-4)
    remaining = num_samples - np.floor(x + 1e-4).sum(axis=-1, keepdims=True)
    counts = _offspring_counts("residual", num_samples)
    assert (counts >= floors).all()
    assert (counts <= floors + remaining + 1).all()


def test_residual_remainder_is_multinomial():
    # Skewed vector, M = N: particle 3 has M·w̄ = 0.8 and R = 3, so it gets ≥ 2 offspring with
    # probability ≈ 0.175 per draw; over 8000 draws never seeing it would be astronomically rare.
    counts = _offspring_counts("residual", N)[0]
    assert (counts[:, 3] >= 2).any()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_neg_inf_particles_never_picked(scheme):
    # Row 1 has -inf at the first, a middle and the last index (the last one exercises the
    # clip against a position rounding onto the total mass).
    counts = _offspring_counts(scheme, 13)[1]
    assert counts[:, [0, 4, 7]].sum() == 0


# --- per-call properties and edge cases ------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_draws_sorted_and_in_range(scheme):
    for num_samples, ancestors in _draws(scheme).items():
        assert ancestors.shape == (len(LOG_WEIGHTS), NUM_DRAWS, num_samples)
        assert ancestors.dtype == np.int32
        assert (np.diff(ancestors, axis=-1) >= 0).all()
        assert ((ancestors >= 0) & (ancestors < N)).all()


def test_inverse_cdf_never_lands_on_zero_weight():
    # A position that rounds onto the total mass (systematic: (M − 1 + u)/M == 1.0 in float32
    # when u ≈ 1) must go to the last *positive* particle, and a position on a boundary next to
    # a zero-weight particle must skip it. Too rare (~1e-7) to reach through random keys.
    from smcsd.resample.schemes import _inverse_cdf

    w = jnp.array([0.5, 0.0, 0.3, 0.2, 0.0, 0.0])
    positions = jnp.array([0.0, 0.5, 0.8, 0.999, 1.0])
    np.testing.assert_array_equal(_inverse_cdf(w, positions), [0, 2, 3, 3, 3])


# Shapes below reuse (N = 8, M = 5) where possible: each new shape costs a compilation.


@pytest.mark.parametrize("num_samples", [1, 5])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_output_shape_dtype_sorted(scheme, num_samples):
    out = get_resampler(scheme)(jax.random.key(0), LOG_WEIGHTS[1], num_samples)
    assert out.shape == (num_samples,) and out.dtype == jnp.int32
    assert (np.diff(np.asarray(out)) >= 0).all()
    assert ((out >= 0) & (out < N)).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_nan_treated_as_neg_inf(scheme):
    fn = get_resampler(scheme)
    key = jax.random.key(3)
    with_nan = np.array([0.5, np.nan, -1.0, np.nan, 0.2, 0.0, -0.3, np.nan])
    as_neg_inf = np.where(np.isnan(with_nan), -np.inf, with_nan)
    np.testing.assert_array_equal(fn(key, with_nan, 5), fn(key, as_neg_inf, 5))
    assert not np.isin(np.asarray(fn(key, with_nan, 5)), [1, 3, 7]).any()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_all_neg_inf_falls_back_to_uniform(scheme):
    fn = get_resampler(scheme)
    key = jax.random.key(4)
    for dead in (np.full(N, -np.inf), np.full(N, np.nan)):
        out = fn(key, dead, 5)
        np.testing.assert_array_equal(out, fn(key, np.zeros(N), 5))
        assert ((out >= 0) & (out < N)).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_single_particle(scheme):
    fn = get_resampler(scheme)
    for lw in ([0.0], [-123.0], [-np.inf]):
        np.testing.assert_array_equal(fn(jax.random.key(5), np.array(lw), 1), [0])
        np.testing.assert_array_equal(fn(jax.random.key(5), np.array(lw), 4), [0, 0, 0, 0])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_extreme_log_weights(scheme):
    fn = get_resampler(scheme)
    key = jax.random.key(6)
    m = 400
    np.testing.assert_array_equal(fn(key, np.array([0.0, -1e4, -5000.0]), m), np.zeros(m))
    np.testing.assert_array_equal(fn(key, np.array([-1e4, 1e4, 5000.0]), m), np.ones(m))
    # Two equal, hugely negative weights keep the mass split between them: particle 0's share
    # is ≥ Binomial(400, ½)-concentrated (sd 10), so (100, 300) is a ±10-sigma window.
    out = np.asarray(fn(key, np.array([-1e4, -1e4, -3e4]), m))
    assert not (out == 2).any() and 100 < (out == 0).sum() < 300


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bad_num_samples(scheme):
    fn = get_resampler(scheme)
    key, lw = jax.random.key(0), jnp.zeros(N)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_samples"):
            fn(key, lw, bad)
    for bad in (2.0, "3", True, None, jnp.array(3)):
        with pytest.raises(TypeError, match="num_samples"):
            fn(key, lw, bad)
    with pytest.raises(TypeError, match="num_samples"):
        jax.jit(fn)(key, lw, 5)  # traced, not static
    assert fn(key, lw, np.int64(5)).shape == (5,)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bad_log_weights_shape(scheme):
    with pytest.raises(ValueError, match="1-D"):
        get_resampler(scheme)(jax.random.key(0), jnp.zeros((2, 3)), 3)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jit_and_vmap_match_unbatched(scheme, num_samples=5):
    fn = get_resampler(scheme)
    keys = jax.random.split(jax.random.key(7), 3)
    batch = jnp.asarray(LOG_WEIGHTS[:3], jnp.float32)
    unbatched = np.stack([fn(k, lw, num_samples) for k, lw in zip(keys, batch)])
    batched = jax.jit(jax.vmap(functools.partial(fn, num_samples=num_samples)))(keys, batch)
    np.testing.assert_array_equal(batched, unbatched)
    if scheme == "systematic":  # a Python int through vmap's in_axes=None works too
        in_axes = jax.vmap(fn, in_axes=(0, 0, None))(keys, batch, num_samples)
        np.testing.assert_array_equal(in_axes, unbatched)


# --- weights and ESS -------------------------------------------------------------------------


def test_normalize():
    lw = np.array([1.0, -2.0, -np.inf, 0.5, np.nan])
    out = np.asarray(normalize(lw))
    np.testing.assert_allclose(np.exp(out[[0, 1, 3]]), _true_weights(lw[[0, 1, 3]]), rtol=1e-6)
    assert out[2] == -np.inf and out[4] == -np.inf
    np.testing.assert_allclose(normalize(np.full(4, -np.inf)), np.full(4, -np.log(4)), rtol=1e-6)
    np.testing.assert_allclose(normalize([0.0, -1e4, -5000.0]), [0.0, -1e4, -5000.0])
    shares = np.exp(np.asarray(normalize([np.inf, 0.0, np.inf])))  # +inf entries share the mass
    np.testing.assert_allclose(shares, [0.5, 0.0, 0.5])


def test_ess_matches_definition():
    rng = np.random.default_rng(0)
    for n in (2, N, 64):
        lw = rng.normal(scale=3.0, size=n)
        w = _true_weights(lw)
        np.testing.assert_allclose(ess(lw), 1.0 / np.sum(w**2), rtol=1e-5)
        np.testing.assert_allclose(log_ess(lw), -np.log(np.sum(w**2)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ess(lw + 1e3), ess(lw), rtol=1e-3)  # shift invariance


def test_ess_edge_cases():
    assert float(ess(jnp.zeros(16))) == 16.0  # uniform: exactly N (clipped against rounding)
    assert float(ess(np.array([0.0, -1e4, -5000.0]))) == 1.0
    np.testing.assert_allclose(ess(np.array([-1e4, -1e4, -3e4])), 2.0, rtol=1e-6)
    np.testing.assert_allclose(ess(np.array([0.0, -np.inf, np.nan, 0.0])), 2.0, rtol=1e-6)
    assert float(ess(np.full(5, -np.inf))) == 0.0 and float(log_ess(np.full(5, -np.inf))) == -np.inf
    assert float(ess(np.array([7.0]))) == 1.0
    batch = jax.vmap(ess)(jnp.asarray(LOG_WEIGHTS, jnp.float32))
    assert not np.isnan(np.asarray(batch)).any() and (np.asarray(batch) <= N).all()


# --- policy ----------------------------------------------------------------------------------


def test_threshold_zero_never_one_always():
    key = jax.random.key(8)
    peaked = np.array([0.0, -np.inf, -np.inf, -np.inf])  # ESS = 1, the worst case
    never = maybe_resample(key, peaked, 0.0)
    assert isinstance(never, ResampleResult)
    assert not never.resampled and not never.degenerate
    np.testing.assert_array_equal(never.ancestors, np.arange(4))
    np.testing.assert_allclose(never.ess, 1.0)
    # Uniform weights have ESS == N exactly, so `ess < 1·N` alone would not fire.
    always = maybe_resample(key, np.zeros(4), 1.0, scheme="multinomial")
    assert always.resampled and float(always.ess) == 4.0
    np.testing.assert_array_equal(always.ancestors, multinomial(key, np.zeros(4), 4))
    assert maybe_resample(key, peaked, 1.0).resampled
    np.testing.assert_array_equal(maybe_resample(key, peaked, 1.0).ancestors, np.zeros(4))


def test_threshold_follows_ess():
    # ESS of [½, ½, 0, 0] is 2 = 0.5·N; thresholds straddle 0.5 (the exact boundary is left out
    # as float rounding may fall either way there).
    lw = np.array([0.0, 0.0, -np.inf, -np.inf])
    thresholds = jnp.array([0.0, 0.25, 0.45, 0.55, 0.9, 1.0])
    keys = jax.random.split(jax.random.key(9), thresholds.shape[0])
    out = jax.jit(jax.vmap(maybe_resample, in_axes=(0, None, 0)))(keys, lw, thresholds)
    np.testing.assert_array_equal(out.resampled, [False, False, False, True, True, True])
    ancestors = np.asarray(out.ancestors)
    np.testing.assert_array_equal(ancestors[:3], np.tile(np.arange(4), (3, 1)))
    assert np.isin(ancestors[3:], [0, 1]).all()
    # Random vectors against the rule computed here, for thresholds away from ESS/N.
    rng = np.random.default_rng(1)
    for _ in range(5):
        lw = rng.normal(scale=2.0, size=N)
        ratio = 1.0 / np.sum(_true_weights(lw) ** 2) / N
        for tau in (ratio - 0.02, ratio + 0.02):
            result = maybe_resample(jax.random.key(0), lw, tau)
            assert bool(result.resampled) == (tau > ratio)


def test_degenerate_flag():
    key = jax.random.key(10)
    for dead in (np.full(4, -np.inf), np.full(4, np.nan)):
        out = maybe_resample(key, dead, 0.5)
        assert out.degenerate and out.resampled and float(out.ess) == 0.0
        np.testing.assert_array_equal(out.ancestors, systematic(key, np.zeros(4), 4))
        kept = maybe_resample(key, dead, 0.0)
        assert kept.degenerate and not kept.resampled
        np.testing.assert_array_equal(kept.ancestors, np.arange(4))
    assert not maybe_resample(key, np.array([0.0, -np.inf, np.nan, -1.0]), 0.5).degenerate


def test_policy_scheme_by_name_or_callable():
    key, lw = jax.random.key(11), LOG_WEIGHTS[0]
    for name in ("multinomial", "residual"):  # name → function routing; registry tested below
        out = maybe_resample(key, lw, 1.0, scheme=name)
        np.testing.assert_array_equal(out.ancestors, get_resampler(name)(key, lw, N))
    reverse = lambda key, log_weights, num_samples: jnp.arange(num_samples)[::-1]
    reversed_out = maybe_resample(key, lw, 1.0, reverse).ancestors
    np.testing.assert_array_equal(reversed_out, np.arange(N)[::-1])
    with pytest.raises(ValueError, match="unknown resampler 'foo'"):
        maybe_resample(key, lw, 0.5, scheme="foo")


def test_policy_in_while_loop_under_vmap():
    # A toy decode loop: per step, add random log-weight increments, then maybe resample and
    # reset resampled requests' weights to 0. The vmapped while_loop must match a Python loop.
    batch, steps = 3, 4
    thresholds = jnp.array([0.0, 0.5, 1.0])

    def step(key, log_weights, threshold):
        k_inc, k_res = jax.random.split(key)
        log_weights = log_weights + 2.0 * jax.random.normal(k_inc, log_weights.shape)
        result = maybe_resample(k_res, log_weights, threshold)
        log_weights = jnp.where(result.resampled, 0.0, log_weights[result.ancestors])
        return log_weights, result

    def run(key, threshold):
        def body(carry):
            i, lw, count = carry
            lw, result = step(jax.random.fold_in(key, i), lw, threshold)
            return i + 1, lw, count + result.resampled

        init = (0, jnp.zeros(N), 0)
        return jax.lax.while_loop(lambda c: c[0] < steps, body, init)[1:]

    keys = jax.random.split(jax.random.key(12), batch)
    lw_batched, counts = jax.jit(jax.vmap(run))(keys, thresholds)
    for b in range(batch):
        lw, count = jnp.zeros(N), 0
        for i in range(steps):
            lw, result = step(jax.random.fold_in(keys[b], i), lw, thresholds[b])
            count += int(result.resampled)
        np.testing.assert_allclose(lw_batched[b], lw, rtol=1e-6)
        assert int(counts[b]) == count
    assert int(counts[0]) == 0 and int(counts[2]) == steps


# --- registry --------------------------------------------------------------------------------


def test_registry():
    assert available_resamplers() == SCHEMES
    assert set(RESAMPLERS) == set(SCHEMES)
    assert get_resampler("systematic") is systematic and get_resampler("residual") is residual
    assert get_resampler("stratified") is stratified and get_resampler("multinomial") is multinomial
    message = (
        "unknown resampler 'foo'; choose one of: "
        "multinomial, residual, stratified, systematic"
    )
    with pytest.raises(ValueError) as info:
        get_resampler("foo")
    assert str(info.value) == message
    with pytest.raises(TypeError):
        get_resampler(3)


def test_public_api_exported():
    for name in resample.__all__:
        assert hasattr(resample, name)
    assert math.isfinite(float(ess(np.zeros(3))))
