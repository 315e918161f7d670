"""The trained target/draft pairs shipped inside the package (`models/shipped/<pair>/{target,draft}/`).

Each model directory holds `config.json` (a `ModelConfig` dict) and `model.safetensors` (params
flattened with "/"-joined names, float32 or bfloat16, cast to the config's dtype on load). Files are
found relative to this module, so they load the same from a checkout and from a pip-installed wheel.
Every failure names the offending file: missing, unreadable/truncated, a missing or unexpected
tensor, or a tensor whose shape does not match the config.
"""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig
from .lm import LanguageModel
from .tokenizer import ByteTokenizer
from .transformer import Transformer

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped")
ROLES = ("target", "draft")


class CheckpointError(ValueError):
    """A shipped (or exported) checkpoint is missing, corrupted, or does not match its config."""


def available_shipped() -> list[str]:
    """Names of the shipped pairs present in this installation (directories with a target and a draft)."""
    if not os.path.isdir(SHIPPED_DIR):
        return []
    return sorted(n for n in os.listdir(SHIPPED_DIR)
                  if all(os.path.isdir(os.path.join(SHIPPED_DIR, n, r)) for r in ROLES))


def _expected_shapes(config: ModelConfig) -> dict[str, tuple]:
    """Flattened param name -> shape, from the module's abstract init (no compute, no memory)."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens))["params"]
    leaves = jax.tree_util.tree_flatten_with_path(shapes)[0]
    return {"/".join(str(getattr(key, "key", key)) for key in path): tuple(v.shape) for path, v in leaves}


def flatten_params(params, sep: str = "/") -> dict[str, np.ndarray]:
    """{"a/b/c": array} of a nested-dict params tree (the safetensors names `load_model_dir` expects)."""
    flat = {}

    def walk(prefix, node):
        if isinstance(node, dict) or hasattr(node, "items"):
            for k, v in node.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        else:
            flat[prefix] = np.asarray(node)
    walk("", params)
    return flat


def export_model(config: ModelConfig, params, directory: str, dtype: str = "float32", info: dict | None = None):
    """Write `config.json`, `model.safetensors` (flattened "/"-joined names) and `training.json` (`info`)."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    flat = flatten_params(params)
    if dtype == "bfloat16":
        import ml_dtypes
        flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in flat.items()}
    elif dtype == "float32":
        flat = {k: v.astype(np.float32) for k, v in flat.items()}
    else:
        raise ValueError(f"export dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    save_file(flat, os.path.join(directory, "model.safetensors"), metadata={"format": "smcsd-flax"})
    os.chmod(os.path.join(directory, "model.safetensors"), 0o644)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config.to_dict(), f, indent=2)
    if info is not None:
        with open(os.path.join(directory, "training.json"), "w") as f:
            json.dump(info, f, indent=2)


def unflatten(flat: dict) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def _read_config(path: str) -> ModelConfig:
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint config not found: {path}")
    try:
        with open(path) as f:
            return ModelConfig.from_dict(json.load(f))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"corrupted checkpoint config {path}: {e}") from e


def read_tensors(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint weights not found: {path}")
    try:
        from safetensors.numpy import load_file
        return load_file(path)
    except Exception as e:  # safetensors raises SafetensorError / OSError / ValueError on bad files
        raise CheckpointError(f"corrupted or truncated checkpoint weights {path}: {type(e).__name__}: {e}") from e


def load_model_dir(directory: str, name: str | None = None, tokenizer=None) -> LanguageModel:
    """A `LanguageModel` from a directory holding `config.json` and `model.safetensors` (byte tokenizer)."""
    config = _read_config(os.path.join(directory, "config.json"))
    weights = os.path.join(directory, "model.safetensors")
    tensors = read_tensors(weights)
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"checkpoint weights {weights} lack tensor(s) {missing} required by its config")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"checkpoint weights {weights} have unexpected tensor(s) {extra} for its config")
    for k, shape in expected.items():
        if tuple(tensors[k].shape) != shape:
            raise CheckpointError(f"checkpoint weights {weights}: tensor {k!r} has shape {tuple(tensors[k].shape)}, "
                                  f"but the config needs {shape}")
    dtype = config.jnp_dtype
    params = unflatten({k: jnp.asarray(np.asarray(v, np.float32), dtype) for k, v in tensors.items()})
    return LanguageModel(config=config, params=params, tokenizer=tokenizer or ByteTokenizer(),
                         name=name or os.path.basename(os.path.normpath(directory)))


@functools.lru_cache(maxsize=None)
def load_shipped(name: str = "tiny-code") -> tuple[LanguageModel, LanguageModel]:
    """(target, draft) of a shipped pair, e.g. "tiny-code" or "tiny-arith" (cached per process)."""
    if not isinstance(name, str):
        raise TypeError(f"shipped pair name must be a string, got {type(name).__name__}")
    directory = os.path.join(SHIPPED_DIR, name)
    if not os.path.isdir(directory):
        have = available_shipped()
        raise ValueError(f"unknown shipped model pair {name!r} (no directory {directory}); "
                         f"available: {', '.join(have) if have else 'none installed'}")
    target, draft = (load_model_dir(os.path.join(directory, r), name=f"{name}/{r}") for r in ROLES)
    if target.config.vocab_size != draft.config.vocab_size:
        raise CheckpointError(f"shipped pair {name!r}: target and draft vocabularies differ")
    return target, draft
