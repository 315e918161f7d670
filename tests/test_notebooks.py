"""The Colab notebooks under notebooks/: committed clean (nbformat v4, no outputs), and each one runs top
to bottom in a fresh kernel (nbclient) with SMCSD_NOTEBOOK_SMALL=1, cwd = notebooks/, without a cell error.

Executing them takes a few minutes on a CPU (mostly compiling one program per method and shape), hence
the `slow` mark on the execution tests; the cleanliness checks are fast."""

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NB_DIR = os.path.join(ROOT, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NB_DIR, "*.ipynb")))
EXPECTED = {"quickstart.ipynb", "speed_vs_accuracy.ipynb", "your_checkpoint.ipynb", "real_model.ipynb",
            "train_drafter.ipynb"}
CELL_TIMEOUT_S = 1800  # per cell: generous, a shared CPU compiles slowly


def _ids(paths):
    return [os.path.basename(p) for p in paths]


def test_expected_notebooks_present():
    assert EXPECTED <= set(_ids(NOTEBOOKS)), f"missing notebooks: {EXPECTED - set(_ids(NOTEBOOKS))}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_clean(path):
    """nbformat v4, valid, and saved without outputs or execution counts (clear outputs before committing)."""
    with open(path, encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4, f"{path}: nbformat {nb.nbformat}, expected 4"
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{os.path.basename(path)}: code cells {dirty} have outputs; clear them before committing"
    assert "widgets" not in nb.metadata, f"{path}: saved widget state; clear it before committing"
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "SMCSD_NOTEBOOK_SMALL" in sources, f"{path}: heavy settings must read SMCSD_NOTEBOOK_SMALL"
    assert os.path.getsize(path) < 100_000, f"{path} is {os.path.getsize(path)} bytes: outputs left in?"


def _execute(path, monkeypatch, **env):
    """Run the notebook in a fresh python3 kernel (it inherits this environment), cwd = notebooks/."""
    from nbclient import NotebookClient

    monkeypatch.setenv("SMCSD_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with open(path, encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": NB_DIR}})
    client.execute()  # raises CellExecutionError (with the traceback) when a cell fails
    return nb


def _stream_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, monkeypatch):
    # Default paths of your_checkpoint.ipynb point at Google Drive: it must fall back and say so.
    nb = _execute(path, monkeypatch)
    text = _stream_text(nb)
    name = os.path.basename(path)
    if name == "quickstart.ipynb":
        assert "greedy tokens identical to ar: True" in text
        assert _images(nb) == 2  # ESS over cycles, accepted per position
    elif name == "speed_vs_accuracy.ipynb":
        assert "grid of" in text and "noise floor" in text
        assert _images(nb) == 2  # Pareto plot, TV vs N
    elif name == "your_checkpoint.ipynb":
        assert "NOTE: the checkpoint folders were not found" in text
    elif name == "real_model.ipynb":  # SmolLM2 when the registry (or the cache) has it, else tiny-code, said so
        assert "smollm2-135m" in text or "falling back to the shipped tiny-code pair" in text
        assert "smc N=2 K=4, ar-distilled" in text and _images(nb) == 1
    elif name == "train_drafter.ipynb":
        assert "mean acceptance length" in text and text.count("mean acceptance length") == 3
        assert _images(nb) == 1  # training curves


@pytest.mark.slow
def test_your_checkpoint_loads_hf_pair(tmp_path, monkeypatch):
    """With real checkpoint folders (tiny random HF exports here), the notebook loads them and decodes on a mesh."""
    from smcsd.models import ByteTokenizer, ModelConfig, init_model, save_pretrained

    tok = ByteTokenizer()
    for role, hidden, layers, seed in [("target", 32, 2, 0), ("draft", 16, 1, 1)]:
        cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=256)
        save_pretrained(init_model(cfg, seed, tokenizer=tok, name=role), str(tmp_path / role))
    nb = _execute(os.path.join(NB_DIR, "your_checkpoint.ipynb"), monkeypatch,
                  SMCSD_TARGET_DIR=str(tmp_path / "target"), SMCSD_DRAFT_DIR=str(tmp_path / "draft"),
                  SMCSD_USE_CHECKPOINT_ON_CPU="1")
    text = _stream_text(nb)
    assert "Loaded your checkpoints (float32)" in text and "NOTE:" not in text
    assert "(checkpoint pair on" in text
