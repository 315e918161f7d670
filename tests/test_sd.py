"""The exact speculative methods `sd` and `sd-multi`: exactness by enumeration (chi-square against the
enumerated p_T, and a deliberately broken acceptance rule that the same test must reject), greedy
token identity with `ar`, the draft = target limit, multi-draft acceptance gain, EOS and bad input."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import ByteTokenizer, init_model
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

# Toy pair for enumeration: vocab 6, seed 2, prompt [0, 1] has a spread-out p_T over the 6**3 = 216
# continuations (entropy ~2.9 nats; 13 outcomes with mass > 5e-4 remain at top_p = 0.8, 20 at
# temperature 0.7 / top_k 3), and the draft is far from it (sequence-level TV ~0.9), so both the
# accept and the residual branches are exercised heavily.
V, SEED, PROMPT, LENGTH = 6, 2, (0, 1), 3
K, N = 2, 3
NUM_SAMPLES = 20_000
BATCH = 5_000
# With a correct sampler the p-value is Uniform(0, 1), so one test falsely fails with probability
# 1e-3 (about 1% over the ~8 calls here); the seeds are fixed, so the outcome is deterministic anyway.
P_MIN = 1e-3
# The broken sampler's p-value must be astronomically small, not merely unlucky: 1e-6.
P_BROKEN = 1e-6

SETTINGS = {
    "t1": dict(temperature=1.0),
    "t07_topk3": dict(temperature=0.7, top_k=3),
    "topp08": dict(temperature=1.0, top_p=0.8),
}


def noisy_copy(model, scale: float, seed: int, name: str = "noisy"):
    """The model with each weight matrix perturbed by `scale` x its own std of Gaussian noise: a
    draft genuinely related to the target (acceptance strictly between 0 and 1)."""
    leaves, tree = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return type(model)(config=model.config, params=jax.tree_util.tree_unflatten(tree, noisy),
                       tokenizer=model.tokenizer, name=name)


def _exactness(method, setting, seed=0, draft=None, **kw):
    target, toy_draft = tiny_pair(V, SEED)
    draft = toy_draft if draft is None else draft
    params = SETTINGS[setting]
    counts = sample_counts(method, target, draft, PROMPT, LENGTH, NUM_SAMPLES, batch=BATCH, seed=seed,
                           num_speculative_tokens=K, num_particles=N, **params, **kw)
    probs = exact_distribution(target, PROMPT, LENGTH, **params)
    return chi_square_pvalue(counts, probs), total_variation(counts, probs)


# ----------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("method,setting", [pytest.param(m, st, marks=pytest.mark.slow) if (m, st) == ("sd-multi", "t1")
                                            else (m, st) for st in SETTINGS for m in ("sd", "sd-multi")])
def test_exact_distribution(method, setting):  # sd-multi at t1 runs with -m slow (default-run budget)
    pvalue, tv = _exactness(method, setting, seed=1000)
    assert pvalue > P_MIN, f"{method} {setting}: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # two extra compiles (the target as draft); `-m "not slow"` skips it
@pytest.mark.parametrize("method", ["sd", "sd-multi"])
def test_exact_with_close_draft(method):
    """The target itself as draft, at draft temperature 1.4: acceptance is high, so whole blocks are
    accepted (the 2-token draft feed path) and sd-multi's drafts often coincide (duplicate children)."""
    target, _ = tiny_pair(V, SEED)
    pvalue, tv = _exactness(method, "t1", seed=2000, draft=target, draft_temperature=1.4)
    assert pvalue > P_MIN, f"{method}: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.parametrize("method", ["sd", pytest.param("sd-multi", marks=pytest.mark.slow)])
def test_broken_acceptance_is_detected(method, accept_always):
    """Test of the test: the same chi-square check must reject an inexact sampler."""
    pvalue, tv = _exactness(method, "t1", seed=1000)
    assert pvalue < P_BROKEN, f"{method} with accept-always passed the exactness test (p={pvalue:.2e}, TV={tv:.4f})"


# ----------------------------------------------------------------------------- greedy identity
# Compilation dominates the run time here, so the tests below share static shapes on purpose: the
# greedy, EOS and draft = target tests all use the same 3 prompts, max_new_tokens 20 or 21 (same
# cache/output buckets), K in {1, 4}, num_particles 3 and one stop-id slot, so each (method, K)
# compiles once; likewise the multi-draft and EOS tests on the toy pair share one program per method.

