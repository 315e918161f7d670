"""Hugging Face checkpoints: load Llama / Mistral / Qwen2 / Qwen3 from local safetensors, and export ours.

`from_pretrained(path)` reads a local directory holding `config.json`, one or many `*.safetensors`
(with `model.safetensors.index.json` when sharded) and optionally `tokenizer.json`. Tensors are read
lazily, shard by shard, with `safetensors.safe_open` straight into preallocated, layer-stacked numpy
arrays (Dense kernels transposed from HF's [out, in] to Flax's [in, out]), so peak host memory stays
near one copy of the weights. Every tensor name and shape is checked against the config *before*
anything is allocated; a missing, unexpected or misshapen tensor is a `ValueError` naming the key.
Never unpickles anything: `pytorch_model.bin` checkpoints are refused (convert them to safetensors).

`save_pretrained(model, path)` writes the reverse: `config.json` (with `architectures`/`model_type`, so
`transformers.AutoModelForCausalLM.from_pretrained` loads it), `model.safetensors`, and tokenizer files.

Mistral's sliding-window attention is not implemented here. Attention within a window of W tokens is
exactly full causal attention for sequences of at most W tokens, so a checkpoint whose
`sliding_window` is smaller than its `max_position_embeddings` is loaded with
`max_position_embeddings` lowered to `sliding_window` (with a warning): every sequence the decoder
accepts then gets exactly the checkpoint's logits, and longer ones are refused by `smcsd.decode`
instead of silently diverging.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from .config import ModelConfig
from .lm import LanguageModel
from .tokenizer import ByteTokenizer, HFTokenizer, _read_tokenizer_config

__all__ = ["from_pretrained", "save_pretrained", "byte_tokenizer_json", "SUPPORTED_ARCHITECTURES"]

# architectures entry -> model_type (config.json carries both; either one identifies the family).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_INDEX = "model.safetensors.index.json"
_BYTE_TOKENIZER_TAG = "smcsd.ByteTokenizer"
# Tensors some exporters write that carry nothing we need: RoPE's inverse frequencies (recomputed from
# the config). `lm_head.weight` of a tied model is skipped separately (it is the embedding again).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# --------------------------------------------------------------------------------------------- config

def _arch_of(hf: Mapping[str, Any], where: str) -> str:
    """The model_type ('llama', 'mistral', 'qwen2', 'qwen3') of an HF config dict, or a ValueError."""
    archs = hf.get("architectures") or []
    for a in archs:
        if a in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[a]
    if archs:
        raise ValueError(f"{where}: unsupported architecture {archs!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    model_type = hf.get("model_type")
    if model_type in _MODEL_TYPES:
        return model_type
    raise ValueError(f"{where}: unsupported model_type {model_type!r} (and no 'architectures'); supported: "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope(hf: Mapping[str, Any], where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either the v4 keys (rope_theta, rope_scaling) or v5's rope_parameters."""
    params = hf.get("rope_parameters")
    scaling = hf.get("rope_scaling")
    theta = hf.get("rope_theta")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", theta)
        if scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    theta = 10000.0 if theta is None else float(theta)
    if scaling:
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            return theta, None
        if rope_type not in ("llama3", "linear"):
            raise ValueError(f"{where}: rope_scaling type {rope_type!r} is not supported "
                             "(supported: default, llama3, linear)")
        scaling["rope_type"] = rope_type
        scaling.pop("type", None)
        return theta, scaling
    return theta, None


