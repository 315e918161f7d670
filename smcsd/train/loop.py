"""One training loop for any params pytree and loss, its checkpoints and exports, and the AR-drafter recipe.

- `train(loss_fn, params, batches, ...)`: optax AdamW (decoupled weight decay on matrices only) with
  linear warmup + cosine decay to 10 % and global-norm clipping (`make_optimizer`); a jitted step
  `value_and_grad(loss_fn)`; orbax checkpoints of (params, optimiser state, step) with the history and
  the run's settings as JSON metadata. `batches` is a *function* step -> batch, so the batch of step s
  is fixed and a run resumed from a checkpoint reproduces the uninterrupted run's losses and params
  bitwise. Resuming with other settings, or starting over existing checkpoints without `resume` /
  `overwrite`, is refused. A tqdm bar shows progress; the history goes to JSON and PNG (`save_curves`).
- `placement(mesh)` -> `Placement`: where a run lives on a `("data", "model")` device mesh (`smcsd.make_mesh`),
  one process or several joined by `jax.distributed`. Batch rows are data-parallel over "data" (each process feeds
  the rows of its own devices, `local_rows` / `shard_batch`); the frozen target's weights are tensor-parallel over
  "model" with the decoding layout (`shard_frozen`, `models.sharding`); the drafter's params and optimiser state are
  *replicated* (a drafter is a few % of its target: replicas keep the step plain data parallelism, GSPMD all-reduces
  the gradients, and a checkpoint restores onto any mesh shape). `train(..., mesh=)` and every recipe's `mesh=`
  use it; `mesh=None` is the single-device code path, unchanged.
- `export_model`: `config.json` + `model.safetensors` (+ `training.json`), the format
  `models.shipped.load_model_dir` reads.
- `distill_ar_drafter(target, draft, corpus, ...)`: an autoregressive drafter distilled from any target:
  loss = w_ce · CE(gold) + w_kl · KL(p_T ‖ q) against a `TeacherStream` (top-k or full), held-out CE, KL
  and acceptance, exported with the command, budget and wall time in `training.json`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from smcsd.models import ModelConfig, forward_full, init_model
from smcsd.models.shipped import export_model, flatten_params  # noqa: F401  (re-exported: saving lives beside loading)
from smcsd.models.sharding import DATA, MODEL, axis_size, param_specs, put

from .data import TeacherStream, TextCorpus, check_vocab
from .losses import (check_alpha, check_weights, cross_entropy, forward_kl, forward_kl_topk, masked_mean,
                     token_forward_kl, token_forward_kl_topk, token_renyi, token_renyi_kl_mix,
                     token_renyi_kl_mix_topk, token_renyi_topk, token_reverse_kl, token_reverse_kl_topk)

__all__ = [
    "Placement", "TrainResult", "checkpoint_manager", "distill_ar_drafter", "draft_config_for", "export_model",
    "flatten_params", "make_optimizer", "placement", "restore_checkpoint", "save_checkpoint", "save_curves", "train",
    "training_info",
]


# ----------------------------------------------------------------------------------------------- optimiser

def make_optimizer(lr: float, steps: int, warmup: int, weight_decay: float = 0.1, clip: float = 1.0):
    """Global-norm clipping, then AdamW (β = 0.9, 0.95) on a linear-warmup + cosine schedule ending at lr/10.

    Weight decay applies to matrices only (ndim ≥ 2), not to norms' scales or biases.
    """
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, min(warmup, steps - 1)), max(steps, 2),
                                                  end_value=lr * 0.1)
    decay_mask = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=weight_decay,
                                   mask=decay_mask))


# ----------------------------------------------------------------------------------------------- placement

_FROZEN_ALIASES = {"embed": ("embed_tokens", "embedding"), "head": ("lm_head",)}


def _barrier(name: str) -> None:
    """Every process waits here (a no-op in one process): e.g. before one process removes a directory."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a training run's arrays live: one device (`mesh=None`) or a `("data", "model")` mesh, over one process
    or several (`jax.distributed`). Build it with `placement(mesh)`; recipes pass their `mesh=` through.

    - rows: batch rows split over "data" in contiguous blocks (block d on the devices of data index d). Each process
      feeds only its own blocks' rows (`local_rows(n)`; all rows in one process), so per-row host work (the teacher
      pass, its cache, anchors) is done once per row across processes; `shard_batch` joins them into global arrays.
    - the frozen target: `shard_frozen` lays its weights out over "model" with the decoding rules (`models.sharding`:
      heads / MLP hidden / vocab split where they divide, the rest replicated).
    - the drafter: params and optimiser state replicated on every device. A drafter is a few % of its target, so a
      replica costs little next to the target's shard, the step stays plain data parallelism (GSPMD all-reduces the
      gradients over "data"), and a replicated checkpoint restores onto any other mesh shape (or one device).
    With `mesh=None` every method is what the single-device loop always did (`shard_batch` = `jnp.asarray`).
    """

    mesh: Mesh | None = None

    # -- shape --------------------------------------------------------------------------------------------
    @property
    def data(self) -> int:
        """Size of the data axis (1 without a mesh)."""
        return 1 if self.mesh is None else axis_size(self.mesh, DATA)

    @property
    def model(self) -> int:
        return 1 if self.mesh is None else axis_size(self.mesh, MODEL)

    @property
    def is_lead(self) -> bool:
        """True on the process that writes files (exports, curves, the progress bar): process 0."""
        return jax.process_index() == 0

    def describe(self) -> dict | None:
        if self.mesh is None:
            return None
        return {"data": self.data, "model": self.model, "devices": int(self.mesh.devices.size),
                "processes": jax.process_count(), "backend": jax.default_backend()}

    @functools.cached_property
    def local_data(self) -> tuple[int, ...]:
        """Data indices with a device on this process (sorted): the row blocks this process feeds."""
        if self.mesh is None:
            return (0,)
        devs = np.moveaxis(self.mesh.devices, list(self.mesh.axis_names).index(DATA), 0).reshape(self.data, -1)
        me = jax.process_index()
        return tuple(d for d in range(self.data) if any(x.process_index == me for x in devs[d]))

    def check_rows(self, n: int, what: str = "batch_size") -> None:
        """ValueError unless the data axis divides `n` rows (named `what` in the message)."""
        if n % self.data:
            lo = n - n % self.data
            raise ValueError(
                f"mesh: the data axis ({self.data}) must divide {what} ({n}), so each data shard holds whole rows; "
                f"use {what}={lo + self.data}" + (f" or {lo}" if lo else "") + f" (a multiple of {self.data}), or a "
                "mesh with a smaller data axis (smcsd.make_mesh(data=..., model=...))")

    def local_rows(self, n: int) -> np.ndarray:
        """Indices (into a batch of `n` rows) of the rows this process feeds: its data blocks, in order."""
        self.check_rows(n)
        blk = n // self.data
        return np.concatenate([np.arange(d * blk, (d + 1) * blk) for d in self.local_data]).astype(np.int64)

    # -- shardings ----------------------------------------------------------------------------------------
    @property
    def replicated(self) -> NamedSharding | None:
        return None if self.mesh is None else NamedSharding(self.mesh, P())

    def rows_sharding(self, ndim: int) -> NamedSharding:
        return NamedSharding(self.mesh, P(DATA if self.data > 1 else None, *([None] * (ndim - 1))))

    def _on_mesh(self, x) -> bool:
        return isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == self.mesh

    # -- placing ------------------------------------------------------------------------------------------
    def shard_batch(self, batch):
        """A training batch on the mesh. Host (numpy) arrays hold *this process's rows* (`local_rows`), joined
        into global arrays split over "data"; arrays already on the mesh (e.g. `shard_frozen`'s) stay as they are;
        other device arrays and 0-d values are replicated (every process must pass the same value; place big frozen
        arrays once with `shard_frozen` / `replicate`, or they are copied every step). Without a mesh: `jnp.asarray`
        of every leaf, the single-device loop's behaviour."""
        if self.mesh is None:
            return jax.tree_util.tree_map(jnp.asarray, batch)
        return jax.tree_util.tree_map(self._place_rows, batch)

    def _place_rows(self, x):
        if isinstance(x, jax.Array):
            return x if self._on_mesh(x) else put(x, self.replicated)
        x = np.asarray(x)
        if x.ndim == 0:
            return put(x, self.replicated)
        nb = len(self.local_data)
        if x.shape[0] % nb:
            raise ValueError(f"shard_batch: a batch array has {x.shape[0]} rows, not a whole number of this "
                             f"process's {nb} data blocks; return the rows local_rows(n) names (or place non-row "
                             "arrays with Placement.replicate)")
        blk = x.shape[0] // nb
        shape = (blk * self.data,) + x.shape[1:]
        sharding = self.rows_sharding(x.ndim)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        where = {d: i for i, d in enumerate(self.local_data)}

        def block(index):
            start, stop, _ = index[0].indices(shape[0])
            d = start // blk
            lo = where[d] * blk + start - d * blk
            return x[(slice(lo, lo + stop - start),) + tuple(index[1:])]
        return jax.make_array_from_callback(shape, sharding, block)

    def shard_global(self, batch):
        """A batch every process holds whole (e.g. held-out rows): rows split over "data" where the data axis divides
        them, else replicated; arrays already on the mesh stay. Without a mesh: `jnp.asarray` of every leaf."""
        if self.mesh is None:
            return jax.tree_util.tree_map(jnp.asarray, batch)

        def place(x):
            if self._on_mesh(x):
                return x
            nd = np.ndim(x)
            ok = nd >= 1 and np.shape(x)[0] % self.data == 0
            return put(x if isinstance(x, jax.Array) else np.asarray(x),
                       self.rows_sharding(nd) if ok else self.replicated)
        return jax.tree_util.tree_map(place, batch)

    def replicate(self, tree):
        """`tree` replicated on every device of the mesh (each process must hold the same values); unchanged
        without a mesh."""
        if self.mesh is None:
            return tree
        return jax.tree_util.tree_map(lambda x: x if self._on_mesh(x) and x.sharding.is_fully_replicated
                                      else put(x, self.replicated), tree)

    def shard_frozen(self, tree, config: ModelConfig | None = None):
        """The frozen target's weights (a target params tree, or a block drafter's shared `{"embed", "head"}`) in
        the decoding layout over "model" (`models.sharding.param_specs`: vocab-parallel embedding / head, heads and
        MLP hidden split where they divide); unchanged without a mesh."""
        if self.mesh is None:
            return tree
        if isinstance(tree, dict) and tree and set(tree) <= set(_FROZEN_ALIASES):
            out = {}
            for k, v in tree.items():
                path = _FROZEN_ALIASES[k]
                nested = {path[0]: {path[1]: v}} if len(path) == 2 else {path[0]: v}
                spec = param_specs(nested, self.model, config)
                spec = spec[path[0]][path[1]] if len(path) == 2 else spec[path[0]]
                same = [o for kk, o in out.items() if tree[kk] is v]  # tied embedding: one placed array
                out[k] = same[0] if same else put(v, NamedSharding(self.mesh, spec))
            return out
        specs = param_specs(tree, self.model, config)
        return jax.tree_util.tree_map(lambda x, s: put(x, NamedSharding(self.mesh, s)), tree, specs,
                                      is_leaf=lambda s: isinstance(s, P))

    def to_host(self, tree):
        """numpy copies of (possibly global) arrays, readable on every process: a replicated array from this
        process's own copy, a split one gathered (`process_allgather`)."""
        def host(x):
            if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
                return np.asarray(x)
            from jax.experimental import multihost_utils
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.tree_util.tree_map(host, tree)

    def barrier(self, name: str) -> None:
        _barrier(name)

    def on_lead(self, fn: Callable[[], Any], name: str = "smcsd-train-write") -> None:
        """Run `fn` (a file write) on process 0 only; the other processes wait until it is done."""
        if self.is_lead:
            fn()
        _barrier(name)


def placement(mesh: "Mesh | Placement | None" = None) -> Placement:
    """The `Placement` of `mesh` (validated: a `jax.sharding.Mesh` with axes "data" and "model", from
    `smcsd.make_mesh`); None: one device, the plain loop."""
    if mesh is None or isinstance(mesh, Placement):
        return mesh or Placement(None)
    from ..runtime.mesh import check_mesh
    return Placement(check_mesh(mesh))


def _global_norm(tree):
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree)))


