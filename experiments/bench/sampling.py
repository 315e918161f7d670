"""Per-row cost of turning logits into a token at a real vocabulary size: `process_logits` + `sample`.

    python -m experiments.bench.sampling                      # V = 49152 (SmolLM2), rows 1 4 16
    python -m experiments.bench.sampling --baseline OLD.py    # also time another sampling.py (e.g. an older
                                                              # commit's: git show REV:smcsd/sampling.py > OLD.py)

Settings: plain (T=0.7), top-k 50, top-p 0.9, top-k 50 + top-p 0.9, greedy. Logits are drawn like a language
model's (normal, scale 4: a few hundred tokens hold most of the mass). Median of --repeats jitted calls.
Prints a markdown table of ms per call and per row; writes JSON (--out).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os

from experiments import report
from experiments.common import REPO

SETTINGS = {"plain T=0.7": (0.7, 0, 1.0), "top-k 50": (0.7, 50, 1.0), "top-p 0.9": (0.7, 0, 0.9),
            "top-k 50 + top-p 0.9": (0.7, 50, 0.9), "greedy": (0.0, 0, 1.0)}


def _module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_sampler(mod, vocab: int, rows: int, setting, repeats: int) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    logits = jnp.asarray(np.random.default_rng(0).normal(size=(rows, vocab)) * 4, jnp.float32)
    params = mod.SamplingParams.make(*setting)
    fn = jax.jit(lambda k, x, p: mod.sample(k, mod.process_logits(x, p)))
    seeds = itertools.chain([0], range(repeats))  # the warm-up call's, then the timed calls'
    return report.timed(lambda: fn(jax.random.PRNGKey(next(seeds)), logits, params), repeats, warmup=1)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--baseline", default=None, help="another sampling.py to time side by side")
    ap.add_argument("--out", default=report.results_path("bench_sampling.json"))
    args = ap.parse_args(argv)
    samplers = {"now": _module(os.path.join(REPO, "smcsd", "sampling.py"), "sampling_now")}
    if args.baseline:
        samplers["baseline"] = _module(args.baseline, "sampling_baseline")
    rows = []
    for name, setting in SETTINGS.items():
        for r in args.rows:
            row = {"setting": name, "rows": r}
            for label, mod in samplers.items():  # side by side, same logits
                t = time_sampler(mod, args.vocab, r, setting, args.repeats)
                row[f"{label}_ms"] = 1e3 * t
                row[f"{label}_ms_per_row"] = 1e3 * t / r
            rows.append(row)
            print(row, flush=True)
    cols = [k for k in rows[0] if k not in ("setting", "rows")]
    table = report.markdown_table(["setting", "rows", *cols],
                                  [[r["setting"], r["rows"], *(f"{r[c]:.2f}" for c in cols)] for r in rows])
    print(table)
    print("wrote", report.write_json(args.out, {"schema": "smcsd.bench_sampling/1", "vocab": args.vocab, "rows": rows,
                                                "markdown": table, "command": report.command(__file__, argv)},
                                     indent=2))


if __name__ == "__main__":
    main()
