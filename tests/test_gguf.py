"""GGUF checkpoints (models/gguf.py): synthetic llama.cpp-style files written with `gguf.GGUFWriter` from a
tiny random model round-trip exactly (permuted q/k undone, quantized tensors equal the `gguf` package's own
dequantization), the tokenizer rebuilt from metadata matches one built directly with `tokenizers`, and bad
files fail with clear errors. A slow test loads the real SmolLM2-135M-Instruct GGUF."""

import json
import math
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from tokenizers import AddedToken, Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

import smcsd.models.gguf as mg
from smcsd.models import LanguageModel, ModelConfig, from_gguf, from_pretrained
from smcsd.models.checkpoint import param_shape, tensor_map, tree_get, tree_set
from smcsd.models.hf import _bytes_to_unicode
from smcsd.models.rope import inverse_frequencies

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "smollm2")


def smollm2_gguf_path() -> str | None:
    """The real SmolLM2-135M-Instruct GGUF in the user cache (`smcsd fetch smollm2-135m`), or None."""
    from smcsd.models.registry import cached_path
    return cached_path("smollm2-135m")


# ------------------------------------------------------------------------------------ tiny tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # CONTROL tokens (ids 0..2)
USER_TOKEN = "<think>"  # a USER_DEFINED token (added, not special)
CORPUS = ["The capital of France is Paris. The capital of Italy is Rome.",
          "def square(x):\n    return x * x  # 12345\n", "Café déjà vu, naïve façade.",
          "In 2024 there were 365 days; in 2025, 366? No: 365.", "hello hello world, the the the"] * 4
TEXTS = ["The capital of France is", "12345 + 678 = 13023", "Café déjà vu ½ ²", "日本語 emoji 😀",
         "def f(x):\n\treturn x  # hi\n", "  multiple   spaces ", "<|im_start|>user\nhi<|im_end|>\n",
         "a<think>b<|endoftext|>", "I'm don't THE", ""]


def smollm_pre_tokenizer():
    """SmolLM2's tokenizer.json pre-tokenizer: every digit alone, then GPT-2's byte-level regex split."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


@pytest.fixture(scope="module")
def reference_tokenizer():
    """A ~300-token byte-level BPE trained on CORPUS, built directly with `tokenizers` (the reference)."""
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = smollm_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(USER_TOKEN, special=False, normalized=False)])
    return tok


def tokenizer_meta(tok: Tokenizer, pre: str = "smollm") -> dict:
    """llama.cpp's tokenizer.ggml.* metadata for a byte-level BPE `tok` (as convert_hf_to_gguf writes it)."""
    n = tok.get_vocab_size(with_added_tokens=True)
    tokens = [tok.id_to_token(i) for i in range(n)]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    types = [3 if t in SPECIALS else 4 if t == USER_TOKEN else 1 for t in tokens]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.padding_token_id": 2, "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"}


# ---------------------------------------------------------------------------------------- tiny model

def tiny_config(vocab: int, **kw) -> ModelConfig:
    base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    base.update(kw)
    return ModelConfig(**base)


