"""Method `sd-overlap` (MineDraft, arXiv 2603.18016): `sd` with drafting hidden behind verification.

The batch is split into two halves, A and B, and the two models live on two device groups: the target's params
and KV caches on one, the drafter's params and state on the other. Each half runs exactly `sd`'s cycle (draft K
tokens -> one target call -> accept a prefix plus a correction/bonus token -> the drafter observes), but the halves
are half a cycle apart, so while the target verifies half A the drafter drafts for half B, and then they swap:

    drafter group:   D(A,0)  D(B,0)  D(A,1)  D(B,1)  D(A,2) ...
    target group:            V(A,0)  V(B,0)  V(A,1)  V(B,1) ...

A step then costs about max(T_verify, T_draft) + the transfers instead of their sum (`overlap_step_model`).

How it runs: four compiled programs per half-batch shape — target start (prefill, first token), drafter start
(init + first proposal), verify (`sd.verify_chain` + the cycle's bookkeeping) and drafter step (observe, roll back,
propose) — dispatched asynchronously from a host loop in the order above. JAX dispatch returns at once, each program
waits on device for its inputs, and programs on different devices run at the same time. What crosses the groups
per half-cycle: drafter -> target the proposal (tokens [b, K] and log q [b, K, V], which the acceptance test and the
residual need), target -> drafter the verified block, the accepted counts, the new lengths and feed (and the
target's hidden states of the drafter's layers, for block drafters). The host blocks only on one bool per
half-cycle (is every row of the half done?), read one half-step late, when it is ready anyway.
Why not one program whose halves land on disjoint devices: XLA's SPMD partitioner runs one program on every device of
its mesh, so two different computations cannot share a program on disjoint devices; two programs it is.

Output law: each request goes through `sd`'s cycle unchanged, so its law is `sd`'s, i.e. `ar`'s (p_T exactly);
tested by enumeration. Tokens are not `sd`'s tokens for the same seed: `sd` draws each cycle's randomness for the
whole batch at once, and here each half draws its own, from `fold_in(fold_in(key, half), cycle)`, which does not
depend on the dispatch order or the devices. So a run with overlap, a run in sequential order and a run on one
device (where both groups are that device: the programs run one after another) give identical tokens.

Devices (`decode(..., mesh=)`): None splits `jax.devices()` into two halves (the first for the target, the second
for the drafter; on one device both groups are it); a `jax.sharding.Mesh` has its devices split the same way; an
`OverlapMeshes(target=..., drafter=...)` gives both groups' meshes (axes ("data", "model"), `smcsd.make_mesh`) —
the target may then be tensor-parallel over its "model" axis. Within a group the half-batch's rows are sharded
over "data" (with automatic groups, the largest data size that divides the half-batch).
An odd batch gets one padding row (a copy of the last request, done from the start: it adds no output or stats).
"""

from __future__ import annotations

from typing import ClassVar

import dataclasses
import math
import queue
import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from smcsd.models.sharding import DATA, MODEL, axis_size, layout, param_specs, put

from ..drafters import as_drafter
from .base import ChainMethod
from ..runtime.engine import MethodDef, ProgramInputs, StaticSpec, prefill, register_method
from .sd import SDState, finish_cycle, headroom, initial_state, program_result, verify_chain

__all__ = ["SDOverlap", "OverlapMeshes", "split_devices", "OverlapRunner", "overlap_step_model"]


class OverlapMeshes(NamedTuple):
    """The two device groups of `sd-overlap`: each a mesh with axes ("data", "model") (`smcsd.make_mesh(...,
    devices=...)`). They may share devices (then the programs on them run one after another)."""

    target: Mesh
    drafter: Mesh


