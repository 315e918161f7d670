"""Draft vocabularies (smcsd/drafters/vocab.py): the top V′ ids by frequency with the stop ids always kept, the
EAGLE-3 / SpecForge maps (d2t offsets, t2d mask) both ways, the floor mixture (a normalised law that puts ε/V on
every token and is what `sample_floor_mixture` draws), and clear errors for bad vocabularies."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smcsd.drafters import DraftVocab, stop_ids_of
from smcsd.drafters.vocab import floor_mixture, sample_floor_mixture
from toys import chi_square_pvalue

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (the seed is fixed anyway)


def test_from_counts_keeps_the_most_frequent_and_the_stop_ids():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3])
    v = DraftVocab.from_counts(counts, 4)
    assert v.draft_to_target.tolist() == [0, 2, 3, 5]  # 9, 9, 7, 5 (ties: the smaller id first), increasing order
    w = DraftVocab.from_counts(counts, 4, required_ids=[6])  # a never-seen stop id replaces the least frequent
    assert w.draft_to_target.tolist() == [2, 3, 5, 6]
    assert DraftVocab.from_counts(counts, 3).draft_to_target.tolist() == [2, 3, 5]
    t2d = w.target_to_draft
    assert t2d.tolist() == [-1, -1, 0, 1, -1, 2, 3, -1]
    assert np.array_equal(w.draft_to_target[t2d[w.draft_to_target]], w.draft_to_target)
    assert w.mask.tolist() == [False, False, True, True, False, True, True, False]
    np.testing.assert_allclose(w.coverage(counts), 25 / 34)
    assert len(w) == 4 and w.vocab_size == 8 and w.contains([2, 6]) and not w.contains([0])
    assert DraftVocab.from_ids([5, 3, 2, 6], 8) == w and hash(DraftVocab.from_ids([6, 5, 3, 2], 8)) == hash(w)
    assert DraftVocab.from_ids([5, 3, 2, 7], 8) != w
    assert w.fingerprint == "d364866f5df3a6105bc0"  # stable across processes (a resumed run's metadata holds it)


def test_eagle_maps_round_trip():
    v = DraftVocab.from_ids([1, 4, 5, 9], 12)
    d2t, t2d = v.to_eagle()
    assert d2t.dtype == np.int64 and d2t.tolist() == [1, 3, 3, 6]  # SpecForge: target id = i + d2t[i]
    assert t2d.dtype == bool and np.nonzero(t2d)[0].tolist() == [1, 4, 5, 9]
    assert DraftVocab.from_eagle(d2t, t2d) == v
    with pytest.raises(ValueError, match="disagree"):
        DraftVocab.from_eagle(d2t, np.roll(t2d, 1))


@pytest.mark.parametrize("build,match", [
    (lambda: DraftVocab.from_ids(range(8), 8), "V′ must be < V"),
    (lambda: DraftVocab.from_counts(np.ones(8), 8), r"size \(V′\) must be in \[1, 8\)"),
    (lambda: DraftVocab.from_counts(np.ones(8), 0), r"size \(V′\) must be in \[1, 8\)"),
    (lambda: DraftVocab.from_ids([], 8), "at least one token"),
    (lambda: DraftVocab.from_ids([0, 1, 2], 8, required_ids=[7]), r"misses the stop .* \[7\]"),
    (lambda: DraftVocab.from_ids([0, 1, 9], 8), "outside the target vocabulary"),
    (lambda: DraftVocab.from_ids([0, -1], 8), "outside the target vocabulary"),
    (lambda: DraftVocab.from_ids([0, 1, 1], 8), r"repeats token ids \[1\]"),
    (lambda: DraftVocab.from_counts(np.ones(8), 1, required_ids=[3, 4]), "cannot hold the 2 required"),
    (lambda: DraftVocab.from_counts(-np.ones(8), 2), "counts must be >= 0"),
])
def test_bad_vocabularies(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_types():
    with pytest.raises(TypeError, match="integer token ids"):
        DraftVocab.from_ids([0.5, 1.0], 8)
    with pytest.raises(TypeError, match="vocab_size"):
        DraftVocab.from_ids([0], 1)
    with pytest.raises(TypeError, match="size must be an int"):
        DraftVocab.from_counts(np.ones(8), 2.5)


def test_stop_ids_of():
    class Tok:
        eos_id, end_of_turn_ids = 2, [2, 7]

    class Cfg:
        eos_token_id = 0

    class Model:
        tokenizer, config = Tok(), Cfg()

    assert stop_ids_of(Model()) == (0, 2, 7)


def test_floor_mixture_is_the_law_it_samples():
    """q = (1 − ε)q′ + ε/V: normalised, ε/V outside the kept tokens, −inf there at ε = 0; 200k draws of
    `sample_floor_mixture` (given draws from q′) follow it (chi-square)."""
    V, kept, eps = 7, np.array([1, 2, 5]), 0.3
    lq = jnp.log(jnp.asarray([0.5, 0.3, 0.2]))
    q = np.exp(np.asarray(floor_mixture(lq, kept, V, eps), np.float64))
    np.testing.assert_allclose(q.sum(), 1.0, atol=1e-6)
    np.testing.assert_allclose(q[[0, 3, 4, 6]], eps / V, rtol=1e-5)
    np.testing.assert_allclose(q[kept], 0.7 * np.array([0.5, 0.3, 0.2]) + eps / V, rtol=1e-5)
    plain = np.asarray(floor_mixture(lq, kept, V, 0.0))
    assert np.all(np.isneginf(plain[[0, 3, 4, 6]])) and np.allclose(np.exp(plain[kept]), [0.5, 0.3, 0.2])
    n = 200_000
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    idx = jax.random.categorical(k1, jnp.broadcast_to(lq, (n, 3)))
    draws = np.asarray(sample_floor_mixture(k2, idx, kept, V, eps))
    assert chi_square_pvalue(np.bincount(draws, minlength=V), q) > P_MIN
    # the training loss's floor (smcsd.train.losses) is the same law, where that helper exists
    from smcsd.train import losses
    if hasattr(losses, "floor_mixture_logq"):
        np.testing.assert_allclose(np.asarray(losses.floor_mixture_logq(lq, jnp.asarray(kept), V, eps)),
                                   np.log(q), atol=1e-5)
    assert math.isclose(float(np.exp(np.asarray(floor_mixture(lq, kept, V, 1e-3))).sum()), 1.0, rel_tol=1e-5)
