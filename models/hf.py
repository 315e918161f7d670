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

Parsing the config, the HF-name -> param map and the checks on a checkpoint's files live in
`models.checkpoint` (shared with `models.sharded_load.load_sharded` and `models.gguf`); this module
builds a `LanguageModel` from them and writes one back.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from .checkpoint import (BYTE_TOKENIZER_TAG, NP_DTYPES, SUPPORTED_ARCHITECTURES, config_from_hf, config_to_hf,
                         load_tokenizer, param_shape, scan_checkpoint, tensor_map, tree_get, tree_set)
from .gguf import find_gguf, from_gguf
from .lm import LanguageModel
from .tokenizer import ByteTokenizer, HFTokenizer

__all__ = ["from_pretrained", "save_pretrained", "byte_tokenizer_json", "SUPPORTED_ARCHITECTURES",
           "config_from_hf", "config_to_hf", "scan_checkpoint"]

# -------------------------------------------------------------------------------------------- loading

def from_pretrained(path: str, dtype: str | None = None, *, tokenizer: bool = True,
                    name: str | None = None) -> LanguageModel:
    """Load a local Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoint as a `LanguageModel`.

    path: a directory with config.json, *.safetensors (+ model.safetensors.index.json when sharded)
    and optionally tokenizer.json. dtype: "float32" / "bfloat16" / "float16" for the params; default
    the config's torch_dtype (float32 when absent). Logits are float32 whatever the dtype.
    A `.gguf` file, or a directory holding one and no config.json, is read by `models.gguf.from_gguf`.
    """
    path = os.fspath(path)
    gguf_file = find_gguf(path)
    if gguf_file is not None:
        return from_gguf(gguf_file, dtype, tokenizer=tokenizer, name=name)
    # 1. Headers only: config, tensor names and shapes, all checked before anything is allocated.
    config, arch, expected, found, files = scan_checkpoint(path, dtype)

    # 2. Preallocate one stacked array per param, then fill it shard by shard, tensor by tensor.
    np_dtype = NP_DTYPES[config.dtype]
    L = config.num_hidden_layers
    buffers: dict[tuple, np.ndarray] = {}
    for slot in expected.values():
        if slot.path is not None and slot.path not in buffers:
            buffers[slot.path] = np.empty(param_shape(slot, L), np_dtype)
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
        tree_set(params, p, jnp.asarray(buffers.pop(p)))

    tok = load_tokenizer(path, config) if tokenizer else None
    return LanguageModel(config=config, params=params, tokenizer=tok,
                         name=name or os.path.basename(os.path.normpath(path)))


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
    for key, slot in tensor_map(c, hf["model_type"]).items():
        if slot.zero_only:
            tensors[key] = np.zeros(slot.shape, NP_DTYPES[c.dtype])
            continue
        value = np.asarray(tree_get(model.params, slot.path))
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
                "pad_token": "<pad>", "add_bos_token": True, "smcsd_tokenizer": BYTE_TOKENIZER_TAG}
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
