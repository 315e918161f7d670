"""Mesh checks on 8 host CPU devices, run by tests/test_mesh.py in a subprocess (XLA_FLAGS must be
set before jax is imported, and the pytest process has already imported jax with one device).

For each method and mesh: decode once unsharded and once on the mesh with the same seed, compare
tokens and stats, check the params' shardings in the compiled program's inputs, and record the KV
caches' shardings as the partitioner decided them (`smcsd.runtime.mesh.record_cache_shardings`). Also checks
`models.load_sharded` and the argument errors. Prints one JSON object (and writes --out).

    python tests/mesh_check.py --methods ar,sd,sd-multi,smc --meshes 8x1,4x2,2x4,1x8 --out res.json
"""

from __future__ import annotations

import os
import sys

NUM_DEVICES = 8
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += f" --xla_force_host_platform_device_count={NUM_DEVICES}"
# Fast CPU compiles (the unsharded reference is compiled with the same flags, so exactness is unaffected).
_flags += " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import smcsd  # noqa: E402
from smcsd.models import ModelConfig, init_model, load_sharded, save_pretrained  # noqa: E402
from smcsd.models.sharding import cache_spec, param_specs, shard_params  # noqa: E402
from smcsd.runtime import engine  # noqa: E402
from smcsd.runtime.mesh import record_cache_shardings  # noqa: E402

V = 256
# 8 query heads divide every model axis; the target's 4 KV heads do not divide 8 (replicated there).
TARGET = ModelConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)
DRAFT = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=128)
# 8 ragged requests (divisible by every data axis) x 2 particles.
PROMPTS = [[3 + b, 17 * b % V, 40 + b][: 1 + b % 3] for b in range(8)]
KWARGS = dict(max_new_tokens=6, num_particles=2, num_speculative_tokens=2, seed=0, temperature=1.0)
SKIP_STATS = {"wall_time_s", "tokens_per_s", "compile_time_s"}


def _models():
    # init_std 0.2: different, moderately peaked target/draft distributions (weights vary, drafts get
    # rejected), yet no token's probability is below float32 resolution: sampling.process_logits's top-p
    # cumsum then never cuts a token at top_p = 1, a rounding-sensitive decision that could flip with
    # the reduction order of a sharded matmul.
    return init_model(TARGET, 0, init_std=0.2, name="t"), init_model(DRAFT, 1, init_std=0.2, name="d")


def _compare_stats(a, b):
    """(names of differing exact stats, max relative error over float stats)."""
    bad, rel = [], 0.0
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    for name in da:
        if name in SKIP_STATS:
            continue
        x, y = da[name], db[name]
        if x is None or y is None:
            if x is not y:
                bad.append(name)
            continue
        ax, ay = np.asarray(x), np.asarray(y)
        if ax.shape != ay.shape:
            bad.append(name)
        elif ax.dtype.kind == "f":
            if not np.array_equal(np.isnan(ax), np.isnan(ay)) or not np.array_equal(np.isinf(ax), np.isinf(ay)):
                bad.append(name)
                continue
            fin = np.isfinite(ax)
            if fin.any():
                err = np.abs(ax[fin] - ay[fin]) / np.maximum(np.abs(ax[fin]), 1.0)
                rel = max(rel, float(err.max()))
        elif not np.array_equal(ax, ay):
            bad.append(name)
    return bad, rel


def _program(method, mesh):
    # compile-cache keys: (method, target cfg, draft cfg, spec, params layout[, mesh])
    keys = [k for k in engine.compiled_programs() if k[0] == method and len(k) == 6 and k[5] == mesh]
    return engine.compiled_programs()[keys[-1]] if keys else None


def _check_program_params(program, mesh, target, draft):
    """The compiled program's input shardings of both param trees equal the tensor-parallel layout."""
    (t_sh, d_sh, _), _ = program.input_shardings
    m = dict(mesh.shape)["model"]
    ok, sharded = True, 0
    for model, shardings in ((target, t_sh), (draft, d_sh)):
        if shardings is None:
            continue
        specs = param_specs(model.params, m, model.config)
        for s, spec, x in zip(jax.tree_util.tree_leaves(shardings), jax.tree_util.tree_leaves(
                specs, is_leaf=lambda p: isinstance(p, jax.sharding.PartitionSpec)),
                jax.tree_util.tree_leaves(model.params)):
            ok &= s.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)
            sharded += int(not s.is_fully_replicated)
    return bool(ok), sharded


def _check_caches(seen, mesh):
    """Every constrained cache (prefill, loop, gathers) came out of the partitioner in the expected layout."""
    bad = []
    for name, s in seen:
        shape = json.loads(name[1:])
        kv_spec, _ = cache_spec(shape[3], mesh)
        if not s.is_equivalent_to(NamedSharding(mesh, kv_spec), 5):
            bad.append(f"{name}: {s}")
    return bad


