"""A generated GSM8K-like arithmetic task for the shipped `tiny-arith` pair.

Each problem is a short word problem, a chain of thought of one to three operations, and a final
answer line, e.g.::

    Q: Sam has 23 apples. He buys 15 more and gives 8 to Ann. How many apples does Sam have?
    A: 23 + 15 = 38. 38 - 8 = 30.
    #### 30

Design (sized so a ~1-2 M parameter byte-level model learns it on a CPU in minutes):
- 8 templates with 1-3 operations (+, -, *); names, items and phrasing vary, arithmetic stays small:
  start values 2..30, changes 1..12, products of 2..5 by 2..9, "twice" of 2..15; every intermediate
  is in 0..71, so each step is a one- or two-digit fact a ~1 M parameter model learns as a lookup.
- A problem is at most 126 bytes, so BOS + problem + EOS fits one 128-token training row.
- Training rows mix word problems with "drill" rows (`train_texts`, `drill_text`): the chain-of-thought
  steps of several problems on one line, so a small model sees ~4x more arithmetic per token.
- Training problems come from `train_batch(seed, step, n)`: a fixed seed per (seed, step), so a
  resumed run sees the same data. The test set (`test_set()`, 1000 problems) uses its own seed and
  the training stream drops any problem whose question text is in the test set, so the two are disjoint.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

NAMES = ["Sam", "Ann", "Tom", "Mia", "Leo", "Eva", "Ben", "Zoe", "Max", "Ivy", "Dan", "Amy", "Raj", "Kim",
         "Joe", "Liz", "Ada", "Bob", "Sue", "Ned"]
ITEMS = ["apples", "pens", "books", "cards", "eggs", "coins", "shells", "stamps", "marbles", "cookies",
         "stickers", "rocks", "balls", "cups", "toys", "beads"]
TEST_SEED = 20240917
TEST_SIZE = 1000
MAX_BYTES = 126
ANSWER_RE = re.compile(r"####\s*(-?\d+)")


class Problem(NamedTuple):
    question: str  # "Q: ...?\nA:" — the prompt
    answer_text: str  # " 23 + 15 = 38. 38 - 8 = 30.\n#### 30" — what the model must produce
    answer: int

    @property
    def text(self) -> str:
        return self.question + self.answer_text


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _names(rng, k):
    idx = rng.choice(len(NAMES), size=k, replace=False)
    return [NAMES[i] for i in idx]


def _fmt(steps):
    """Chain of thought from [(a, op, b, result), ...]."""
    return " " + " ".join(f"{a} {op} {b} = {r}." for a, op, b, r in steps) + f"\n#### {steps[-1][3]}"


def _t_buy_give(rng):
    a, b = int(rng.integers(2, 31)), int(rng.integers(1, 13))
    s = a + b
    c = int(rng.integers(1, min(s, 12) + 1))
    x, y = _names(rng, 2)
    it = _pick(rng, ITEMS)
    q = f"{x} has {a} {it}. {x} buys {b} more and gives {c} to {y}. How many does {x} have?"
    return q, [(a, "+", b, s), (s, "-", c, s - c)]


def _t_lost(rng):
    a = int(rng.integers(2, 31))
    b = int(rng.integers(1, min(a, 12) + 1))
    x = _names(rng, 1)[0]
    it = _pick(rng, ITEMS)
    verb = _pick(rng, ["lost", "gave away", "sold", "used"])
    q = f"{x} had {a} {it} and {verb} {b}. How many {it} are left?"
    return q, [(a, "-", b, a - b)]


def _t_together(rng):
    a, b = int(rng.integers(2, 31)), int(rng.integers(1, 13))
    x, y = _names(rng, 2)
    it = _pick(rng, ITEMS)
    q = f"{x} has {a} {it} and {y} has {b} {it}. How many {it} do they have together?"
    return q, [(a, "+", b, a + b)]


def _t_boxes(rng):
    n, k = int(rng.integers(2, 6)), int(rng.integers(2, 10))
    x = _names(rng, 1)[0]
    it = _pick(rng, ITEMS)
    box = _pick(rng, ["boxes", "bags", "packs", "jars"])
    q = f"{x} buys {n} {box} of {it} with {k} {it} in each. How many {it} does {x} buy?"
    return q, [(n, "*", k, n * k)]


def _t_boxes_eat(rng):
    n, k = int(rng.integers(2, 6)), int(rng.integers(2, 10))
    p = n * k
    c = int(rng.integers(1, min(p, 12) + 1))
    x, y = _names(rng, 2)
    it = _pick(rng, ITEMS)
    box = _pick(rng, ["boxes", "bags", "packs", "jars"])
    q = f"{x} has {n} {box} with {k} {it} each and gives {c} to {y}. How many {it} are left?"
    return q, [(n, "*", k, p), (p, "-", c, p - c)]


def _t_more_than(rng):
    a, b = int(rng.integers(2, 31)), int(rng.integers(1, 13))
    s = a + b
    x, y = _names(rng, 2)
    it = _pick(rng, ITEMS)
    q = f"{x} has {a} {it}. {y} has {b} more than {x}. How many do they have in all?"
    return q, [(a, "+", b, s), (a, "+", s, a + s)]


def _t_three(rng):
    a, b = int(rng.integers(2, 31)), int(rng.integers(1, 13))
    s = a + b
    c = int(rng.integers(1, min(s, 12) + 1))
    t = s - c
    d = int(rng.integers(1, min(t, 12) + 1)) if t >= 1 else 0
    x, y, z = _names(rng, 3)
    it = _pick(rng, ITEMS)
    q = f"{x} had {a} {it}, got {b}, gave {c} to {y}, {d} to {z}. How many now?"
    return q, [(a, "+", b, s), (s, "-", c, t), (t, "-", d, t - d)]


def _t_twice(rng):
    a = int(rng.integers(2, 16))
    b = int(rng.integers(1, 13))
    x, y = _names(rng, 2)
    it = _pick(rng, ITEMS)
    q = f"{x} has {a} {it}. {y} has twice as many and finds {b} more. How many does {y} have?"
    return q, [(a, "*", 2, 2 * a), (2 * a, "+", b, 2 * a + b)]


TEMPLATES = (_t_buy_give, _t_lost, _t_together, _t_boxes, _t_boxes_eat, _t_more_than, _t_three, _t_twice)


def make_problem(rng: np.random.Generator) -> Problem:
    """One problem; redrawn in the rare case it exceeds MAX_BYTES (so BOS + text + EOS fits 128 tokens)."""
    while True:
        q, steps = TEMPLATES[int(rng.integers(len(TEMPLATES)))](rng)
        p = Problem(question=f"Q: {q}\nA:", answer_text=_fmt(steps), answer=steps[-1][3])
        if len(p.text.encode()) <= MAX_BYTES:
            return p


def generate(seed: int, n: int, exclude: frozenset = frozenset()) -> list[Problem]:
    """`n` problems from `seed`, skipping questions in `exclude` (and duplicates within the call)."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < n:
        p = make_problem(rng)
        if p.question in exclude or p.question in seen:
            continue
        seen.add(p.question)
        out.append(p)
    return out


