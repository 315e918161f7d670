"""The reporting plumbing the experiment scripts share: where results go, what ran them, how calls are
timed, and how results are written, tabled and plotted (`from experiments import report`).

Each script still builds its own result dict (its keys and their order are its documented schema) and
its own table cells; these helpers only replace the copies of the plumbing around them. Only the
standard library is imported at module level (jax and matplotlib inside the helpers that need them), so
the peer interpreters of bench/real.py and bench/lookup.py, which may lack jax, can import it too.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

from experiments.common import RESULTS



# ----------------------------------------------------------------------------------- paths and metadata

def results_path(*parts: str) -> str:
    """A path under experiments/results/ (absolute, whatever the working directory)."""
    return os.path.join(RESULTS, *parts)


def new_result(schema: str, **fields) -> dict:
    """A result dict that starts with `schema` and `created` (local time to the second, ISO 8601:
    `2025-01-31T12:34:56`), then `fields` in the order given."""
    return {"schema": schema, "created": datetime.datetime.now().isoformat(timespec="seconds"), **fields}


def device_info(count: bool = False, host_cores: bool = True) -> tuple[str, str]:
    """(description, platform) of jax's first device, e.g. ("cpu: cpu (2 host cores)", "cpu") or
    ("gpu: NVIDIA H100 80GB HBM3", "gpu"); `count` appends " x<devices>", `host_cores` the host's core
    count on a CPU."""
    import jax
    dev = jax.devices()[0]
    desc = f"{dev.platform}: {getattr(dev, 'device_kind', str(dev))}"
    if count:
        desc += f" x{jax.device_count()}"
    if host_cores and dev.platform == "cpu":
        desc += f" ({os.cpu_count()} host cores)"
    return desc, dev.platform


def machine_info() -> dict:
    """The `machine` field of a result: platform, CPU model, cores, jax version, backend, the machine key its own
    defaults are stored under (`smcsd.defaults.machine_key`) and the load average (the machine may be shared:
    compare numbers within one run; CPUs differ: compare numbers from one machine)."""
    import jax
    from smcsd.defaults import cpu_model, machine_key
    return dict(platform=platform.platform(), cpu=cpu_model(), cores=os.cpu_count(), jax=jax.__version__,
                backend=jax.default_backend(), machine_key=machine_key(), load_avg=os.getloadavg())


def command(script: str, argv=None) -> str:
    """The command line that ran the experiments module at path `script` (a script's `__file__`) with `argv`
    (default: this process's arguments), `python -m experiments.<sub>.<name> ...`: the `command` field of a
    result."""
    args = argv if argv is not None else sys.argv[1:]
    parts = os.path.normpath(os.path.splitext(script)[0]).split(os.sep)
    module = ".".join(parts[len(parts) - 1 - parts[::-1].index("experiments"):])
    return f"python -m {module} " + " ".join(args)


# ----------------------------------------------------------------------------------- timing

def timed(fn, repeats: int, warmup: int = 0, reset=None) -> tuple[float, list[float]]:
    """(median, all) wall times in seconds of `repeats` calls of `fn()`, after `warmup` untimed calls.
    Each result is waited for (`jax.block_until_ready`, a no-op on non-jax values) inside its timing;
    `reset(result)`, when given, runs untimed after every call, warm-up ones included (e.g. to restore a
    donated cache)."""
    import jax
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if reset is not None:
            reset(out)
    return statistics.median(times), times


def round_robin(items: list, rounds: int):
    """(round, item) for `rounds` rounds of every item once, each round starting one item later, so the
    drift of a shared machine hits every item alike."""
    for r in range(rounds):
        for i in range(len(items)):
            yield r, items[(i + r) % len(items)]


# ----------------------------------------------------------------------------------- JSON

def json_safe(obj):
    """`obj` with NaN and infinities as None (strict JSON: null), dict keys as strings, tuples as lists."""
    if isinstance(obj, float):
        return None if (math.isnan(obj) or math.isinf(obj)) else obj
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path, obj, indent: int | None = 1):
    """Write `obj` as JSON to `path` (its folder made if missing); returns `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
    return path


# ----------------------------------------------------------------------------------- tables

def fmt(value, spec: str = ".2f", none: str = "–") -> str:
    """format(value, spec), or `none` where the value is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return format(value, spec)


def markdown_row(cells) -> str:
    """One markdown table row: `| a | b |`."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(columns, rows, align: str = "---") -> str:
    """A markdown table: header `columns`, then one row per sequence of cells in `rows` (already
    formatted; str() is applied); `align` is each column's separator cell (`---:` right-aligns)."""
    lines = [markdown_row(columns), "|" + f"{align}|" * len(columns)]
    return "\n".join(lines + [markdown_row(r) for r in rows])


# ----------------------------------------------------------------------------------- plots

def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (the scripts only write files)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def savefig(fig, path: str, **kwargs) -> str:
    """Save `fig` to `path` (its folder made if missing; `kwargs` go to `fig.savefig`), close it, and
    return `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, **kwargs)
    pyplot().close(fig)
    return path
