"""Load a Hugging Face checkpoint straight into the tensor-parallel layout of `models/sharding.py`.

`load_sharded(path, mesh)` reads the same checkpoints as `models.from_pretrained` (it uses the same
reading code, `models/checkpoint.py`), but builds every param with `jax.make_array_from_callback`,
reading only the block each device holds. `param_shardings(config, mesh)` is the layout it produces.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from safetensors import safe_open

from .checkpoint import NP_DTYPES, load_tokenizer, param_shape, scan_checkpoint, tree_get, tree_set
from .config import ModelConfig
from .lm import LanguageModel
from .sharding import MODEL, axis_size, param_specs
from .transformer import Transformer

__all__ = ["abstract_params", "load_sharded", "param_shardings"]


def abstract_params(config: ModelConfig):
    """The params pytree of a model with `config` as `jax.ShapeDtypeStruct`s (nothing allocated)."""
    module = Transformer(config)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(module.init, jax.random.PRNGKey(0), tokens, tokens)["params"]


def param_shardings(config: ModelConfig, mesh: Mesh):
    """A pytree of `NamedSharding` matching the params of a model with `config` (no params built)."""
    specs = param_specs(abstract_params(config), axis_size(mesh, MODEL), config)
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                  is_leaf=lambda s: isinstance(s, P))


def load_sharded(path: str, mesh: Mesh, dtype: str | None = None, *, tokenizer: bool = True,
                 name: str | None = None) -> LanguageModel:
    """Load a local Hugging Face checkpoint (as `models.from_pretrained` reads it) straight into the
    tensor-parallel layout on `mesh`: every param is built with `jax.make_array_from_callback`, whose
    callback reads only the block one device holds (`safe_open(...).get_slice`), so neither the host
    nor any device ever materialises a whole sharded tensor. Replicated params (norms, undividable
    dims) are read once per distinct block. Multi-host: each process reads only its devices' blocks.

    Uses the reading code of `models/checkpoint.py` (config parsing, the HF-name -> param-slot map,
    shard discovery, tokenizer), as `from_pretrained` does, so both loaders accept exactly the same
    checkpoints.
    """
    path = os.fspath(path)
    config, arch, expected, found, files = scan_checkpoint(path, dtype)
    found = {k: fname for k, (fname, _) in found.items()}  # tensor -> its file
    np_dtype = NP_DTYPES[config.dtype]
    L = config.num_hidden_layers
    specs = param_specs(abstract_params(config), axis_size(mesh, MODEL), config)

    # param path -> its slots: one (unstacked) or L (stacked, indexed by layer)
    slots: dict[tuple, dict] = {}
    for key, slot in expected.items():
        if slot.path is None:
            continue
        slots.setdefault(slot.path, {})[slot.layer] = (key, slot)

    with contextlib.ExitStack() as stack:
        handles = {fname: stack.enter_context(safe_open(os.path.join(path, fname), framework="numpy"))
                   for fname in files}
        # o_proj biases the attention doesn't have must be zero (same rule as from_pretrained).
        for key, slot in expected.items():
            if slot.zero_only and np.any(handles[found[key]].get_tensor(key).astype(np.float32) != 0):
                raise ValueError(f"tensor {key!r} is a non-zero o_proj bias, which smcsd's attention does not "
                                 "have (only q/k/v bias is supported)")

        def read(key, slot, idx):
            """Block `idx` (slices of our param layout, without the layer dim) of HF tensor `key`."""
            sl = handles[found[key]].get_slice(key)
            if slot.transpose:  # ours [in, out] = HF [out, in].T
                return np.asarray(sl[idx[1], idx[0]]).T
            return np.asarray(sl[idx] if len(idx) > 1 else sl[idx[0]])

        def build(ppath, by_layer):
            first = next(iter(by_layer.values()))[1]
            shape = param_shape(first, L)
            spec = tree_get(specs, ppath)
            memo: dict = {}

            def callback(index):
                index = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
                k = tuple((s.start, s.stop) for s in index)
                if k not in memo:
                    if first.layer is None:
                        block = read(by_layer[None][0], first, index)
                    else:
                        layers = range(L)[index[0]]
                        block = np.stack([read(*by_layer[i], index[1:]) for i in layers])
                    memo[k] = np.ascontiguousarray(block.astype(np_dtype, copy=False))
                return memo[k]

            return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), callback)

        params: dict = {}
        for ppath, by_layer in slots.items():
            tree_set(params, ppath, build(ppath, by_layer))

    tok = load_tokenizer(path, config) if tokenizer else None
    return LanguageModel(config=config, params=params, tokenizer=tok,
                         name=name or os.path.basename(os.path.normpath(path)))