def split_devices(devices=None, half_batch: int | None = None) -> OverlapMeshes:
    """Two groups from `devices` (default `jax.devices()`): the first half for the target, the second for the
    drafter, each a ("data", "model") mesh with model = 1; one device serves both. With `half_batch`, each group's
    data axis is the largest divisor of it that fits the group (the rest of the group's devices stay idle)."""
    from ..runtime.mesh import make_mesh
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("sd-overlap: no devices to split")
    if len(devices) == 1:
        groups = (devices, devices)
    else:
        h = len(devices) // 2
        groups = (devices[:h], devices[h:2 * h])
    meshes = []
    for g in groups:
        n = len(g) if half_batch is None else math.gcd(len(g), half_batch)
        meshes.append(make_mesh(data=n, model=1, devices=g[:n]))
    return OverlapMeshes(*meshes)


def as_meshes(mesh, half_batch: int, drafter=None) -> OverlapMeshes:
    """`decode(mesh=...)` for sd-overlap -> the two groups, checked against the half-batch (and, for drafters whose
    state cannot be sharded yet, a one-device drafter group)."""
    from ..runtime.mesh import check_mesh
    if isinstance(mesh, OverlapMeshes):
        meshes = OverlapMeshes(check_mesh(mesh.target), check_mesh(mesh.drafter))
        for name, m in zip(("target", "drafter"), meshes):
            d = axis_size(m, DATA)
            if half_batch % d:
                raise ValueError(f"sd-overlap: the {name} mesh's data axis ({d}) must divide the half-batch "
                                 f"({half_batch} requests per half); pass a multiple of {2 * d} prompts or a mesh "
                                 "with a smaller data axis")
        if drafter is not None and not drafter.supports_mesh and meshes.drafter.devices.size > 1:
            raise ValueError(f"sd-overlap: {drafter.describe()} cannot shard its state yet, so its group must be one "
                             "device: pass OverlapMeshes(target=..., drafter=smcsd.make_mesh(1, 1, devices=[d]))")
        return meshes
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError("mesh for method 'sd-overlap' must be None (split jax.devices() in two), a jax.sharding.Mesh "
                        "(its devices split in two) or smcsd.methods.sd_overlap.OverlapMeshes(target=..., drafter=...); got "
                        f"{type(mesh).__name__}")
    meshes = split_devices(None if mesh is None else list(mesh.devices.flat), half_batch)
    if drafter is not None and not drafter.supports_mesh and meshes.drafter.devices.size > 1:
        from ..runtime.mesh import make_mesh
        meshes = meshes._replace(drafter=make_mesh(1, 1, devices=[meshes.drafter.devices.flat[0]]))
    return meshes


def _rows(mesh: Mesh, x):
    """Sharding of a per-row array (rows first) on `mesh`: rows over "data"."""
    rows = DATA if axis_size(mesh, DATA) > 1 else None
    return NamedSharding(mesh, P(rows, *([None] * (x.ndim - 1)))) if x.ndim else NamedSharding(mesh, P())


def place_rows(mesh, tree):
    return jax.tree_util.tree_map(lambda x: put(x, _rows(mesh, x)), tree)


def _place_params(mesh, params, cfg):
    if params is None:
        return None
    if axis_size(mesh, MODEL) == 1:
        return jax.tree_util.tree_map(lambda x: put(x, NamedSharding(mesh, P())), params)
    specs = param_specs(params, axis_size(mesh, MODEL), cfg)
    return jax.tree_util.tree_map(lambda x, s: put(x, NamedSharding(mesh, s)), params, specs,
                                  is_leaf=lambda s: isinstance(s, P))


def _place_inputs(mesh, inp: ProgramInputs) -> ProgramInputs:
    rep = NamedSharding(mesh, P())
    placed = jax.tree_util.tree_map(lambda x: put(x, rep), inp)
    return placed._replace(prompt=put(inp.prompt, _rows(mesh, inp.prompt)),
                           prompt_len=put(inp.prompt_len, _rows(mesh, inp.prompt_len)))


def cycle_keys(key, half, cycle):
    """(k_draft, k_accept, k_corr) of `half`'s cycle `cycle` (cycle -1: the first token)."""
    return jax.random.split(jax.random.fold_in(jax.random.fold_in(key, half), cycle + 1), 3)


