"""GGUF checkpoints (llama.cpp's format): read Llama-family models and their tokenizers.

`from_gguf(path)` (architectures llama, qwen2, qwen3) memory-maps the file with the `gguf` package's
`GGUFReader`, turns its metadata into a `ModelConfig`, checks every tensor's name, shape and type
against that config before allocating anything, then dequantizes tensor by tensor (in row chunks,
with the package's numpy dequantizers) straight into preallocated, layer-stacked arrays laid out
like `from_pretrained`'s.
Peak host memory stays near one copy of the dequantized weights.

Layout differences from Hugging Face undone here:
- GGUF lists a tensor's dimensions fastest-first (`[in, out]`); the numpy view is `[out, in]`,
  which is HF's weight layout.
- llama.cpp's converter permutes the rows of Llama's q/k projections so that its interleaved
  ("GPT-J") RoPE equals HF's rotate-half one; we apply the inverse permutation (per KV head for k).
  Qwen2/Qwen3 files are not permuted (llama.cpp runs them with rotate-half RoPE).
- Llama 3.x long-context RoPE is stored as a `rope_freqs.weight` tensor of per-frequency divisors
  rather than as metadata; we accept it when it equals a `llama3` scaling we can express.

The tokenizer is rebuilt from `tokenizer.ggml.*` metadata as a `tokenizers.Tokenizer` (byte-level
BPE, "gpt2" in llama.cpp's terms) with the pre-tokenizer llama.cpp uses for the file's
`tokenizer.ggml.pre`; SentencePiece ("llama") vocabularies are not supported yet.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from .checkpoint import NP_DTYPES, Slot, list_keys, param_shape, tensor_map, tree_set
from .config import ModelConfig
from .lm import LanguageModel
from .rope import inverse_frequencies
from .tokenizer import HFTokenizer

__all__ = ["from_gguf", "find_gguf", "read_metadata", "config_from_gguf", "tokenizer_from_gguf",
           "SUPPORTED_ARCHITECTURES", "SUPPORTED_TENSOR_TYPES", "SUPPORTED_PRE_TOKENIZERS"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Tensor types we read (all dequantized by the `gguf` package's numpy code).
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_CHUNK_ELEMENTS = 1 << 22  # dequantize at most ~4M values (16 MB of float32) at a time
_ROPE_FREQS = "rope_freqs.weight"

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4


# ------------------------------------------------------------------------------------------ opening

def find_gguf(path) -> str | None:
    """The GGUF file `path` names: itself when it ends in `.gguf`; the only `*.gguf` of a directory
    without config.json; else None (not a GGUF checkpoint). Several candidates are a ValueError."""
    path = os.fspath(path)
    if path.lower().endswith(".gguf"):
        return path
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
        return None
    files = sorted(n for n in os.listdir(path) if n.lower().endswith(".gguf"))
    if len(files) > 1:
        raise ValueError(f"{path} holds several GGUF files ({', '.join(files)}); pass the path of the one to load")
    return os.path.join(path, files[0]) if files else None


def _open(path: str):
    """A `GGUFReader` over `path`, with clear errors for a missing, foreign, truncated or corrupt file."""
    from gguf import GGUFReader

    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # the reader fails on short reads with assorted numpy errors
        raise ValueError(f"GGUF file {path} is truncated or corrupt ({type(e).__name__}: {e}); download it "
                         "again (or, if it is newer than the installed `gguf` package: pip install -U gguf)") from e
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ValueError(f"GGUF file {path} is truncated or corrupt: tensor {t.name!r} extends past the end "
                             f"of the file ({t.data_offset + t.n_bytes} > {size} bytes); download it again")
    return reader


# ----------------------------------------------------------------------------------------- metadata

def _field_value(field) -> Any:
    """A metadata field as Python: str, int/float/bool, or a list (strings) / numpy array (numbers)."""
    from gguf import GGUFValueType

    def scalar(part, vtype):
        if vtype == GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        value = part[0].item()
        return bool(value) if vtype == GGUFValueType.BOOL else value

    types = list(field.types)
    if not types:
        return None
    if types[0] != GGUFValueType.ARRAY:
        return scalar(field.parts[field.data[0]], types[0])
    if len(types) < 2 or types[1] == GGUFValueType.ARRAY:
        return [None] * len(field.data)  # nested arrays: nothing we read
    if types[1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
    if not len(field.data):
        return np.zeros(0)
    values = np.concatenate([field.parts[i] for i in field.data])
    return values.astype(bool) if types[1] == GGUFValueType.BOOL else values


def _metadata(reader) -> dict[str, Any]:
    """A reader's key/value metadata as Python values (the reader's own GGUF.* header fields left out)."""
    return {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def read_metadata(path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (no tensor data is read)."""
    return _metadata(_open(os.fspath(path)))


