"""Draft vocabularies (FR-Spec, arXiv 2502.14856; VocabTrim, arXiv 2506.22694): the V′ most frequent tokens of the
target's own outputs, the only tokens a drafter with its own head proposes.

A drafter over a `DraftVocab` computes logits over its V′ kept tokens only (the LM head is most of a small drafter's
cost) and reports its proposal over the *full* vocabulary: q = 0 outside the kept tokens (log q = −inf), so `sd`,
`sd-multi` and `sd-tree` verify over the full vocabulary and stay exact (rejection sampling is exact for any q).
`smc` weights by p_T/q and needs q > 0 wherever p_T > 0: it runs the drafter's floored twin (`floor_mixture`).

Kept ids are stored in increasing order, so draft index i is the i-th smallest kept target id: the layout of the
EAGLE-3 / SpecForge checkpoints, whose `t2d` is a boolean mask over the target vocabulary and whose `d2t[i]` is the
offset target_id − i (`to_eagle` / `from_eagle`).
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DraftVocab", "floor_mixture", "stop_ids_of"]


def _int_ids(name: str, ids) -> np.ndarray:
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
    if arr.size == 0:
        return np.zeros((0,), np.int64)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integer token ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of token ids, got shape {arr.shape}")
    return arr.astype(np.int64)


def _check_vocab_size(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise TypeError(f"vocab_size must be the target's vocabulary size (an int >= 2), got {vocab_size!r}")
    return int(vocab_size)


def _most_frequent(candidates: np.ndarray, counts: np.ndarray, size: int, required: np.ndarray) -> np.ndarray:
    """`required` and then the most frequent other `candidates` by `counts` (ties to the smaller id), `size` in all."""
    if len(required) > size:
        raise ValueError(f"size {size} cannot hold the {len(required)} required stop ids {required.tolist()}")
    order = candidates[np.lexsort((candidates, -counts[candidates].astype(np.float64)))]  # count desc, then id asc
    return np.concatenate([required, order[~np.isin(order, required)][:size - len(required)]])


class DraftVocab:
    """The kept token ids `draft_to_target int32[V′]` (increasing) of a target vocabulary of `vocab_size` V, with
    1 <= V′ < V. Build one with `from_counts` (the top V′ by frequency, the stop tokens always kept) or `from_ids`.

    Equal vocabularies compare and hash equal (by content); `target_to_draft int32[V]` is −1 outside."""

    def __init__(self, draft_to_target: Sequence[int], vocab_size: int, required_ids: Iterable[int] = ()):
        V = _check_vocab_size(vocab_size)
        ids = _int_ids("draft_to_target", draft_to_target)
        n = len(ids)
        if n < 1:
            raise ValueError("a draft vocabulary needs at least one token (V′ >= 1); pass draft_vocab=None for "
                             "the full vocabulary")
        if n >= V:
            raise ValueError(f"a draft vocabulary of {n} tokens is not smaller than the target's vocabulary ({V}): "
                             f"V′ must be < V; pass draft_vocab=None to draft over the full vocabulary")
        bad = ids[(ids < 0) | (ids >= V)]
        if bad.size:
            raise ValueError(f"draft_to_target holds ids outside the target vocabulary [0, {V}): "
                             f"{sorted(set(bad.tolist()))[:10]}")
        uniq, counts = np.unique(ids, return_counts=True)
        if len(uniq) != n:
            raise ValueError(f"draft_to_target repeats token ids {uniq[counts > 1].tolist()[:10]}: each kept token "
                             "must appear once")
        required = _int_ids("required_ids", required_ids)
        bad = required[(required < 0) | (required >= V)]
        if bad.size:
            raise ValueError(f"required_ids {bad.tolist()} are outside the target vocabulary [0, {V})")
        missing = np.setdiff1d(required, uniq)
        if missing.size:
            raise ValueError(f"the draft vocabulary misses the stop (EOS / end-of-turn) token ids {missing.tolist()}: "
                             "a drafter that cannot propose them never drafts the end of an answer; add them to "
                             "the ids, or build it with DraftVocab.from_counts(..., required_ids=...) which always "
                             "keeps them")
        self._ids = uniq.astype(np.int32)  # increasing
        self._ids.setflags(write=False)
        self.vocab_size = V

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_counts(cls, counts, size: int, required_ids: Iterable[int] = ()) -> "DraftVocab":
        """The `size` most frequent ids of `counts int[V]` (token counts in the target's outputs, e.g.
        `SelfDistilledCorpus.answer_frequencies(V)`; ties go to the smaller id), with `required_ids` (the target's
        EOS / end-of-turn ids) always kept: they take the places of the least frequent of the top `size`."""
        counts = np.asarray(counts)
        if counts.ndim != 1 or not (np.issubdtype(counts.dtype, np.integer) or np.issubdtype(counts.dtype, np.floating)):
            raise TypeError(f"counts must be a 1-D array of token counts (one per target id), got shape "
                            f"{counts.shape} dtype {counts.dtype}")
        V = _check_vocab_size(len(counts))
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an int (V′, the number of kept tokens), got {size!r}")
        size = int(size)
        if not 1 <= size < V:
            raise ValueError(f"size (V′) must be in [1, {V}) for a target vocabulary of {V}, got {size}; "
                             "pass draft_vocab=None for the full vocabulary")
        if np.any(counts < 0):
            raise ValueError("counts must be >= 0")
        required = np.unique(_int_ids("required_ids", required_ids))
        if required.size and (required.min() < 0 or required.max() >= V):
            raise ValueError(f"required_ids {required.tolist()} are outside the target vocabulary [0, {V})")
        return cls(_most_frequent(np.arange(V), counts, size, required), V, required)

    def top(self, counts, size: int, required_ids: Iterable[int] = ()) -> "DraftVocab":
        """The `size` most frequent of this vocabulary's kept ids by `counts int[V]` (ties to the smaller id), with
        `required_ids` (the stop ids) always kept: a smaller vocabulary inside this one, e.g. to cut a trained
        drafter's head to fewer rows without retraining (`EagleDrafter.with_draft_vocab`)."""
        counts = np.asarray(counts)
        if counts.ndim != 1 or len(counts) != self.vocab_size:
            raise ValueError(f"counts must hold one count per target id ({self.vocab_size}), got shape {counts.shape}")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an int (V′, the number of kept tokens), got {size!r}")
        if not 1 <= size < self.size:
            raise ValueError(f"size (V′) must be in [1, {self.size}) to cut this {self.size}-token vocabulary, got "
                             f"{size}")
        required = np.unique(_int_ids("required_ids", required_ids))
        outside = required[~np.isin(required, self._ids)]
        if outside.size:
            raise ValueError(f"required_ids {outside.tolist()} are not in this vocabulary: a cut keeps a subset of it")
        if np.any(counts[self._ids] < 0):
            raise ValueError("counts must be >= 0")
        return DraftVocab(_most_frequent(self._ids, counts, size, required), self.vocab_size, required)

    @classmethod
    def from_ids(cls, ids: Sequence[int], vocab_size: int, required_ids: Iterable[int] = ()) -> "DraftVocab":
        """A user-given set of kept ids (any order; stored increasing); raises ValueError naming the fix if it
        misses `required_ids`, repeats an id, or holds ids outside [0, vocab_size)."""
        return cls(ids, vocab_size, required_ids)

    @classmethod
    def from_eagle(cls, d2t, t2d=None) -> "DraftVocab":
        """From an EAGLE-3 / SpecForge checkpoint's maps: `d2t[i]` = target id − i (offsets), `t2d` bool[V]."""
        d2t = _int_ids("d2t", np.asarray(d2t))
        ids = d2t + np.arange(len(d2t))
        if t2d is None:
            raise ValueError("from_eagle needs t2d (bool[vocab_size]) to know the target's vocabulary size")
        t2d = np.asarray(t2d)
        if t2d.dtype != bool:
            t2d = t2d.astype(bool)
        vocab = cls(ids, len(t2d))
        if not np.array_equal(np.nonzero(t2d)[0], vocab.draft_to_target):
            raise ValueError("the checkpoint's d2t and t2d disagree (t2d must mark exactly the ids d2t maps to, in "
                             "increasing order)")
        return vocab

    # ------------------------------------------------------------------ views
    @property
    def size(self) -> int:
        return len(self._ids)

    def __len__(self) -> int:
        return self.size

    @property
    def draft_to_target(self) -> np.ndarray:
        return self._ids

    @property
    def target_to_draft(self) -> np.ndarray:
        """int32[V]: the draft index of each target id, −1 where it is not kept."""
        out = np.full((self.vocab_size,), -1, np.int32)
        out[self._ids] = np.arange(self.size, dtype=np.int32)
        return out

    @property
    def mask(self) -> np.ndarray:
        """bool[V]: kept target ids (EAGLE-3's `t2d`)."""
        m = np.zeros((self.vocab_size,), bool)
        m[self._ids] = True
        return m

    def to_eagle(self) -> tuple[np.ndarray, np.ndarray]:
        """(`d2t` int64[V′] offsets target_id − i, `t2d` bool[V]): the EAGLE-3 / SpecForge checkpoint maps."""
        return (self._ids.astype(np.int64) - np.arange(self.size, dtype=np.int64)), self.mask

    def coverage(self, counts) -> float:
        """The share of the counted tokens that the vocabulary keeps."""
        counts = np.asarray(counts, np.float64)
        total = counts.sum()
        return float(counts[self._ids].sum() / total) if total > 0 else 0.0

    def contains(self, ids: Iterable[int]) -> bool:
        return bool(np.all(np.isin(_int_ids("ids", ids), self._ids)))

    def __eq__(self, other) -> bool:
        return isinstance(other, DraftVocab) and self.vocab_size == other.vocab_size and \
            np.array_equal(self._ids, other._ids)

    @property
    def fingerprint(self) -> str:
        """A hex digest of the target vocabulary size and the kept ids (stable across processes)."""
        h = hashlib.blake2b(digest_size=10)
        h.update(str(self.vocab_size).encode() + b"|" + self._ids.astype("<i4").tobytes())
        return h.hexdigest()

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"DraftVocab({self.size} of {self.vocab_size} tokens)"