class _Obs(NamedTuple):
    """What the drafter needs from a verification of its half."""

    block: jax.Array  # int32[b, K+1]: the verified [x0, x1..xK]
    hidden: Any  # [b, K+1, H] target hidden states of the drafter's layers, or None
    start: jax.Array  # int32[b]: target length before the call (where block[:, 0] sits)
    counts: jax.Array  # int32[b]: tokens of block now committed (0 for rows that were done)
    draft_len: jax.Array  # int32[b]: the drafter's length after the cycle, for live rows
    feed: jax.Array  # int32[b, 2]
    feed_count: jax.Array  # int32[b]
    live: jax.Array  # bool[b]


# ----------------------------------------------------------------------------- the four programs

def _programs(target_cfg, drafter, spec: StaticSpec):
    """(target_start, drafter_start, verify, drafter_step) for half-batches of `spec.batch` rows."""
    K = spec.num_speculative_tokens
    hl = drafter.hidden_layers

    def target_start(target_params, inp: ProgramInputs, half, valid):
        pre = prefill(target_cfg, target_params, inp.prompt, inp.prompt_len, spec.cache_len, 1, hidden_layers=hl)
        key = jax.random.fold_in(jax.random.fold_in(inp.key, half), 0)
        s = initial_state(inp._replace(key=key), spec, pre[0], pre[1], None)
        s = s._replace(done=s.done | ~valid)
        return s, (s.feed, s.feed_count, pre[2] if hl else None), jnp.all(s.done)

    def drafter_start(draft_params, inp: ProgramInputs, half, first):
        feed, feed_count, hidden = first
        dstate = drafter.init(draft_params, inp.prompt, inp.prompt_len, spec.cache_len, 1, hidden)
        k_draft = cycle_keys(inp.key, half, 0)[0]
        dlen = drafter.lengths(dstate)
        prop = drafter.propose(draft_params, dstate, feed, feed_count, k_draft, inp.draft_sampling, K)
        return prop.state, dlen, (prop.tokens, prop.logq)

    def verify(target_params, s: SDState, proposal, inp: ProgramInputs, half, cycle):
        x, logq = proposal
        _, k_accept, k_corr = cycle_keys(inp.key, half, cycle)
        live = ~s.done
        tlen_before = s.target_cache.lengths
        n_acc, c, block, tcache, hidden, _, _ = verify_chain(target_cfg, target_params, s.target_cache, s.tok, x,
                                                             logq, live, k_accept, k_corr, inp.sampling, hl)
        s, tlen, dlen = finish_cycle(s, inp, K, n_acc, x, c, tlen_before, tlen_before)
        any_live = jnp.any(live)  # a cycle of a half with no live row (never run by the host loop) counts nothing
        s = s._replace(calls=s.calls - 1 + any_live.astype(jnp.int32), target_cache=tcache.set_lengths(tlen))
        obs = _Obs(block, hidden, tlen_before, jnp.where(live, n_acc + 1, 0), dlen, s.feed, s.feed_count, live)
        return s, obs, jnp.all(s.done)

    def drafter_step(draft_params, dstate, dlen_before, obs: _Obs, inp: ProgramInputs, half, cycle):
        dstate = drafter.observe(draft_params, dstate, obs.block, obs.hidden, obs.start, obs.counts)
        dstate = drafter.set_lengths(dstate, jnp.where(obs.live, obs.draft_len, dlen_before))
        k_draft = cycle_keys(inp.key, half, cycle)[0]
        dlen = drafter.lengths(dstate)
        prop = drafter.propose(draft_params, dstate, obs.feed, obs.feed_count, k_draft, inp.draft_sampling, K)
        return prop.state, dlen, (prop.tokens, prop.logq)

    return target_start, drafter_start, verify, drafter_step


# ----------------------------------------------------------------------------- the host loop

