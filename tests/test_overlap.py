"""`sd-overlap` (MineDraft, smcsd/methods/sd_overlap.py): the same output law as `sd` by enumeration (with an AR and a block
drafter), a broken acceptance rule that the same test rejects, identical tokens in sequential and overlapped order,
odd batches, the throughput model, and bad input. The 8-device runs (4 + 4 groups) are in tests/overlap_check.py,
run by the slow test at the end in a subprocess (XLA_FLAGS must be set before jax is imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import smcsd
from smcsd.runtime import engine
from smcsd.drafters import DFlashDrafter
from smcsd.methods.sd_overlap import OverlapMeshes, OverlapRunner, overlap_step_model, split_devices
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_pair, total_variation

HERE = os.path.dirname(os.path.abspath(__file__))
# The enumeration setup of tests/test_sd.py: vocab 6, 216 continuations of 3 tokens, a draft far from the target.
V, SEED, PROMPT, LENGTH, K = 6, 2, (0, 1), 3, 2
NUM_SAMPLES, BATCH = 20_000, 5_000
P_MIN, P_BROKEN = 1e-3, 1e-6  # as test_sd.py: a correct sampler fails w.p. 1e-3; a broken one must be far below


def _exactness(draft=None, seed=1000, **kw):
    target, toy_draft = tiny_pair(V, SEED)
    draft = toy_draft if draft is None else draft
    counts = sample_counts("sd-overlap", target, draft, PROMPT, LENGTH, NUM_SAMPLES, batch=BATCH, seed=seed,
                           num_speculative_tokens=K, **kw)
    probs = exact_distribution(target, PROMPT, LENGTH, **kw)
    return chi_square_pvalue(counts, probs), total_variation(counts, probs)


def test_overlap_is_exact():
    pvalue, tv = _exactness(temperature=0.7, top_k=3)
    assert pvalue > P_MIN, f"sd-overlap: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # default-run budget
def test_overlap_is_exact_with_a_block_drafter():
    target, _ = tiny_pair(V, SEED)
    drafter = DFlashDrafter.create(target, num_layers=1, block_size=4, seed=0)
    pvalue, tv = _exactness(draft=drafter, temperature=1.0)
    assert pvalue > P_MIN, f"sd-overlap with a block drafter: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # default-run budget
def test_broken_acceptance_is_detected(accept_always):
    pvalue, tv = _exactness(temperature=1.0)
    assert pvalue < P_BROKEN, f"sd-overlap with accept-always passed the exactness test (p={pvalue:.2e}, TV={tv:.4f})"


def _prepared(batch=5, **kw):
    target, draft = tiny_pair(V, SEED)
    args = dict(target=target, draft=draft, method="sd-overlap", max_new_tokens=10, temperature=1.0, seed=3,
                num_speculative_tokens=K, eos_id=[])
    args.update(kw)
    return smcsd.decode, args, [[0, 1], [2], [3, 4, 5], [1], [0]][:batch]


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_sequential_order_gives_identical_tokens_and_stats():
    """On one device both groups are that device; the runner in sequential order (each program waited for before the
    next is dispatched) must give the overlapped run's tokens and counters exactly (same programs, same keys)."""
    decode, args, prompts = _prepared()
    res = decode(prompts, **args)
    from smcsd.decode import prepare
    p = prepare(prompts, **args)
    runner, compile_s = engine.compiled_program(p.method, p.target.config, p.draft, p.spec, p.args, mesh=p.mesh)
    assert compile_s == 0.0 and isinstance(runner, OverlapRunner)  # decode's runner, compiled once
    runner.sequential, runner.trace = True, True
    try:
        raw = runner(*p.args)
    finally:
        runner.sequential, runner.trace = False, False
    assert [list(r[:n]) for r, n in zip(raw["tokens"], raw["lengths"])] == res.tokens
    assert int(raw["stats"]["num_accepted_tokens"]) == res.stats.num_accepted_tokens
    assert int(raw["stats"]["num_target_calls"]) == res.stats.num_target_calls
    # The timeline has one start per half and a verification per drafting step.
    names = [e["program"] for e in runner.last_timeline]
    assert names.count("target_start") == 2 and names.count("drafter_start") == 2
    assert names.count("verify") == names.count("drafter_start") + names.count("drafter_step")


