"""`decode`'s defaults: the method and (N, K) it runs when the caller leaves them out.

For a shipped or fetchable pair they were chosen by measurement (`experiments/studies/choose_defaults.py`) and are stored
with the pair in `models/shipped/<pair>/decode_defaults.json`, per backend ("cpu", and "accelerator" for GPU/TPU,
where a call over many tokens costs about what one token costs) and per drafter: the fastest setting whose
quality is within tolerance of `ar`, never slower than `ar` (which is itself a candidate, so a pair whose drafters
do not pay for themselves on a backend gets `ar` there). The file records the command that chose them and what
was measured. Greedy decoding (temperature 0) has its own choice where the file holds one (its "greedy" entry,
chosen by `choose_defaults --temperature 0`): there every speculative method is exact and the fastest may differ,
e.g. an `sd-tree` whose tree the entry names. A batch of several requests takes the entry's `by_batch` choice where
it was measured (`choose_defaults --batch-sizes`): the one of the smallest measured batch size at least as large,
and `ar` past the largest (on a CPU a call over more rows costs more, so drafting stops paying as the batch grows).
Any other target and drafter get the generic defaults below.

Per machine. What pays differs between CPUs as much as between backends: SmolLM2's call over 4 tokens costs ~1.4x
a one-token call on one 2-core CPU measured here and 1.8x on another, and at T=0.7 `sd` K=2 ran 1.04x `ar` on the
first, 0.94x on the second. So a choice measured on this machine (`machine_key()`: the CPU model and core count, or
the accelerator's kind and count) is preferred where one exists. Lookup order, first file holding the drafter (its
greedy entry at temperature 0 where it has one, else its sampled one): the user's own choice for this machine
(`user_defaults_path`, written by `choose_defaults --write-user`), the pair's shipped choice for this machine
(`machine_defaults_path`, `--write-machine`), the pair's backend-wide choice (`defaults_path`, `--write`).
`$SMCSD_MACHINE` overrides the machine key.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
from typing import NamedTuple

import jax

from smcsd.models.shipped import SHIPPED_DIR

SCHEMA = "smcsd.decode_defaults/1"
FILENAME = "decode_defaults.json"

# (N, K) per method when nothing better is known: sd K=4 and sd-multi N=4 K=4 are exact whatever the drafter;
# smc's N=4 K=4 is the middle of experiments/studies/choose_defaults.py's grid.
METHOD_DEFAULTS = {"sd": (1, 4), "sd-multi": (4, 4), "smc": (4, 4), "sd-tree": (1, 4), "sd-overlap": (1, 4)}
GENERIC_METHOD = "sd"  # with a drafter and no stored choice: exact, and the usual speed-up


class Choice(NamedTuple):
    method: str
    num_particles: int
    num_speculative_tokens: int
    source: str  # where it came from: the pair's stored file, or "generic"
    tree: str | None = None  # sd-tree: the stored tree (its string form, smcsd.TreeSpec.parse)


def backend() -> str:
    """"cpu" on a CPU, "accelerator" on a GPU or TPU (the defaults differ: see the module docstring)."""
    return "cpu" if jax.default_backend() == "cpu" else "accelerator"


def defaults_path(pair: str) -> str:
    """The pair's backend-wide choice (shipped with it)."""
    return os.path.join(SHIPPED_DIR, pair, FILENAME)


MACHINES_DIR = "decode_defaults.machines"  # next to decode_defaults.json: one file per machine_key()


