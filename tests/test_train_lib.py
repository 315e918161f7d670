"""smcsd.train: losses against hand-computed values, the corpus and teacher stream (disk cache included),
exact resume of the generic loop, the clear errors, and a short distillation that lowers the KL."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smcsd.models import ByteTokenizer, ModelConfig, forward_full, init_model
from smcsd.train import (TeacherStream, TextCorpus, ar_distill_loss, check_vocab, distill_ar_drafter,
                         losses, train)
from smcsd.train import cli as train_cli

TOK = ByteTokenizer()


def cfg(hidden=16, layers=1, heads=2, vocab=TOK.vocab_size):
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=1, max_position_embeddings=64,
                       bos_token_id=TOK.bos_id, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)


def texts(n=40, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "def", "f(x):", "return", "x"]
    return [" ".join(rng.choice(words, size=30)) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def target():
    """A tiny random target with peaked (init_std 0.5) next-token distributions."""
    return init_model(cfg(32, 2, 2), seed=3, tokenizer=TOK, init_std=0.5, name="tiny-target")


def corpus(batch_size=4, seq_len=16, **kw):
    return TextCorpus(texts(), tokenizer=TOK, seq_len=seq_len, batch_size=batch_size, **kw)


def log_softmax_np(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ----------------------------------------------------------------------------------------------- losses

def test_cross_entropy_and_masked_mean_match_numpy():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(2, 3, 5)).astype(np.float32), rng.integers(0, 5, (2, 3))
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    per = -np.take_along_axis(log_softmax_np(logits), labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(losses.token_cross_entropy(logits, labels), per, rtol=1e-5)
    np.testing.assert_allclose(losses.cross_entropy(logits, labels, mask), (per * mask).sum() / 3, rtol=1e-5)
    np.testing.assert_allclose(losses.cross_entropy(logits, labels), per.mean(), rtol=1e-5)
    assert abs(float(losses.cross_entropy(logits, labels, mask)) - per.mean()) > 1e-3  # the mask matters


def test_forward_kl_is_zero_iff_draft_equals_target_and_matches_numpy():
    rng = np.random.default_rng(1)
    t_logits, d_logits = rng.normal(size=(2, 4, 7)), rng.normal(size=(2, 4, 7))
    t_logp = log_softmax_np(t_logits)
    assert abs(float(losses.forward_kl(t_logp, t_logits + 3.0))) < 1e-6  # same distribution (shifted logits)
    kl = losses.forward_kl(t_logp, d_logits)
    expected = (np.exp(t_logp) * (t_logp - log_softmax_np(d_logits))).sum(-1).mean()
    np.testing.assert_allclose(kl, expected, rtol=1e-5)
    assert float(kl) > 0.01
    # target entries of probability 0 contribute nothing (no nan from 0 * -inf)
    with np.errstate(divide="ignore"):
        t0 = np.log(np.array([0.5, 0.5, 0.0]))
    np.testing.assert_allclose(losses.forward_kl(t0, np.zeros(3)), 0.5 * np.log(0.5 * 3) * 2, rtol=1e-6)


def test_topk_kl_equals_full_kl_when_k_is_vocab_and_is_renormalised_otherwise():
    rng = np.random.default_rng(2)
    V = 6
    t_logp, d_logits = log_softmax_np(rng.normal(size=(3, V)) * 2), rng.normal(size=(3, V))
    ids = np.argsort(-t_logp, -1)
    vals = np.take_along_axis(t_logp, ids, -1)
    full = losses.forward_kl(t_logp, d_logits)
    np.testing.assert_allclose(losses.forward_kl_topk(ids, vals, d_logits), full, rtol=1e-5)
    k = 2
    p = np.exp(vals[:, :k]) / np.exp(vals[:, :k]).sum(-1, keepdims=True)
    logq = np.take_along_axis(log_softmax_np(d_logits), ids[:, :k], -1)
    expected = (p * (np.log(p) - logq)).sum(-1).mean()
    got = losses.forward_kl_topk(ids[:, :k], vals[:, :k], d_logits)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert abs(float(got) - float(full)) > 1e-3 and float(got) > 0


def test_block_position_weights_on_hand_examples():
    np.testing.assert_array_equal(losses.uniform_weights(3), [1, 1, 1])
    w = np.asarray(losses.dflash_weights(3, gamma=2.0))
    np.testing.assert_allclose(w, [1.0, np.exp(-0.5), np.exp(-1.0)], rtol=1e-6)
    assert not np.allclose(w, 1.0)
    np.testing.assert_allclose(losses.dflash_weights(3, gamma=1e9), [1, 1, 1], rtol=1e-6)
    with pytest.raises(ValueError, match="gamma"):
        losses.dflash_weights(3, gamma=0.0)
    # D-PACE, a = 0.5: s = [0.75, 0.9, 0.95], P = [0.75, 0.675, 0.64125], w_k = sum of P_j for j >= k
    P = np.array([0.75, 0.75 * 0.9, 0.75 * 0.9 * 0.95])
    np.testing.assert_allclose(losses.dpace_weights(np.array([0.5, 0.8, 0.9])), [P.sum(), P[1:].sum(), P[2]],
                               rtol=1e-6)
    # a masked position has s = 1 and adds nothing to the sums; a = 1 ignores q (w_k = number of valid j >= k)
    np.testing.assert_allclose(losses.dpace_weights(np.array([0.5, 0.8, 0.9]), np.array([1, 0, 1])),
                               [0.75 + 0.75 * 0.95, 0.75 * 0.95, 0.75 * 0.95], rtol=1e-6)
    np.testing.assert_allclose(losses.dpace_weights(np.array([[0.1, 0.2], [0.3, 0.4]]), a=1.0), [[2, 1], [2, 1]])
    with pytest.raises(ValueError, match="a must be"):
        losses.dpace_weights(np.array([0.5]), a=1.5)
    assert losses.dflash_gamma(16) == 7 and losses.dflash_gamma(8) == 4 and losses.dflash_gamma(4) == 3
    np.testing.assert_allclose(losses.cat_weights(np.log(np.array([0.5, 0.25, 0.9]))), [1.0, 0.5, 0.125], rtol=1e-6)
    np.testing.assert_array_equal(losses.valid_prefix_mask(np.array([True, False, True, True])), [1, 1, 0, 0])
    np.testing.assert_array_equal(losses.valid_prefix_mask(np.array([[0, 1, 1], [1, 1, 1]])), [[1, 0, 0], [1, 1, 1]])
    # data-dependent weights are not trained through
    for fn in (losses.dpace_weights, losses.cat_weights, losses.valid_prefix_mask):
        g = jax.grad(lambda a: fn(a).sum())(jnp.array([0.3, 0.6, 0.9]))
        np.testing.assert_array_equal(g, 0.0)


def test_weighted_mean_on_hand_example():
    loss = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 7.0]])
    w = np.array([1.0, 0.5, 0.25])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    num = 1 + 1 + 1 + 3 + 2.5
    np.testing.assert_allclose(losses.weighted_mean(loss, w, mask), num / (1.75 + 1.5), rtol=1e-6)
    np.testing.assert_allclose(losses.weighted_mean(loss, w, mask, normalize=False), num / 5, rtol=1e-6)
    np.testing.assert_allclose(losses.weighted_mean(loss, losses.uniform_weights(3), mask), 15 / 5, rtol=1e-6)
    assert float(losses.weighted_mean(loss, w, mask)) != pytest.approx(15 / 5)  # the weights matter


# ----------------------------------------------------------------------------------------------- data

def test_corpus_batches_are_deterministic_cover_an_epoch_and_hold_out_rows():
    c = corpus(heldout_frac=0.1)
    assert c.train_rows.shape[1] == 16 and len(c.heldout_rows) >= 1
    np.testing.assert_array_equal(c.batch(5), corpus(heldout_frac=0.1).batch(5))
    assert not np.array_equal(c.batch(5), c.batch(6))
    assert not np.array_equal(c.batch(0), TextCorpus(texts(), tokenizer=TOK, seq_len=16, batch_size=4,
                                                     heldout_frac=0.1, seed=1).batch(0))
    seen = np.concatenate([c.train_indices(s) for s in range(c.batches_per_epoch)])
    assert len(set(seen.tolist())) == len(seen) == c.batches_per_epoch * 4  # an epoch: no row twice
    # the held-out rows are the packed stream's tail, never in a training batch
    assert c.train_rows[-1].tobytes() != c.heldout_rows[0].tobytes()
    assert c.describe()["heldout_rows"] == len(c.heldout_rows)


def test_unpacked_corpus_has_one_padded_document_per_row():
    docs = ["ab", "hello world", "xyz"] * 4
    c = TextCorpus(docs, tokenizer=TOK, seq_len=16, batch_size=2, heldout_frac=0.25, pack=False)
    rows = np.concatenate([c.train_rows, c.heldout_rows])
    assert rows.shape == (12, 16) and c.num_tokens == sum(len(d) + 2 for d in docs)  # BOS + bytes + EOS
    np.testing.assert_array_equal(rows[1, :13], [TOK.bos_id] + list(b"hello world") + [TOK.eos_id])
    assert (rows[1, 13:] == TOK.pad_id).all() and (rows[:, 0] == TOK.bos_id).all()
    with pytest.raises(ValueError, match="more than seq_len=8"):
        TextCorpus(docs, tokenizer=TOK, seq_len=8, batch_size=2, pack=False)


def test_corpus_too_small_and_vocab_mismatch_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"corpus has 11 tokens, fewer than one batch of batch_size\*seq_len = 64; "
                                         r"add text or lower batch_size/seq_len"):
        TextCorpus(["tiny text"], tokenizer=TOK, seq_len=16, batch_size=4)
    (tmp_path / "a.txt").write_text("x" * 70)
    with pytest.raises(ValueError, match="training rows .* fewer than one batch of batch_size = 4"):
        TextCorpus(files=[str(tmp_path)], tokenizer=TOK, seq_len=16, batch_size=4, heldout_frac=0.2)
    with pytest.raises(FileNotFoundError, match="nope"):
        TextCorpus(files=[str(tmp_path / "nope")], tokenizer=TOK, seq_len=16, batch_size=4)
    with pytest.raises(ValueError, match="vocab mismatch: the target has vocab_size 259 but the drafter config has 300"):
        check_vocab(cfg(), cfg(vocab=300))
    check_vocab(cfg(), cfg(32))


def test_teacher_stream_outputs_match_the_target(target):
    c = corpus()
    s = TeacherStream(target, c, topk=5, layers=(0, 1))
    b = s.batch(3)
    assert b["tokens"].shape == (4, 16) and b["topk_ids"].shape == b["topk_logp"].shape == (4, 16, 5)
    assert b["hidden"].shape == (4, 16, 2 * 32)
    logits, hidden = forward_full(target.config, target.params, jnp.asarray(c.batch(3)), hidden_layers=(0, 1))
    logp = np.asarray(jax.nn.log_softmax(logits, -1))
    np.testing.assert_allclose(b["topk_logp"], np.sort(logp, -1)[..., ::-1][..., :5], atol=1e-5)
    np.testing.assert_allclose(b["hidden"][..., 32:], np.asarray(hidden[1]), atol=1e-5)  # layer-major concat
    full = TeacherStream(target, c, topk=None).batch(3)
    assert set(full) == {"tokens", "logp"} and full["logp"].shape == (4, 16, TOK.vocab_size)
    np.testing.assert_allclose(full["logp"], logp, atol=1e-5)


def test_teacher_disk_cache_round_trip(target, tmp_path, monkeypatch):
    c = corpus()
    plain = TeacherStream(target, c, topk=8, layers=(1,))
    cached = TeacherStream(target, c, topk=8, layers=(1,), cache_dir=str(tmp_path), shard_rows=8)
    steps = [0, 1, c.batches_per_epoch + 2]  # the last is in the second epoch
    first = [cached.batch(s) for s in steps]
    files = sorted(os.listdir(cached.cache_dir))
    assert "meta.json" in files and any(f.endswith(".topk_logp.npy") for f in files)
    shard = next(f for f in files if f.endswith(".topk_logp.npy"))
    assert np.load(os.path.join(cached.cache_dir, shard)).dtype == np.float16
    again = TeacherStream(target, c, topk=8, layers=(1,), cache_dir=str(tmp_path), shard_rows=8)
    assert again.cache_dir == cached.cache_dir
    monkeypatch.setattr(again, "compute", lambda tokens: pytest.fail("a cached shard was recomputed"))
    for s, b1 in zip(steps, first):
        b2, b0 = again.batch(s), plain.batch(s)
        for k in b1:
            np.testing.assert_array_equal(b2[k], b1[k])  # re-read == first (both from the float16 store)
        np.testing.assert_array_equal(b2["topk_ids"][..., :1], b0["topk_ids"][..., :1])
        np.testing.assert_allclose(b2["topk_logp"], b0["topk_logp"], rtol=2e-3, atol=2e-3)  # float16 rounding
        np.testing.assert_allclose(b2["hidden"], b0["hidden"], rtol=2e-3, atol=2e-3)
    # another k, or another target, is another cache entry
    assert TeacherStream(target, c, topk=4, cache_dir=str(tmp_path)).cache_dir != cached.cache_dir
    other = init_model(target.config, seed=9, tokenizer=TOK, init_std=0.5)
    assert TeacherStream(other, c, topk=8, layers=(1,), cache_dir=str(tmp_path),
                         shard_rows=8).cache_dir != cached.cache_dir


# ----------------------------------------------------------------------------------------------- loop

DRAFT = cfg(16, 1, 2)
# One optimiser setting for the loop tests, so they share one compiled step (XLA:CPU compiles take seconds).
OPT = dict(steps=30, lr=1e-2, warmup=3)


@pytest.fixture(scope="module")
def stream(target):
    return TeacherStream(target, corpus(batch_size=8, heldout_frac=0.1), topk=None)


@pytest.fixture(scope="module")
def draft():
    return init_model(DRAFT, seed=1, tokenizer=TOK, name="tiny-draft")


def _run(stream, draft, tmp, **kw):
    args = dict(OPT, ckpt_dir=str(tmp / "ckpt"), progress=False, ckpt_every=100, meta={"what": "test"})
    args.update(kw)
    return train(ar_distill_loss(DRAFT, 0.5, 0.5), draft.params, stream.batch, **args)


def test_resume_reproduces_the_uninterrupted_run_exactly(stream, draft, tmp_path):
    full = _run(stream, draft, tmp_path / "a")
    part = _run(stream, draft, tmp_path / "b", stop_after=10)
    assert part.step == 10 and not part.history["finished"]
    resumed = _run(stream, draft, tmp_path / "b", resume=True, curves_path=str(tmp_path / "curves"))
    assert resumed.step == 30 and resumed.history["finished"]
    assert resumed.history["train"] == full.history["train"]  # bitwise: loss, ce, kl, grad norm of every step
    for a, b in zip(jax.tree_util.tree_leaves(full.params), jax.tree_util.tree_leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert os.path.exists(tmp_path / "curves.json") and os.path.exists(tmp_path / "curves.png")
    with pytest.raises(ValueError, match=r"other settings .*\"lr\""):
        _run(stream, draft, tmp_path / "b", lr=5e-3, resume=True)
    with pytest.raises(ValueError, match="other settings .*what"):
        _run(stream, draft, tmp_path / "b", resume=True, meta={"what": "else"})
    with pytest.raises(FileExistsError, match="resume .* overwrite"):
        _run(stream, draft, tmp_path / "b")
    again = _run(stream, draft, tmp_path / "b", overwrite=True, stop_after=2)
    assert again.step == 2 and [r["step"] for r in again.history["train"]] == [1, 2]


def test_distillation_lowers_the_kl_and_exports(target, stream, draft, tmp_path):
    res = distill_ar_drafter(target, draft, stream, **OPT, eval_every=15, progress=False,
                             out=str(tmp_path / "drafter"), command="pytest distill")
    ev = res.history["eval"]
    assert [e["step"] for e in ev] == [0, 15, 30]
    assert ev[-1]["kl"] < 0.8 * ev[0]["kl"], ev
    assert 0 < ev[0]["accept"] < ev[-1]["accept"] <= 1
    from smcsd.models.shipped import load_model_dir
    m = load_model_dir(str(tmp_path / "drafter"))
    assert m.config == DRAFT
    for a, b in zip(jax.tree_util.tree_leaves(res.params), jax.tree_util.tree_leaves(m.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    info = json.loads((tmp_path / "drafter" / "training.json").read_text())
    assert info["commands"][0]["command"] == "pytest distill" and info["train_wall_s"] >= 0
    assert info["budget"]["tokens_seen"] == 30 * 8 * 16 and info["final_eval"]["step"] == 30


def test_objective_per_position_matches_closed_forms_at_temperature():
    """An SMC objective compares p_τ ∝ p^(1/τ) with q_τ = softmax(logits / τ); each divergence is checked against
    its closed form computed here in numpy (D_2 = log Σ p²/q, reverse KL = Σ q log q/p)."""
    from smcsd.train import Objective
    rng = np.random.default_rng(5)
    t_logits, d_logits = rng.normal(size=(2, 3, 6)) * 2, rng.normal(size=(2, 3, 6)) * 2
    batch = {"logp": jnp.asarray(log_softmax_np(t_logits), jnp.float32)}
    tau = 0.7
    p, q = np.exp(log_softmax_np(t_logits / tau)), np.exp(log_softmax_np(d_logits / tau))
    closed = {"renyi": np.log((p ** 2 / q).sum(-1)), "reverse_kl": (q * np.log(q / p)).sum(-1),
              "forward_kl": (p * np.log(p / q)).sum(-1)}
    a15 = np.log((p ** 1.5 * q ** -0.5).sum(-1)) / 0.5
    closed["renyi_kl_mix"] = a15 + 0.25 * closed["forward_kl"]
    for name, want in closed.items():
        obj = Objective(name, alpha=1.5 if name == "renyi_kl_mix" else 2.0, temperature=tau, mix_kl_weight=0.25)
        got = np.asarray(obj.per_position(batch, jnp.asarray(d_logits, jnp.float32)))
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5, err_msg=name)
    # the temperature is applied: at τ = 1 the value differs
    assert not np.allclose(np.asarray(Objective("renyi").per_position(batch, jnp.asarray(d_logits, jnp.float32))),
                           closed["renyi"], atol=1e-3)


@pytest.mark.parametrize("kw, match", [
    (dict(divergence="renyi", alpha=1.0), "alpha"), (dict(divergence="renyi_kl_mix", alpha=0.5), "alpha"),
    (dict(divergence="chi2"), "divergence must be one of"), (dict(temperature=0.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(mix_kl_weight=-1.0), "mix_kl_weight"),
    (dict(mix_kl_weight=float("nan")), "mix_kl_weight")])
def test_objective_bad_settings_are_clear_errors(kw, match):
    from smcsd.train import Objective
    with pytest.raises(ValueError, match=match):
        Objective(**kw)


def test_distill_with_an_smc_objective_resumes_exactly_and_lowers_it(target, stream, draft, tmp_path):
    """Rényi-2 at τ = 0.7: the held-out objective falls; a run stopped and resumed gives the uninterrupted losses
    bit for bit; resuming with another objective is refused (it is part of the run's settings)."""
    from smcsd.train import Objective
    obj = Objective("renyi", alpha=2.0, temperature=0.7)
    kw = dict(steps=12, lr=1e-2, warmup=2, eval_every=12, progress=False, objective=obj, ce_weight=0.0,
              kl_weight=1.0)
    full = distill_ar_drafter(target, draft, stream, ckpt_dir=str(tmp_path / "a"), **kw)
    ev = full.history["eval"]
    assert ev[-1]["objective"] < 0.9 * ev[0]["objective"], ev
    distill_ar_drafter(target, draft, stream, ckpt_dir=str(tmp_path / "b"), stop_after=5, **kw)
    resumed = distill_ar_drafter(target, draft, stream, ckpt_dir=str(tmp_path / "b"), resume=True, **kw)
    assert resumed.history["train"] == full.history["train"]
    with pytest.raises(ValueError, match="other settings"):
        distill_ar_drafter(target, draft, stream, ckpt_dir=str(tmp_path / "b"), resume=True,
                           **{**kw, "objective": Objective("reverse_kl", temperature=0.7)})
    with pytest.raises(TypeError, match="objective must be"):
        distill_ar_drafter(target, draft, stream, steps=1, objective=2.0)


# ----------------------------------------------------------------------------------------------- cli

def test_train_drafter_cli_end_to_end(target, draft, tmp_path, capsys):
    from smcsd.train.loop import export_model
    export_model(target.config, target.params, str(tmp_path / "target"))
    export_model(draft.config, draft.params, str(tmp_path / "init"))
    (tmp_path / "corpus").mkdir()
    for i, t in enumerate(texts()):
        (tmp_path / "corpus" / f"{i:02d}.txt").write_text(t)
    # the loop tests' shapes and settings, so the compiled programs are shared
    argv = ["--target", str(tmp_path / "target"), "--corpus", str(tmp_path / "corpus"), "--out",
            str(tmp_path / "out"), "--init", str(tmp_path / "init"), "--steps", "30", "--lr", "1e-2", "--warmup", "3",
            "--batch-size", "8", "--seq-len", "16", "--heldout-frac", "0.1", "--topk", "0", "--no-progress"]
    from experiments.train import drafter as train_drafter  # the thin script: the same parser and run()
    assert train_drafter.main(argv) == 0
    assert "exported to" in capsys.readouterr().out
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert info["run"]["draft_config"] == DRAFT.to_dict() and info["run"]["topk"] is None
    assert info["corpus"]["documents"] == len(texts()) and info["commands"][0]["command"].startswith(
        "python -m experiments.train.drafter --target")
    assert os.path.exists(tmp_path / "out" / "curves.png") and os.path.isdir(tmp_path / "out-ckpt")
    with pytest.raises(ValueError, match="checkpoints exist .* --resume .* --overwrite"):  # in OUT-ckpt
        train_cli.run(train_cli.build_parser().parse_args(argv))
    with pytest.raises(ValueError, match="--target nope-model: no such file"):
        train_cli.run(train_cli.build_parser().parse_args(["--target", "nope-model"] + argv[2:]))
    # --mesh: the finished run restored onto a (1x1) mesh and exported again (the mesh code path; 8-device and
    # two-process meshes are tests/test_train_mesh.py's); bad specs name the flag
    capsys.readouterr()
    assert train_cli.run(train_cli.build_parser().parse_args(argv + ["--resume", "--mesh", "1x1"])) == 0
    assert "30/30 steps" in capsys.readouterr().out
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert [p["data"] for p in info["budget"]["placements"]] == [1], info["budget"]["placements"]
    for spec, match in (("3x", r"--mesh '3x': expected DATAxMODEL"), ("2x1", r"--mesh '2x1': data \(2\) x model")):
        with pytest.raises(ValueError, match=match):
            train_cli.run(train_cli.build_parser().parse_args(argv + ["--mesh", spec]))
    with pytest.raises(ValueError, match="--coordinator / --num-processes / --process-id need --distributed"):
        train_cli.run(train_cli.build_parser().parse_args(argv + ["--process-id", "1"]))


def test_draft_config_spec():
    target = cfg(64, 2, 2)
    d = train_cli.parse_draft_config("hidden=32,layers=1,heads=2,kv_heads=1,intermediate=48,rope_theta=500.0", target)
    assert (d.hidden_size, d.num_hidden_layers, d.num_attention_heads, d.num_key_value_heads,
            d.intermediate_size, d.rope_theta) == (32, 1, 2, 1, 48, 500.0)
    assert (d.vocab_size, d.eos_token_id, d.max_position_embeddings) == (259, TOK.eos_id, 64)
    assert train_cli.parse_draft_config(None, target).hidden_size == 64
    with pytest.raises(ValueError, match="--draft-config: unknown key 'width'"):
        train_cli.parse_draft_config("width=3", target)
    with pytest.raises(ValueError, match="expected key=value"):
        train_cli.parse_draft_config("hidden", target)