def config_from_hf(hf: Mapping[str, Any], dtype: str | None = None, where: str = "config.json") -> ModelConfig:
    """Our `ModelConfig` for an HF `config.json` dict (Llama / Mistral / Qwen2 / Qwen3)."""
    arch = _arch_of(hf, where)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if name not in hf:
            raise ValueError(f"{where}: missing required field {name!r}")
    theta, scaling = _rope(hf, where)
    if dtype is None:
        dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
        if dtype not in _NP_DTYPES:
            dtype = "float32"
    elif dtype not in _NP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_NP_DTYPES)}, got {dtype!r}")

    attention_bias = bool(hf.get("attention_bias", False))
    if arch == "qwen2":
        attention_bias = True  # Qwen2 always has q/k/v bias (and no o_proj bias); not a config field
    mlp_bias = bool(hf.get("mlp_bias", False)) if arch == "llama" else False
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"{where}: hidden_act {hf.get('hidden_act')!r} is not supported (only silu)")

    max_pos = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window")
    uses_window = window is not None and (arch == "mistral" or bool(hf.get("use_sliding_window", False))
                                          or "sliding_attention" in (hf.get("layer_types") or ()))
    if uses_window and int(window) < max_pos:
        warnings.warn(
            f"{where}: sliding_window={window} < max_position_embeddings={max_pos}; smcsd has no sliding-window "
            f"attention, so max_position_embeddings is lowered to {window}: within that length full attention "
            "equals the windowed one exactly, and longer sequences are refused.", stacklevel=3)
        max_pos = int(window)

    vocab = int(hf["vocab_size"])

    def token_id(name):
        value = hf.get(name)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is None:
            return None
        if not 0 <= int(value) < vocab:
            warnings.warn(f"{where}: {name}={value} is outside the vocabulary [0, {vocab}); ignored", stacklevel=4)
            return None
        return int(value)

    try:
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=int(hf["num_attention_heads"]),
            num_key_value_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            head_dim=None if hf.get("head_dim") is None else int(hf["head_dim"]),
            max_position_embeddings=max_pos,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=arch == "qwen3",
            mlp_bias=mlp_bias,
            hidden_act="silu",
            dtype=dtype,
            bos_token_id=token_id("bos_token_id"),
            eos_token_id=token_id("eos_token_id"),
            pad_token_id=token_id("pad_token_id"),
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def _architecture_for(c: ModelConfig) -> str:
    """The HF model_type that represents `c` exactly (Mistral is written as Llama: no sliding window)."""
    if c.qk_norm:
        if c.mlp_bias:
            raise ValueError("cannot export qk_norm together with mlp_bias: no Hugging Face architecture has both")
        return "qwen3"
    if c.attention_bias and not c.mlp_bias:
        return "qwen2"
    return "llama"