def cpu_model() -> str:
    """This CPU's model name (/proc/cpuinfo's "model name", else what `platform` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name") and ":" in line:
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def machine_key() -> str:
    """The name this machine's own defaults are stored under: `$SMCSD_MACHINE` if set, else on a CPU its model and
    core count ("Intel(R) Xeon(R) Processor, 2 cores"), on an accelerator its kind and count ("NVIDIA H100 80GB
    HBM3 x 1")."""
    explicit = os.environ.get("SMCSD_MACHINE")
    if explicit:
        return explicit
    if backend() == "cpu":
        return f"{cpu_model()}, {os.cpu_count()} cores"
    devices = jax.devices()
    return f"{devices[0].device_kind} x {len(devices)}"


def machine_slug(key: str) -> str:
    """A file name for a machine key: lower case, runs of anything but letters and digits as one '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    return slug or "unknown"


def machine_defaults_path(pair: str, key: str | None = None) -> str:
    """The pair's shipped choice for one machine (default: this one)."""
    return os.path.join(SHIPPED_DIR, pair, MACHINES_DIR, machine_slug(key or machine_key()) + ".json")


def user_defaults_path(pair: str, key: str | None = None) -> str:
    """The user's own choice for a pair on one machine (default: this one), in smcsd's cache directory."""
    from smcsd.models.registry import cache_dir
    return os.path.join(cache_dir(), "decode_defaults", pair, machine_slug(key or machine_key()) + ".json")


def read_defaults(path: str) -> dict | None:
    """A stored choice file (None if there is none); re-read when the file changes."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    return _read(path, mtime)


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime: int) -> dict:
    del mtime  # part of the cache key only
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r} is not {SCHEMA!r}; rerun "
                         "python -m experiments.studies.choose_defaults")
    return data


def load_defaults(pair: str) -> dict | None:
    """The pair's backend-wide stored choice (None if it has none); re-read when the file changes."""
    return read_defaults(defaults_path(pair))


load_defaults.cache_clear = _read.cache_clear  # what callers that write the files may call


def defaults_chain(pair: str) -> list[tuple[str, dict]]:
    """`(path, stored choice)` in lookup order (module docstring): the user's for this machine, the pair's for this
    machine, the pair's backend-wide one; those that exist."""
    chain = [(p, read_defaults(p)) for p in (user_defaults_path(pair), machine_defaults_path(pair))]
    chain.append((defaults_path(pair), load_defaults(pair)))
    return [(p, d) for p, d in chain if d is not None]


def default_drafter(pair: str) -> str | None:
    """The drafter `smcsd.load(pair)` gives on this backend when none is named: the stored `default_drafter` (the
    drafter whose measured default setting is fastest, written by experiments/studies/choose_defaults.py) of the
    first stored choice that names one (`defaults_chain`), else None."""
    for _, stored in defaults_chain(pair):
        name = (stored.get("default_drafter") or {}).get(backend())
        if name:
            return name
    return None


def identify(target, draft=None) -> tuple[str | None, str | None]:
    """(pair, drafter name) of a target and drafter as `smcsd.load` made them, else Nones: the one place that reads the
    names `smcsd.load` gives ("tiny-code/target", "smollm2-135m", "<pair>/<drafter>"; a toy's own draft is "<pair>/draft",
    the `ar` drafter). A user's own model (any other name) is no pair's; a drafter is the pair's only when its name
    says so. `draft` may be an `ARDrafter` (its model's name counts) or a parameter-free drafter (its kind)."""
    from smcsd.models.registry import available_models
    pair = str(getattr(target, "name", None) or "").split("/")[0] or None
    if pair is not None and pair not in available_models():
        pair = None
    if draft is None or pair is None:
        return pair, None
    kind = getattr(draft, "kind", None)
    if getattr(draft, "param_free", False):  # no weights: every pair has it, under its kind
        return pair, kind
    name = getattr(getattr(draft, "model", None), "name", None) if kind == "ar" else getattr(draft, "name", None)
    if not name or "/" not in name or name.split("/")[0] != pair:
        return pair, None
    drafter = name.split("/", 1)[1]
    return pair, ("ar" if drafter == "draft" else drafter)


def _entry(stored: dict, drafter: str, temperature) -> tuple[dict | None, str]:
    """The stored choice for `drafter` on this backend (the greedy one at temperature 0, where stored) and its label."""
    if temperature == 0:
        greedy = (stored.get("greedy") or {}).get("backends", {}).get(backend(), {}).get(drafter)
        if greedy is not None:
            return greedy, f"{backend()}, greedy, {drafter}"
    return stored.get("backends", {}).get(backend(), {}).get(drafter), f"{backend()}, {drafter}"


def _choice(c: dict, source: str) -> Choice:
    return Choice(c["method"], c.get("num_particles", 1), c.get("num_speculative_tokens", 1), source, c.get("tree"))


def _by_batch(entry: dict, batch: int, source: str) -> Choice | None:
    """The entry's choice for a batch of `batch` requests from its `by_batch` measurements (None: not measured);
    `source` is the label without its closing parenthesis."""
    measured = {int(b): e for b, e in (entry.get("by_batch") or {}).items()}
    if batch <= 1 or not measured:
        return None
    fits = [b for b in measured if b >= batch]
    if not fits:
        return Choice("ar", 1, 1, f"{source}, batch {batch} past the largest measured, {max(measured)})")
    b = min(fits)
    return _choice(measured[b]["default"], f"{source}, batch {b})")


def choose(target, draft, method: str | None, temperature: float | None = None, batch: int = 1) -> Choice:
    """The method and (N, K) `decode` runs when `method` (None: choose it too) and N, K are not given; at
    `temperature` 0 the pair's greedy choice where it has one; for `batch` requests the one measured at that batch
    size (module docstring)."""
    if draft is None:  # a method that needs a drafter is refused by decode, naming the argument
        n, k = METHOD_DEFAULTS.get(method, (1, 1))
        return Choice(method or "ar", n, k, "no drafter")
    pair, drafter = identify(target, draft)
    for path, stored in (defaults_chain(pair) if pair and drafter else []):  # this machine's first (module docstring)
        entry, where = _entry(stored, drafter, temperature)
        if entry is None:
            continue
        if method is None:
            return _by_batch(entry, batch, f"{path} ({where}") or _choice(entry["default"], f"{path} ({where})")
        per_method = entry.get("methods", {}).get(method)
        if per_method is not None:
            return _choice(per_method, f"{path} ({where}, {method})")
    if method is None:  # a drafter may name its own (a tree drafter: sd-tree)
        method = getattr(draft, "preferred_method", None) or GENERIC_METHOD
    n, k = METHOD_DEFAULTS.get(method, (1, 1))
    return Choice(method, n, k, "generic")


# sd-tree's tree when none is given (depth = num_speculative_tokens, default 4), from experiments/bench/tree.py:
# - cpu: 9 verified tokens ("2,1,1,1", or a D²SD chain + 1 branch). This CPU turns compute-bound past ~8-16 tokens
#   per call: on SmolLM2 at batch 1 every family lost tokens/s from budget 5 to 9 to 13 (the extra accepted tokens
#   did not pay for the wider call), and 9 is the smallest budget that is a tree at all;
# - accelerator: 17 ("4,1,1,1", or D²SD + 3 branches), the largest budget measured; acceptance still grew with the
#   budget there and the cost model's call over 17 tokens costs about one token's weight traffic.
TREE_DEFAULTS = {"cpu": {"branching": (2,), "branches": 1}, "accelerator": {"branching": (4,), "branches": 3}}


def default_tree(draft, depth: int | None = None):
    """The `TreeSpec` `sd-tree` runs when `tree=` is left out: the drafter's `default_tree` for the backend's
    defaults (a D²SD drafter: its chain plus re-anchored branches; others: a product tree with the backend's
    branching at the first depths and single children below)."""
    from .drafters import as_drafter
    draft = as_drafter(draft)
    if depth is None:  # 4, or less where the drafter drafts fewer tokens per proposal
        depth = min(4, getattr(draft, "max_tokens_per_proposal", None) or 4)
    d = TREE_DEFAULTS[backend()]
    return draft.default_tree(int(depth), tuple(d["branching"]), d["branches"])