def run_methods(methods, meshes):
    target, draft = _models()
    runs = []
    for method in methods:
        extra = {"ess_threshold": 1.0} if method == "smc" else {}  # resample every cycle: gathers run
        ref = smcsd.decode(PROMPTS, target=target, draft=draft, method=method, **KWARGS, **extra)
        for shape in meshes:
            mesh = smcsd.make_mesh(*shape)
            with record_cache_shardings() as seen:
                start = time.perf_counter()
                res = smcsd.decode(PROMPTS, target=target, draft=draft, method=method, mesh=mesh, **KWARGS, **extra)
                elapsed = time.perf_counter() - start
            bad_stats, rel = _compare_stats(ref.stats, res.stats)
            params_ok, n_sharded = _check_program_params(_program(method, mesh), mesh, target, draft)
            runs.append({
                "method": method, "mesh": list(shape), "tokens_equal": ref.tokens == res.tokens,
                "stats_mismatch": bad_stats, "float_stats_max_rel_err": rel,
                "num_resamples": res.stats.num_resamples,
                "num_accepted_tokens": res.stats.num_accepted_tokens,
                "cache_records": len(seen), "cache_bad": _check_caches(seen, mesh),
                "params_in_program_ok": params_ok, "params_sharded": n_sharded,
                "compile_s": res.stats.compile_time_s, "seconds": elapsed})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    return runs


def check_placement():
    """shard_params: every shard has the partitioned shape; q/o/MLP/embeddings split, 4 KV heads on 8 whole."""
    target, _ = _models()
    out = {}
    for shape in ((4, 2), (1, 8)):
        mesh = smcsd.make_mesh(*shape)
        placed = shard_params(target.params, mesh, target.config)
        flat = dict(jax.tree_util.tree_leaves_with_path(placed))
        specs = {"/".join(str(getattr(k, "key", k)) for k in p): str(x.sharding.spec) for p, x in flat.items()}
        shards_ok = all(all(sh.data.shape == x.sharding.shard_shape(x.shape) for sh in x.addressable_shards)
                        for x in flat.values())
        values_ok = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                        zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(target.params)))
        out["x".join(map(str, shape))] = {"specs": specs, "shards_ok": bool(shards_ok), "values_ok": bool(values_ok)}
    return out


def check_load_sharded():
    """Save a Qwen2-style (q/k/v bias) model as an HF checkpoint, load it straight onto a 4x2 mesh."""
    cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, attention_bias=True, max_position_embeddings=64)
    model = init_model(cfg, 3, init_std=0.2)
    mesh = smcsd.make_mesh(4, 2)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp)
        loaded = load_sharded(tmp, mesh)
    specs = param_specs(model.params, 2, cfg)
    rows = []
    for (path, x), ref, spec in zip(jax.tree_util.tree_leaves_with_path(loaded.params),
                                    jax.tree_util.tree_leaves(model.params),
                                    jax.tree_util.tree_leaves(specs, is_leaf=lambda p: isinstance(
                                        p, jax.sharding.PartitionSpec))):
        full = int(np.prod(x.shape))
        rows.append({"param": "/".join(str(getattr(k, "key", k)) for k in path),
                     "equal": bool(np.array_equal(np.asarray(x), np.asarray(ref))),
                     "layout_ok": bool(x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)),
                     "max_shard_fraction": max(int(np.prod(s.data.shape)) for s in x.addressable_shards) / full})
    return {"config_equal": loaded.config == cfg, "params": rows}


def check_errors():
    """Clear ValueErrors that name the argument."""
    target, draft = _models()
    out = {}
    for label, fn in {
        "make_mesh_product": lambda: smcsd.make_mesh(data=3, model=2),
        "make_mesh_model": lambda: smcsd.make_mesh(model=3),
        "decode_batch": lambda: smcsd.decode(PROMPTS[:4], target=target, draft=draft, method="smc",
                                             mesh=smcsd.make_mesh(8, 1), **KWARGS),
        "mesh_axes": lambda: smcsd.decode(PROMPTS, target=target, method="ar", **KWARGS,
                                          mesh=jax.make_mesh((8,), ("x",))),
    }.items():
        try:
            fn()
            out[label] = None
        except ValueError as e:
            out[label] = str(e)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="ar,sd,sd-multi,smc")
    ap.add_argument("--meshes", default="8x1,4x2,2x4,1x8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    meshes = [tuple(int(v) for v in m.split("x")) for m in args.meshes.split(",") if m]
    methods = [m for m in args.methods.split(",") if m]
    result = {"devices": jax.device_count(), "errors": check_errors(), "placement": check_placement(),
              "load_sharded": check_load_sharded(), "runs": run_methods(methods, meshes)}
    result["seconds"] = time.perf_counter() - start
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
