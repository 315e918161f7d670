"""Reading Hugging Face checkpoints: everything both loaders (`models.hf.from_pretrained`, host
arrays; `models.sharded_load.load_sharded`, straight into a device mesh) and `models.gguf` share.

- config: `config_from_hf` / `config_to_hf` (Llama / Mistral / Qwen2 / Qwen3 `config.json` <-> our
  `ModelConfig`), the architecture tables (`SUPPORTED_ARCHITECTURES`, `MODEL_TYPES`, `arch_of`,
  `architecture_for`) and the param dtypes (`NP_DTYPES`);
- the tensor map: `tensor_map(config, arch)` names every HF tensor of a checkpoint and its `Slot` in
  our params (path, layer, HF shape, transpose); `param_shape` is the shape of the (layer-stacked)
  param a slot fills; `tree_get` / `tree_set` address a param by path;
- files: `safetensors_files` (shard discovery, via `model.safetensors.index.json` when present),
  `scan_checkpoint` (config + tensor headers, every name and shape checked before anything is
  read), `load_tokenizer` (tokenizer.json, or our tagged `ByteTokenizer`).

Nothing here builds a model or touches a device: this module imports only `config` and `tokenizer`,
so the loaders depend on it and never on each other.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Mapping, NamedTuple

import ml_dtypes
import numpy as np
from safetensors import safe_open

from .config import ModelConfig
from .tokenizer import ByteTokenizer, HFTokenizer, read_tokenizer_config

__all__ = [
    "SUPPORTED_ARCHITECTURES", "MODEL_TYPES", "NP_DTYPES", "INDEX_FILE", "BYTE_TOKENIZER_TAG", "Slot",
    "arch_of", "architecture_for", "config_from_hf", "config_to_hf", "tensor_map", "param_shape",
    "tree_get", "tree_set", "list_keys", "safetensors_files", "scan_checkpoint", "load_tokenizer",
]

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
MODEL_TYPES = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
INDEX_FILE = "model.safetensors.index.json"
BYTE_TOKENIZER_TAG = "smcsd.ByteTokenizer"
# Tensors some exporters write that carry nothing we need: RoPE's inverse frequencies (recomputed from
# the config). `lm_head.weight` of a tied model is skipped separately (it is the embedding again).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# --------------------------------------------------------------------------------------------- config

def arch_of(hf: Mapping[str, Any], where: str) -> str:
    """The model_type ('llama', 'mistral', 'qwen2', 'qwen3') of an HF config dict, or a ValueError."""
    archs = hf.get("architectures") or []
    for a in archs:
        if a in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[a]
    if archs:
        raise ValueError(f"{where}: unsupported architecture {archs!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    model_type = hf.get("model_type")
    if model_type in MODEL_TYPES:
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
    arch = arch_of(hf, where)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if name not in hf:
            raise ValueError(f"{where}: missing required field {name!r}")
    theta, scaling = _rope(hf, where)
    if dtype is None:
        dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
        if dtype not in NP_DTYPES:
            dtype = "float32"
    elif dtype not in NP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(NP_DTYPES)}, got {dtype!r}")

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


def architecture_for(c: ModelConfig) -> str:
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
    arch = architecture_for(c)
    out = {
        "architectures": [MODEL_TYPES[arch]],
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

class Slot(NamedTuple):
    """Where one HF tensor goes: our param path (None: checked, then dropped), its layer (None: not
    stacked), the HF shape, whether the HF [out, in] weight is transposed into a Flax kernel, and
    whether it must be all zeros (the o_proj bias our attention does not have)."""

    path: tuple | None
    layer: int | None
    shape: tuple
    transpose: bool = False
    zero_only: bool = False


def tensor_map(c: ModelConfig, arch: str) -> dict[str, Slot]:
    """Every tensor an HF checkpoint of family `arch` and config `c` holds: HF name -> our param slot."""
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    hq, hk, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    out: dict[str, Slot] = {"model.embed_tokens.weight": Slot(("embed_tokens", "embedding"), None, (v, d)),
                             "model.norm.weight": Slot(("norm", "weight"), None, (d,))}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = Slot(("lm_head",), None, (v, d))
    o_bias = c.attention_bias and arch in ("llama", "qwen3")
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."

        def dense(name, group, n_out, n_in, bias, zero_bias=False):
            out[f"{p}{group}.{name}.weight"] = Slot(("layers", group, name, "kernel"), i, (n_out, n_in), True)
            if bias:
                out[f"{p}{group}.{name}.bias"] = Slot(("layers", group, name, "bias"), i, (n_out,))
            elif zero_bias:
                out[f"{p}{group}.{name}.bias"] = Slot(None, i, (n_out,), zero_only=True)

        dense("q_proj", "self_attn", hq * hd, d, c.attention_bias)
        dense("k_proj", "self_attn", hk * hd, d, c.attention_bias)
        dense("v_proj", "self_attn", hk * hd, d, c.attention_bias)
        dense("o_proj", "self_attn", d, hq * hd, False, zero_bias=o_bias)
        if c.qk_norm:
            out[f"{p}self_attn.q_norm.weight"] = Slot(("layers", "self_attn", "q_norm", "weight"), i, (hd,))
            out[f"{p}self_attn.k_norm.weight"] = Slot(("layers", "self_attn", "k_norm", "weight"), i, (hd,))
        dense("gate_proj", "mlp", f, d, c.mlp_bias)
        dense("up_proj", "mlp", f, d, c.mlp_bias)
        dense("down_proj", "mlp", d, f, c.mlp_bias)
        out[f"{p}input_layernorm.weight"] = Slot(("layers", "input_layernorm", "weight"), i, (d,))
        out[f"{p}post_attention_layernorm.weight"] = Slot(("layers", "post_attention_layernorm", "weight"), i, (d,))
    return out


def param_shape(slot: Slot, num_layers: int) -> tuple[int, ...]:
    """Shape of the param `slot` fills: the HF shape (reversed when transposed), layer-stacked to
    `[num_layers, ...]` when the slot has a layer."""
    shape = tuple(reversed(slot.shape)) if slot.transpose else tuple(slot.shape)
    return shape if slot.layer is None else (num_layers,) + shape


def tree_set(tree: dict, path, value):
    """`tree[path[0]]...[path[-1]] = value`, creating the nested dicts on the way."""
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def tree_get(tree, path):
    """`tree[path[0]]...[path[-1]]`."""
    for k in path:
        tree = tree[k]
    return tree


def list_keys(keys, limit=8) -> str:
    """The first `limit` of `keys` (sorted, repr'd) for an error message."""
    keys = sorted(keys)
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(repr(k) for k in keys[:limit]) + more


# -------------------------------------------------------------------------------------------- loading

def safetensors_files(path: str) -> tuple[list[str], dict[str, str] | None]:
    """The checkpoint's files (from the shard index when there is one) and the index's weight_map."""
    index_path = os.path.join(path, INDEX_FILE)
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
    FileNotFoundError. Shared by `models.hf.from_pretrained` and `models.sharded_load.load_sharded`.
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
    arch = arch_of(hf, cfg_path)
    expected = tensor_map(config, arch)

    # 1. Headers only: which tensor is where, with which shape. Check everything before allocating.
    files, weight_map = safetensors_files(path)
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
            raise ValueError(f"{INDEX_FILE} maps tensor {k!r} to {weight_map[k]!r}, but "
                             + (f"it is in {found[k][0]!r}" if k in found else "no shard holds it")
                             + (f" ({len(misplaced)} such tensors)" if len(misplaced) > 1 else ""))
    skipped = {k for k in found if k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings and "lm_head.weight" in found:
        skipped.add("lm_head.weight")  # a tied checkpoint may still store the (identical) head
    missing = set(expected) - set(found)
    if missing:
        raise ValueError(f"checkpoint {path} is missing tensor(s) {list_keys(missing)} "
                         f"required by its config ({MODEL_TYPES[arch]})")
    unexpected = set(found) - set(expected) - skipped
    if unexpected:
        raise ValueError(f"checkpoint {path} has unexpected tensor(s) {list_keys(unexpected)} that its config "
                         f"({MODEL_TYPES[arch]}) does not use")
    for key, slot in expected.items():
        if found[key][1] != tuple(slot.shape):
            raise ValueError(f"tensor {key!r} in {found[key][0]!r} has shape {list(found[key][1])}, "
                             f"expected {list(slot.shape)} from config.json")

    return config, arch, expected, found, files


# ------------------------------------------------------------------------------------------ tokenizer

def load_tokenizer(path: str, config: ModelConfig):
    """HFTokenizer for tokenizer.json (ByteTokenizer if we wrote it for one); None when absent."""
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        return None
    tcfg = read_tokenizer_config(path)
    if tcfg.get("smcsd_tokenizer") == BYTE_TOKENIZER_TAG:
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