@pytest.mark.slow  # default-run budget (two more compiles)
def test_odd_batch_and_stats():
    """An odd batch pads one row that is done from the start: three requests give three outputs of max_new_tokens
    (no stop tokens), and the counters cover exactly the real rows (one draft per live row per cycle)."""
    decode, args, prompts = _prepared(batch=3)
    res = decode(prompts, **args)
    assert [len(t) for t in res.tokens] == [10, 10, 10]
    assert all(0 <= t < V for toks in res.tokens for t in toks)
    s = res.stats
    assert s.num_drafts == sum(s.target_calls_per_request) and len(s.target_calls_per_request) == 3
    assert s.num_draft_tokens == K * s.num_drafts
    # Every live cycle emits between 1 and accepted + 1 tokens (the prefill gave each request its first).
    assert s.num_drafts <= s.num_generated_tokens - 3 <= s.num_drafts + s.num_accepted_tokens


@pytest.mark.slow  # default-run budget
def test_greedy_equals_ar():
    decode, args, prompts = _prepared(temperature=0.0)
    ar = decode(prompts, **{**args, "method": "ar"})
    ov = decode(prompts, **args)
    assert ov.tokens == ar.tokens


def test_throughput_model():
    m = overlap_step_model(0.03, 0.01, 0.002)
    assert m["sd_step_s"] == pytest.approx(0.04) and m["overlap_step_s"] == pytest.approx(0.032)
    assert m["beats_sd"] and m["speedup"] == pytest.approx(0.04 / 0.032)
    assert not overlap_step_model(0.03, 0.01, 0.02)["beats_sd"]  # transfers dearer than the hidden draft


def test_errors():
    decode, args, prompts = _prepared()
    with pytest.raises(TypeError, match="sd-overlap"):
        decode(prompts, **args, mesh="two groups")
    with pytest.raises(ValueError, match="needs a draft"):
        decode(prompts, **{**args, "draft": None})
    from smcsd.drafters.specblock import SpecBlockDrafter
    target = args["target"]
    adaptive = SpecBlockDrafter.create(target, num_layers=1, block_size=3, seed=0).adaptive()
    with pytest.raises(ValueError, match="learns online"):
        decode(prompts, **{**args, "draft": adaptive})
    with pytest.raises(ValueError, match="data axis"):  # a 2-row half cannot be split over a 3-wide data axis
        from smcsd.methods.sd_overlap import as_meshes
        as_meshes(OverlapMeshes(smcsd.make_mesh(1, 1), smcsd.make_mesh(1, 1))._replace(
            target=_fake_mesh(3)), 2)
    one = split_devices()
    assert isinstance(one, OverlapMeshes) and one.target.devices.size == 1  # this process sees one device


def _fake_mesh(data):
    """A ("data", "model") mesh with `data` entries (the one device repeated is enough for the shape checks)."""
    import jax
    from jax.sharding import AxisType, Mesh
    return Mesh(np.array([jax.devices()[0]] * data).reshape(data, 1), ("data", "model"),
                axis_types=(AxisType.Auto, AxisType.Auto))


def test_overlap_in_available_methods():
    assert "sd-overlap" in smcsd.available_methods()
    assert engine.METHODS["sd-overlap"].exact


@pytest.mark.slow  # a subprocess on 8 host devices, several compiles
def test_eight_devices_overlap(tmp_path):
    """4 target + 4 drafter devices: tokens identical to the one-device fallback and to the sequential order, and a
    timeline in which the two groups are busy at the same time."""
    out = tmp_path / "overlap.json"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = os.pathsep.join([root, HERE, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "overlap_check.py"), "--out", str(out)], env=env,
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"overlap_check.py failed:\n{proc.stderr[-4000:]}"
    rep = json.loads(out.read_text())
    assert rep["devices"] == 8 and rep["groups"] == [4, 4]
    assert rep["tokens_equal_sequential"] and rep["tokens_equal_one_device"]
    # Both groups busy at once for a real share of the run (at least a tenth of the shorter group's busy time).
    ov = rep["timeline"]
    assert ov["both_busy_s"] > 0.1 * min(ov["target_busy_s"], ov["drafter_busy_s"]), ov
    assert np.isfinite(rep["overlap_wall_s"]) and rep["overlap_wall_s"] > 0
