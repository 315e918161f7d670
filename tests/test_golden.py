"""Decoding behaviour is unchanged: every method x drafter kind of the toy pairs (and a short SmolLM2 run when its
target is fetched) reproduces tests/data/golden.json, tokens and integer statistics exactly, float statistics to
1e-5 relative, errors by type and message (`tests/golden.py` writes and checks it; rewrite it only for an intended
change of behaviour, and say so in the commit)."""

from __future__ import annotations

import json

import jax
import pytest

import golden


@pytest.mark.slow  # ~20 decodes, each compiled (~4 min); `python tests/golden.py --check` runs them all
def test_decoding_reproduces_the_golden_file():
    with open(golden.GOLDEN) as f:
        stored = json.load(f)
    if stored["jax"] != jax.__version__ or stored["backend"] != jax.default_backend():
        pytest.skip(f"golden file written with jax {stored['jax']} on {stored['backend']}; this is jax "
                    f"{jax.__version__} on {jax.default_backend()} (sampled tokens depend on float rounding)")
    include_real = golden.real_available()
    names = [c[0] for c in golden.cases(include_real)]
    assert set(names) == {k for k in stored["cases"] if include_real or not k.startswith("smollm2")}
    quick = golden.quick_cases(names)  # CI's budget: each method and drafter kind; the script checks them all
    want = {k: stored["cases"][k] for k in quick}
    got = golden.compute(include_real, only=set(quick))
    diffs = golden.differences(want, got)
    assert not diffs, "\n".join(diffs[:40])
    ok = [v for v in got.values() if "error" not in v]
    assert len(ok) >= 15  # real decodes, not only errors


def test_golden_comparison_catches_changes():
    """The comparison itself: a changed token, a changed integer stat, a float beyond 1e-5 relative and a new
    error are all reported; a float within 1e-5 is not."""
    base = {"a": {"tokens": [[1, 2]], "stats": {k: 0 for k in golden.STATS}}}
    base["a"]["stats"]["acceptance_rate"] = 0.5
    same = json.loads(json.dumps(base))
    same["a"]["stats"]["acceptance_rate"] = 0.5 * (1 + 1e-7)
    assert golden.differences(base, same) == []
    for change in ("tokens", "int", "float", "error", "missing"):
        other = json.loads(json.dumps(base))
        if change == "tokens":
            other["a"]["tokens"] = [[1, 3]]
        elif change == "int":
            other["a"]["stats"]["num_target_calls"] = 1
        elif change == "float":
            other["a"]["stats"]["acceptance_rate"] = 0.5001
        elif change == "error":
            other["a"] = {"error": "ValueError", "message": "x"}
        else:
            other = {}
        assert golden.differences(base, other), change