@functools.lru_cache(maxsize=None)
def test_set() -> tuple[Problem, ...]:
    """The held-out test set: TEST_SIZE distinct problems from TEST_SEED (never in training)."""
    return tuple(generate(TEST_SEED, TEST_SIZE))


@functools.lru_cache(maxsize=None)
def _test_questions() -> frozenset:
    return frozenset(p.question for p in test_set())


def train_batch(seed: int, step: int, n: int) -> list[Problem]:
    """The training problems of one step: a pure function of (seed, step), disjoint from the test set."""
    rng = np.random.default_rng([seed, step, 0xA817])
    exclude = _test_questions()
    out = []
    while len(out) < n:
        p = make_problem(rng)
        if p.question not in exclude:
            out.append(p)
    return out


def drill_text(rng: np.random.Generator, max_bytes: int = MAX_BYTES) -> str:
    """A drill row: the chain-of-thought steps of several fresh problems, "23 + 12 = 35. 35 - 8 = 27. ..."

    Same facts and format as the answers, ~9 per row instead of ~2: dense practice of the arithmetic."""
    parts, size = [], 0
    while True:
        cot = make_problem(rng).answer_text.split("\n")[0].strip()
        if size + len(cot) + 1 > max_bytes:
            return " ".join(parts)
        parts.append(cot)
        size += len(cot) + 1


def train_texts(seed: int, step: int, n: int, drill_frac: float = 0.0) -> list[str]:
    """Training rows of one step: word problems (`train_batch`) with the first round(n * drill_frac)
    rows replaced by drill rows; a pure function of (seed, step)."""
    k = int(round(n * drill_frac))
    rng = np.random.default_rng([seed, step, 0xD817])
    return [drill_text(rng) for _ in range(k)] + [p.text for p in train_batch(seed, step, n - k)]


def parse_answer(text: str) -> int | None:
    """The integer on the first "#### N" line of a generated answer, or None."""
    m = ANSWER_RE.search(text)
    return int(m.group(1)) if m else None


if __name__ == "__main__":  # a peek at the data
    for p in generate(0, 8):
        print(p.text, end="\n\n")
    lens = [len(p.text.encode()) for p in generate(1, 5000)]
    print("bytes: max", max(lens), "mean", sum(lens) / len(lens))