# ------------------------------------------------------------------------------------------- config

def _scalar_int(meta: Mapping[str, Any], key: str, where: str, default=None) -> int | None:
    """Integer metadata `key` (None/`default` when absent); per-layer arrays are refused."""
    value = meta.get(key, default)
    if value is None:
        return None
    if isinstance(value, (list, np.ndarray)):
        values = np.unique(np.asarray(value))
        if len(values) != 1:
            raise ValueError(f"{where}: {key} varies per layer ({list(np.asarray(value))[:8]}...), "
                             "which smcsd's uniform transformer does not support")
        value = values[0]
    return int(value)


def _decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.9999997e-06),
    so configs read from GGUF equal the Hugging Face ones they were converted from."""
    return float(str(np.float32(value)))


def _rope_scaling(meta: Mapping[str, Any], arch: str, where: str) -> dict | None:
    """HF-style rope_scaling from `{arch}.rope.scaling.*` metadata (none, linear); others refused."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _decimal(factor)}
    raise ValueError(f"{where}: {arch}.rope.scaling.type {kind!r} is not supported (supported: none, linear, "
                     "and llama3 scaling stored as rope_freqs.weight)")


def _llama3_scaling_from_freqs(factors: np.ndarray, head_dim: int, theta: float,
                               original_len: int | None, where: str) -> dict | None:
    """The `llama3` rope_scaling whose per-frequency divisors equal `rope_freqs.weight`, or None when
    they are all 1. llama.cpp stores only the divisors; we try Llama 3.1's published constants."""
    factors = np.asarray(factors, np.float64).reshape(-1)
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"{where}: tensor {_ROPE_FREQS!r} has {factors.size} values, expected {head_dim // 2} "
                         f"(head_dim / 2)")
    if np.allclose(factors, 1.0):
        return None
    base = inverse_frequencies(head_dim, theta).astype(np.float64)
    for old_len in ([original_len] if original_len else []) + [8192]:
        scaling = {"rope_type": "llama3", "factor": _decimal(factors.max()), "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": int(old_len)}
        got = base / inverse_frequencies(head_dim, theta, scaling).astype(np.float64)
        if np.allclose(got, factors, rtol=1e-4, atol=1e-5):
            return scaling
    raise ValueError(f"{where}: tensor {_ROPE_FREQS!r} holds RoPE frequency divisors that match no llama3 scaling "
                     "(factor = max divisor, low_freq_factor 1, high_freq_factor 4); this RoPE is not supported")


