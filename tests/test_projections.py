"""experiments.studies.projections: the cost-model table of every method on H100 / TPU v5e (analytic, seconds): a row for
every (device, pair, method), `ar` the reference of every ratio, a reason on every skipped row, acceptance that
really drives `sd`, and the 70B/1B numbers of experiments.studies.paper_check reproduced."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from experiments.studies import cost_model, projections

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LLAMA = list(projections.LLAMA_PAIRS)


def _run(tmp_path, *argv, name="p.json"):
    out = tmp_path / name
    assert projections.main([*argv, "--out", str(out)]) == 0
    with open(out) as f:
        return json.load(f)


def _rows(res, **match):
    return [r for r in res["rows"] if all(r[k] == v for k, v in match.items())]


def test_every_device_pair_method_has_a_row(tmp_path):
    res = _run(tmp_path)
    assert res["schema"] == projections.SCHEMA and isinstance(res["markdown"], str)
    keys = [(r["device"], r["pair"], r["method"]) for r in res["rows"]]
    want = set(itertools.product(projections.DEVICE_NAMES, projections.DEFAULT_PAIRS, projections.METHODS))
    assert set(keys) == want and len(keys) == len(want)  # each exactly once
    for r in res["rows"]:
        assert set(projections.ROW_FIELDS) <= set(r)
        if r["skipped"]:
            assert r["reason"] and r["tokens_per_s"] is None and r["speedup_vs_ar"] is None
        else:
            assert r["tokens_per_s"] > 0 and r["cycle_s"] > 0 and r["speedup_vs_ar"] > 0 and r["tokens_per_cycle"] >= 1
            assert r["bound"] in ("memory", "compute") and r["acceptance_source"]
        if r["method"] == "ar":
            assert r["speedup_vs_ar"] == pytest.approx(1.0)
        if r["method"] == "smc" and not r["skipped"]:
            assert r["tokens_per_cycle"] == r["K"] + 1
    # SmolLM2's acceptance figures name a committed result that exists
    for r in res["rows"]:
        if r["pair"].startswith("smollm2") and r["method"] == "sd":
            f = r["acceptance_source"].split(" ")[0]
            assert os.path.exists(os.path.join(projections.report.results_path(), f)), r["acceptance_source"]
    assert set(res["sources"]) <= set(projections.Evidence.FILES)
    # 70B + 1B needs 4 H100s (the SMC-SD paper's setup) and 16 v5e chips; 8B fits one H100
    assert _rows(res, pair=LLAMA[1], device="h100")[0]["chips"] == 4
    assert _rows(res, pair=LLAMA[1], device="tpu-v5e")[0]["chips"] == 16
    assert _rows(res, pair=LLAMA[0], device="h100")[0]["chips"] == 1


def test_70b_matches_paper_check(tmp_path):
    """The same device (4xH100 tensor-parallel), acceptance and K as experiments.studies.paper_check: the same ar and sd."""
    from experiments.studies import paper_check
    paper_check.main(["--out", str(tmp_path / "pc.json")])
    with open(tmp_path / "pc.json") as f:
        pc = {r["method"]: r["predicted_tokens_per_s"] for r in json.load(f)["rows"] if r["model"] == "roofline"}
    res = _run(tmp_path, "--pairs", LLAMA[1], "--devices", "h100")
    for method in ("ar", "sd"):
        assert _rows(res, method=method)[0]["tokens_per_s"] == pytest.approx(pc[method], rel=1e-9)


def test_skipped_rows_say_why(tmp_path):
    # the tree projection is for batch 1 only
    res = _run(tmp_path, "--batch", "2", "--devices", "h100")
    trees = _rows(res, method="sd-tree")
    assert trees and all(r["skipped"] and "batch 1" in r["reason"] for r in trees)
    assert all(not r["skipped"] for r in res["rows"] if r["method"] != "sd-tree")
    # no measured results at all: SmolLM2's acceptance-driven rows are skipped with the reason, the rest projected
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _run(tmp_path, "--results-dir", str(empty), "--devices", "tpu-v5e", name="e.json")
    for r in _rows(res, pair="smollm2-135m+ar-distilled"):
        if r["method"] in ("sd", "sd-multi", "sd-tree", "flex", "sd-overlap"):
            assert r["skipped"] and str(empty) in r["reason"]
        else:
            assert not r["skipped"]
    assert not any(r["skipped"] for r in res["rows"] if r["pair"] in LLAMA)
    with pytest.raises(SystemExit):
        projections.main(["--tree", "2,2", "--out", str(tmp_path / "x.json")])


def test_acceptance_drives_sd(tmp_path):
    """With acceptance 0 `sd` makes one token per cycle and pays for drafting: it cannot beat `ar`; with a higher
    acceptance its tokens/s rises."""
    zero = _run(tmp_path, "--pairs", *LLAMA, "--llama-acceptance", "0", name="z.json")
    lo = _run(tmp_path, "--pairs", *LLAMA, "--llama-acceptance", "0.6", name="lo.json")
    hi = _run(tmp_path, "--pairs", *LLAMA, "--llama-acceptance", "0.9", name="hi.json")
    for d in projections.DEVICE_NAMES:
        for p in LLAMA:
            z, a, b = (_rows(x, device=d, pair=p, method="sd")[0] for x in (zero, lo, hi))
            assert z["tokens_per_cycle"] == pytest.approx(1.0) and z["speedup_vs_ar"] < 1
            assert a["speedup_vs_ar"] > 1 and b["tokens_per_s"] > a["tokens_per_s"]
            assert _rows(hi, device=d, pair=p, method="ar")[0]["tokens_per_s"] == \
                _rows(lo, device=d, pair=p, method="ar")[0]["tokens_per_s"]  # ar does not depend on it


def test_bench_matrix_is_preferred(tmp_path):
    """A bench_matrix.json cell, when there is one, is where sd's acceptance comes from (and says so)."""
    res_dir = tmp_path / "res"
    res_dir.mkdir()
    cell = dict(pair="smollm2-135m", method="sd", drafter="ar-distilled", N=None, K=4, batch=1,
                label="sd ar-distilled K=4", tokens_per_target_call=2.0, mean_acceptance_length=2.0)
    with open(res_dir / "bench_matrix.json", "w") as f:
        json.dump({"suites": [{"suite": {"pair": "smollm2-135m"}, "cells": [cell]}]}, f)
    res = _run(tmp_path, "--results-dir", str(res_dir), "--pairs", "smollm2-135m+ar-distilled", "--devices", "h100")
    sd = _rows(res, method="sd")[0]
    assert sd["acceptance_source"].startswith("bench_matrix.json")
    assert sd["acceptance"] == pytest.approx(cost_model.solve_acceptance(2.0, 4))
    assert sd["tokens_per_cycle"] == pytest.approx(2.0, rel=1e-6)
    assert res["sources"] == {"bench_matrix.json": os.path.relpath(str(res_dir / "bench_matrix.json"), REPO)}