def stop_ids_of(target) -> tuple[int, ...]:
    """The ids a target ends an answer with: its tokenizer's EOS and end-of-turn ids and its config's EOS (what a
    draft vocabulary must keep)."""
    ids = set()
    tok = getattr(target, "tokenizer", None)
    for e in ([getattr(tok, "eos_id", None)] + list(getattr(tok, "end_of_turn_ids", None) or [])) if tok else []:
        if e is not None:
            ids.add(int(e))
    eos = getattr(getattr(target, "config", None), "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    return tuple(sorted(ids))


def floor_mixture(logq_kept, draft_to_target, vocab_size: int, eps: float):
    """Full-vocabulary log q of a proposal over kept tokens mixed with a uniform floor, `[..., V]`:

        q(x) = (1 − ε)·q′(x) + ε/V   (q′ = 0 outside the kept tokens),

    with `logq_kept [..., V′]` the normalised log q′ and `draft_to_target int[V′]`. Why uniform over the whole
    vocabulary: it is the one floor that needs nothing but V, does not depend on p_T (so it can be sampled before the
    target runs) and gives every token q ≥ ε/V, so `smc`'s weights p_T/q stay finite wherever p_T > 0; it is also the
    floor `smcsd.train.losses.floor_mixture_logq` trains against, so a drafter trained for smc is scored on the law
    it samples. ε = 0 gives q′ itself (−inf outside). The same law is sampled by `sample_floor_mixture`."""
    lq = jnp.asarray(logq_kept, jnp.float32)
    V = int(vocab_size)
    d2t = jnp.asarray(draft_to_target, jnp.int32)
    if eps <= 0:
        full = jnp.full(lq.shape[:-1] + (V,), -jnp.inf, jnp.float32)
        return full.at[..., d2t].set(lq)
    log_floor = math.log(eps) - math.log(V)
    kept = jnp.logaddexp(math.log1p(-eps) + lq, log_floor)
    full = jnp.full(lq.shape[:-1] + (V,), log_floor, jnp.float32)
    return full.at[..., d2t].set(kept)


def sample_floor_mixture(key, kept_index, draft_to_target, vocab_size: int, eps: float):
    """Target ids drawn from `floor_mixture`'s law given draws `kept_index [...]` from q′: with probability ε a
    uniform id over the whole vocabulary, else the kept token `draft_to_target[kept_index]`."""
    d2t = jnp.asarray(draft_to_target, jnp.int32)
    tok = jnp.take(d2t, kept_index)
    if eps <= 0:
        return tok
    k_mix, k_uni = jax.random.split(key)
    uniform = jax.random.randint(k_uni, tok.shape, 0, int(vocab_size), dtype=jnp.int32)
    return jnp.where(jax.random.uniform(k_mix, tok.shape) < eps, uniform, tok)