class _Program:
    """A program jitted for its group: compiled ahead of time, on demand, once per argument layout (shapes, dtypes,
    shardings: known at dispatch even for arrays still being computed), under its group's cache layout. The seconds
    spent compiling add up in `compile_s`."""

    def __init__(self, fn, mesh):
        self.fn, self.mesh, self.cache, self.compile_s = fn, mesh, {}, 0.0

    def __call__(self, *args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        sig = (tree, tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
        exe = self.cache.get(sig)
        if exe is None:
            start = time.perf_counter()
            with layout(self.mesh if self.mesh.devices.size > 1 else None):
                exe = jax.jit(self.fn).lower(*args).compile()
            self.compile_s += time.perf_counter() - start
            self.cache[sig] = exe
        return exe(*args)


class _Timeline:
    """Completion times of dispatched programs, one watcher thread per device group (`trace=True`): each program's
    interval is [max(its dispatch, the end of the group's previous program, the end of what it waited for), end]."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.events: list[dict] = []
        self._queues = {g: queue.Queue() for g in ("target", "drafter")}
        self._threads = [threading.Thread(target=self._watch, args=(g,), daemon=True) for g in self._queues]
        for t in self._threads:
            t.start()

    def _watch(self, group):
        q = self._queues[group]
        while True:
            item = q.get()
            if item is None:
                return
            ev, out = item
            jax.block_until_ready(out)
            ev["end"] = time.perf_counter() - self.t0
            self.events.append(ev)

    def add(self, group, name, half, cycle, out, after=None):
        ev = {"group": group, "program": name, "half": half, "cycle": cycle,
              "dispatch": time.perf_counter() - self.t0, "after": after}
        self._queues[group].put((ev, out))
        return ev

    def close(self):
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join()
        last = {}
        ends = {id(ev): ev["end"] for ev in self.events}
        for ev in sorted(self.events, key=lambda e: e["end"]):
            dep = ends.get(ev.pop("after"), 0.0) if ev.get("after") is not None else 0.0
            ev["start"] = max(ev["dispatch"], last.get(ev["group"], 0.0), dep)
            last[ev["group"]] = ev["end"]
        return sorted(self.events, key=lambda e: e["start"])


def overlap_seconds(events) -> dict:
    """Busy seconds of each group and the seconds both were busy at once, from a `_Timeline`'s events."""
    spans = {g: [(e["start"], e["end"]) for e in events if e["group"] == g] for g in ("target", "drafter")}
    busy = {g: sum(b - a for a, b in s) for g, s in spans.items()}
    both = sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in spans["target"] for a2, b2 in spans["drafter"])
    wall = max((e["end"] for e in events), default=0.0) - min((e["start"] for e in events), default=0.0)
    return {"target_busy_s": busy["target"], "drafter_busy_s": busy["drafter"], "both_busy_s": both, "wall_s": wall}


class OverlapRunner:
    """`sd-overlap`'s "compiled program": called like the others as `runner(target_params, draft_params, inputs)` and
    returning the same raw dict (tokens, lengths, stats). `sequential=True` waits for each program before dispatching
    the next (the no-overlap control: same programs, same tokens); `trace=True` records a timeline of the programs
    (`last_timeline`) at the cost of two watcher threads."""

    def __init__(self, target_cfg, drafter, spec: StaticSpec, mesh=None, sequential: bool = False,
                 trace: bool = False):
        self.drafter = as_drafter(drafter)
        self.target_cfg, self.spec = target_cfg, spec
        self.half = (spec.batch + 1) // 2
        self.meshes = mesh if isinstance(mesh, OverlapMeshes) else as_meshes(mesh, self.half, self.drafter)
        self.half_spec = dataclasses.replace(spec, batch=self.half)
        fns = _programs(target_cfg, self.drafter, self.half_spec)
        t, d = self.meshes
        self.programs = dict(zip(("target_start", "drafter_start", "verify", "drafter_step"),
                                 (_Program(fns[0], t), _Program(fns[1], d), _Program(fns[2], t), _Program(fns[3], d))))
        self.sequential, self.trace = sequential, trace
        self.last_timeline: list | None = None

    # -------------------------------------------------------------- inputs
    def _split(self, inp: ProgramInputs):
        """Per half: (inputs on the target group, inputs on the drafter group, row-valid mask on the target)."""
        B, b = self.spec.batch, self.half
        prompt, plen = np.asarray(inp.prompt), np.asarray(inp.prompt_len)
        idx = np.minimum(np.arange(2 * b), B - 1)  # an odd batch repeats its last request once (as padding)
        valid = np.arange(2 * b) < B
        halves = []
        for h in range(2):
            rows = idx[h * b:(h + 1) * b]
            hi = inp._replace(prompt=jnp.asarray(prompt[rows]), prompt_len=jnp.asarray(plen[rows]))
            halves.append((_place_inputs(self.meshes.target, hi), _place_inputs(self.meshes.drafter, hi),
                           put(jnp.asarray(valid[h * b:(h + 1) * b]), _rows(self.meshes.target, valid[:b])),
                           [put(jnp.asarray(h, jnp.int32), NamedSharding(m, P())) for m in self.meshes]))
        return halves

    def _scalar(self, group, value):
        return put(jnp.asarray(value, jnp.int32), NamedSharding(self.meshes[group], P()))

    # -------------------------------------------------------------- run
    @property
    def compile_s(self) -> float:
        return sum(p.compile_s for p in self.programs.values())

    def compile(self, target_params, draft_params, inp: ProgramInputs) -> float:
        """Compile every program for these arguments by a short warm-up run (at most 2K+4 tokens per request, stop
        tokens off), so that the real run only executes. Returns the seconds spent compiling."""
        before = self.compile_s
        K = self.spec.num_speculative_tokens
        mnt = jnp.minimum(inp.max_new_tokens, 2 * K + 4)
        self._run(target_params, draft_params, inp._replace(max_new_tokens=mnt,
                                                              stop_ids=jnp.full_like(inp.stop_ids, -1)), trace=False)
        return self.compile_s - before

    def __call__(self, target_params, draft_params, inp: ProgramInputs):
        return self._run(target_params, draft_params, inp, trace=self.trace)

    def _run(self, target_params, draft_params, inp: ProgramInputs, trace: bool):
        t, d = self.meshes
        tp = _place_params(t, target_params, self.target_cfg)
        dp = _place_params(d, draft_params, self.drafter.config)
        halves = self._split(inp)
        pr = self.programs
        tl = _Timeline() if trace else None

        def launch(group, name, h, cycle, fn, *args, after=None):
            out = fn(*args)
            ev = tl.add(group, name, h, cycle, out, after) if tl is not None else None
            if self.sequential:
                jax.block_until_ready(out)
            return out, (id(ev) if ev is not None else None)

        def to_t(x):
            return place_rows(t, x)

        def to_d(x):
            return place_rows(d, x)

        ts, first, done, obs, ds, dlen, prop = ({} for _ in range(7))
        ev_t, ev_d = {}, {}
        for h in range(2):
            ti, _, valid, (ht, _) = halves[h]
            (ts[h], first[h], done[h]), ev_t[h] = launch("target", "target_start", h, -1, pr["target_start"], tp, ti,
                                                         ht, valid)
        live = [True, True]
        started = [False, False]
        cycle = [0, 0]

        def draft(h):
            """Dispatch half h's next proposal, unless its verification (or start) left every row done. Reads that
            bool: by now the target has moved on to the other half, so this waits only if the drafter is ahead."""
            if bool(done[h]):
                live[h] = False
                return
            _, di, _, (_, hd) = halves[h]
            if not started[h]:
                started[h] = True
                (ds[h], dlen[h], prop[h]), ev_d[h] = launch("drafter", "drafter_start", h, 0, pr["drafter_start"], dp,
                                                            di, hd, to_d(first[h]), after=ev_t[h])
            else:
                cycle[h] += 1
                (ds[h], dlen[h], prop[h]), ev_d[h] = launch("drafter", "drafter_step", h, cycle[h], pr["drafter_step"],
                                                            dp, ds[h], dlen[h], to_d(obs[h]), di, hd,
                                                            self._scalar(1, cycle[h]), after=ev_t[h])

        def verify(h):
            if not live[h]:
                return
            ti, _, _, (ht, _) = halves[h]
            (ts[h], obs[h], done[h]), ev_t[h] = launch("target", "verify", h, cycle[h], pr["verify"], tp, ts[h],
                                                       to_t(prop[h]), ti, ht, self._scalar(0, cycle[h]),
                                                       after=ev_d[h])

        draft(0)  # D(A,0); then V(A,c), D(B,c), V(B,c), D(A,c+1), ...
        while live[0] or live[1]:
            verify(0)
            if live[1]:
                draft(1)
            verify(1)
            if live[0]:
                draft(0)
        self.last_timeline = tl.close() if tl is not None else None
        return self._merge([jax.device_get(program_result(ts[h], self.spec.num_speculative_tokens, self.drafter))
                            for h in range(2)])

    def _merge(self, raws):
        """One raw result over the batch from the two halves' (padding row dropped; target calls of both halves)."""
        B = self.spec.batch
        out = {"tokens": np.concatenate([r["tokens"] for r in raws])[:B],
               "lengths": np.concatenate([r["lengths"] for r in raws])[:B], "stats": {}}
        for name in raws[0]["stats"]:
            vals = [np.asarray(r["stats"][name]) for r in raws]
            out["stats"][name] = np.concatenate(vals)[:B] if name == "live_calls" else sum(vals)
        return out


def _build(target_cfg, drafter, spec: StaticSpec):
    raise AssertionError("sd-overlap runs through OverlapRunner (engine.compiled_program), not one program")


def overlap_step_model(t_verify: float, t_draft: float, t_transfer: float = 0.0) -> dict:
    """The throughput model of the overlap, per half-batch step: in sequential order a half costs t_verify + t_draft
    (the two run one after the other), overlapped max(t_verify, t_draft) + t_transfer (each group works on one half
    while the other works on the other half). Times are per half-batch program, so the overlap beats the same
    programs in sequence when t_transfer < min(t_verify, t_draft).

    Against plain `sd` on the whole batch, mind what a half costs: when calls are memory-bound (small batches on an
    accelerator) a half-batch verification costs about a whole-batch one, and two half-steps lose to one sd cycle;
    MineDraft therefore keeps twice the requests in flight (halves the size of sd's batch), where the gain is
    (t_verify + t_draft) / (max(t_verify, t_draft) + t_transfer) (experiments/studies/cost_model.py `overlap_projection`).
    Returns both step times and the predicted speed-up."""
    seq = t_verify + t_draft
    ov = max(t_verify, t_draft) + t_transfer
    return {"sd_step_s": seq, "overlap_step_s": ov, "speedup": seq / ov if ov > 0 else float("nan"),
            "beats_sd": t_transfer < min(t_verify, t_draft)}


def place(mesh, batch: int, target, drafter, inputs):
    """sd-overlap's arguments on its two device groups (each placed by the runner): the groups from `mesh`
    (`as_meshes`), per-layer buffers on a one-device group, stacked params to shard on several."""
    meshes = as_meshes(mesh, (batch + 1) // 2, drafter)
    one = [m.devices.size == 1 for m in meshes]
    draft_params = drafter.drafter_params() if one[1] else drafter.sharded_params()
    return meshes, (target.decode_params() if one[0] else target.params, draft_params, inputs)


DEFINITION = register_method(MethodDef(name="sd-overlap", build=_build, needs_draft=True, headroom=headroom,
                                       runner=OverlapRunner, passes_feedback=False, place=place))


@dataclasses.dataclass(frozen=True, repr=False)
class SDOverlap(ChainMethod):
    """`sd-overlap`: MineDraft's `sd` with drafting overlapped with verification on two device groups."""

    name: ClassVar[str] = "sd-overlap"