def config_from_gguf(meta: Mapping[str, Any], dtype: str | None = None, where: str = "GGUF file",
                     vocab_size: int | None = None, tied: bool = False) -> ModelConfig:
    """Our `ModelConfig` for GGUF metadata `meta` (llama.cpp's `{arch}.*` and `tokenizer.ggml.*` keys),
    for architectures llama (Llama 1-3, Mistral, SmolLM, ...), qwen2 (q/k/v bias) and qwen3 (q/k norm).

    vocab_size: the embedding's row count when the file has no token list; tied: the file has no
    `output.weight` (the head is the embedding). dtype None means float32.
    """
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{where}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    dtype = "float32" if dtype is None else dtype
    if dtype not in NP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(NP_DTYPES)} (or None for float32), got {dtype!r}")
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count"):
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"{where}: missing required metadata key {arch}.{key!s}")

    def get_int(key, default=None):
        return _scalar_int(meta, f"{arch}.{key}", where, default)

    hidden, heads = get_int("embedding_length"), get_int("attention.head_count")
    kv_heads = get_int("attention.head_count_kv", heads)
    head_dim = get_int("attention.key_length")
    value_dim = get_int("attention.value_length")
    if value_dim is not None and value_dim != (head_dim or hidden // heads):
        raise ValueError(f"{where}: {arch}.attention.value_length={value_dim} differs from the key length; "
                         "not supported")
    rot_dim = get_int("rope.dimension_count")
    if rot_dim is not None and rot_dim != (head_dim or hidden // heads):
        raise ValueError(f"{where}: {arch}.rope.dimension_count={rot_dim} is not the head dimension "
                         f"{head_dim or hidden // heads}; partial rotary embeddings are not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else get_int("vocab_size", vocab_size)
    if vocab is None:
        raise ValueError(f"{where}: cannot tell the vocabulary size (no tokenizer.ggml.tokens, {arch}.vocab_size "
                         "or token_embd.weight)")

    def token_id(key):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is None:
            return None
        if not 0 <= int(value) < vocab:
            warnings.warn(f"{where}: tokenizer.ggml.{key}={value} is outside the vocabulary [0, {vocab}); ignored",
                          stacklevel=4)
            return None
        return int(value)

    eps = _decimal(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
    try:
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=get_int("feed_forward_length"),
            num_hidden_layers=get_int("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=get_int("context_length", 2048),
            rope_theta=_decimal(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(meta, arch, where),
            rms_norm_eps=float(eps),
            tie_word_embeddings=bool(tied),
            attention_bias=arch == "qwen2",  # Qwen2 always has q/k/v bias
            qk_norm=arch == "qwen3",
            dtype=dtype,
            bos_token_id=token_id("bos_token_id"),
            eos_token_id=token_id("eos_token_id"),
            pad_token_id=token_id("padding_token_id"),
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


# -------------------------------------------------------------------------------------- tensor map

_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
_LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                "post_attention_layernorm": "ffn_norm"}


def _gguf_name(hf_name: str) -> str:
    """llama.cpp's name for the HF tensor `hf_name`: model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if m is None or m[2] not in _LAYER_NAMES:
        raise KeyError(f"no GGUF name for HF tensor {hf_name!r}")
    return f"blk.{m[1]}.{_LAYER_NAMES[m[2]]}.{m[3]}"


def gguf_tensor_map(config: ModelConfig, arch: str = "llama") -> dict[str, Slot]:
    """Every tensor a GGUF file of family `arch` and `config` holds: GGUF name -> our param slot
    (the slot's shape is the numpy / HF `[out, in]` shape)."""
    return {_gguf_name(k): slot for k, slot in tensor_map(config, arch).items()}


def _rope_row_order(n_rows: int, n_heads: int) -> np.ndarray:
    """For each row of a llama.cpp-permuted q/k tensor, its row in HF's layout.

    llama.cpp stores head h's row pair (j, j + d/2) of HF's rotate-half layout as rows (2j, 2j+1);
    so GGUF row h*d + 2j + t is HF row h*d + t*d/2 + j.
    """
    if n_rows % (2 * n_heads):
        raise ValueError(f"cannot undo the RoPE permutation of {n_rows} rows over {n_heads} heads")
    return np.arange(n_rows).reshape(n_heads, 2, n_rows // n_heads // 2).swapaxes(1, 2).reshape(-1)


def _row_orders(config: ModelConfig, arch: str, names) -> dict[str, np.ndarray]:
    """HF row index of every GGUF row, for the tensors llama.cpp permuted: llama's attn_q / attn_k (Qwen
    models use the rotate-half RoPE in llama.cpp too, so their rows are stored as in HF)."""
    if arch != "llama":
        return {}
    out = {}
    for name in names:
        m = re.fullmatch(r"blk\.\d+\.attn_([qk])\.(weight|bias)", name)
        if m:  # q rows are permuted per query head, k rows per KV head
            heads = config.num_attention_heads if m[1] == "q" else config.num_key_value_heads
            out[name] = _rope_row_order(heads * config.head_dim, heads)
    return out


def _numpy_shape(tensor) -> tuple[int, ...]:
    """A reader tensor's shape in numpy order (GGUF lists dimensions fastest-first)."""
    return tuple(int(d) for d in reversed(list(tensor.shape)))


def _check_types(tensors, path: str) -> None:
    """Refuse any tensor whose type we do not dequantize, before anything is allocated."""
    for t in tensors:
        if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(f"{path}: tensor {t.name!r} has type {t.tensor_type.name}, which smcsd cannot read; "
                             f"supported types: {', '.join(SUPPORTED_TENSOR_TYPES)} (re-quantize the model, e.g. "
                             "with llama.cpp's llama-quantize, to one of them)")


def _check_tensors(expected: Mapping[str, Slot], found: Mapping[str, Any], path: str) -> None:
    """Missing, unexpected or misshapen tensors -> ValueError naming the tensor."""
    missing = set(expected) - set(found)
    if missing:
        raise ValueError(f"GGUF file {path} is missing tensor(s) {list_keys(missing)} required by its metadata")
    unexpected = set(found) - set(expected)
    if unexpected:
        raise ValueError(f"GGUF file {path} has unexpected tensor(s) {list_keys(unexpected)} that a model "
                         "of its architecture and metadata does not use")
    for name, slot in expected.items():
        shape = _numpy_shape(found[name])
        if shape != tuple(slot.shape):
            raise ValueError(f"GGUF file {path}: tensor {name!r} has shape {list(shape)} (numpy order), expected "
                             f"{list(slot.shape)} from the metadata")


# ------------------------------------------------------------------------------------------ loading

def _dequantize_rows(tensor):
    """Yield `(row_start, float32[rows, cols])` chunks of a reader tensor viewed as a 2-D `[rows, cols]`."""
    from gguf import quants

    data = tensor.data
    data = data.reshape(1, -1) if data.ndim == 1 else data.reshape(-1, data.shape[-1])
    cols = _numpy_shape(tensor)[-1]
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    for a in range(0, data.shape[0], step):
        chunk = quants.dequantize(np.asarray(data[a:a + step]), tensor.tensor_type)
        yield a, chunk.reshape(-1, cols)


def _fill(dest: np.ndarray, tensor, slot: Slot, row_order: np.ndarray | None) -> None:
    """Dequantize `tensor` into `dest` (this layer's view), undoing llama.cpp's row permutation and
    transposing HF's [out, in] into a Flax [in, out] kernel when the slot says so."""
    if len(_numpy_shape(tensor)) == 1:  # norms and biases: one "row" whose elements may be permuted
        (_, values), = _dequantize_rows(tensor)
        dest[slice(None) if row_order is None else row_order] = values.reshape(-1)
        return
    for a, chunk in _dequantize_rows(tensor):
        rows = slice(a, a + chunk.shape[0]) if row_order is None else row_order[a:a + chunk.shape[0]]
        if slot.transpose:
            dest[:, rows] = chunk.T
        else:
            dest[rows] = chunk


def _check_zero(tensor, path: str) -> None:
    """A tensor we do not store (Llama's o_proj bias) must be all zeros."""
    for _, chunk in _dequantize_rows(tensor):
        if np.any(chunk != 0):
            raise ValueError(f"{path}: tensor {tensor.name!r} is a non-zero attention output bias, which smcsd's "
                             "attention does not have (only q/k/v bias is supported)")


def from_gguf(path, dtype: str | None = None, *, tokenizer: bool = True, name: str | None = None) -> LanguageModel:
    """Load a llama.cpp GGUF file of a Llama / Qwen2 / Qwen3 architecture model as a `LanguageModel`.

    path: the `.gguf` file. dtype: "float32" / "bfloat16" / "float16" for the dequantized params
    (default float32, what the CPU computes in). tokenizer: also build the tokenizer from the file's
    metadata. Tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q2_K..Q6_K; anything
    else, a foreign architecture, or missing / misshapen tensors are a ValueError naming the cause.
    """
    path = os.fspath(path)
    reader = _open(path)
    meta = _metadata(reader)
    found = {t.name: t for t in reader.tensors}
    embd = found.get("token_embd.weight")
    config = config_from_gguf(meta, dtype, where=path, tied="output.weight" not in found,
                              vocab_size=None if embd is None else _numpy_shape(embd)[0])
    if "blk.0.attn_q.bias" in found:
        config = config.replace(attention_bias=True)
    arch = meta["general.architecture"]

    # 1. Check names, shapes and types of every tensor before allocating anything.
    rope_freqs = found.pop(_ROPE_FREQS, None)
    if rope_freqs is not None:
        _check_types([rope_freqs], path)
        scaling = _llama3_scaling_from_freqs(
            next(_dequantize_rows(rope_freqs))[1], config.head_dim, config.rope_theta,
            _scalar_int(meta, f"{arch}.rope.scaling.original_context_length", path), path)
        if scaling is not None:
            if config.rope_scaling is not None:
                raise ValueError(f"{path}: both {arch}.rope.scaling.type and {_ROPE_FREQS!r} scale RoPE; "
                                 "not supported")
            config = config.replace(rope_scaling=scaling)
    expected = gguf_tensor_map(config, arch)
    _check_tensors(expected, found, path)
    _check_types(found.values(), path)
    orders = _row_orders(config, arch, expected)

    # 2. Preallocate one stacked array per param; dequantize tensor by tensor into it.
    np_dtype = NP_DTYPES[config.dtype]
    L = config.num_hidden_layers
    buffers: dict[tuple, np.ndarray] = {}
    for slot in expected.values():
        if slot.path is not None and slot.path not in buffers:
            buffers[slot.path] = np.empty(param_shape(slot, L), np_dtype)
    for tname, slot in expected.items():
        if slot.zero_only:
            _check_zero(found[tname], path)
            continue
        dest = buffers[slot.path]
        _fill(dest if slot.layer is None else dest[slot.layer], found[tname], slot, orders.get(tname))

    # 3. Hand each buffer to JAX and drop the host copy as we go.
    params: dict = {}
    for p in list(buffers):
        tree_set(params, p, jnp.asarray(buffers.pop(p)))
    del reader, found

    tok = tokenizer_from_gguf(meta, name=path) if tokenizer else None  # its size is the config's vocab_size
    return LanguageModel(config=config, params=params, tokenizer=tok,
                         name=name or os.path.splitext(os.path.basename(path))[0])


# ---------------------------------------------------------------------------------------- tokenizer

# GPT-2's split: contractions, letters, numbers, other symbols, each with an optional leading space.
# Llama 3's and Qwen2's splits, as their tokenizer.json files (and llama.cpp) spell them.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> how llama.cpp splits text before BPE (its llama-vocab.cpp groups names that
# share a split). "gpt2": GPT-2's regex; "digits": each digit alone, then GPT-2's regex (SmolLM,
# StarCoder); "llama3" / "qwen2": the regex above (Llama 3 also ignores merges for whole-word tokens
# and adds BOS by default). "default" (an unrecognised vocabulary at conversion time) gets GPT-2's split.
_PRE_KINDS = {
    "default": "gpt2", "gpt2": "gpt2", "mpt": "gpt2", "olmo": "gpt2",
    "smollm": "digits", "starcoder": "digits", "refact": "digits", "command-r": "digits", "codeshell": "digits",
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3", "dbrx": "llama3",
    "smaug-bpe": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
}
SUPPORTED_PRE_TOKENIZERS = tuple(_PRE_KINDS)


def _pre_tokenizer(kind: str):
    """The `tokenizers` pre-tokenizer for one of `_PRE_KINDS`' split kinds."""
    from tokenizers import Regex, pre_tokenizers as pt

    if kind == "gpt2":
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "digits":
        return pt.Sequence([pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = {"llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}[kind]
    return pt.Sequence([pt.Split(Regex(split), behavior="isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def _byte_level_tokenizer(tokens, merges, token_types, pre: str, where: str):
    """A byte-level BPE `tokenizers.Tokenizer` with GGUF's ids; CONTROL tokens become special added
    tokens and USER_DEFINED ones plain added tokens, so either written in a text encodes to its id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    if pre not in _PRE_KINDS:
        raise ValueError(f"{where}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_PRE_TOKENIZERS)}")
    kind = _PRE_KINDS[pre]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    if len(vocab) != len(tokens):
        warnings.warn(f"{where}: {len(tokens) - len(vocab)} duplicate token string(s) in tokenizer.ggml.tokens; "
                      "the first id of each is used when encoding", stacklevel=3)
    pairs = []
    for m in merges or ():
        left, sep, right = m.partition(" ")
        if not sep:
            raise ValueError(f"{where}: malformed merge {m!r} in tokenizer.ggml.merges (expected 'left right')")
        pairs.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=kind == "llama3"))
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()  # Qwen2's tokenizer.json normalizes to NFC
    tok.pre_tokenizer = _pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    if token_types is not None:
        types = np.asarray(token_types)
        control = [AddedToken(tokens[i], special=True, normalized=False) for i in np.flatnonzero(types == _CONTROL)]
        user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == _USER_DEFINED)]
        tok.add_special_tokens(control)
        tok.add_tokens(user)
        for t in control + user:
            if tok.token_to_id(t.content) != vocab[t.content]:
                raise ValueError(f"{where}: added token {t.content!r} did not keep its id {vocab[t.content]}")
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError(f"{where}: the rebuilt tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, "
                         f"the file lists {len(tokens)}")
    return tok


def tokenizer_from_gguf(meta: Mapping[str, Any], name: str = "gguf") -> HFTokenizer | None:
    """An `HFTokenizer` rebuilt from GGUF `tokenizer.*` metadata; None when the file carries no tokenizer.

    Supports llama.cpp's "gpt2" (byte-level BPE) vocabularies with the pre-tokenizers in
    `SUPPORTED_PRE_TOKENIZERS`; BOS is added when `tokenizer.ggml.add_bos_token` says so (default:
    llama.cpp's per-vocabulary default, True only for Llama 3 style vocabularies).
    """
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        return None
    if model != "gpt2":
        hint = " (SentencePiece vocabularies are not supported yet)" if model == "llama" else ""
        raise ValueError(f"{name}: tokenizer.ggml.model {model!r} is not supported{hint}; supported: gpt2 "
                         "(byte-level BPE). Pass tokenizer=False to load the weights alone")
    pre = meta.get("tokenizer.ggml.pre") or "default"
    tok = _byte_level_tokenizer(tokens, meta.get("tokenizer.ggml.merges"), meta.get("tokenizer.ggml.token_type"),
                                pre, name)

    def token_id(key):
        value = meta.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = _PRE_KINDS[pre] == "llama3"
    template = meta.get("tokenizer.chat_template")
    return HFTokenizer.from_object(tok, bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"),
                                   pad_id=token_id("padding_token_id"), add_bos=bool(add_bos),
                                   chat_template=template if isinstance(template, str) else None, name=name)