def model_meta(c: ModelConfig, arch: str = "llama") -> dict:
    """llama.cpp's {arch}.* metadata for config `c`."""
    meta = {"block_count": c.num_hidden_layers, "context_length": c.max_position_embeddings,
            "embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
            "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": c.rms_norm_eps, "rope.freq_base": c.rope_theta,
            "rope.dimension_count": c.head_dim}
    return {f"{arch}.{k}": v for k, v in meta.items()}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotate-half rows -> llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LLAMA_CPP_NAMES = {  # HF name piece -> llama.cpp tensor name piece (gguf-py's tensor_mapping), kept apart from
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",  # models/gguf.py
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_cpp_name(hf_name: str) -> str:
    """llama.cpp's name of an HF tensor, e.g. model.layers.1.mlp.up_proj.weight -> blk.1.ffn_up.weight."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    piece, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LLAMA_CPP_NAMES[piece]}.{kind}"


def gguf_tensors(model, arch: str = "llama") -> dict[str, np.ndarray]:
    """The model's tensors as llama.cpp names and lays them out: HF [out, in] weights, and for llama the
    q/k rows (weights and biases) permuted; an o_proj bias our model lacks is written as zeros."""
    c = model.config
    out = {}
    for hf_name, slot in tensor_map(c, arch).items():
        name = llama_cpp_name(hf_name)
        if slot.zero_only:
            out[name] = np.zeros(slot.shape, np.float32)
            continue
        w = np.asarray(tree_get(model.params, slot.path), np.float32)
        w = w[slot.layer] if slot.layer is not None else w
        w = w.T if slot.transpose else w
        if arch == "llama" and ".attn_q." in name:
            w = llama_cpp_permute(w, c.num_attention_heads)
        elif arch == "llama" and ".attn_k." in name:
            w = llama_cpp_permute(w, c.num_key_value_heads)
        out[name] = np.ascontiguousarray(w)
    return out


def random_model(config: ModelConfig, seed: int, arch: str = "llama") -> LanguageModel:
    """A model of `config` whose every param (norms and biases too) is random, so no mix-up goes unseen.
    Params are laid out by the HF tensor map, as from_pretrained builds them (no jit: init_model compiles)."""
    rng = np.random.default_rng(seed)
    params: dict = {}
    for slot in tensor_map(config, arch).values():
        if slot.path is not None:
            shape = param_shape(slot, config.num_hidden_layers)
            tree_set(params, slot.path, jnp.asarray(rng.standard_normal(shape) * 0.5, jnp.float32))
    return LanguageModel(config=config, params=params, name="random")


def write_gguf(path, meta: dict, tensors: dict, qtypes=None, arch: str = "llama") -> str:
    """Write a GGUF file: metadata by Python type, tensors quantized with `gguf.quants` to qtypes[name]
    (default F32); a (uint8 bytes, qtype) pair is written raw."""
    w = GGUFWriter(os.fspath(path), arch)
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    for name, value in tensors.items():
        if isinstance(value, tuple):  # raw bytes of a given type
            w.add_tensor(name, value[0], raw_dtype=value[1])
            continue
        qt = (qtypes or {}).get(name, Q.F32)
        if qt == Q.F32:
            w.add_tensor(name, value.astype(np.float32))
        elif qt == Q.F16:
            w.add_tensor(name, value.astype(np.float16))
        else:
            w.add_tensor(name, quants.quantize(value, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


@pytest.fixture(scope="module")
def tiny(reference_tokenizer):
    """(model, metadata, tensors) of a tiny random untied llama and its tokenizer's metadata."""
    meta_tok = tokenizer_meta(reference_tokenizer)
    model = random_model(tiny_config(len(meta_tok["tokenizer.ggml.tokens"])), seed=0)
    return model, {**model_meta(model.config), **meta_tok}, gguf_tensors(model)


@pytest.fixture(scope="module")
def f32_file(tiny, tmp_path_factory):
    model, meta, tensors = tiny
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", meta, tensors)


# ------------------------------------------------------------------------------------------- weights

def test_f32_round_trip_params_and_logits(tiny, f32_file):
    """An F32 file gives back the original params exactly (the q/k permutation undone) and the same logits."""
    model, _, _ = tiny
    loaded = from_gguf(f32_file)
    assert loaded.config == model.config and loaded.name == "tiny-f32"
    flat = lambda p: {"/".join(map(str, k)): v for k, v in _flatten(p)}
    want, got = flat(model.params), flat(loaded.params)
    assert want.keys() == got.keys()
    for k in want:
        assert got[k].dtype == jnp.float32 and np.array_equal(np.asarray(got[k]), np.asarray(want[k])), k
    tokens = jnp.asarray([[5, 17, 200, 3, 99, 42, 7]])
    np.testing.assert_allclose(np.asarray(loaded(tokens)), np.asarray(model(tokens)), atol=1e-6)


def _flatten(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flatten(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama_cpp_permute, written independently: llama.cpp rows (2j, 2j+1) -> HF rows (j, j + d/2)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


MIXED = {"attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q5_0, "attn_output": Q.Q5_1, "ffn_gate": Q.Q8_0,
         "ffn_up": Q.F16, "ffn_down": Q.BF16, "token_embd": Q.Q8_0, "output": Q.Q4_1}


def test_quantized_model_equals_package_dequantization(tiny, tmp_path, monkeypatch):
    """Each layer quantized to a different type (read in small row chunks): every param equals the gguf
    package's own dequantization of the written tensor, un-permuted and transposed like HF's."""
    model, meta, tensors = tiny
    qtypes = {n: MIXED[n.split(".")[-2]] for n in tensors if n.split(".")[-2] in MIXED}
    path = write_gguf(tmp_path / "mixed.gguf", meta, tensors, qtypes)
    monkeypatch.setattr(mg, "_CHUNK_ELEMENTS", 64 * 5)  # 5 rows per chunk: chunks straddle heads
    loaded = from_gguf(path, tokenizer=False)
    c = model.config
    assert loaded.tokenizer is None and loaded.config == c
    for hf_name, slot in tensor_map(c, "llama").items():
        name = llama_cpp_name(hf_name)
        w, qt = tensors[name], qtypes.get(name, Q.F32)
        ref = quants.dequantize(quants.quantize(w, qt), qt).reshape(w.shape)
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            ref = _unpermute(ref, c.num_attention_heads if "attn_q" in name else c.num_key_value_heads)
        got = np.asarray(tree_get(loaded.params, slot.path))
        got = got[slot.layer] if slot.layer is not None else got
        np.testing.assert_array_equal(got.T if slot.transpose else got, ref, err_msg=name)
    bf16 = from_gguf(path, "bfloat16", tokenizer=False)
    q = bf16.params["layers"]["self_attn"]["q_proj"]["kernel"]
    assert bf16.config.dtype == "bfloat16" and q.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(q), np.asarray(loaded.params["layers"]["self_attn"]["q_proj"]["kernel"]
                                                            ).astype(jnp.bfloat16))


def _random_blocks(qt, rows: int, cols: int, rng) -> np.ndarray:
    """Random bytes for `rows` rows of `cols` values of K-quant type `qt` (the package cannot quantize those)."""
    block, size = GGML_QUANT_SIZES[qt]
    return rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)


def test_every_supported_type_dequantizes_like_the_package(tmp_path, monkeypatch):
    """Every supported type, read through the loader's chunked path, equals `gguf.quants.dequantize`."""
    rng = np.random.default_rng(0)
    rows, cols = 7, 512
    written = {}
    for name in mg.SUPPORTED_TENSOR_TYPES:
        qt = Q[name]
        try:
            data = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qt)
        except NotImplementedError:  # K-quants: the package dequantizes them but cannot quantize
            data = _random_blocks(qt, rows, cols, rng)
        written[name] = (data, qt)
    path = write_gguf(tmp_path / "types.gguf", {}, {f"t.{k}": v for k, v in written.items()})
    monkeypatch.setattr(mg, "_CHUNK_ELEMENTS", 3 * cols)
    reader = mg._open(path)
    for t in reader.tensors:
        data, qt = written[t.name[2:]]
        assert t.tensor_type == qt and mg._numpy_shape(t) == (rows, cols)
        with np.errstate(invalid="ignore", over="ignore"):  # random K-quant scales may be inf/nan
            got = np.concatenate([chunk for _, chunk in mg._dequantize_rows(t)])
            ref = quants.dequantize(data, qt).reshape(rows, cols)
        np.testing.assert_array_equal(got, ref, err_msg=t.name)  # NaNs compare equal here


