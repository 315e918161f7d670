"""`smcsd.decode(method="smc")`: SMC speculative decoding.

What is checked, and against what:
- finite-N correctness with one cycle: the output law of SMC-SD with N particles and no resampling
  in between is the sampling-importance-resampling law L_N(y) = Q(y)·E[N w(y) / (w(y) + S_{N-1})]
  (Q the proposal law of x_0 ~ p_T, drafts ~ q, bonus ~ p_T; w the importance weight; S_{N-1} a
  sum of N-1 i.i.d. weights). Q and w are enumerated exactly from the toy models' full-sequence
  logits and the expectation over S is a 10^5-draw Monte Carlo average, so each run is checked
  with a chi-square test against its own exact finite-N law — including EOS, truncation at
  max_new_tokens and alpha != 1 (which make the weighting conventions observable);
- consistency: TV to the exact target falls as N = 1, 4, 16, 64 grows and is small at N = 64;
- with resampling between cycles: the output matches an independent NumPy implementation of the
  algorithm on the enumerated distributions (two-sample chi-square);
- unbiased evidence E[exp(log Ẑ)] = 1 at alpha = 1; particle moves under resampling (caches,
  pending tokens, feeds) against full-sequence forwards; counted target calls; tau = 0 / 1; N = 1;
  temperature 0; -inf weights under top-k; stats; bad input.
A broken weight (forgetting -log q) must fail the same chi-square test (test of the test).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

import smcsd
from smcsd.models import forward_cached
from smcsd.runtime import engine
from smcsd.methods import smc as smc_mod
from smcsd.sampling import SamplingParams, process_logits
from toys import chi_square_pvalue, exact_distribution, tiny_pair, total_variation

# Toy pair: tiny_pair() (vocab 6, seed 0). For the prompt (4, 5) the target's 3-token continuations
# have entropy ~1.6 nats, the draft is far from it (TV(Q, p_T) ~0.71 with K = 1) and the second
# moment of the weights is rho = E_Q[w^2] ~ 4.2, so N = 4 is strongly biased (TV(L_4, p_T) ~0.33)
# while N = 64 is nearly exact (TV(L_64, p_T) ~0.01): the N-ladder is informative.
V, PROMPT = 6, (4, 5)
K = 1
LENGTH = 3  # max_new_tokens of the one-cycle tests: x_0 + one cycle (x_1 drafted, bonus)
BATCH = 2000  # requests per decode call (one compiled program per N, shared by all one-cycle tests)
NUM_SAMPLES = 20_000
# With a correct implementation a chi-square p-value is Uniform(0, 1): P(p < 1e-3) = 1e-3 per test.
# Seeds are fixed, so the outcome is deterministic anyway.
P_MIN = 1e-3
P_BROKEN = 1e-6  # a broken weight must be rejected decisively, not by bad luck
MC_DRAWS = 100_000  # Monte Carlo draws of S_{N-1} for the finite-N law (relative error ~1e-3 per cell)


def _pair():
    return tiny_pair()


# ----------------------------------------------------------------------------- exact reference laws

def _tables(model, prompt, length, temperature=1.0, top_k=0, top_p=1.0):
    """All V**length continuations and log p(.|prompt, y_<t) at each position t: float64[S, length, V]."""
    conts = np.array(list(itertools.product(range(V), repeat=length)), np.int32)
    seqs = np.concatenate([np.broadcast_to(np.asarray(prompt, np.int32), (len(conts), len(prompt))), conts], 1)
    logits = model(jnp.asarray(seqs))[:, len(prompt) - 1:-1]
    logp = process_logits(logits, SamplingParams.make(temperature, top_k, top_p))
    return conts, np.asarray(logp, np.float64)


def _key(tokens, length):
    """Cell of an output padded with V past its end (stop tokens make outputs ragged)."""
    tokens = np.asarray(tokens)
    return (tokens * (V + 1) ** np.arange(length)[::-1]).sum(-1)


def single_cycle_laws(prompt, length, Ns, alpha=1.0, eos=None, seed=0, lq=None):
    """(p_alpha, {N: L_N}) over padded outputs for `length` <= K + 2 (x_0 plus at most one cycle).
    `lq` float64[V**length, length, V]: the drafter's log q at each position of each continuation (default:
    the toy draft model's).

    Proposal per position t: t = 0 and t = K+1 from normalise(p^alpha), 1 <= t <= K from q. Only
    emitted tokens (up to the first `eos`, inclusive) are weighted: draft tokens by p^alpha / q,
    the bonus by Z_alpha (x_0's Z_alpha is common to all particles). Target p_alpha ∝ Q·w.
    """
    target, draft = _pair()
    y, lp = _tables(target, prompt, length)
    if lq is None:
        _, lq = _tables(draft, prompt, length)
    t = np.arange(length)
    from_p = (t == 0) | (t == K + 1)
    la = alpha * lp
    log_z = np.logaddexp.reduce(la, axis=-1)
    la_y = np.take_along_axis(la, y[..., None], -1)[..., 0]
    lq_y = np.take_along_axis(lq, y[..., None], -1)[..., 0]
    log_q = np.where(from_p, la_y - log_z, lq_y).sum(1)
    stop_len = np.full(len(y), length)
    if eos is not None:
        hit = y == eos
        stop_len = np.where(hit.any(1), hit.argmax(1) + 1, length)
    emitted = t[None] < stop_len[:, None]
    log_w = (np.where(emitted & ~from_p, la_y - lq_y, 0.0).sum(1)
             + np.where(emitted & from_p & (t >= 1), log_z, 0.0).sum(1))
    cells = _key(np.where(emitted, y, V), length)
    Q = np.exp(log_q)
    Q /= Q.sum()
    w = np.exp(log_w - log_w.max())
    ncell = (V + 1) ** length
    target_law = np.bincount(cells, Q * w, minlength=ncell)
    target_law /= target_law.sum()
    rng = np.random.default_rng(seed)
    laws = {}
    for N in Ns:
        if N == 1:
            f = np.ones(len(y))
        else:
            s = w[rng.choice(len(y), size=(MC_DRAWS, N - 1), p=Q)].sum(1)
            f = np.mean(N * w[:, None] / (w[:, None] + s[None, :]), axis=1)
        law = np.bincount(cells, Q * f, minlength=ncell)
        laws[N] = law / law.sum()
    return target_law, laws


def expected_tv_noise(probs, n):
    """E[TV(empirical of n draws, probs)] ≈ Σ_i E|p̂_i − p_i| / 2 with p̂_i ≈ Normal(p_i, p_i(1−p_i)/n),
    E|Z| = σ·sqrt(2/π): Σ_i sqrt(p_i(1−p_i) / (2πn)). Its standard deviation is at most
    ½·sqrt((1 − 2/π)·Σ_i p_i(1−p_i)/n) <= 0.3/sqrt(n) (cells nearly independent)."""
    probs = np.asarray(probs, np.float64)
    return float(np.sum(np.sqrt(probs * (1 - probs) / (2 * np.pi * n)))), 0.3 / math.sqrt(n)


# ----------------------------------------------------------------------------- decoding helpers

def smc_outputs(N, length, num_samples, seed=0, prompt=PROMPT, draft=None, **kw):
    """`num_samples` outputs (padded with V) of batched requests, and the concatenated raw stats."""
    target, toy_draft = _pair()
    draft = toy_draft if draft is None else draft
    k = kw.pop("num_speculative_tokens", K)
    rows, log_z, flags = [], [], []
    done = 0
    while done < num_samples:
        res = smcsd.decode([list(prompt)] * BATCH, target=target, draft=draft, method="smc", max_new_tokens=length,
                           num_speculative_tokens=k, num_particles=N,
                           seed=seed + done, **{"eos_id": [], **kw})
        for toks in res.tokens:
            rows.append(list(toks) + [V] * (length - len(toks)))
        log_z += res.stats.log_z
        flags += res.stats.all_weights_neg_inf
        done += BATCH
    return np.array(rows), np.array(log_z), np.array(flags)


def counts_of(outputs, length):
    return np.bincount(_key(outputs, length), minlength=(V + 1) ** length)


# ----------------------------------------------------------------------------- finite-N exactness

def test_one_cycle_matches_finite_n_law():
    """N = 4, one cycle (x_0, drafted x_1, bonus): the output law is exactly L_4 (chi-square), which
    is far from both the proposal Q = L_1 and the target (so the test sees the weights)."""
    target_law, laws = single_cycle_laws(PROMPT, LENGTH, [1, 4])
    out, log_z, flags = smc_outputs(4, LENGTH, NUM_SAMPLES, seed=1)
    counts = counts_of(out, LENGTH)
    assert chi_square_pvalue(counts, laws[4]) > P_MIN
    assert chi_square_pvalue(counts, laws[1]) < P_BROKEN
    assert chi_square_pvalue(counts, target_law) < P_BROKEN
    assert np.isfinite(log_z).all() and not flags.any()


def test_n1_is_draft_blocks_plus_bonus():
    """N = 1 has no correction: x_0 ~ p_T, then per cycle K draft tokens from q and one bonus from p_T."""
    _, laws = single_cycle_laws(PROMPT, LENGTH, [1])
    out, _, _ = smc_outputs(1, LENGTH, NUM_SAMPLES, seed=2)
    assert chi_square_pvalue(counts_of(out, LENGTH), laws[1]) > P_MIN


@pytest.mark.parametrize("eos", [2, 3])
def test_eos_weighting(eos):
    """A stop token is absorbing: tokens after it are not emitted and not weighted. Under L_4 token 2
    ends ~11% of outputs early (almost all at the drafted token), token 3 ~43% (~32% at x_0, where
    the particle is done before any cycle); the finite-N law with the EOS convention must fit
    (weighting the unemitted tokens would change L_4)."""
    _, laws = single_cycle_laws(PROMPT, LENGTH, [4], eos=eos)
    out, _, _ = smc_outputs(4, LENGTH, NUM_SAMPLES, seed=3, eos_id=eos)
    stopped_early = np.mean(out[:, -1] == V)
    assert 0.05 < stopped_early < 0.95, stopped_early
    assert chi_square_pvalue(counts_of(out, LENGTH), laws[4]) > P_MIN


@pytest.mark.parametrize("alpha,length", [(0.5, 3), (2.0, 2)])
def test_alpha_weighting(alpha, length):
    """alpha != 1: the bonus is drawn from normalise(p^alpha) and weighted by log Z_alpha only when it
    is emitted. length 3 emits the bonus (Z_alpha counted), length 2 truncates it (not counted)."""
    _, laws = single_cycle_laws(PROMPT, length, [4], alpha=alpha)
    out, log_z, _ = smc_outputs(4, length, NUM_SAMPLES // 2, seed=4, alpha=alpha)
    assert chi_square_pvalue(counts_of(out, length), laws[4]) > P_MIN
    assert np.isfinite(log_z).all()


@pytest.fixture
def forget_log_q(monkeypatch):
    """A broken weight increment (alpha·log p, without − log q), compiled into a fresh compile cache."""
    engine.clear_compile_cache()
    monkeypatch.setattr(smc_mod, "weight_increment", lambda lp, lq, alpha: smc_mod.tempered_logp(lp, alpha))
    yield
    monkeypatch.undo()
    engine.clear_compile_cache()


@pytest.mark.slow
def test_broken_weight_is_detected(forget_log_q):
    """Test of the test: the finite-N chi-square must reject SMC with a wrong weight."""
    _, laws = single_cycle_laws(PROMPT, LENGTH, [4])
    out, _, _ = smc_outputs(4, LENGTH, NUM_SAMPLES, seed=1)
    assert chi_square_pvalue(counts_of(out, LENGTH), laws[4]) < P_BROKEN


# ----------------------------------------------------------------------------- consistency in N

@pytest.mark.slow
def test_consistency_as_n_grows():
    """TV(output, p_T) falls with N = 1, 4, 16, 64 and is small at N = 64; each N fits its own L_N.

    Bound at N = 64: TV(emp, p_T) <= TV(emp, L_64) + TV(L_64, p_T). The first term has mean
    ≈ Σ sqrt(L(1−L)/(2πn)) (~0.0085 here for n = 20 000) and sd <= 0.3/sqrt(n) = 0.0021; the second is
    the SMC bias, computed from the enumerated weights (~0.0097; its Monte Carlo error is < 1e-3).
    So TV <= noise + 4 sd + bias + 0.002 (~0.029) holds with overwhelming probability for a correct
    sampler. Observed: TV ~0.71, 0.33, 0.056, 0.009 for N = 1, 4, 16, 64.
    """
    Ns = (1, 4, 16, 64)
    target_law, laws = single_cycle_laws(PROMPT, LENGTH, Ns)
    tvs = {}
    for N in Ns:
        counts = counts_of(smc_outputs(N, LENGTH, NUM_SAMPLES, seed=10 * N)[0], LENGTH)
        tvs[N] = total_variation(counts, target_law)
        assert chi_square_pvalue(counts, laws[N]) > P_MIN, (N, tvs[N])
    noise, sd = expected_tv_noise(laws[64], NUM_SAMPLES)
    bias = 0.5 * np.abs(laws[64] - target_law).sum()
    # Strictly falling, each step by more than 4 sd of the TV noise.
    assert tvs[1] > tvs[4] + 4 * sd and tvs[4] > tvs[16] + 4 * sd and tvs[16] > tvs[64] + 4 * sd, tvs
    assert tvs[64] < noise + 4 * sd + bias + 0.002, (tvs, noise, bias)
    assert tvs[64] < 0.03, tvs


@pytest.mark.slow
def test_draft_equals_target_is_exact():
    """q = p_T: every weight is 0 (up to float rounding of the two forwards), so the output is p_T
    exactly (chi-square) and ESS = N in every cycle."""
    target, _ = _pair()
    probs = exact_distribution(target, PROMPT, LENGTH)
    out, _, _ = smc_outputs(4, LENGTH, NUM_SAMPLES, seed=5, draft=target)
    counts = np.bincount((out * V ** np.arange(LENGTH)[::-1]).sum(1), minlength=V ** LENGTH)
    assert chi_square_pvalue(counts, probs) > P_MIN
    # max_new_tokens = 5: two cycles (same compiled program as above)
    res = smcsd.decode([list(PROMPT)] * BATCH, target=target, draft=target, method="smc", num_particles=4,
                       num_speculative_tokens=K, max_new_tokens=5, eos_id=[], seed=6)
    ess = np.array(res.stats.ess_per_cycle)
    assert ess.shape == (2, BATCH)
    np.testing.assert_allclose(ess, 4.0, rtol=1e-4)
    assert res.stats.num_resamples == 0
    np.testing.assert_allclose(res.stats.log_z, 0.0, atol=1e-4)


@pytest.mark.slow
def test_greedy_with_stochastic_draft_finds_greedy_path():
    """Temperature 0 with draft = target at draft temperature 1: each particle's drafts are the
    target's argmax with high probability, so SMC keeps the particles on the greedy path; every
    request that is not flagged must output exactly ar's greedy continuation."""
    target, _ = _pair()
    ref = smcsd.decode([list(PROMPT)], target=target, method="ar", max_new_tokens=5, temperature=0.0, eos_id=[])
    res = smcsd.decode([list(PROMPT)] * BATCH, target=target, draft=target, method="smc", num_particles=4,
                       num_speculative_tokens=K, max_new_tokens=5, eos_id=[], seed=9, temperature=0.0,
                       draft_temperature=1.0)
    flags = np.array(res.stats.all_weights_neg_inf)
    assert flags.mean() < 0.5, flags.mean()
    assert all(res.tokens[b] == ref.tokens[0] for b in np.flatnonzero(~flags))
    assert np.all(np.array(res.stats.log_z)[flags] == -np.inf)
    assert not np.isnan(res.stats.log_z).any() and not np.isnan(res.stats.ess_per_cycle).any()


# ----------------------------------------------------------------------------- resampling: NumPy reference

def _reference_smc(N, length, num_runs, tau, scheme, rng):
    """SMC-SD in NumPy on the enumerated tables (no caches, no jax): x_0 ~ p, per cycle K draft tokens
    ~ q weighted by p/q and a bonus ~ p; after each cycle with tokens left to emit, resample when
    ESS < tau·N (tau = 1: always) with `scheme`; output one particle ∝ weight."""
    target, draft = _pair()
    conts, lp = _tables(target, PROMPT, length)
    _, lq = _tables(draft, PROMPT, length)
    p, q = np.exp(lp), np.exp(lq)
    powers = V ** np.arange(length)[::-1]
    y = np.zeros((num_runs, N, length), np.int64)
    log_w = np.zeros((num_runs, N))

    def draw(probs):  # probs [runs, N, V]
        u = rng.random(probs.shape[:2] + (1,))
        return np.minimum((np.cumsum(probs, -1) < u).sum(-1), V - 1)

    for t in range(length):
        row = (y[..., :t] * powers[:t]).sum(-1)  # prefix index, later tokens 0: causal logits ignore them
        from_p = t % (K + 1) == 0
        probs = (p if from_p else q)[row, t]
        tok = draw(probs)
        y[..., t] = tok
        if not from_p:
            log_w += np.log(np.take_along_axis(p[row, t], tok[..., None], -1)[..., 0]) \
                - np.log(np.take_along_axis(q[row, t], tok[..., None], -1)[..., 0])
        if from_p and 1 <= t < length - 1:  # a cycle ended and the particles are still live
            w = np.exp(log_w - log_w.max(1, keepdims=True))
            w /= w.sum(1, keepdims=True)
            ess = 1.0 / (w ** 2).sum(1)
            do = (tau >= 1.0) | (ess < tau * N)
            if scheme == "multinomial":
                pos = rng.random((num_runs, N))
            else:  # systematic
                pos = (rng.random((num_runs, 1)) + np.arange(N)) / N
            anc = np.minimum((np.cumsum(w, 1)[:, None, :] <= pos[..., None]).sum(-1), N - 1)
            anc = np.where(do[:, None], anc, np.arange(N))
            y = np.take_along_axis(y, anc[..., None], 1)
            log_w = np.where(do[:, None], 0.0, log_w)
    w = np.exp(log_w - log_w.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    pick = (np.cumsum(w, 1) <= rng.random((num_runs, 1))).sum(1).clip(0, N - 1)
    return y[np.arange(num_runs), pick]


def _homogeneity_pvalue(a, b, min_expected=5.0):
    """Two-sample chi-square (contingency) test on two count vectors; sparse cells pooled."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    total = a + b
    exp_small = total * min(a.sum(), b.sum()) / total.sum()
    big = exp_small >= min_expected
    table = np.array([np.append(a[big], a[~big].sum()), np.append(b[big], b[~big].sum())])
    table = table[:, table.sum(0) > 0]
    return float(sps.chi2_contingency(table)[1])


@pytest.mark.slow
@pytest.mark.parametrize("resampler,tau", [("systematic", 1.0), ("multinomial", 0.9)])
def test_resampling_matches_numpy_reference(resampler, tau):
    """Two cycles with resampling in between (max_new_tokens = 5, K = 1, N = 4): the output law equals
    that of an independent NumPy implementation (100 000 runs) — wrong cache/pending-token moves or
    wrong ancestor weights change the joint law of the tokens across the resampling boundary."""
    length, N = 5, 4
    out, _, _ = smc_outputs(N, length, NUM_SAMPLES, seed=7, ess_threshold=tau, resampler=resampler)
    ref = _reference_smc(N, length, 100_000, tau, resampler, np.random.default_rng(7))
    cells = V ** length
    powers = V ** np.arange(length)[::-1]
    a = np.bincount((out * powers).sum(1), minlength=cells)
    b = np.bincount((ref * powers).sum(1), minlength=cells)
    assert _homogeneity_pvalue(a, b) > P_MIN
    # and the reference is not trivially equal to the no-resampling (tau = 0) law
    ref0 = _reference_smc(N, length, 100_000, 0.0, resampler, np.random.default_rng(8))
    assert _homogeneity_pvalue(a, np.bincount((ref0 * powers).sum(1), minlength=cells)) < P_MIN


# ----------------------------------------------------------------------------- evidence

# Ẑ is a product of importance weights, heavy-tailed when q is far from p_T: for PROMPT at draft
# temperature 1 and two cycles, E[w^2] ~ 3e3 with half of E[w] = 1 carried by events of probability
# ~7e-5, so a mean of 6000 estimates typically reads ~0.6. The evidence tests use prompt (4, 2) at
# draft temperature 2 instead (same compiled programs): E[w^2] ~ 9.6, E[w^4] ~ 2e4, and a NumPy
# simulation of the N = 1 and N = 4 (tau = 0) estimators never failed the 4-se check in 300 repeats.
EVIDENCE_PROMPT, EVIDENCE_DRAFT_T = (4, 2), 2.0


def _check_unbiased(N, tau, runs):
    _, log_z, flags = smc_outputs(N, 5, runs, seed=100 * N + int(10 * tau), prompt=EVIDENCE_PROMPT,
                                  draft_temperature=EVIDENCE_DRAFT_T, ess_threshold=tau)
    z = np.exp(log_z)
    assert np.isfinite(z).all() and not flags.any()
    mean, se = z.mean(), z.std(ddof=1) / math.sqrt(len(z))
    # The mean of `runs` i.i.d. estimates is ~Normal(1, se^2): |mean − 1| < 4 se fails w.p. 6e-5.
    assert abs(mean - 1.0) < 4 * se, (N, tau, mean, se)
    return mean, se


@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0])
def test_evidence_unbiased(tau):
    """alpha = 1 targets the normalised p_T, so E[Ẑ] = 1 (two cycles, resampling between them; the
    ESS-adaptive decision keeps Ẑ a martingale, so it stays unbiased)."""
    _check_unbiased(4, tau, 6000)


@pytest.mark.slow
@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_evidence_unbiased_more_n(tau):
    """Unbiased for N = 1, 16, 64 too, and the standard error falls with N (Var Ẑ ~ 1/N: a factor ~8
    from N = 1 to 64; require 3)."""
    se = {N: _check_unbiased(N, tau, 6000)[1] for N in (1, 16, 64)}
    assert se[64] < se[16] < se[1] and se[64] < se[1] / 3, se


# ----------------------------------------------------------------------------- small-batch program

PROMPTS = [[1, 2, 3], [4, 5, 1], [0, 3, 2], [2, 2, 5], [5, 1, 0], [3, 4, 4], [1, 0, 5], [2, 4, 3]]
KA, NA, CYCLES = 2, 4, 3
M_FULL = 1 + CYCLES * (KA + 1)  # 10: three full cycles


def _small(**kw):
    target, draft = _pair()
    args = dict(target=target, draft=draft, method="smc", num_speculative_tokens=KA, num_particles=NA,
                max_new_tokens=M_FULL, eos_id=[], seed=0, select="argmax", return_particles=True)
    args.update(kw)
    return smcsd.decode(PROMPTS, **args)


def test_one_target_call_per_cycle(monkeypatch):
    """Trace one cycle and count the target forwards in it; then the counted stats of a run with
    max_new_tokens = 1 + c·(K+1): c target calls, K+1 tokens per target call per request."""
    target, draft = _pair()
    calls = []

    def counting(config, *a, **k):
        calls.append(config)
        return forward_cached(config, *a, **k)

    spec = engine.StaticSpec(method="smc", batch=2, prompt_len=8, cache_len=16, out_len=12, num_stop=1,
                             num_speculative_tokens=KA, num_particles=NA)
    init, cycle, _ = smc_mod.program_parts(target.config, draft.config, spec)
    inp = _inputs(PROMPTS[:2], ess_threshold=1.0)
    state = jax.eval_shape(lambda: init(target.params, draft.params, inp))
    monkeypatch.setattr(engine, "forward_cached", counting)  # the target's verification call (engine.verify_call)
    jax.make_jaxpr(lambda s: cycle(target.params, draft.params, inp, s))(state)
    assert [c == target.config for c in calls] == [True]

    st = _small(ess_threshold=0.5).stats
    assert st.num_target_calls == CYCLES
    assert st.tokens_per_target_call == KA + 1
    assert st.num_draft_calls == KA * CYCLES
    rows = len(PROMPTS) * NA
    assert st.num_drafts == rows * CYCLES and st.num_draft_tokens == KA * rows * CYCLES
    assert st.num_accepted_tokens == st.num_draft_tokens and st.acceptance_rate == 1.0
    assert st.accepted_per_position == [rows * CYCLES] * KA
    assert st.mean_acceptance_length == KA + 1
    assert np.array(st.ess_per_cycle).shape == (CYCLES, len(PROMPTS))


def test_truncated_last_cycle_stats():
    """max_new_tokens = 8 = 1 + 2·3 + 1: the third cycle emits only its first draft token."""
    res = _small(max_new_tokens=8)
    rows = len(PROMPTS) * NA
    assert [len(t) for t in res.tokens] == [8] * len(PROMPTS)
    assert all(len(p) == 8 for ps in res.particles for p in ps)
    assert res.stats.num_target_calls == 3
    assert res.stats.accepted_per_position == [3 * rows, 2 * rows]
    assert res.stats.num_draft_tokens == KA * 3 * rows


def test_tau_zero_never_tau_one_always():
    never = _small(ess_threshold=0.0).stats
    assert never.num_resamples == 0 and not np.any(never.resampled_per_cycle)
    always = _small(ess_threshold=1.0).stats
    # Every cycle after which a request still has tokens to emit resamples; the last cycle does not
    # (the output is drawn ∝ weight instead, the same law with less variance).
    assert np.all(np.array(always.resampled_per_cycle)[:-1]) and not np.any(always.resampled_per_cycle[-1])
    assert always.num_resamples == (CYCLES - 1) * len(PROMPTS)
    for st in (never, always):
        assert np.all(np.isfinite(st.log_z)) and not np.any(st.all_weights_neg_inf)
        ess = np.array(st.ess_per_cycle)
        assert np.all((ess >= 1 - 1e-4) & (ess <= NA + 1e-4))


def test_run_summary_stats_ess_fraction_and_resample_rate():
    """mean ESS/N and the resampling rate are the per-cycle buffers averaged over each request's live cycles."""
    for tau in (0.0, 0.5, 1.0):
        st = _small(ess_threshold=tau).stats
        ess, res = np.array(st.ess_per_cycle), np.array(st.resampled_per_cycle)
        calls = st.target_calls_per_request
        assert st.num_particles == NA and len(calls) == len(PROMPTS)
        want = np.concatenate([ess[:c, b] for b, c in enumerate(calls)]).mean() / NA
        assert abs(st.mean_ess_fraction - want) < 1e-9 and 1 / NA - 1e-6 <= st.mean_ess_fraction <= 1 + 1e-6
        assert abs(st.resample_rate - np.concatenate([res[:c, b] for b, c in enumerate(calls)]).mean()) < 1e-12
        d = st.to_dict()
        assert d["mean_ess_fraction"] == st.mean_ess_fraction and len(d["ess_fraction_per_request"]) == len(PROMPTS)
        assert "ESS/N" in st.summary()
        if tau == 0.0:
            assert st.resample_rate == 0.0
    ar = smcsd.decode([1, 2, 3], target=_pair()[0], max_new_tokens=3).stats
    assert math.isnan(ar.mean_ess_fraction) and math.isnan(ar.resample_rate) and "ESS/N" not in ar.summary()


def test_argmax_select_and_particles():
    res = _small(ess_threshold=0.5)
    lw = np.asarray(res.log_weights)
    assert lw.shape == (len(PROMPTS), NA) and not np.isnan(lw).any()
    for b in range(len(PROMPTS)):
        assert res.tokens[b] == res.particles[b][int(np.argmax(lw[b]))]
    # log Ẑ: the final logsumexp is included, so with tau = 0 (no resampling) log Ẑ = lse(ℓ) − log N.
    res0 = _small(ess_threshold=0.0)
    lw0 = np.asarray(res0.log_weights, np.float64)
    expected = np.logaddexp.reduce(lw0, axis=1) - math.log(NA)
    np.testing.assert_allclose(res0.stats.log_z, expected, rtol=1e-5, atol=1e-5)


def test_greedy():
    """Temperature 0: p_T is one-hot, so a particle keeps a finite weight iff its drafts are the
    target's argmax. Unflagged requests must equal ar's greedy output; nothing is NaN. (This toy
    draft rarely agrees with the target 6 times in a row, so most requests collapse and are flagged;
    the slow test below uses a draft that often agrees.)"""
    target, _ = _pair()
    ref = smcsd.decode(PROMPTS, target=target, method="ar", max_new_tokens=M_FULL, temperature=0.0, eos_id=[])
    for draft_temperature in (0.0, 1.0):
        res = _small(temperature=0.0, draft_temperature=draft_temperature, ess_threshold=0.5)
        flags = np.array(res.stats.all_weights_neg_inf)
        lw = np.asarray(res.log_weights)
        assert not np.isnan(lw).any() and not np.isnan(res.stats.log_z).any()
        assert not np.isnan(np.array(res.stats.ess_per_cycle)).any()
        if draft_temperature == 0.0:  # q one-hot too: weights are 0 (all drafts right) or −inf
            assert set(np.unique(lw[np.isfinite(lw)]).tolist()) <= {0.0}
        for b in range(len(PROMPTS)):
            if not flags[b]:
                assert res.tokens[b] == ref.tokens[b], (draft_temperature, b)
            else:
                assert res.stats.log_z[b] == -np.inf


def test_top_k_zero_probability_drafts():
    """top_k = 4: a draft token outside the target's top 4 has p_T = 0, so its particle gets ℓ = −inf;
    such particles are never selected; fully −inf requests are flagged; never NaN."""
    target, _ = _pair()
    # top_k = 2 kills every particle of almost every request (all 8 dead for most seeds, with the old
    # sampler as with this one), leaving the live branch untested; top_k = 4 kills some of each.
    res = _small(top_k=4, ess_threshold=0.0)
    lw = np.asarray(res.log_weights)
    flags = np.array(res.stats.all_weights_neg_inf)
    assert np.isneginf(lw).any() and not np.isnan(lw).any()
    assert not np.isnan(res.stats.log_z).any()
    for b in range(len(PROMPTS)):
        dead = np.all(np.isneginf(lw[b]))
        assert flags[b] == dead  # tau = 0: weights only ever accumulate
        assert (res.stats.log_z[b] == -np.inf) == dead
        if not dead:
            assert np.isfinite(lw[b, int(np.argmax(lw[b]))])
            # the output has positive target probability under top-k = 4
            seq = PROMPTS[b] + res.tokens[b]
            logp = process_logits(target(jnp.asarray([seq]))[0, len(PROMPTS[b]) - 1:-1],
                                  SamplingParams.make(1.0, 4, 1.0))
            assert np.isfinite(np.take_along_axis(np.asarray(logp), np.array(res.tokens[b])[:, None], 1)).all()
    assert not flags.all()


@pytest.mark.slow
def test_top_k_target_is_reached_as_n_grows():
    """With top-k, smc still converges to p_T: its draft proposes untruncated, so q covers p_T's support.

    (A draft truncated by the same top-k leaves outputs unreachable; on this toy their p_T mass is 0.086,
    where smc's TV used to plateau.) Bound: the exact samplers' noise floor here is E[TV] ~0.005 with
    sd ~0.002 for n = 20 000 (experiments/studies/exactness.py computes both), plus an SMC bias at N = 64 of
    ~0.01 (as in the temperature-1 case above): 0.03 leaves > 5 sd of room and is far below 0.086.
    """
    from toys import exact_distribution, sample_counts, tiny_pair
    target, draft = tiny_pair()
    probs = exact_distribution(target, [4, 5], 3, temperature=0.7, top_k=3)
    counts = sample_counts("smc", target, draft, [4, 5], 3, 20000, batch=500, temperature=0.7, top_k=3,
                           num_particles=64, num_speculative_tokens=1)
    assert total_variation(counts, probs) < 0.03


# ----------------------------------------------------------------------------- particle moves

def _inputs(prompts, **kw):
    width = 8
    arr = np.zeros((len(prompts), width), np.int32)
    for b, p in enumerate(prompts):
        arr[b, :len(p)] = p
    args = dict(prompt=jnp.asarray(arr), prompt_len=jnp.asarray([len(p) for p in prompts], jnp.int32),
                key=jax.random.PRNGKey(3), sampling=SamplingParams.make(1.0), draft_sampling=SamplingParams.make(1.0),
                max_new_tokens=jnp.asarray(M_FULL, jnp.int32), stop_ids=jnp.asarray([-1], jnp.int32),
                ess_threshold=jnp.asarray(1.0, jnp.float32), alpha=jnp.asarray(1.0, jnp.float32))
    args.update({k: jnp.asarray(v, jnp.float32) for k, v in kw.items()})
    return engine.ProgramInputs(**args)


@pytest.mark.slow  # default-run budget
def test_resampling_moves_whole_particles():
    """After cycles with resampling (tau = 1), every particle's target cache + pending token and draft
    cache + feed reproduce the full-sequence logits of its own token sequence (prompt + emitted
    tokens) — so caches, pending tokens and feeds moved with the tokens. The same cycle without
    resampling (tau = 0, same key) gives the pre-resampling particles: the moved rows are exactly
    those rows gathered by the recorded ancestors."""
    target, draft = _pair()
    prompts = PROMPTS[:3]
    B = len(prompts)
    spec = engine.StaticSpec(method="smc", batch=B, prompt_len=8, cache_len=16, out_len=12, num_stop=1,
                             num_speculative_tokens=KA, num_particles=NA)
    init, cycle, _ = smc_mod.program_parts(target.config, draft.config, spec)
    init = jax.jit(init)
    cycle = jax.jit(cycle)
    resampling, fixed = _inputs(prompts, ess_threshold=1.0), _inputs(prompts, ess_threshold=0.0)
    state = init(target.params, draft.params, resampling)
    for c in range(2):
        before = cycle(target.params, draft.params, fixed, state)
        state = cycle(target.params, draft.params, resampling, state)
        anc = np.asarray(state.ancestors)
        assert np.all(np.asarray(state.resampled)[c])
        assert not np.array_equal(anc, np.arange(B * NA)), "choose a key where resampling permutes"
        assert np.all(anc // NA == np.arange(B * NA) // NA)  # ancestors stay within their request
        np.testing.assert_array_equal(np.asarray(state.out), np.asarray(before.out)[anc])
        np.testing.assert_array_equal(np.asarray(state.pending), np.asarray(before.pending)[anc])
        np.testing.assert_array_equal(np.asarray(state.log_w), 0.0)
        _check_particles_consistent(target, draft, prompts, state)


def _check_particles_consistent(target, draft, prompts, state):
    n = np.asarray(state.n)
    out = np.asarray(state.out)
    assert np.all(n == n[0])
    P = len(prompts[0])
    seqs = np.array([prompts[r // NA] + out[r, :n[r]].tolist() for r in range(len(n))])
    np.testing.assert_array_equal(np.asarray(state.pending), out[:, n[0] - 1])
    np.testing.assert_array_equal(np.asarray(state.feed), out[:, n[0] - 2:n[0]])
    np.testing.assert_array_equal(np.asarray(state.cache_t.lengths), P + n - 1)
    np.testing.assert_array_equal(np.asarray(state.cache_d.lengths), P + n - 2)
    t_logits, _ = forward_cached(target.config, target.params, state.pending[:, None], state.cache_t)
    d_logits, _ = forward_cached(draft.config, draft.params, state.feed, state.cache_d, num_valid=state.feed_count)
    np.testing.assert_allclose(np.asarray(t_logits[:, 0]), np.asarray(target(seqs)[:, -1]), atol=1e-4)
    np.testing.assert_allclose(np.asarray(d_logits[:, 1]), np.asarray(draft(seqs)[:, -1]), atol=1e-4)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kw,exc,match", [
    (dict(num_particles=0), ValueError, "num_particles"),
    (dict(num_particles=2.5), TypeError, "num_particles"),
    (dict(num_speculative_tokens=0), ValueError, "num_speculative_tokens"),
    (dict(ess_threshold=-0.1), ValueError, "ess_threshold"),
    (dict(ess_threshold=1.5), ValueError, "ess_threshold"),
    (dict(ess_threshold=float("nan")), ValueError, "ess_threshold"),
    (dict(alpha=0.0), ValueError, "alpha"),
    (dict(alpha=-1.0), ValueError, "alpha"),
    (dict(alpha=float("inf")), ValueError, "alpha"),
    (dict(resampler="bogus"), ValueError, "resampler.*systematic"),
    (dict(select="bogus"), ValueError, "select"),
    (dict(draft=None), ValueError, "draft"),
])
def test_bad_input(kw, exc, match):
    target, draft = _pair()
    args = dict(target=target, draft=draft, method="smc", max_new_tokens=4)
    args.update(kw)
    with pytest.raises(exc, match=match):
        smcsd.decode([1, 2], **args)


def test_registered():
    mdef = engine.METHODS["smc"]
    assert "smc" in smcsd.available_methods() and mdef.needs_draft and not mdef.exact
    assert mdef.headroom(3, 8) >= 2  # last cycle may write K tokens past max_new_tokens