def config_to_hf(c: ModelConfig) -> dict:
    """An HF `config.json` dict for `c` (readable by transformers v4 and v5)."""
    arch = _architecture_for(c)
    out = {
        "architectures": [_MODEL_TYPES[arch]],
        "model_type": arch,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_scaling": None if c.rope_scaling is None else dict(c.rope_scaling),
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": c.hidden_act,
        "torch_dtype": c.dtype,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if arch in ("llama", "qwen3"):
        # HF Llama/Qwen3 `attention_bias` also biases o_proj; we write that bias as zeros.
        out["attention_bias"] = c.attention_bias
    if arch == "llama":
        out["mlp_bias"] = c.mlp_bias
    if arch in ("qwen2", "qwen3"):
        out["use_sliding_window"] = False
        out["sliding_window"] = None
        out["max_window_layers"] = c.num_hidden_layers
    return out


# ---------------------------------------------------------------------------------------- tensor map

class _Slot(NamedTuple):
    """Where one HF tensor goes: our param path (None: checked, then dropped), its layer (None: not
    stacked), the HF shape, whether the HF [out, in] weight is transposed into a Flax kernel, and
    whether it must be all zeros (the o_proj bias our attention does not have)."""

    path: tuple | None
    layer: int | None
    shape: tuple
    transpose: bool = False
    zero_only: bool = False


def _tensor_map(c: ModelConfig, arch: str) -> dict[str, _Slot]:
    """Every tensor an HF checkpoint of family `arch` and config `c` holds: HF name -> our param slot."""
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    out: dict[str, _Slot] = {"model.embed_tokens.weight": _Slot(("embed_tokens", "embedding"), None, (v, d)),
                             "model.norm.weight": _Slot(("norm", "weight"), None, (d,))}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = _Slot(("lm_head",), None, (v, d))
    o_bias = c.attention_bias and arch in ("llama", "qwen3")
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."

        def dense(name, group, n_out, n_in, bias, zero_bias=False):
            out[f"{p}{group}.{name}.weight"] = _Slot(("layers", group, name, "kernel"), i, (n_out, n_in), True)
            if bias:
                out[f"{p}{group}.{name}.bias"] = _Slot(("layers", group, name, "bias"), i, (n_out,))
            elif zero_bias:
                out[f"{p}{group}.{name}.bias"] = _Slot(None, i, (n_out,), zero_only=True)

        dense("q_proj", "self_attn", hq * hd, d, c.attention_bias)
        dense("k_proj", "self_attn", hk * hd, d, c.attention_bias)
        dense("v_proj", "self_attn", hk * hd, d, c.attention_bias)
        dense("o_proj", "self_attn", d, hq * hd, False, zero_bias=o_bias)
        if c.qk_norm:
            out[f"{p}self_attn.q_norm.weight"] = _Slot(("layers", "self_attn", "q_norm", "weight"), i, (hd,))
            out[f"{p}self_attn.k_norm.weight"] = _Slot(("layers", "self_attn", "k_norm", "weight"), i, (hd,))
        dense("gate_proj", "mlp", f, d, c.mlp_bias)
        dense("up_proj", "mlp", f, d, c.mlp_bias)
        dense("down_proj", "mlp", d, f, c.mlp_bias)
        out[f"{p}input_layernorm.weight"] = _Slot(("layers", "input_layernorm", "weight"), i, (d,))
        out[f"{p}post_attention_layernorm.weight"] = _Slot(("layers", "post_attention_layernorm", "weight"), i, (d,))
    return out


def _param_shape(slot: _Slot, num_layers: int) -> tuple[int, ...]:
    shape = tuple(reversed(slot.shape)) if slot.transpose else tuple(slot.shape)
    return shape if slot.layer is None else (num_layers,) + shape


def _set(tree: dict, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _list_keys(keys, limit=8) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(repr(k) for k in keys[:limit]) + more


# -------------------------------------------------------------------------------------------- loading

def _safetensors_files(path: str) -> tuple[list[str], dict[str, str] | None]:
    """The checkpoint's files (from the shard index when there is one) and the index's weight_map."""
    index_path = os.path.join(path, _INDEX)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path}: no 'weight_map' in the shard index")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.isfile(os.path.join(path, name)):
                raise FileNotFoundError(f"{index_path} lists shard {name!r}, which is not in {path}")
        return files, weight_map
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        other = [n for n in os.listdir(path) if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        hint = (f" (found {other}: pickled checkpoints are not loaded for safety; convert them to safetensors)"
                if other else "")
        raise FileNotFoundError(f"no *.safetensors weights in {path}{hint}")
    return files, None


def scan_checkpoint(path: str, dtype: str | None = None):
    """Read and check a checkpoint's config and tensor headers without loading any tensor.

    Returns `(config, arch, expected, found, files)`: `expected` maps each HF tensor name to its slot in
    our params, `found` maps it to `(file, shape)`. Missing, unexpected or misshapen tensors and an
    unsupported architecture are a ValueError naming the key; a missing directory/config.json is a
    FileNotFoundError. Shared by `from_pretrained` and `models.sharding.load_sharded`.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no config.json in {path}: a Hugging Face checkpoint directory needs one")
    with open(cfg_path) as f:
        hf = json.load(f)
    config = config_from_hf(hf, dtype, where=cfg_path)
    arch = _arch_of(hf, cfg_path)
    expected = _tensor_map(config, arch)

    # 1. Headers only: which tensor is where, with which shape. Check everything before allocating.
    files, weight_map = _safetensors_files(path)
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for fname in files:
        with safe_open(os.path.join(path, fname), framework="numpy") as f:
            for key in f.keys():
                if key in found:
                    raise ValueError(f"tensor {key!r} appears in both {found[key][0]!r} and {fname!r}")
                found[key] = (fname, tuple(f.get_slice(key).get_shape()))
    if weight_map is not None:
        misplaced = [k for k, fname in weight_map.items() if k not in found or found[k][0] != fname]
        if misplaced:
            k = sorted(misplaced)[0]
            raise ValueError(f"{_INDEX} maps tensor {k!r} to {weight_map[k]!r}, but "
                             + (f"it is in {found[k][0]!r}" if k in found else "no shard holds it")
                             + (f" ({len(misplaced)} such tensors)" if len(misplaced) > 1 else ""))
    skipped = {k for k in found if k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings and "lm_head.weight" in found:
        skipped.add("lm_head.weight")  # a tied checkpoint may still store the (identical) head
    missing = set(expected) - set(found)
    if missing:
        raise ValueError(f"checkpoint {path} is missing tensor(s) {_list_keys(missing)} "
                         f"required by its config ({_MODEL_TYPES[arch]})")
    unexpected = set(found) - set(expected) - skipped
    if unexpected:
        raise ValueError(f"checkpoint {path} has unexpected tensor(s) {_list_keys(unexpected)} that its config "
                         f"({_MODEL_TYPES[arch]}) does not use")
    for key, slot in expected.items():
        if found[key][1] != tuple(slot.shape):
            raise ValueError(f"tensor {key!r} in {found[key][0]!r} has shape {list(found[key][1])}, "
                             f"expected {list(slot.shape)} from config.json")

    return config, arch, expected, found, files


def from_pretrained(path: str, dtype: str | None = None, *, tokenizer: bool = True,
                    name: str | None = None) -> LanguageModel:
    """Load a local Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoint as a `LanguageModel`.

    path: a directory with config.json, *.safetensors (+ model.safetensors.index.json when sharded)
    and optionally tokenizer.json. dtype: "float32" / "bfloat16" / "float16" for the params; default
    the config's torch_dtype (float32 when absent). Logits are float32 whatever the dtype.
    A `.gguf` file, or a directory holding one and no config.json, is read by `models.gguf.from_gguf`.
    """
    path = os.fspath(path)
    from .gguf import find_gguf, from_gguf

    gguf_file = find_gguf(path)
    if gguf_file is not None:
        return from_gguf(gguf_file, dtype, tokenizer=tokenizer, name=name)
    config, arch, expected, found, files = scan_checkpoint(path, dtype)

    # 2. Preallocate one stacked array per param, then fill it shard by shard, tensor by tensor.
    np_dtype = _NP_DTYPES[config.dtype]
    L = config.num_hidden_layers
    buffers: dict[tuple, np.ndarray] = {}
    for slot in expected.values():
        if slot.path is not None and slot.path not in buffers:
            buffers[slot.path] = np.empty(_param_shape(slot, L), np_dtype)
    by_file: dict[str, list[str]] = {}
    for key in expected:
        by_file.setdefault(found[key][0], []).append(key)
    for fname in files:
        keys = by_file.get(fname, [])
        if not keys:
            continue
        with safe_open(os.path.join(path, fname), framework="numpy") as f:
            for key in keys:
                slot = expected[key]
                tensor = f.get_tensor(key)
                if slot.zero_only:
                    if np.any(tensor.astype(np.float32) != 0):
                        raise ValueError(f"tensor {key!r} is a non-zero o_proj bias, which smcsd's attention "
                                         "does not have (only q/k/v bias is supported)")
                    continue
                if slot.transpose:
                    tensor = tensor.T
                dest = buffers[slot.path]
                if slot.layer is None:
                    dest[...] = tensor.astype(np_dtype, copy=False)
                else:
                    dest[slot.layer] = tensor.astype(np_dtype, copy=False)
                del tensor

    # 3. Hand each buffer to JAX and drop the host copy as we go.
    params: dict = {}
    for p in list(buffers):
        _set(params, p, jnp.asarray(buffers.pop(p)))

    tok = _load_tokenizer(path, config) if tokenizer else None
    return LanguageModel(config=config, params=params, tokenizer=tok,
                         name=name or os.path.basename(os.path.normpath(path)))


def _load_tokenizer(path: str, config: ModelConfig):
    """HFTokenizer for tokenizer.json (ByteTokenizer if we wrote it for one); None when absent."""
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        return None
    tcfg = _read_tokenizer_config(path)
    if tcfg.get("smcsd_tokenizer") == _BYTE_TOKENIZER_TAG:
        return ByteTokenizer()
    from tokenizers import Tokenizer

    # Without tokenizer_config.json, name the special tokens from config.json's ids.
    raw = Tokenizer.from_file(file)
    bos = eos = None
    if "bos_token" not in tcfg and config.bos_token_id is not None:
        bos = raw.id_to_token(config.bos_token_id)
    if "eos_token" not in tcfg and config.eos_token_id is not None:
        eos = raw.id_to_token(config.eos_token_id)
    return HFTokenizer(file, bos_token=bos, eos_token=eos)


# -------------------------------------------------------------------------------------------- saving

def save_pretrained(model: LanguageModel, path: str) -> None:
    """Write `model` as a Hugging Face checkpoint directory that `transformers` and `from_pretrained` load.

    Files: config.json, model.safetensors (params in their dtype, HF names and layouts), and
    tokenizer.json + tokenizer_config.json. An `HFTokenizer`'s files are copied; the `ByteTokenizer`
    is written as an equivalent byte-level `tokenizer.json` (see `byte_tokenizer_json`), tagged so
    `from_pretrained` gives back a `ByteTokenizer`.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    c = model.config
    hf = config_to_hf(c)
    tensors: dict[str, np.ndarray] = {}
    for key, slot in _tensor_map(c, hf["model_type"]).items():
        if slot.zero_only:
            tensors[key] = np.zeros(slot.shape, _NP_DTYPES[c.dtype])
            continue
        value = np.asarray(_get(model.params, slot.path))
        if slot.layer is not None:
            value = value[slot.layer]
        if slot.transpose:
            value = value.T
        if tuple(value.shape) != tuple(slot.shape):
            raise ValueError(f"param {'/'.join(slot.path)} has shape {value.shape}, expected {slot.shape} for {key!r}")
        tensors[key] = np.ascontiguousarray(value)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    gen = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hf[k] is not None}
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    _save_tokenizer(model.tokenizer, path)


def _save_tokenizer(tok, path: str) -> None:
    if tok is None:
        return
    if isinstance(tok, ByteTokenizer):
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            f.write(byte_tokenizer_json())
        tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                "pad_token": "<pad>", "add_bos_token": True, "smcsd_tokenizer": _BYTE_TOKENIZER_TAG}
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump(tcfg, f, indent=2)
        return
    if isinstance(tok, HFTokenizer):
        src_dir = os.path.dirname(os.path.abspath(tok.path))
        dst = os.path.join(path, "tokenizer.json")
        if os.path.abspath(tok.path) != os.path.abspath(dst):
            shutil.copyfile(tok.path, dst)
        src_cfg = os.path.join(src_dir, "tokenizer_config.json")
        dst_cfg = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(src_cfg):
            if os.path.abspath(src_cfg) != os.path.abspath(dst_cfg):
                shutil.copyfile(src_cfg, dst_cfg)
        else:
            raw = tok._tok
            tcfg = {"tokenizer_class": "PreTrainedTokenizerFast"}
            for field, i in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id), ("pad_token", tok.pad_id)):
                if i is not None:
                    tcfg[field] = raw.id_to_token(i)
            with open(dst_cfg, "w") as f:
                json.dump(tcfg, f, indent=2)
        return
    warnings.warn(f"save_pretrained: tokenizer {type(tok).__name__} has no Hugging Face form; not written",
                  stacklevel=3)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table (what tokenizers' ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer_json() -> str:
    """A `tokenizer.json` equivalent to `ByteTokenizer`: byte b -> id b, <s>=256, </s>=257, <pad>=258.

    A byte-level BPE with no merges: the ByteLevel pre-tokenizer maps each byte to one character,
    the vocabulary maps that character back to the byte's value, and the decoder inverts it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>", "<pad>"])
    return tok.to_str()
