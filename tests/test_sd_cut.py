"""`sd`'s confidence cut (`SD(confidence_cut=...)`, smcsd/methods/sd.py): each cycle verifies only the first L of its
K drafts, L = the drafts whose cumulative top-1 confidence under the drafter stays >= the cut (0..K; 0 is a plain
target step), in the narrowest of the static call widths that holds every live row's L. The tests: the output law
is still the enumerated p_T (an EAGLE drafter, which reports its temperature-1 confidence, over a reduced
vocabulary; an AR draft at T = 0.7), the cut really varies L across cycles (so every width's
branch is exercised), greedy `sd` with the cut emits `ar`'s tokens, the step-by-step API runs it, and bad values get
clear errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.drafters import DraftVocab, EagleDrafter, Proposal
from smcsd.drafters.base import top1_confidence
from smcsd.methods import SD
from smcsd.methods.sd import confidence_lengths, cut_widths
from smcsd.models import init_model
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2
VOCAB = (0, 2, 3, 5)  # the target puts mass on 1 and 4 too: the drafter never proposes them


def eagle(target, vocab=VOCAB):
    return EagleDrafter.create(target, draft_vocab=DraftVocab.from_ids(vocab, V) if vocab else None, seed=1,
                               init_std=0.5)


def test_confidence_lengths_and_widths():
    """L counts the leading drafts whose running product of confidences stays >= the cut (0 when the first is
    below it); without a reported confidence it reads max q (so a one-hot q, greedy drafting, never cuts)."""
    conf = jnp.log(jnp.asarray([[0.9, 0.9, 0.9], [0.4, 0.9, 0.9], [0.95, 0.5, 1.0]], jnp.float32))
    logq = jnp.zeros((3, 3, 4), jnp.float32)
    prop = Proposal(jnp.zeros((3, 3), jnp.int32), logq, None, conf)
    # cumulative: row 0 .9 .81 .729; row 1 .4 .36 .324; row 2 .95 .475 .475
    assert confidence_lengths(prop, 0.75).tolist() == [2, 0, 1]
    assert confidence_lengths(prop, 0.3).tolist() == [3, 3, 3]
    greedy = Proposal(jnp.zeros((3, 3), jnp.int32), logq, None)  # log q = 0: one-hot at its argmax
    assert confidence_lengths(greedy, 0.9).tolist() == [3, 3, 3]
    assert np.allclose(top1_confidence(jnp.log(jnp.asarray([[0.2, 0.5, 0.3]]))), np.log([0.5]))
    assert cut_widths(1) == (0, 1) and cut_widths(2) == (0, 1, 2) and cut_widths(4) == (0, 1, 2, 4)
    assert cut_widths(6) == (0, 1, 2, 4, 6)


# 0.9 cuts often (0.3-0.5 drafts verified per cycle here, most cycles at width 0 or 1): a cycle that accepted past
# its call's width, reading padded logits, fails it at p ~ 1e-180 (checked by hand); 0.5 cuts about a third.
@pytest.mark.parametrize("cut", [0.9, pytest.param(0.5, marks=pytest.mark.slow)])
def test_cut_sd_is_exact_with_eagle(cut):
    """sd K=2 with a confidence cut and a random EAGLE drafter over 4 of the 6 tokens reproduces the enumerated p_T
    (20k samples, chi-square), and the cut verified some but not all drafts (its 0-, 1- and 2-wide calls ran).
    One request per decode: a batch's call is as wide as its most confident row's L, so only single requests make
    every cycle take its own width (the narrow branches are what this test is for; ~2 ms a decode)."""
    target, _ = tiny_pair(V, SEED)
    d = eagle(target)
    counts = sample_counts(SD(num_speculative_tokens=K, confidence_cut=cut), target, d, PROMPT, LENGTH, 20_000,
                           batch=1, seed=78)
    probs = exact_distribution(target, PROMPT, LENGTH)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (cut, p, total_variation(counts, probs))
    # Verified drafts per cycle strictly between 0 and K: cycles with fewer than K drafts verified ran beside full
    # ones (one request, so each cycle's call had its own L's width).
    res = smcsd.decode([list(PROMPT)], target=target, draft=d, method=SD(num_speculative_tokens=K, confidence_cut=cut),
                       max_new_tokens=48, eos_id=[], seed=5)
    per_cycle = res.stats.num_draft_tokens / res.stats.num_drafts
    assert 0.05 < per_cycle < K - 0.05, per_cycle


@pytest.mark.slow  # default-run budget
def test_cut_sd_is_exact_with_an_ar_draft():
    target, draft = tiny_pair(V, SEED)
    counts = sample_counts("sd", target, draft, PROMPT, LENGTH, 20_000, batch=1, seed=91, num_speculative_tokens=3,
                           confidence_cut=0.5, temperature=0.7)
    probs = exact_distribution(target, PROMPT, LENGTH, temperature=0.7)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (p, total_variation(counts, probs))


def test_greedy_cut_sd_equals_ar_and_steps():
    """At T = 0 sd K=3 with the cut emits ar's tokens over many cycles (a 3-layer toy target, two requests in one
    batch), verifies fewer drafts than K per cycle, and `SD(...).init/step/finish` gives decode's result."""
    target = init_model(tiny_config(6, layers=3), 0, init_std=0.8, name="toy-deep")
    d = eagle(target)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    method = SD(num_speculative_tokens=3, confidence_cut=0.6)
    res = smcsd.decode(prompts, draft=d, method=method, **kw)
    assert res.tokens == ref
    assert res.stats.num_draft_tokens < 3 * res.stats.num_drafts
    full = smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=3, **kw)
    assert full.stats.num_draft_tokens == 3 * full.stats.num_drafts
    prepared = smcsd.prepare(prompts, draft=d, method=method, **kw)
    state = method.init(prepared)
    while not method.done(state):
        state = method.step(prepared, state)
    stepped = method.finish(prepared, state)
    assert stepped.tokens == res.tokens and stepped.stats.num_draft_tokens == res.stats.num_draft_tokens


def test_errors():
    target, _ = tiny_pair(V, SEED)
    d = eagle(target)
    for bad in (1.0, -0.1, float("nan"), True, "0.3"):
        with pytest.raises(ValueError, match="confidence_cut"):
            SD(confidence_cut=bad)
        with pytest.raises(ValueError, match="confidence_cut"):
            smcsd.decode([0, 1], target=target, draft=d, method="sd", confidence_cut=bad, max_new_tokens=2)
    with pytest.raises(ValueError, match="confidence_cut= shapes method='sd' only"):
        smcsd.decode([0, 1], target=target, draft=d, method="sd-multi", confidence_cut=0.3, max_new_tokens=2)
    with pytest.raises(ValueError, match="confidence_cut given twice"):
        smcsd.decode([0, 1], target=target, draft=d, method=SD(confidence_cut=0.3), confidence_cut=0.5,
                     max_new_tokens=2)
    assert repr(SD(num_speculative_tokens=2, confidence_cut=0.3)) == "SD(num_speculative_tokens=2, confidence_cut=0.3)"
    np.testing.assert_equal(SD(confidence_cut=0.3) == SD(confidence_cut=0.3), True)
