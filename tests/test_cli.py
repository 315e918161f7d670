"""The `smcsd` command line end to end: generate, bench, eval, help, and one-line errors.

Most tests call `smcsd.cli.main([...])` in-process (compiled programs are reused across tests); a
couple go through `python -m smcsd` to check the real entry point, exit status and stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import smcsd
from smcsd import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "def fibonacci(n):"  # bench_speed's first prompt: generate and the 1-cell bench share one program


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for word in ("generate", "bench", "eval", "examples:"):
        assert word in out
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0
    for flag in ("--method", "--num-particles", "--num-speculative-tokens", "--temperature", "--top-k", "--top-p",
                 "--max-new-tokens", "--seed", "--draft-temperature", "--ess-threshold", "--resampler", "--model",
                 "--target", "--draft", "examples:"):
        assert flag in out, flag
    code, out, _ = run(capsys, "bench", "--help")
    assert code == 0 and "--batch-sizes" in out and "usage: smcsd bench" in out


def test_no_command_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code != 0 and "generate" in out


def test_generate_random_ar(capsys):
    code, out, err = run(capsys, "generate", PROMPT, "--model", "random", "--method", "ar", "--max-new-tokens", "8",
                         "--seed", "1")
    assert code == 0, err
    lines = out.rstrip("\n").split("\n")
    assert lines[-1].startswith("ar | ") and "tok/s" in lines[-1]  # DecodeStats.summary()
    assert len(out) > len(lines[-1])


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_generate_random_smc_json(capsys):
    code, out, err = run(capsys, "generate", PROMPT, "--model", "random", "--method", "smc", "-N", "2", "-K", "2",
                         "--max-new-tokens", "8", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["prompts"] == [PROMPT] and len(res["texts"]) == 1
    assert res["stats"]["method"] == "smc" and 1 <= len(res["tokens"][0]) <= 8
    assert res["stats"]["num_resamples"] is not None


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_generate_random_sd_tree_json(capsys):
    code, out, err = run(capsys, "generate", PROMPT, "--model", "random", "--method", "sd-tree", "--tree",
                         "2,1:distinct", "--max-new-tokens", "8", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["stats"]["method"] == "sd-tree" and 1 <= len(res["tokens"][0]) <= 8
    assert len(res["stats"]["accepted_per_position"]) == 2  # one count per tree depth


def test_generate_random_sd_confidence_cut_json(capsys):
    code, out, err = run(capsys, "generate", PROMPT, "--model", "random", "--method", "sd", "-K", "3",
                         "--confidence-cut", "0.5", "--max-new-tokens", "8", "--json")
    assert code == 0, err
    st = json.loads(out)["stats"]
    assert st["method"] == "sd" and st["num_draft_tokens"] <= 3 * st["num_drafts"]


def test_generate_stdin_json_ar(capsys, monkeypatch):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT))
    code, out, err = run(capsys, "generate", "-", "--model", "random", "--method", "ar", "--max-new-tokens", "8",
                         "--json")
    assert code == 0, err
    res = json.loads(out)  # strict JSON: ar's undefined acceptance rate is null, not NaN
    assert res["prompts"] == [PROMPT] and res["stats"]["acceptance_rate"] is None


@pytest.mark.skipif("tiny-code" not in smcsd.available_models(), reason="the shipped tiny-code pair isn't built yet")
def test_generate_shipped_default_pair(capsys):
    code, out, err = run(capsys, "generate", "def add(a, b):", "--max-new-tokens", "8", "--echo")
    assert code == 0, err
    # the shipped pair with its best drafter: the method decode's stored defaults choose on this backend
    from smcsd.defaults import backend, load_defaults
    chosen = load_defaults("tiny-code")["backends"][backend()]["ar-distilled"]["default"]["method"]
    assert out.startswith("def add(a, b):") and out.rstrip("\n").split("\n")[-1].startswith(f"{chosen} | ")


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_bench_one_cell(capsys, tmp_path):
    bench = cli.load_experiment("experiments.bench.speed")
    out_json = tmp_path / "bench.json"
    code, out, err = run(capsys, "bench", "--model", "random", "--cells", "smc,N=2,K=2", "--batch-sizes", "1",
                         "--max-new-tokens", "8", "--repeats", "2", "--warmup", "0", "--out", str(out_json),
                         "--no-progress")
    assert code == 0, err
    assert "| smc | 1 | 2 | 2 |" in out  # the markdown table row
    res = json.loads(out_json.read_text())
    assert tuple(res) == bench.TOP_FIELDS and res["schema"] == bench.SCHEMA
    (cell,) = res["cells"]
    assert tuple(cell) == bench.CELL_FIELDS
    for field in bench.TOP_FIELDS + bench.CELL_FIELDS:  # every field is documented
        assert field in bench.__doc__, field
    assert cell["label"] == "smc N=2 K=2" and cell["tokens_per_s"] > 0 and len(cell["tokens_per_s_runs"]) == 2
    assert cell["tokens_per_request"] == 8  # EOS ignored: every request makes max_new_tokens
    assert cell["target_calls_per_token"] == pytest.approx(cell["target_calls"] / 8)
    assert 0 < cell["mean_ess_fraction"] <= 1 and cell["resamples"] is not None
    assert cell["speedup_vs_ar"] is None  # no ar cell in this run


def test_bench_pareto_helpers():
    bench = cli.load_experiment("experiments.bench.speed")
    assert bench.pareto_front([(10, 0.5), (5, 0.9), (4, 0.8), (12, 0.4), (10, 0.6)]) == {1, 3, 4}
    cells = bench.make_cells(["ar", "sd", "smc"], [1, 4], [2, 4], [3])
    assert [c.label for c in cells if c.batch_size == 1] == ["ar", "sd K=3", "smc N=2 K=3", "smc N=4 K=3"]
    assert bench.parse_cell_spec("smc,N=4,K=2") == ("smc", 4, 2) and bench.parse_cell_spec("ar") == ("ar", None, None)


def test_make_docs_from_existing_results(tmp_path):
    """make_docs --no-run renders the page from whatever JSON is there (no benchmark is run)."""
    docs = cli.load_experiment("experiments.docs.make_docs")
    page = tmp_path / "benchmarks.md"
    assert docs.main(["--no-run", "--quick", "--out", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Benchmarks") and "## " in text
    assert "No speed results" not in text and "Not generated" not in text  # no empty sections: missing ones are listed
    rendered = docs.render_generic({"device": "cpu", "rows": [{"a": 1, "b": 0.5}], "pairs": {"x": {"ms": 2.0}}})
    assert "| a | b |" in rendered and "| x | 2 |" in rendered and "- device: cpu" in rendered
    assert docs.REPO not in text  # no machine paths on the page
    assert docs.portable(f"see {docs.REPO}/experiments/x.json") == "see experiments/x.json"


@pytest.mark.skipif("tiny-arith" not in smcsd.available_models(), reason="the shipped tiny-arith pair isn't built yet")
def test_eval_ten_problems(capsys, tmp_path):
    out_json = tmp_path / "eval.json"
    code, out, err = run(capsys, "eval", "--limit", "10", "--batch-size", "10", "--out", str(out_json),
                         "--no-progress")
    assert code == 0, err
    res = json.loads(out_json.read_text())
    assert res["n"] == 10 and 0 <= res["accuracy"] <= 1


def _write_pair(directory):
    """The random pair in the shipped-checkpoint layout (<dir>/{target,draft}/config.json + model.safetensors)."""
    import numpy as np
    from safetensors.numpy import save_file

    from smcsd.models.shipped import flatten_params
    for role, model in zip(("target", "draft"), cli.random_pair()):
        d = directory / role
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(model.config.to_dict()))
        tensors = {k: np.asarray(v, np.float32) for k, v in flatten_params(model.params).items()}
        save_file(tensors, str(d / "model.safetensors"))


def test_eval_pair_dir(capsys, tmp_path):
    """`smcsd eval` end to end on a (random) pair given by --pair-dir, so it runs before tiny-arith ships."""
    _write_pair(tmp_path / "pair")
    out_json = tmp_path / "eval.json"
    code, out, err = run(capsys, "eval", "--pair-dir", str(tmp_path / "pair"), "--method", "ar", "--limit", "10",
                         "--batch-size", "10", "--max-new-tokens", "8", "--out", str(out_json), "--no-progress")
    assert code == 0, err
    res = json.loads(out_json.read_text())
    assert res["n"] == 10 and 0 <= res["accuracy"] <= 1 and res["settings"]["method"] == "ar"


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_generate_local_checkpoints(capsys, tmp_path):
    """--target/--draft DIR load local checkpoints (here in the project's own layout)."""
    _write_pair(tmp_path / "pair")
    code, out, err = run(capsys, "generate", PROMPT, "--target", str(tmp_path / "pair" / "target"), "--draft",
                         str(tmp_path / "pair" / "draft"), "--max-new-tokens", "8", "--seed", "1")
    assert code == 0, err
    assert out.rstrip("\n").split("\n")[-1].startswith("sd | ")  # not a known pair: the generic default, sd


@pytest.mark.parametrize("argv, name", [
    (["generate", "x", "--temperature", "-1"], "--temperature"),
    (["generate", "x", "--method", "beam"], "--method"),
    (["generate", "x", "--top-p", "2"], "--top-p"),
    (["generate", "x", "--top-k", "-3"], "--top-k"),
    (["generate", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "x", "--num-particles", "zero"], "--num-particles"),
    (["generate", "x", "--resampler", "bogus"], "--resampler"),
    (["generate", "x", "--method", "sd-tree", "--tree", "2,zero"], "--tree"),
    (["generate", "x", "--confidence-cut", "1"], "--confidence-cut"),
    (["generate", "x", "--model", "random", "--method", "smc", "--confidence-cut", "0.3"], "confidence_cut"),
    (["generate", "x", "--model", "no-such-pair"], "--model"),
    (["generate", "x", "--target", "/no/such/dir"], "--target"),
    (["generate", "x", "--model", "random", "--max-new-tokens", "100000"], "max_new_tokens"),  # a library error
    (["generate"], "PROMPT"),
    (["frobnicate"], "frobnicate"),
    (["bench", "--batch-sizes", "0"], "--batch-sizes"),
    (["bench", "--cells", "smc,N=4"], "--cells"),
    (["eval", "--pair-dir", "x", "--limit", "many"], "--limit"),
    (["generate", "x", "--model", "random", "--target", "/tmp"], "--model"),
])
def test_bad_arguments_one_line(capsys, argv, name):
    code, out, err = run(capsys, *argv)
    assert code != 0
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    assert err.startswith("smcsd: error:") and name in err, err
    assert "Traceback" not in err


def test_bench_without_the_repo_is_one_clear_line(capsys, monkeypatch, tmp_path):
    """Installed without the source checkout, bench/eval say where the scripts should be."""
    monkeypatch.setattr(cli, "experiments_dir", lambda: tmp_path / "experiments")
    code, out, err = run(capsys, "bench", "--model", "random")
    assert code != 0 and err.count("\n") == 1
    assert err.startswith("smcsd: error:") and os.path.join("experiments", "bench", "speed.py") + " not found" in err


def test_entry_point_subprocess():
    """`python -m smcsd`: help exits 0; a bad argument exits 2 with one stderr line, no traceback."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ok = subprocess.run([sys.executable, "-m", "smcsd", "--help"], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ok.returncode == 0 and "generate" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "smcsd", "generate", "hi", "--top-p", "2"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("smcsd: error: argument --top-p"), bad.stderr


def test_console_script_declared():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["smcsd"] == "smcsd.cli:main"


def test_console_script_runs():
    """The installed `smcsd` command (present after `pip install -e .` with this pyproject)."""
    exe = os.path.join(os.path.dirname(sys.executable), "smcsd")
    if not os.path.isfile(exe):
        pytest.skip("the smcsd console script is not installed in this environment (re-run pip install -e .)")
    res = subprocess.run([exe, "generate", "x", "--method", "beam"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("smcsd: error: argument --method")
