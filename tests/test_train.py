"""Training of the shipped pairs (experiments.train.pair): exact resume from an orbax checkpoint,
the data generator's determinism and train/test disjointness, and the export round trip."""

import jax
import numpy as np
import pytest

from experiments import arith_data, code_data
from experiments.train import pair as tp
from smcsd.models import ModelConfig

TINY = ModelConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)


def _train(tmp_path, **kw):
    pair = tp.PAIRS["tiny-arith"]
    args = dict(steps=6, batch_size=4, seq_len=128, lr=3e-3, ckpt_dir=str(tmp_path / "ckpt"), out=None,
                results_dir=None, eval_every=3, ckpt_every=100, progress=False, config=TINY)
    args.update(kw)
    return tp.train_role(pair, "target", **args)


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    full = _train(tmp_path / "a")
    part = _train(tmp_path / "b", stop_after=3)  # "interrupted" after step 3 (checkpoint at 3)
    assert part["step"] == 3
    resumed = _train(tmp_path / "b", resume=True)
    assert resumed["step"] == full["step"] == 6
    full_losses = [l for _, l in full["history"]["train"]]
    resumed_losses = [l for _, l in resumed["history"]["train"]]
    assert len(resumed_losses) == 6
    assert resumed_losses == full_losses  # bitwise: same params, optimiser state and data
    assert [e["loss"] for e in resumed["history"]["eval"]] == [e["loss"] for e in full["history"]["eval"]]
    for a, b in zip(jax.tree_util.tree_leaves(full["params"]), jax.tree_util.tree_leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert full_losses[-1] < full_losses[0]  # it does learn


def test_resume_with_other_settings_or_without_flag_is_refused(tmp_path):
    _train(tmp_path, steps=4, stop_after=2)
    with pytest.raises(SystemExit, match="other settings"):
        _train(tmp_path, steps=4, lr=1e-3, resume=True)
    with pytest.raises(SystemExit, match="--resume"):
        _train(tmp_path, steps=4)


def test_export_round_trip(tmp_path):
    res = _train(tmp_path, steps=2, out=str(tmp_path / "out"))
    from smcsd.models.shipped import load_model_dir
    m = load_model_dir(str(tmp_path / "out" / "tiny-arith" / "target"))
    assert m.config == TINY
    for a, b in zip(jax.tree_util.tree_leaves(res["params"]), jax.tree_util.tree_leaves(m.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_arith_data_is_deterministic_and_disjoint_from_the_test_set():
    a, b = arith_data.train_batch(0, 7, 64), arith_data.train_batch(0, 7, 64)
    assert a == b and a != arith_data.train_batch(0, 8, 64)
    test = arith_data.test_set()
    assert len(test) >= 500 and len({p.question for p in test}) == len(test)
    test_q = {p.question for p in test}
    for step in range(20):
        assert not any(p.question in test_q for p in arith_data.train_batch(0, step, 64))
    for p in test[:200]:
        assert arith_data.parse_answer(p.answer_text) == p.answer
        assert len(p.text.encode()) <= arith_data.MAX_BYTES
        assert p.question.startswith("Q: ") and p.question.endswith("\nA:")


def test_code_split_is_by_file_and_deterministic():
    assert code_data.is_heldout("json/decoder.py") == code_data.is_heldout("json/decoder.py")
    files = [rel for rel, _ in code_data.stdlib_files()]
    held = [f for f in files if code_data.is_heldout(f)]
    assert 0.02 < len(held) / len(files) < 0.09


def test_cli_size_and_export_as(tmp_path):
    """--size resizes the role's model and --export-as puts the export (and checkpoint) under another name: how the
    distilled drafters of the shipped pairs are made (OUT/<pair>/drafters/ar-distilled)."""
    out = tmp_path / "out"
    tp.main(["--pair", "tiny-arith", "--role", "target", "--steps", "2", "--batch-size", "2", "--size", "32,48,1,2,1",
             "--export-as", "drafters/small", "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(out),
             "--results-dir", "", "--no-progress", "--eval-every", "2"])
    from smcsd.models.shipped import load_model_dir
    m = load_model_dir(str(out / "tiny-arith" / "drafters" / "small"))
    assert (m.config.hidden_size, m.config.intermediate_size, m.config.num_hidden_layers,
            m.config.num_attention_heads, m.config.num_key_value_heads) == (32, 48, 1, 2, 1)
    assert not (out / "tiny-arith" / "target").exists()
    assert (tmp_path / "ckpt" / "tiny-arith" / "drafters" / "small").is_dir()
    with pytest.raises(SystemExit, match="five integers"):
        tp.main(["--pair", "tiny-arith", "--role", "draft", "--size", "32,48"])
    with pytest.raises(SystemExit, match="one role"):
        tp.main(["--pair", "tiny-arith", "--role", "both", "--size", "32,48,1,2,1"])
