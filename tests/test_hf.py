"""Hugging Face checkpoints: logit parity with transformers' own references (tests/fixtures/hf, made by
tests/fixtures/make_hf_fixtures.py), tokenizer parity, export round trips, and clear errors on bad input."""

import contextlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from smcsd.models import ByteTokenizer, HFTokenizer, ModelConfig, from_pretrained, init_model, save_pretrained
from smcsd.models.hf import byte_tokenizer_json

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
ARCHS = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def refs():
    return load_file(os.path.join(FIX, "reference.safetensors"))


def _load(name, **kw):
    with pytest.warns(UserWarning, match="sliding_window") if name == "mistral" else contextlib.nullcontext():
        return from_pretrained(os.path.join(FIX, name), **kw)


@pytest.mark.parametrize("name", ARCHS)
def test_logit_parity_float32(name, refs):
    model = _load(name, dtype="float32")
    logits = np.asarray(model(refs[f"{name}/input_ids"]))
    ref = refs[f"{name}/logits"]
    assert logits.dtype == np.float32 and logits.shape == ref.shape
    assert np.abs(logits - ref).max() < 1e-4


def test_cached_forward_matches_reference(refs):
    """The decode path (KV cache, two chunks) gives the same logits as transformers on a loaded model."""
    model = _load("qwen3", dtype="float32")
    ids = jnp.asarray(refs["qwen3/input_ids"], jnp.int32)
    cache = model.init_cache(ids.shape[0], 16)
    a, cache = model.apply(model.params, ids[:, :5], cache)
    b, cache = model.apply(model.params, ids[:, 5:], cache)
    got = np.concatenate([np.asarray(a), np.asarray(b)], axis=1)
    assert np.abs(got - refs["qwen3/logits"]).max() < 1e-4


def test_config_mapping():
    llama = _load("llama")
    c = llama.config
    assert dict(c.rope_scaling) == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 8)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (0, 1, 2)
    assert c.rms_norm_eps == 1e-5 and c.rope_theta == 10000.0 and c.dtype == "float32"
    assert not c.tie_word_embeddings and not c.attention_bias and not c.qk_norm
    mistral = _load("mistral")  # sliding_window 64 < 256: max length lowered, with a warning
    assert mistral.config.max_position_embeddings == 64 and mistral.config.rope_theta == 1e6
    qwen2 = _load("qwen2")
    assert qwen2.config.attention_bias and qwen2.config.tie_word_embeddings and "lm_head" not in qwen2.params
    qwen3 = _load("qwen3")
    assert qwen3.config.qk_norm and qwen3.config.head_dim == 16 and not qwen3.config.attention_bias
    assert qwen3.config.dtype == "bfloat16"  # from the config's dtype when none is asked for
    assert qwen3.tokenizer is None and llama.tokenizer is not None


def test_tokenizer_parity():
    tok = _load("llama").tokenizer
    assert isinstance(tok, HFTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (0, 1, 2, 300)
    with open(os.path.join(FIX, "tokenizer_reference.json")) as f:
        cases = json.load(f)
    for case in cases:
        assert tok.encode(case["text"], add_bos=False) == case["ids"]
        assert tok.encode(case["text"]) == [0] + case["ids"]
        assert tok.decode(case["ids"]) == case["text"]
        assert tok.decode([0] + case["ids"] + [1]) == case["text"]  # specials skipped


def _assert_same(a, b):
    assert a.config == b.config
    la, lb = jax.tree_util.tree_leaves_with_path(a.params), jax.tree_util.tree_leaves_with_path(b.params)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32)), path


@pytest.mark.parametrize("name", ARCHS)
def test_round_trip(name, tmp_path, refs):
    model = _load(name)
    save_pretrained(model, tmp_path)
    assert json.load(open(tmp_path / "config.json"))["architectures"]
    back = from_pretrained(tmp_path)
    _assert_same(model, back)
    if model.tokenizer is not None:
        for text in ("def f(x):\n    return x", "naïve ✓"):
            assert back.tokenizer.encode(text) == model.tokenizer.encode(text)
        assert (back.tokenizer.bos_id, back.tokenizer.eos_id) == (model.tokenizer.bos_id, model.tokenizer.eos_id)
    else:
        assert back.tokenizer is None


@pytest.mark.parametrize("flags", [dict(attention_bias=True, qk_norm=True),  # Qwen3 + zero o_proj bias
                                   dict(attention_bias=True, mlp_bias=True),  # Llama with biases
                                   dict(tie_word_embeddings=True)])
def test_round_trip_random_models(flags, tmp_path):
    cfg = ModelConfig(vocab_size=259, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=257, bos_token_id=256, **flags)
    model = init_model(cfg, seed=1, tokenizer=ByteTokenizer())
    save_pretrained(model, tmp_path)
    back = from_pretrained(tmp_path)
    _assert_same(model, back)
    assert isinstance(back.tokenizer, ByteTokenizer)