@functools.lru_cache(maxsize=8)
def _compiled_step(loss_fn, lr, steps, warmup, weight_decay, clip, mesh=None):
    """(optimizer, jitted step), cached so runs with the same loss and settings (a resume) share one compile.
    On a mesh every output (params, optimiser state, loss, aux, gradient norm) is replicated."""
    tx = make_optimizer(lr, steps, warmup, weight_decay, clip)

    def step(params, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, aux, _global_norm(grads)
    if mesh is None:
        return tx, jax.jit(step, donate_argnums=(0, 1))
    return tx, jax.jit(step, donate_argnums=(0, 1), out_shardings=NamedSharding(mesh, P()))


# ----------------------------------------------------------------------------------------------- checkpoints

def checkpoint_manager(directory: str, max_to_keep: int = 2):
    """An orbax `CheckpointManager` in `directory` (created) keeping the last `max_to_keep` steps."""
    import orbax.checkpoint as ocp
    return ocp.CheckpointManager(os.path.abspath(directory),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def _step_array(step: int, params):
    """The step counter as an array beside `params`: replicated on their mesh when they live on one (a checkpoint
    written by several processes holds only global arrays), else a plain single-device array."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array)]
    sh = leaves[0].sharding if leaves else None
    if isinstance(sh, NamedSharding) and sh.mesh.devices.size > 1:
        return put(np.asarray(step, np.int32), NamedSharding(sh.mesh, P()))
    return jnp.asarray(step, jnp.int32)


def save_checkpoint(mngr, step: int, params, opt_state, meta: dict) -> None:
    """Save (params, opt_state, step) and the JSON `meta` as checkpoint `step`; waits until it is on disk.
    Under `jax.distributed` every process calls it (orbax writes each array once and the JSON from process 0)."""
    import orbax.checkpoint as ocp
    state = {"params": params, "opt_state": opt_state, "step": _step_array(step, params)}
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
              force=True)
    mngr.wait_until_finished()


def restore_meta(mngr) -> dict:
    """The JSON `meta` of the latest checkpoint alone (cheap: no arrays are read)."""
    import orbax.checkpoint as ocp
    return mngr.restore(mngr.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def restore_checkpoint(mngr, params, opt_state):
    """(params, opt_state, step, meta) of the latest checkpoint; `params`/`opt_state` give the structure and the
    placement: arrays come back with their shardings, so a checkpoint written on one mesh shape (or one device)
    restores onto another."""
    import orbax.checkpoint as ocp
    step = mngr.latest_step()
    abstract = {"params": params, "opt_state": opt_state, "step": _step_array(0, params)}
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract)
    out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                     meta=ocp.args.JsonRestore()))
    return out["state"]["params"], out["state"]["opt_state"], int(out["state"]["step"]), out["meta"]


# ----------------------------------------------------------------------------------------------- export

# ----------------------------------------------------------------------------------------------- curves

def _rows_as_dicts(rows, names):
    if rows and not isinstance(rows[0], dict):
        names = list(names or ["loss"])
        names += [f"v{i}" for i in range(len(names), max(len(r) for r in rows) - 1)]
        return [{"step": r[0], **dict(zip(names, r[1:]))} for r in rows]
    return list(rows)


def save_curves(history: dict, path_prefix: str, title: str = "", *, train_keys: Sequence[str] | None = None,
                eval_keys: Sequence[str] | None = None, ylabel: str = "nats/token") -> None:
    """`path_prefix.json` (the history) and `path_prefix.png` (train curves, smoothed, and held-out points).

    `history["train"]` rows are dicts `{"step", key: value, ...}` or lists `[step, v1, v2, ...]` whose
    columns `train_keys` names; `train_keys` / `eval_keys` choose what to plot (default: every numeric
    key but step, grad_norm and lr for training; every float key of the held-out entries). A metric
    keeps its colour in both (train: line, held-out: dashed with markers); acceptance rates (keys
    starting with "accept") go on a right-hand axis. The PNG is skipped when matplotlib is missing.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path_prefix)), exist_ok=True)
    with open(path_prefix + ".json", "w") as f:
        json.dump(history, f)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    train = _rows_as_dicts(history.get("train", []), train_keys)
    evals = history.get("eval", [])
    skip = {"step", "grad_norm", "lr"}
    tkeys = list(train_keys) if train_keys else [k for k in (train[0] if train else {}) if k not in skip]
    ekeys = list(eval_keys) if eval_keys else [k for k in (evals[0] if evals else {})
                                               if k not in skip and isinstance(evals[0][k], float)]
    colour = {k: f"C{i}" for i, k in enumerate(dict.fromkeys(tkeys + ekeys))}
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax2 = None
    positive = True
    for src, keys, held in ((train, tkeys, False), (evals, ekeys, True)):
        for k in keys:
            pts = np.asarray([(r["step"], r[k]) for r in src if k in r], np.float64).reshape(-1, 2)
            if not len(pts):
                continue
            target_ax = ax
            if k.startswith("accept"):
                ax2 = ax2 or ax.twinx()
                target_ax = ax2
            else:
                positive &= bool((pts[:, 1] > 0).all())
            if held:
                target_ax.plot(pts[:, 0], pts[:, 1], "o--", color=colour[k], label=f"held-out {k}")
            else:
                w = max(1, len(pts) // 50)
                target_ax.plot(pts[:, 0], pts[:, 1], alpha=0.2, color=colour[k])
                target_ax.plot(pts[w - 1:, 0], np.convolve(pts[:, 1], np.ones(w) / w, mode="valid"),
                               color=colour[k], label=f"train {k}")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if positive:
        ax.set_yscale("log")
    handles, labels = ax.get_legend_handles_labels()
    if ax2 is not None:
        ax2.set_ylabel("acceptance")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.set_title(title)
    if handles:
        ax.legend(handles, labels, fontsize="small")
    fig.tight_layout()
    fig.savefig(path_prefix + ".png", dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- train

class TrainResult(NamedTuple):
    """`params, history = train(...)`; `history` holds run, train, eval, step, finished, wall_s."""

    params: Any
    history: dict

    @property
    def step(self) -> int:
        return self.history["step"]


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _commit(tree):
    """Commit single-device arrays to their device. Restored arrays come back committed and jit keys its cache on
    that, so without this a resumed run would compile the step again (seconds to minutes)."""
    def commit(x):
        if isinstance(x, jax.Array) and len(x.sharding.device_set) == 1:
            return jax.device_put(x, next(iter(x.sharding.device_set)))
        return x
    return jax.tree_util.tree_map(commit, tree)


_ARRAYS = "arrays"  # the checkpoint's JSON: path, shape and dtype of every saved array (checked before a restore)


def _arrays_signature(params, opt_state) -> list:
    """[path, shape, dtype] of every array, the params' first (so a misfit names a param, not its Adam moment)."""
    return [[name + jax.tree_util.keystr(path), list(np.shape(x)), str(np.dtype(x.dtype))]
            for name, tree in (("params", params), ("opt_state", opt_state))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _arrays_diff(saved: list | None, now: list) -> str | None:
    """None when the checkpoint's arrays (or an unknown, older checkpoint's) fit `now`, else what differs first."""
    if saved is None or saved == now:
        return None
    s, n = {a[0]: a[1:] for a in saved}, {a[0]: a[1:] for a in now}
    for path in n:
        if path not in s:
            return f"{path} is not in the checkpoint"
        if s[path] != n[path]:
            return (f"{path}: the checkpoint holds shape {tuple(s[path][0])} {s[path][1]}, these params "
                    f"{tuple(n[path][0])} {n[path][1]}")
    return f"the checkpoint holds arrays these params lack: {sorted(set(s) - set(n))[:5]}"


def _settings_diff(saved: dict, now: dict) -> dict:
    """{key: {"checkpoint": ..., "now": ...}} of the settings that differ; within a dict setting (a drafter's
    config) only its differing fields, so the message names what changed."""
    out = {}
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k), now.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out[k] = {f: {"checkpoint": a.get(f), "now": b.get(f)} for f in sorted(set(a) | set(b))
                      if a.get(f) != b.get(f)}
        else:
            out[k] = {"checkpoint": a, "now": b}
    return out


def _scalars(aux) -> dict[str, float]:
    return {k: float(v) for k, v in (aux or {}).items() if np.ndim(v) == 0}


def train(loss_fn: Callable, params, batches: Callable[[int], Any], *, steps: int, lr: float,
          warmup: int | None = None, clip: float = 1.0, weight_decay: float = 0.1, ckpt_dir: str | None = None,
          resume: bool = False, overwrite: bool = False, eval_fn: Callable | None = None, eval_every: int = 100,
          ckpt_every: int = 100, progress: bool = True, stop_after: int | None = None,
          curves_path: str | None = None, meta: dict | None = None, desc: str = "train",
          command: str | None = None, mesh: "Mesh | Placement | None" = None) -> TrainResult:
    """Minimise `loss_fn(params, batch) -> (loss, aux_dict)` over `batches(step)` for `steps` steps.

    warmup: linear-warmup steps (default min(100, steps // 10)); then cosine decay to lr/10. clip:
    global gradient-norm bound. ckpt_dir: orbax checkpoints every `ckpt_every` steps and at the end
    (None: no checkpoints). resume: continue from the latest checkpoint in `ckpt_dir`; its settings
    (steps, lr, warmup, clip, weight_decay and `meta`) must equal these. overwrite: discard existing
    checkpoints. eval_fn(params) -> {name: float}: run at step 0, every `eval_every` steps and at the end.
    stop_after: stop (and checkpoint) after that many steps, as if interrupted. curves_path: write
    `curves_path.json` / `.png`. meta: JSON-able settings recorded with (and checked on resume against)
    the checkpoint, e.g. the model config and the data's fingerprint. Returns `TrainResult(params, history)`;
    `history["train"]` holds {"step", "loss", aux..., "grad_norm"} per step.

    mesh: a `("data", "model")` mesh (`smcsd.make_mesh`) or a `Placement` (see `placement`): `batches(step)` then
    returns this process's rows (`Placement.local_rows`) as host arrays, joined by `Placement.shard_batch` into
    global arrays split over "data" (arrays already on the mesh, e.g. the frozen target's, pass as they are);
    params and optimiser state are replicated, `eval_fn` receives the replicated params. Under `jax.distributed`
    every process runs `train` with the same arguments; checkpoints go to one shared `ckpt_dir` (on a pod: a
    bucket or a shared disk), curves and the progress bar come from process 0. A run resumes on any other mesh
    shape (or on one device) and continues with the uninterrupted losses, up to float reduction order.
    """
    from tqdm import tqdm
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    pl = placement(mesh)
    warmup = max(1, min(100, steps // 10)) if warmup is None else int(warmup)
    run = _jsonable({"steps": steps, "lr": lr, "warmup": warmup, "clip": clip, "weight_decay": weight_decay,
                     **(meta or {})})
    tx, step_fn = _compiled_step(loss_fn, float(lr), steps, warmup, float(weight_decay), float(clip), pl.mesh)
    if pl.mesh is None:
        params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), params)  # the step donates its inputs
        opt_state = tx.init(params)
    else:
        params = pl.replicate(pl.to_host(params))  # fresh replicas (the step donates its inputs)
        opt_state = jax.jit(tx.init, out_shardings=pl.replicated)(params)
    history = {"run": run, "train": [], "eval": [], "wall_s": 0.0}
    start = 0
    progress = progress and pl.is_lead

    mngr = None
    if resume and not ckpt_dir:
        raise ValueError("resume=True needs ckpt_dir (where the checkpoints are)")
    if ckpt_dir:
        exists = os.path.isdir(ckpt_dir) and bool(os.listdir(ckpt_dir))
        pl.barrier("smcsd-train-ckpt-look")  # every process has looked before one removes anything
        if exists and not resume:
            if not overwrite:
                raise FileExistsError(f"checkpoints exist in {ckpt_dir}: pass resume to continue that run or "
                                      "overwrite to discard them and restart")
            if pl.is_lead:
                shutil.rmtree(ckpt_dir)
            pl.barrier("smcsd-train-ckpt-clear")
        mngr = checkpoint_manager(ckpt_dir)
        if resume and mngr.latest_step() is not None:
            saved = restore_meta(mngr)
            diff = _settings_diff(saved["run"], run)
            if diff:
                mngr.close()
                raise ValueError(f"cannot resume from {ckpt_dir}: the checkpoint was made with other settings "
                                 f"{json.dumps(diff)}; use the same settings (the drafter's configuration and the "
                                 "training arguments), or overwrite=True to restart")
            misfit = _arrays_diff(saved.get(_ARRAYS), _arrays_signature(params, opt_state))
            if misfit is None:
                try:
                    params, opt_state, start, saved = restore_checkpoint(mngr, params, opt_state)
                except (ValueError, KeyError, TypeError) as e:  # a checkpoint written without the signature
                    misfit = str(e)[:500]
            if misfit is not None:
                mngr.close()
                raise ValueError(f"cannot resume from {ckpt_dir}: its arrays do not fit these params (another "
                                 f"drafter configuration?): {misfit}; pass the params the checkpoint was made for, "
                                 "or overwrite=True to restart")
            saved.pop(_ARRAYS, None)
            history = saved
            if progress:
                print(f"[{desc}] resumed from step {start} of {steps}", file=sys.stderr, flush=True)
    if command:
        history.setdefault("commands", []).append({"command": command, "from_step": start})
    signature = _arrays_signature(params, opt_state) if mngr is not None else None
    if pl.mesh is not None:
        history.setdefault("placements", []).append({"from_step": start, **pl.describe()})
    else:
        params, opt_state = _commit((params, opt_state))

    wall0, t0 = history.get("wall_s", 0.0), time.time()
    step = start

    def evaluate():
        ev = {k: float(v) for k, v in eval_fn(params).items()}
        history["eval"].append({"step": step, **ev})
        return ev

    if eval_fn is not None and start == 0:
        evaluate()  # the starting point of the held-out curve
    pbar = tqdm(total=steps, initial=start, desc=desc, disable=not progress, mininterval=1.0, dynamic_ncols=True)
    try:
        while step < steps:
            batch = pl.shard_batch(batches(step))
            params, opt_state, loss, aux, gnorm = step_fn(params, opt_state, batch)
            step += 1
            row = {"step": step, "loss": float(loss), **_scalars(aux), "grad_norm": float(gnorm)}
            if not math.isfinite(row["loss"]):
                raise FloatingPointError(f"[{desc}] loss is {row['loss']} at step {step}; lower lr or check the data")
            history["train"].append(row)
            pbar.update(1)
            pbar.set_postfix({k: f"{v:.4f}" for k, v in row.items() if k not in ("step", "grad_norm")}, refresh=False)
            done = step == steps or (stop_after is not None and step >= stop_after)
            if eval_fn is not None and (step % eval_every == 0 or done):
                ev = evaluate()
                if pl.is_lead:
                        pbar.write(f"[{desc}] step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in ev.items())
                               + f"  ({time.time() - t0:.0f}s)")
            if mngr is not None and (step % ckpt_every == 0 or done):
                history.update(step=step, finished=step == steps, wall_s=wall0 + time.time() - t0)
                save_checkpoint(mngr, step, params, opt_state, {**history, _ARRAYS: signature})
            if done:
                break
    finally:
        pbar.close()
        if mngr is not None:
            mngr.close()  # waits for pending writes, stops orbax's threads
    history.update(step=step, finished=step == steps, wall_s=wall0 + time.time() - t0)
    if curves_path:
        pl.on_lead(lambda: save_curves(history, curves_path, f"{desc}: step {step}/{steps}"), "smcsd-train-curves")
    return TrainResult(params, history)


def training_info(recipe: str, target_name: str, stream: TeacherStream, res: TrainResult, steps: int,
                  export_dtype: str, **extra) -> dict:
    """The `training.json` of a finished run: recipe, target, settings, final held-out metrics, wall time, token
    budget, params, stored dtype, corpus and the commands that ran it (`extra` adds recipe-specific entries)."""
    h, corpus = res.history, stream.corpus
    info = {"recipe": recipe, "target": {"name": target_name, "params_fingerprint": stream.params_fingerprint},
            "run": h["run"], "final_eval": h["eval"][-1] if h["eval"] else None,
            "train_wall_s": round(h["wall_s"], 1),
            "budget": {"steps": steps, "tokens_seen": steps * corpus.batch_size * corpus.seq_len,
                       "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind)},
            "num_params": int(sum(np.size(x) for x in jax.tree_util.tree_leaves(res.params))),
            "stored_dtype": export_dtype, "corpus": corpus.describe(), "commands": h.get("commands", [])}
    if h.get("placements"):  # the meshes the run ran on, each from the step it started at
        info["budget"]["placements"] = h["placements"]
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(info.get(k), dict):
            info[k] = {**info[k], **v}
        else:
            info[k] = v
    return info


# ----------------------------------------------------------------------------------------------- AR drafter

def draft_config_for(target: ModelConfig, *, hidden: int | None = None, layers: int = 2, heads: int | None = None,
                     kv_heads: int | None = None, intermediate: int | None = None, **overrides) -> ModelConfig:
    """A small drafter config sharing the target's vocabulary, special tokens, RoPE and context length.

    Defaults: hidden = half the target's (a multiple of 64, at least 64), 2 layers, hidden/64 heads
    (plain MHA), intermediate ≈ 8/3 · hidden (a multiple of 32), float32. `overrides` are any other
    `ModelConfig` fields.
    """
    hidden = hidden or max(64, (target.hidden_size // 2) // 64 * 64)
    heads = heads or max(1, hidden // 64)
    fields = dict(vocab_size=target.vocab_size, hidden_size=hidden,
                  intermediate_size=intermediate or max(32, (8 * hidden // 3 + 31) // 32 * 32),
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                  max_position_embeddings=target.max_position_embeddings, rope_theta=target.rope_theta,
                  rope_scaling=target.rope_scaling, rms_norm_eps=target.rms_norm_eps,
                  tie_word_embeddings=target.tie_word_embeddings, bos_token_id=target.bos_token_id,
                  eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id, dtype="float32")
    fields.update(overrides)
    return ModelConfig(**fields)


DIVERGENCES = ("forward_kl", "reverse_kl", "renyi", "renyi_kl_mix")


@dataclasses.dataclass(frozen=True)
class Objective:
    """What an autoregressive drafter is distilled towards, per position, against the target's distribution:

    - `divergence`: "forward_kl" KL(p ‖ q) (speculative decoding's acceptance; the default), "reverse_kl" KL(q ‖ p)
      (mode-seeking), "renyi" D_α(p ‖ q) (α = 2: log(1 + χ²), the second moment of SMC's per-token importance
      weight, which N/ESS grows with) or "renyi_kl_mix" D_α + `mix_kl_weight` · KL (the SMC-SD authors' robust
      setting at α = 1.5, 0.5);
    - `temperature`: both distributions processed at the temperature the drafter will propose at (SMC weighs
      p_τ / q_τ; p_τ ∝ p^(1/τ) from the teacher's log-probs, q_τ = softmax(logits / τ));
    - `alpha`: the Rényi order (> 1) of "renyi" / "renyi_kl_mix".

    Frozen and hashable: it is part of the compiled step's key and of a run's resume metadata (`to_dict`).
    """
    divergence: str = "forward_kl"
    alpha: float = 2.0
    temperature: float = 1.0
    mix_kl_weight: float = 0.5

    def __post_init__(self):
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"objective divergence must be one of {', '.join(DIVERGENCES)}, got {self.divergence!r}")
        if self.divergence in ("renyi", "renyi_kl_mix"):
            check_alpha("Objective", self.alpha)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"objective temperature must be a finite number > 0, got {t!r}")
        check_weights(mix_kl_weight=self.mix_kl_weight)
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "mix_kl_weight", float(self.mix_kl_weight))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def per_position(self, batch, logits):
        """The divergence at every position `[B, T]` from a `TeacherStream` batch (full `logp` or top-k)."""
        tau = self.temperature
        lg = logits if tau == 1.0 else logits / tau
        if "logp" in batch:
            lp = batch["logp"] if tau == 1.0 else jax.nn.log_softmax(batch["logp"].astype(jnp.float32) / tau, -1)
            if self.divergence == "forward_kl":
                return token_forward_kl(lp, lg)
            if self.divergence == "reverse_kl":
                return token_reverse_kl(lp, lg)
            if self.divergence == "renyi":
                return token_renyi(lp, lg, self.alpha)
            return token_renyi_kl_mix(lp, lg, alpha=self.alpha, renyi_weight=1.0, kl_weight=self.mix_kl_weight)
        ids, lp = batch["topk_ids"], batch["topk_logp"]
        if tau != 1.0:
            if self.divergence == "reverse_kl":
                raise ValueError("reverse_kl at temperature != 1 needs the target's full log-probs: run the teacher "
                                 "with topk=None")
            lp = lp.astype(jnp.float32) / tau  # renormalised over the top-k by the top-k losses below
        if self.divergence == "forward_kl":
            return token_forward_kl_topk(ids, lp, lg)
        if self.divergence == "reverse_kl":
            return token_reverse_kl_topk(ids, lp, lg)
        if self.divergence == "renyi":
            return token_renyi_topk(ids, lp, lg, self.alpha)
        return token_renyi_kl_mix_topk(ids, lp, lg, alpha=self.alpha, renyi_weight=1.0, kl_weight=self.mix_kl_weight)


def _objective(objective) -> Objective:
    if objective is None:
        return Objective()
    if isinstance(objective, str):
        return Objective(divergence=objective)
    if not isinstance(objective, Objective):
        raise TypeError(f"objective must be an Objective, a divergence name or None, got {type(objective).__name__}")
    return objective


@functools.lru_cache(maxsize=16)
def ar_distill_loss(config: ModelConfig, ce_weight: float, kl_weight: float,
                    objective: "Objective | str | None" = None) -> Callable:
    """loss_fn(params, batch) = w_ce · CE(gold next tokens) + w_kl · D(p_T ‖ q) over a `TeacherStream` batch.

    D is `objective`'s divergence (default: forward KL at temperature 1); it uses the batch's full `logp` when
    present, else its renormalised top-k. Positions holding the config's pad token are masked. The aux values are
    the CE, the forward KL at temperature 1 (`kl`, comparable across objectives) and the objective (`div`).
    Cached per settings so a resumed run reuses the compiled step.
    """
    obj = _objective(objective)
    check_weights(ce_weight=ce_weight, kl_weight=kl_weight)
    pad = config.pad_token_id

    def loss_fn(params, batch):
        tokens = batch["tokens"]
        logits = forward_full(config, params, tokens)
        valid = jnp.ones(tokens.shape, jnp.float32) if pad is None else (tokens != pad).astype(jnp.float32)
        ce = cross_entropy(logits[:, :-1], tokens[:, 1:], valid[:, :-1] * valid[:, 1:])
        if "logp" in batch:
            kl = forward_kl(batch["logp"], logits, valid)
        else:
            kl = forward_kl_topk(batch["topk_ids"], batch["topk_logp"], logits, valid)
        div = kl if obj == Objective() else masked_mean(obj.per_position(batch, logits), valid)
        return ce_weight * ce + kl_weight * div, {"ce": ce, "kl": kl, "div": div}
    return loss_fn


@functools.lru_cache(maxsize=16)
def _ar_eval_program(config: ModelConfig, ce_weight: float, kl_weight: float, objective=None):
    """jit(params, batch) -> (ce, kl, acceptance, objective) batch means; acceptance = Σ_x min(p_T, q) (or its
    top-k bound)."""
    loss_fn = ar_distill_loss(config, ce_weight, kl_weight, objective)

    def ev(params, batch):
        _, aux = loss_fn(params, batch)
        q = jax.nn.softmax(forward_full(config, params, batch["tokens"]), -1)
        if "logp" in batch:
            acc = jnp.minimum(jnp.exp(batch["logp"]), q).sum(-1)
        else:
            acc = jnp.minimum(jnp.exp(batch["topk_logp"]), jnp.take_along_axis(q, batch["topk_ids"], -1)).sum(-1)
        return aux["ce"], aux["kl"], acc.mean(), aux["div"]
    return jax.jit(ev)


def distill_ar_drafter(target, draft, corpus: TextCorpus | TeacherStream, *, steps: int, lr: float = 3e-3,
                       warmup: int | None = None, clip: float = 1.0, weight_decay: float = 0.1,
                       ce_weight: float = 0.5, kl_weight: float = 0.5, topk: int | None = 32, seed: int = 0,
                       cache_dir: str | None = None, ckpt_dir: str | None = None, resume: bool = False,
                       overwrite: bool = False, out: str | None = None, export_dtype: str = "float32",
                       eval_every: int = 100, ckpt_every: int = 100, eval_rows: int | None = 64,
                       progress: bool = True, stop_after: int | None = None, curves_path: str | None = None,
                       command: str | None = None, mesh: "Mesh | Placement | None" = None,
                       objective: "Objective | str | None" = None) -> TrainResult:
    """Distil an autoregressive drafter from `target` on `corpus`: loss = w_ce · CE(gold) + w_kl · D(p_T ‖ q), D the
    `objective`'s divergence (default forward KL; `Objective("renyi", alpha=2, temperature=0.7)` trains an SMC
    proposal for T = 0.7).

    target: a `LanguageModel`. draft: a `ModelConfig` (initialised from `seed`) or a `LanguageModel`
    (warm start from its params). corpus: a `TextCorpus` (the teacher then runs with `topk` / `cache_dir`)
    or a ready `TeacherStream`. Held-out metrics every `eval_every` steps on the first `eval_rows`
    held-out rows: ce, kl and `accept` = E[Σ_x min(p_T, q)], the speculative-sampling acceptance rate at
    temperature 1 (with top-k targets `accept_lb`, a lower bound: only the top-k terms of the sum).
    out: export directory (`export_model`), written once the run finishes, with `training.json` holding
    the settings, corpus, final metrics, wall time, token budget and `command`.
    mesh: train on a device mesh (`placement`): rows over "data", the teacher's target over "model", the drafter
    replicated; every process of a `jax.distributed` job calls this with the same arguments.
    """
    pl = placement(mesh)
    draft_config = draft if isinstance(draft, ModelConfig) else draft.config
    check_vocab(target, draft_config)
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(target, corpus, topk=topk,
                                                                           cache_dir=cache_dir, mesh=pl.mesh)
    corpus = stream.corpus
    pl.check_rows(corpus.batch_size)
    rows = pl.local_rows(corpus.batch_size)
    if corpus.seq_len > draft_config.max_position_embeddings:
        raise ValueError(f"seq_len {corpus.seq_len} exceeds the drafter's max_position_embeddings "
                         f"{draft_config.max_position_embeddings}")
    params = init_model(draft_config, seed=seed).params if isinstance(draft, ModelConfig) else draft.params
    obj = _objective(objective)
    if obj.divergence == "reverse_kl" and obj.temperature != 1.0 and stream.topk is not None:
        raise ValueError("objective reverse_kl at temperature != 1 needs the target's full log-probs: pass topk=None")
    loss_fn = ar_distill_loss(draft_config, float(ce_weight), float(kl_weight), obj)
    ev_prog = _ar_eval_program(draft_config, float(ce_weight), float(kl_weight), obj)
    acc_key = "accept" if stream.topk is None else "accept_lb"
    keys = ("ce", "kl", acc_key) + (() if obj == Objective() else ("objective",))

    def eval_fn(p):
        sums, n = np.zeros(4), 0
        for b in stream.eval_batches(eval_rows):
            m = len(b["tokens"])
            sums += m * np.asarray([float(x) for x in pl.to_host(ev_prog(p, pl.shard_global(b)))])
            n += m
        return dict(zip(keys, (sums / max(n, 1)).tolist()))

    meta = {"recipe": "distill_ar_drafter", "draft_config": draft_config.to_dict(),
            "target_config": stream.config.to_dict(), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "batch_size": corpus.batch_size, "seq_len": corpus.seq_len,
            "data_seed": corpus.seed, "topk": stream.topk, "ce_weight": ce_weight, "kl_weight": kl_weight,
            "init_seed": seed if isinstance(draft, ModelConfig) else "warm-start"}
    if obj != Objective():  # runs with the default objective keep the metadata (and resume) they always had
        meta["objective"] = obj.to_dict()
    name = getattr(target, "name", "target")
    batches = stream.batch if pl.mesh is None else (lambda step: stream.batch(step, rows))
    res = train(loss_fn, params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every,
                ckpt_every=ckpt_every, progress=progress, stop_after=stop_after, curves_path=curves_path,
                meta=meta, desc=f"distill {name}", command=command, mesh=pl)
    h = res.history
    if out and h["finished"]:
        info = training_info("distill_ar_drafter", name, stream, res, steps, export_dtype)
        pl.on_lead(lambda: export_model(draft_config, res.params, out, export_dtype, info), "smcsd-train-export")
    return res
