"""Decoding on a device mesh with axes ("data", "model"): requests x particles over "data",
weights tensor-parallel over "model" (layouts in `models/sharding.py`).

    mesh = smcsd.make_mesh(data=4, model=2)          # 8 devices
    res = smcsd.decode(prompts, target=..., draft=..., method="smc", mesh=mesh)

The whole decode stays one jitted program: `decode` places the params and inputs on the mesh
(`jax.device_put` with `NamedSharding`s; a no-op for params already there, e.g. from
`models.load_sharded`), the program is compiled with those `in_shardings`, and while it is
traced the KV caches are constrained to rows-over-data / KV-heads-over-model, so GSPMD inserts the
collectives (all-reduces after o_proj/down_proj, a gather of vocab-sharded logits for the sampler).

Constraint: the data axis must divide the number of requests B. Each data shard then holds whole
requests with all N of their particles, so resampling (and sd-multi's winner gather, and the
prompt fan-out to particles) moves cache rows only within a shard — no cache ever crosses devices.
The model axis has no such constraint: what it does not divide is replicated.
Tokens and integer stats equal the unsharded run's for the same seed (float stats such as ESS and
log Ẑ up to reduction order, ~1e-6 relative), since the random streams do not depend on layout.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any, Callable

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from smcsd.models.sharding import DATA, MODEL, axis_size, layout, param_specs, put

__all__ = ["make_mesh", "check_mesh", "parse_mesh", "place_args", "compile_sharded", "record_cache_shardings"]


def make_mesh(data: int | None = None, model: int | None = None, *, devices=None) -> Mesh:
    """A mesh with axes ("data", "model") over `devices` (default: all of `jax.devices()`, every host).

    data * model must equal the number of devices; either may be omitted and is then inferred
    (model defaults to 1). Axes are `AxisType.Auto`: the partitioner propagates the shardings.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    for arg, value in (("data", data), ("model", model)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"make_mesh: {arg} must be a positive int, got {value!r}")
    if data is None and model is None:
        model = 1
    if data is None:
        if n % model:
            raise ValueError(f"make_mesh: model={model} does not divide the {n} available devices")
        data = n // model
    elif model is None:
        if n % data:
            raise ValueError(f"make_mesh: data={data} does not divide the {n} available devices")
        model = n // data
    if data * model != n:
        raise ValueError(f"make_mesh: data ({data}) x model ({model}) = {data * model} must equal the number of "
                         f"devices ({n}); e.g. make_mesh(data={n // model if n % model == 0 else 1}, "
                         f"model={model if n % model == 0 else n})")
    return jax.make_mesh((int(data), int(model)), (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto),
                         devices=devices)


def parse_mesh(spec: str | None, *, arg: str = "--mesh") -> Mesh | None:
    """A command line's mesh: "DATAxMODEL" (e.g. "4x2"), "DATA" (model 1) or "auto" (every device on "data");
    None or "" or "none": no mesh. Errors name `arg`."""
    if spec is None or str(spec).strip().lower() in ("", "none"):
        return None
    text = str(spec).strip().lower()
    if text == "auto":
        return make_mesh()
    parts = text.split("x")
    if len(parts) > 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{arg} {spec!r}: expected DATAxMODEL with positive integers (e.g. 4x2), DATA, or 'auto'")
    data, model = int(parts[0]), int(parts[1]) if len(parts) == 2 else 1
    try:
        return make_mesh(data, model)
    except ValueError as e:
        raise ValueError(f"{arg} {spec!r}: {str(e).removeprefix('make_mesh: ')}") from None


def check_mesh(mesh) -> Mesh:
    """`mesh` validated (a `jax.sharding.Mesh` with axes "data" and "model") and with Auto axis types."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (see smcsd.make_mesh), got {type(mesh).__name__}")
    if set(mesh.axis_names) != {DATA, MODEL}:
        raise ValueError(f"mesh must have exactly the axes ('data', 'model'), got {tuple(mesh.axis_names)}; "
                         "build it with smcsd.make_mesh(data=..., model=...)")
    if any(t != AxisType.Auto for t in mesh.axis_types):
        mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    return mesh


def _check_batch(mesh: Mesh, batch: int, num_particles: int) -> None:
    d = axis_size(mesh, DATA)
    if batch % d:
        raise ValueError(
            f"mesh: the data axis ({d}) must divide the number of requests in prompt ({batch}), so each data "
            f"shard holds whole requests with all {num_particles} of their particles (resampling stays on one "
            f"device); pass a multiple of {d} prompts or a mesh with a smaller data axis "
            f"(smcsd.make_mesh(data=..., model=...))")


def _replicated(mesh):
    return NamedSharding(mesh, P())


def program_shardings(mesh: Mesh, target_cfg, draft_cfg, args):
    """(in_shardings, out_shardings) of a decode program called as program(target_params, draft_params,
    inputs): params tensor-parallel, prompt rows over "data", everything else (keys, scalars)
    replicated; outputs replicated (small, and readable by every host)."""
    target_params, draft_params, inputs = args
    m = axis_size(mesh, MODEL)

    def named(specs):
        return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))

    t_sh = named(param_specs(target_params, m, target_cfg))
    d_sh = None if draft_params is None else named(param_specs(draft_params, m, draft_cfg))
    rows = DATA if axis_size(mesh, DATA) > 1 else None
    i_sh = jax.tree_util.tree_map(lambda _: _replicated(mesh), inputs)
    i_sh = i_sh._replace(prompt=NamedSharding(mesh, P(rows, None)), prompt_len=NamedSharding(mesh, P(rows)))
    return (t_sh, d_sh, i_sh), _replicated(mesh)


def place_args(mesh, spec, target_cfg, draft_cfg, args):
    """Validate `mesh` against the request and put the program's arguments on it.

    Returns (mesh with Auto axes, placed args). Params already in the layout are not copied; the
    small inputs go through host numpy so this also works across hosts (every process passes the
    same prompts)."""
    mesh = check_mesh(mesh)
    _check_batch(mesh, spec.batch, spec.num_particles)
    (t_sh, d_sh, i_sh), _ = program_shardings(mesh, target_cfg, draft_cfg, args)
    target_params, draft_params, inputs = args
    target_params = jax.tree_util.tree_map(put, target_params, t_sh)
    if draft_params is not None:
        draft_params = jax.tree_util.tree_map(put, draft_params, d_sh)
    inputs = jax.tree_util.tree_map(put, inputs, i_sh)
    return mesh, (target_params, draft_params, inputs)


_INSPECT: list[Callable[[str, Any], None]] = []


@contextlib.contextmanager
def record_cache_shardings():
    """Debug: collect `(name, sharding)` of every constrained KV cache, as the partitioner decided it,
    for programs *compiled* inside this block (cached programs are not recompiled)."""
    seen: list = []
    _INSPECT.append(lambda name, s: seen.append((name, s)))
    try:
        yield seen
    finally:
        _INSPECT.pop()


def compile_sharded(fn, mesh: Mesh, target_cfg, draft_cfg, args):
    """`jax.jit(fn, in_shardings=..., out_shardings=...)` lowered under the mesh layout and compiled."""
    in_sh, out_sh = program_shardings(mesh, target_cfg, draft_cfg, args)
    inspect = _INSPECT[-1] if _INSPECT else None
    with layout(mesh, inspect=inspect):
        lowered = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh).lower(*args)
    return lowered.compile()