def test_byte_tokenizer_json_matches_byte_tokenizer():
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(byte_tokenizer_json())
    bt = ByteTokenizer()
    for text in ("hello world", "  def f(x):\n\treturn x  ", "naïve café — ✓ 日本語", ""):
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == bt.encode(text, add_bos=False)
        assert hf.decode(ids) == bt.decode(ids) == text
    assert [hf.token_to_id(t) for t in ("<s>", "</s>", "<pad>")] == [256, 257, 258]


def test_bf16_load(refs):
    model = _load("llama", dtype="bfloat16")
    assert model.config.dtype == "bfloat16"
    assert {x.dtype for x in jax.tree_util.tree_leaves(model.params)} == {jnp.dtype(jnp.bfloat16)}
    logits = np.asarray(model(refs["llama/input_ids"]))
    assert logits.dtype == np.float32
    assert np.abs(logits - refs["llama/logits"]).max() < 0.3  # bf16 rounding, not a mapping error


def test_load_peak_host_memory_is_one_copy(tmp_path):
    """Tensors stream shard by shard into preallocated stacked arrays: numpy's peak stays near one copy."""
    import tracemalloc

    cfg = ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4)
    model = init_model(cfg)
    save_pretrained(model, tmp_path)
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.params))
    tracemalloc.start()
    try:
        from_pretrained(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.3 * nbytes, (peak, nbytes)


# --------------------------------------------------------------------------------------- bad checkpoints

def _copy(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(os.path.join(FIX, name), dst)
    return dst


def _edit_tensors(directory, edit, file="model.safetensors"):
    tensors = load_file(str(directory / file))
    edit(tensors)
    save_file(tensors, str(directory / file), metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    d = _copy("qwen2", tmp_path)
    _edit_tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor.*model\.layers\.1\.mlp\.up_proj\.weight"):
        from_pretrained(d)


def test_unexpected_tensor(tmp_path):
    d = _copy("qwen2", tmp_path)
    _edit_tensors(d, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor.*model\.layers\.0\.self_attn\.o_proj\.bias"):
        from_pretrained(d)


def test_wrong_shape(tmp_path):
    d = _copy("qwen2", tmp_path)
    _edit_tensors(d, lambda t: t.update({"model.norm.weight": np.ones(31, np.float32)}))
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*shape \[31\].*expected \[32\]"):
        from_pretrained(d)


def test_unsupported_architecture(tmp_path):
    d = _copy("qwen2", tmp_path)
    cfg = json.load(open(d / "config.json"))
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    json.dump(cfg, open(d / "config.json", "w"))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel"):
        from_pretrained(d)


def test_unsupported_rope_type(tmp_path):
    d = _copy("qwen2", tmp_path)
    cfg = json.load(open(d / "config.json"))
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    json.dump(cfg, open(d / "config.json", "w"))
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        from_pretrained(d)


def test_missing_config(tmp_path):
    d = _copy("qwen2", tmp_path)
    os.remove(d / "config.json")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(d)


def test_missing_shard_and_pickles(tmp_path):
    d = _copy("llama", tmp_path)
    os.remove(d / "model-00002-of-00004.safetensors")
    with pytest.raises(FileNotFoundError, match="model-00002-of-00004.safetensors"):
        from_pretrained(d)
    d = _copy("qwen2", tmp_path)
    os.remove(d / "model.safetensors")
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickled checkpoints are not loaded"):
        from_pretrained(d)


def test_redundant_tensors_are_skipped(tmp_path, refs):
    """A tied checkpoint that still stores lm_head.weight, and RoPE inv_freq buffers, load fine."""
    d = _copy("qwen2", tmp_path)
    _edit_tensors(d, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy(),
                                         "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}))
    model = from_pretrained(d)
    assert np.abs(np.asarray(model(refs["qwen2/input_ids"])) - refs["qwen2/logits"]).max() < 1e-4


def test_nonzero_o_proj_bias_is_refused(tmp_path):
    cfg = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, attention_bias=True, qk_norm=True)
    save_pretrained(init_model(cfg), tmp_path)
    _edit_tensors(tmp_path, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.ones(16, np.float32)}))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.o_proj\.bias.*non-zero"):
        from_pretrained(tmp_path)


def test_export_loads_in_transformers(tmp_path, refs):
    """Our export is a checkpoint transformers reads (only where torch + transformers are installed)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in ARCHS:
        save_pretrained(_load(name, dtype="float32"), tmp_path / name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = hf(torch.from_numpy(refs[f"{name}/input_ids"])).logits.numpy()
        assert np.abs(logits - refs[f"{name}/logits"]).max() < 1e-4, name