def test_llama3_rope_freqs_become_rope_scaling(tiny, tmp_path):
    """Llama 3.1 files carry RoPE scaling as rope_freqs.weight (llama.cpp's per-frequency divisors)."""
    model, meta, tensors = tiny
    hd, theta = model.config.head_dim, model.config.rope_theta
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    divisors = []  # the converter's formula, written out here independently of models/rope.py
    for freq in 1.0 / theta ** (np.arange(0, hd, 2) / hd):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            divisors.append(1.0)
        elif wavelen > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    path = write_gguf(tmp_path / "llama3.gguf", meta,
                      {**tensors, "rope_freqs.weight": np.asarray(divisors, np.float32)})
    c = from_gguf(path, tokenizer=False).config
    assert dict(c.rope_scaling) == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    base = inverse_frequencies(hd, theta)
    np.testing.assert_allclose(base / inverse_frequencies(hd, theta, c.rope_scaling), divisors, rtol=1e-5)
    bad = write_gguf(tmp_path / "bad-rope.gguf", meta,
                     {**tensors, "rope_freqs.weight": np.linspace(1, 3, hd // 2).astype(np.float32)})
    with pytest.raises(ValueError, match="rope_freqs.weight.*match no llama3 scaling"):
        from_gguf(bad, tokenizer=False)


@pytest.mark.parametrize("arch", ["llama-bias", "qwen2", "qwen3"])
def test_bias_and_qwen_round_trip(arch, reference_tokenizer, tmp_path):
    """Llama with q/k/v bias (biases permuted like their rows, zero o_proj bias), Qwen2 (q/k/v bias) and
    Qwen3 (q/k RMSNorm), both stored unpermuted by llama.cpp, tied embeddings: params round-trip exactly."""
    arch = arch.split("-")[0]
    meta_tok = tokenizer_meta(reference_tokenizer, pre="qwen2" if arch != "llama" else "smollm")
    c = tiny_config(len(meta_tok["tokenizer.ggml.tokens"]), attention_bias=arch != "qwen3",
                    qk_norm=arch == "qwen3", tie_word_embeddings=True)
    model = random_model(c, seed=1, arch=arch)
    tensors = gguf_tensors(model, arch)
    assert "output.weight" not in tensors and ("blk.0.attn_output.bias" in tensors) == (arch == "llama")
    loaded = from_gguf(write_gguf(tmp_path / f"{arch}.gguf", {**model_meta(c, arch), **meta_tok}, tensors, arch=arch))
    assert loaded.config == c and loaded.tokenizer.vocab_size == c.vocab_size
    want, got = dict(_flatten(model.params)), dict(_flatten(loaded.params))
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg="/".join(k))
    if arch == "llama":
        nonzero = {**tensors, "blk.1.attn_output.bias": np.ones(c.hidden_size, np.float32)}
        with pytest.raises(ValueError, match="'blk.1.attn_output.bias' is a non-zero attention output bias"):
            from_gguf(write_gguf(tmp_path / "o-bias.gguf", {**model_meta(c), **meta_tok}, nonzero))


def test_from_pretrained_reads_gguf(tiny, f32_file, tmp_path):
    """from_pretrained takes a .gguf path, or a directory holding exactly one .gguf and no config.json."""
    model, _, _ = tiny
    assert from_pretrained(f32_file, tokenizer=False).config == model.config
    shutil.copy(f32_file, tmp_path / "model.gguf")
    assert from_pretrained(tmp_path, tokenizer=False).config == model.config
    shutil.copy(f32_file, tmp_path / "other.gguf")
    with pytest.raises(ValueError, match="several GGUF files"):
        from_pretrained(tmp_path)


# ----------------------------------------------------------------------------------------- tokenizer

def test_tokenizer_matches_direct_tokenizers(reference_tokenizer, f32_file):
    """The tokenizer rebuilt from metadata encodes and decodes like the one built directly; specials keep ids."""
    tok = from_gguf(f32_file).tokenizer
    ref = reference_tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False) == text
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert tok.encode("<|im_start|>x<|im_end|>")[::2] == [1, 2]
    assert tok.encode("a<think>b")[1] == ref.token_to_id(USER_TOKEN) == tok.vocab_size - 1
    assert "<think>" in tok.decode(tok.encode("a<think>b"))  # user-defined, not special: kept on decode
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (1, 2, 2, False)
    assert tok.encode("hi", add_bos=True)[0] == 1 and tok.chat_template.startswith("{% for m in messages %}")


def _pieces(kind: str, text: str) -> list[str]:
    """Pre-tokenized pieces of `text` as text (undoing the byte-level alphabet)."""
    table = {c: b for b, c in _bytes_to_unicode().items()}
    return [bytes(table[ch] for ch in p).decode("utf-8") for p, _ in mg._pre_tokenizer(kind).pre_tokenize_str(text)]


def test_pre_tokenizer_splits():
    """Each llama.cpp pre-tokenizer kind splits text the way its original tokenizer.json's regex does
    (expected pieces worked out by hand from the regexes: GPT-2's contractions are case-sensitive,
    Llama 3's are not and it groups digits by three, SmolLM and Qwen2 isolate every digit)."""
    text = "Hello world 12345 I'M ½!!\n\n x"
    assert _pieces("gpt2", text) == ["Hello", " world", " 12345", " I", "'", "M", " ½", "!!", "\n\n", " x"]
    assert _pieces("digits", text) == ["Hello", " world", " ", "1", "2", "3", "4", "5", " I", "'", "M", " ", "½",
                                       "!!", "\n\n", " x"]
    assert _pieces("llama3", text) == ["Hello", " world", " ", "123", "45", " I", "'M", " ", "½", "!!\n\n", " x"]
    assert _pieces("qwen2", text) == ["Hello", " world", " ", "1", "2", "3", "4", "5", " I", "'M", " ", "½",
                                      "!!\n\n", " x"]
    text = "I'm  fine\r\n\tok"
    assert _pieces("gpt2", text) == _pieces("digits", text) == ["I", "'m", " ", " fine", "\r\n", "\t", "ok"]
    assert _pieces("llama3", text) == _pieces("qwen2", text) == ["I", "'m", " ", " fine", "\r\n", "\tok"]


def test_tokenizer_defaults_and_errors(reference_tokenizer):
    """Llama-3 vocabularies add BOS unless told otherwise; unknown pre-tokenizers and models are refused."""
    meta = tokenizer_meta(reference_tokenizer, pre="llama-bpe")
    del meta["tokenizer.ggml.add_bos_token"]
    tok = mg.tokenizer_from_gguf(meta)
    assert tok.add_bos and tok.encode("hi")[0] == 1
    assert mg.tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": "smollm"}).add_bos is False
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'klingon' is not supported; supported: default"):
        mg.tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": "klingon"})
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'llama'.*SentencePiece.*tokenizer=False"):
        mg.tokenizer_from_gguf({**meta, "tokenizer.ggml.model": "llama"})
    assert mg.tokenizer_from_gguf({"general.architecture": "llama"}) is None


# -------------------------------------------------------------------------------------------- errors

def test_truncated_and_foreign_files(f32_file, tmp_path):
    data = open(f32_file, "rb").read()
    for cut in (len(data) - 100, len(data) // 2, 64):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"GGUF file .*cut{cut}.gguf is truncated or corrupt"):
            from_gguf(short)
    other = tmp_path / "not.gguf"
    other.write_bytes(b'{"json": true}' + bytes(100))
    with pytest.raises(ValueError, match=r"not\.gguf is not a GGUF file: it starts with b'\{\"js'"):
        from_gguf(other)
    with pytest.raises(FileNotFoundError, match="GGUF file not found: .*missing.gguf"):
        from_gguf(tmp_path / "missing.gguf")


def test_unknown_architecture(tiny, tmp_path):
    _, meta, tensors = tiny
    meta = {k.replace("llama.", "gpt2.", 1): v for k, v in meta.items()}
    path = write_gguf(tmp_path / "gpt2.gguf", meta, tensors, arch="gpt2")
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'; supported: llama, qwen2, qwen3"):
        from_gguf(path)


def test_unsupported_tensor_type(tiny, tmp_path):
    _, meta, tensors = tiny
    w = tensors["blk.1.attn_v.weight"]
    block, size = GGML_QUANT_SIZES[Q.Q8_1]
    raw = np.zeros((w.shape[0], w.shape[1] // block * size), np.uint8)
    path = write_gguf(tmp_path / "q8_1.gguf", meta, {**tensors, "blk.1.attn_v.weight": (raw, Q.Q8_1)})
    with pytest.raises(ValueError, match=r"tensor 'blk.1.attn_v.weight' has type Q8_1.*supported types: F32, F16"):
        from_gguf(path)


def test_missing_unexpected_and_misshapen_tensors(tiny, tmp_path):
    _, meta, tensors = tiny
    missing = {k: v for k, v in tensors.items() if k != "blk.1.ffn_down.weight"}
    with pytest.raises(ValueError, match="missing tensor.*'blk.1.ffn_down.weight'"):
        from_gguf(write_gguf(tmp_path / "a.gguf", meta, missing))
    extra = {**tensors, "blk.0.attn_sinks.weight": np.zeros(4, np.float32)}
    with pytest.raises(ValueError, match="unexpected tensor.*'blk.0.attn_sinks.weight'"):
        from_gguf(write_gguf(tmp_path / "b.gguf", meta, extra))
    wrong = {**tensors, "blk.0.ffn_up.weight": tensors["blk.0.ffn_up.weight"][:64]}
    with pytest.raises(ValueError, match=r"tensor 'blk.0.ffn_up.weight' has shape \[64, 64\].*expected \[96, 64\]"):
        from_gguf(write_gguf(tmp_path / "c.gguf", meta, wrong))
    with pytest.raises(ValueError, match="missing required metadata key llama.block_count"):
        from_gguf(write_gguf(tmp_path / "d.gguf", {k: v for k, v in meta.items() if k != "llama.block_count"},
                             tensors))


# ------------------------------------------------------------------------------------- real SmolLM2

SMOLLM2_TOKEN_IDS = {  # llama.cpp's tokenization of the SmolLM2 vocabulary ("smollm" pre-tokenizer)
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
}


@pytest.mark.slow
def test_smollm2_gguf_metadata_and_tokenizer():
    """Config and tokenizer of the real file from its metadata alone (weights, logits, greedy outputs and
    transformers parity: tests/test_smollm2.py)."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("SmolLM2-135M-Instruct GGUF not cached: run `smcsd fetch smollm2-135m`")
    reader = mg._open(path)
    meta = mg._metadata(reader)
    c = mg.config_from_gguf(meta, tied="output.weight" not in {t.name for t in reader.tensors})
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.rms_norm_eps) == (1536, 49152, 100000.0, 1e-5)
    assert c.tie_word_embeddings and c.rope_scaling is None and (c.bos_token_id, c.eos_token_id) == (1, 2)
    tok = mg.tokenizer_from_gguf(meta)
    for text, ids in SMOLLM2_TOKEN_IDS.items():
        assert tok.encode(text) == ids, text
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert "<|im_start|>" in tok.chat_template and not tok.add_bos