@pytest.fixture(scope="module")
def byte_pair():
    """A small random byte-level target (vocab 259; init_std 0.6 gives peaked logits, so argmax ties
    that float reassociation could flip are implausible, and predictions that depend strongly on the
    context, so a draft cache holding the wrong context shows) and a noisy copy of it as draft."""
    tok = ByteTokenizer()
    cfg = tiny_config(259, hidden=32, layers=2, heads=4, kv_heads=2, max_pos=96)
    target = init_model(cfg, 3, tokenizer=tok, init_std=0.6, name="byte-target")
    return target, noisy_copy(target, 0.05, 4, name="byte-draft")


PROMPTS = ["Hi", "speculative decoding", "a longer ragged prompt, ok?"]
GREEDY_KS = [1, 4]
AR_MAX_NEW = 24  # every ar reference decodes 24 tokens (one compile) and is trimmed as needed


def _ar_greedy(target, max_new, eos_id=()):
    res = smcsd.decode(PROMPTS, target=target, method="ar", max_new_tokens=AR_MAX_NEW, temperature=0.0,
                       eos_id=list(eos_id))
    return [t[:max_new] for t in res.tokens]


@pytest.mark.parametrize("num_speculative_tokens", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_greedy_matches_ar(byte_pair, num_speculative_tokens):
    target, draft = byte_pair
    kw = dict(target=target, max_new_tokens=20, temperature=0.0, eos_id=[])
    ref = _ar_greedy(target, 20)
    for method in ("sd", "sd-multi"):
        # draft_temperature 1: the N drafts of sd-multi differ, so the winner's caches matter.
        for draft_temperature in (0.0, 1.0):
            res = smcsd.decode(PROMPTS, draft=draft, method=method, num_speculative_tokens=num_speculative_tokens,
                               num_particles=3, draft_temperature=draft_temperature, **kw)
            assert res.tokens == ref, (method, draft_temperature)
            # The noisy draft must agree sometimes and not always, else the comparison is weak.
            assert 0.0 < res.stats.acceptance_rate < 1.0, (method, draft_temperature, res.stats.acceptance_rate)


@pytest.mark.slow  # default-run budget (test_eos_and_max_new_tokens covers EOS in the default run)
def test_greedy_eos_matches_ar(byte_pair):
    """With a stop token, greedy outputs still equal ar's, cut at (and including) the first stop."""
    target, draft = byte_pair
    stop = _ar_greedy(target, 20)[0][3]  # the 4th greedy token of request 0: it must cut that output early
    kw = dict(target=target, max_new_tokens=20, temperature=0.0, eos_id=[stop])
    ar_stop = _ar_greedy(target, 20, [stop])
    assert len(ar_stop[0]) <= 4 and ar_stop[0][-1] == stop
    for method in ("sd", "sd-multi"):
        for Kd in GREEDY_KS:
            res = smcsd.decode(PROMPTS, draft=draft, method=method, num_speculative_tokens=Kd, num_particles=3, **kw)
            assert res.tokens == ar_stop, (method, Kd)


# ----------------------------------------------------------------------------- draft = target

@pytest.mark.parametrize("method,num_speculative_tokens", [
    (m, k) if (m, k) != ("sd-multi", 4) else pytest.param(m, k, marks=pytest.mark.slow)  # default-run budget
    for m in ("sd", "sd-multi") for k in GREEDY_KS])
def test_draft_equals_target(byte_pair, method, num_speculative_tokens):
    target, _ = byte_pair
    Kd = num_speculative_tokens
    cycles = 20 // (Kd + 1)  # max_new_tokens = 1 + cycles (K+1) = 21 for K = 1 and K = 4: nothing truncated
    max_new = 1 + cycles * (Kd + 1)
    res = smcsd.decode(PROMPTS, target=target, draft=target, method=method, num_speculative_tokens=Kd,
                       num_particles=3, max_new_tokens=max_new, temperature=1.0, eos_id=[], seed=5)
    st = res.stats
    assert [len(t) for t in res.tokens] == [max_new] * len(PROMPTS)
    # p and q agree up to float rounding (~1e-6), so a rejection has probability ~1e-6 per token.
    assert st.acceptance_rate == pytest.approx(1.0, abs=1e-9)
    assert st.tokens_per_target_call == pytest.approx(Kd + 1)
    assert st.mean_acceptance_length == pytest.approx(Kd + 1)
    assert st.num_target_calls == cycles
    assert st.num_drafts == cycles * len(PROMPTS)
    assert st.num_draft_tokens == Kd * st.num_drafts
    assert st.accepted_per_position == [st.num_drafts] * Kd


# ----------------------------------------------------------------------------- draft cache bookkeeping

def _accepted_law(a, start, max_new, K, Nd):
    """Mean and variance of a request's total accepted draft tokens when the target is greedy (p is a
    point mass on the greedy token g_t) and each draft proposes g_t with probability a[t]
    independently: a depth is accepted iff one of the m surviving drafts has g_t, and the survivors
    are those that had it (m' ~ Binomial(m, a) given m' >= 1). Exact dynamic program over
    (tokens emitted, accepted so far); a cycle starting with j tokens emitted drafts g_j..g_{j+K-1}."""
    from collections import defaultdict
    from scipy.stats import binom

    def cycle(j):  # law of the number n of accepted tokens in one cycle
        law, alive = np.zeros(K + 1), {Nd: 1.0}
        for k in range(K):
            nxt = defaultdict(float)
            for m, pm in alive.items():
                law[k] += pm * (1 - a[j + k]) ** m
                for m2 in range(1, m + 1):
                    nxt[m2] += pm * binom.pmf(m2, m, a[j + k])
            alive = nxt
        law[K] = sum(alive.values())
        return law

    states, final = {(start, 0): 1.0}, defaultdict(float)
    while states:
        nxt = defaultdict(float)
        for (j, acc), pr in states.items():
            if j >= max_new:
                final[acc] += pr
                continue
            for n, pn in enumerate(cycle(j)):
                nxt[(j + n + 1, acc + n)] += pr * pn
        states = nxt
    vals, probs = np.array(list(final)), np.array(list(final.values()))
    mean = (vals * probs).sum()
    return mean, (vals ** 2 * probs).sum() - mean ** 2


@pytest.mark.parametrize("method, num_speculative_tokens", [
    (m, k) if (m, k) != ("sd-multi", 4) else pytest.param(m, k, marks=pytest.mark.slow)  # default-run budget
    for m in ("sd", "sd-multi") for k in GREEDY_KS])
def test_draft_cache_bookkeeping(byte_pair, method, num_speculative_tokens):
    """Draft-cache rollback errors never change the output law (only q's context), so check them by
    the acceptance count: draft = target at draft temperature 1 under a greedy target. Each draft
    token is accepted iff it equals the greedy token, with probability a_t = q(g_t | g_<t) computed
    here from a full (cache-free) forward; a draft cache with a wrong context (e.g. a missing x_K
    after a full accept, or a bad rollback after a rejection) makes the count far lower. K = 1 takes
    the full-accept path (2-token feed) often, K = 4 mostly rolls back mid-block."""
    target, _ = byte_pair
    Kd, Nd, max_new, runs = num_speculative_tokens, 3, 20, 10
    greedy = _ar_greedy(target, max_new + Kd)  # drafts may run K - 1 tokens past max_new
    mean = var = 0.0
    for prompt, g in zip(PROMPTS, greedy):
        ids = target.tokenizer.encode(prompt)
        logits = target(np.array([ids + g]))[0, len(ids) - 1:-1]  # predictions of g_0 .. g_{last}
        q = jnp.exp(smcsd.process_logits(logits, smcsd.SamplingParams.make(1.0)))
        a = np.asarray(jnp.take_along_axis(q, jnp.asarray(g)[:, None], axis=-1)[:, 0], np.float64)
        m, v = _accepted_law(a, 1, max_new, Kd, Nd if method == "sd-multi" else 1)
        mean, var = mean + runs * m, var + runs * v
    accepted = 0
    for seed in range(runs):
        res = smcsd.decode(PROMPTS, target=target, draft=target, method=method, num_speculative_tokens=Kd,
                           num_particles=Nd, max_new_tokens=max_new, temperature=0.0, draft_temperature=1.0,
                           eos_id=[], seed=seed)
        assert res.tokens == [g[:max_new] for g in greedy]
        accepted += res.stats.num_accepted_tokens
    # The 3 x 10 request totals are independent: the sum is within 4 standard deviations of its mean
    # (false-alarm rate < 1e-4 by the normal approximation; deterministic with fixed seeds).
    assert abs(accepted - mean) < 4 * math.sqrt(var), (accepted, mean, math.sqrt(var))


# ----------------------------------------------------------------------------- multi-draft gain

TOY_PROMPTS = [[0, 1], [2, 3, 4, 1], [5]]
TOY_REQUESTS = [TOY_PROMPTS[i % 3] for i in range(256)]
TOY_KW = dict(max_new_tokens=16, num_speculative_tokens=3, num_particles=4, temperature=1.0)


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_multi_draft_accepts_more():
    """RRS over N = 4 drafts accepts at least as much as one draft (SpecTr, Sun et al. 2023); here
    the gain is large, so require it to be significant."""
    target, draft = tiny_pair(V, SEED)
    Kd = TOY_KW["num_speculative_tokens"]
    kw = dict(target=target, draft=draft, eos_id=[], **TOY_KW)
    one = smcsd.decode(TOY_REQUESTS, method="sd", seed=11, **kw).stats
    multi = smcsd.decode(TOY_REQUESTS, method="sd-multi", seed=12, **kw).stats
    # Per-cycle acceptance length lies in [1, K+1], so its variance is at most K^2/4 (Popoviciu);
    # the standard error of each mean is at most (K/2)/sqrt(num_drafts) (treating cycles as
    # independent). Require the gain to exceed 3 such standard errors.
    se = math.hypot(Kd / 2 / math.sqrt(one.num_drafts), Kd / 2 / math.sqrt(multi.num_drafts))
    gain = multi.mean_acceptance_length - one.mean_acceptance_length
    assert gain > 3 * se, (one.mean_acceptance_length, multi.mean_acceptance_length, se)


# ----------------------------------------------------------------------------- EOS and lengths

@pytest.mark.parametrize("method", ["sd", pytest.param("sd-multi", marks=pytest.mark.slow)])  # default-run budget
def test_eos_and_max_new_tokens(method):
    target, draft = tiny_pair(V, SEED)
    stop = 1  # about 3/4 of the toy continuations of 16 tokens contain it: both endings occur
    res = smcsd.decode(TOY_REQUESTS, target=target, draft=draft, method=method, eos_id=[stop], seed=3, **TOY_KW)
    max_new = TOY_KW["max_new_tokens"]
    ended_at_stop = 0
    for toks in res.tokens:
        assert 1 <= len(toks) <= max_new
        if stop in toks:
            assert toks.index(stop) == len(toks) - 1, toks  # stops at, and includes, the first stop token
            ended_at_stop += 1
        else:
            assert len(toks) == max_new, toks
    assert 0 < ended_at_stop < len(res.tokens)  # both endings occur, so both branches were checked
    assert res.stats.num_generated_tokens == sum(map(len, res.tokens))


# ----------------------------------------------------------------------------- bad input

def test_bad_inputs():
    target, draft = tiny_pair(V, SEED)  # max_position_embeddings = 64
    kw = dict(target=target, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        smcsd.decode([[0, 1]], draft=draft, method="sd", num_speculative_tokens=0, **kw)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        smcsd.decode([[0, 1]], draft=draft, method="sd", num_speculative_tokens=60, **kw)
    with pytest.raises(ValueError, match="num_particles"):
        smcsd.decode([[0, 1]], draft=draft, method="sd-multi", num_particles=0, **kw)
    for method in ("sd", "sd-multi"):
        with pytest.raises(ValueError, match="needs a draft model"):
            smcsd.decode([[0, 1]], method=method, **kw)
    # Only the config is consulted for the vocabulary check, so a relabelled config suffices.
    other = type(draft)(config=dataclasses.replace(draft.config, vocab_size=V + 1), params=draft.params)
    with pytest.raises(ValueError, match="vocabularies differ"):
        smcsd.decode([[0, 1]], draft=other, method="sd-multi", **kw)
