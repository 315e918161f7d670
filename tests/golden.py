"""The golden file of decoding behaviour: tokens and statistics for fixed seeds, every method x drafter kind of the
shipped toy pairs (and a short SmolLM2 run when its target is fetched), so a refactoring of the house (issue 34:
methods as dataclasses, verification math as its own package, drafters renamed) can show it changed nothing.

    python tests/golden.py            # (re)write tests/data/golden.json from the current code
    python tests/golden.py --check    # compare the current code with it (what tests/test_golden.py runs)

A case that raises records its error type and message instead (the errors are behaviour too). Integer statistics
and tokens must match exactly; float statistics to 1e-5 relative (they are sums and means of the same floats, but
a refactoring may legitimately reorder a reduction).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "data", "golden.json")

PROMPTS = {"tiny-code": ["def fibonacci(n):", "import os\n"],
           "tiny-arith": ["Q: Sam has 23 apples. He buys 15 more. How many apples does Sam have?\nA:"],
           "smollm2-135m": ["The capital of France is"]}
METHODS = ("sd", "sd-multi", "sd-tree", "smc", "flex", "sd-overlap")
# (temperature, seed) per case: one sampled setting for every case, greedy for the SmolLM2 run
SETTING = dict(temperature=0.7, seed=3, max_new_tokens=20)
STATS = ("method", "batch_size", "num_generated_tokens", "num_prefill_calls", "num_target_calls", "num_draft_calls",
         "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "acceptance_rate",
         "mean_acceptance_length", "tokens_per_target_call", "cache_len", "target_calls_per_request",
         "num_particles", "ess_per_cycle", "resampled_per_cycle", "num_resamples", "log_z", "all_weights_neg_inf")


def _plain(x):
    """JSON-able: numpy scalars / arrays and nested lists to Python numbers; NaN / inf as strings."""
    import numpy as np
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return repr(x) if not math.isfinite(x) else x
    return x


def cases(include_real: bool = True):
    """(name, pair, drafter name or None, method, extra decode kwargs) of every case."""
    import smcsd
    out = []
    for pair in ("tiny-code", "tiny-arith"):
        out.append((f"{pair}/ar", pair, None, "ar", {}))
        for d in smcsd.available_drafters(pair):
            for m in METHODS:
                if m == "flex" and d != "flex":
                    continue  # flex is FlexDraft's own method
                out.append((f"{pair}/{d}/{m}", pair, d, m, {}))
    if include_real:
        out.append(("smollm2-135m/ar", "smollm2-135m", None, "ar", {"temperature": 0.0}))
        out.append(("smollm2-135m/eagle/sd", "smollm2-135m", "eagle", "sd", {"temperature": 0.0}))
    return out


def quick_cases(names) -> list[str]:
    """The subset the slow test runs (~1/4 of the cases, each method and each drafter kind at least once):
    every drafter under sd, every method with the AR draft, FlexDraft's own method, smc with tiny-arith's proposal,
    and the SmolLM2 runs. `python tests/golden.py --check` runs them all."""
    keep = []
    for n in names:
        parts = n.split("/")
        if parts[0] == "smollm2-135m" or n.endswith("/ar") and len(parts) == 2:
            keep.append(n)
        elif parts[0] == "tiny-code" and (parts[2] == "sd" or parts[1] == "ar" or n == "tiny-code/flex/flex"):
            keep.append(n)
        elif n == "tiny-arith/smc-proposal/smc":
            keep.append(n)
    return keep


def run_case(pair, drafter, method, extra, cache):
    import smcsd
    if pair not in cache:
        cache[pair] = {}
    if drafter not in cache[pair]:
        cache[pair][drafter] = smcsd.load(pair, drafter=drafter) if drafter else (smcsd.load(pair)[0], None)
    target, draft = cache[pair][drafter]
    kw = {**SETTING, **extra}
    try:
        if method == "ar":
            res = smcsd.decode(PROMPTS[pair], target=target, method="ar", **kw)
        else:
            res = smcsd.decode(PROMPTS[pair], target=target, draft=draft, method=method, **kw)
    except Exception as e:  # noqa: BLE001 - the error is the recorded behaviour
        return {"error": type(e).__name__, "message": str(e).splitlines()[0][:300]}
    st = res.stats
    return {"tokens": [_plain(t) for t in res.tokens],
            "stats": {k: _plain(getattr(st, k, None)) for k in STATS}}


def real_available() -> bool:
    try:
        import smcsd
        smcsd.load("smollm2-135m", drafter="eagle")
        return True
    except Exception:  # noqa: BLE001 - not fetched: the toy cases only
        return False


# The cases run with the pairs' backend-wide stored defaults (a case that leaves K out takes the pair's best K for its
# method), never a machine's own choice (smcsd.defaults: per machine), so the file holds on every machine: this key
# names no stored machine file.
MACHINE = "golden: backend-wide defaults only"


@contextlib.contextmanager
def backend_wide_defaults():
    """`SMCSD_MACHINE` set to `MACHINE` for the duration (then restored)."""
    previous = os.environ.get("SMCSD_MACHINE")
    os.environ["SMCSD_MACHINE"] = MACHINE
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SMCSD_MACHINE", None)
        else:
            os.environ["SMCSD_MACHINE"] = previous


def compute(include_real: bool, verbose: bool = False, only=None):
    import warnings
    cache: dict = {}
    out = {}
    with backend_wide_defaults(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, pair, d, m, extra in cases(include_real):
            if only is not None and name not in only:
                continue
            t0 = time.time()
            out[name] = run_case(pair, d, m, extra, cache)
            _release()
            if verbose:
                print(f"{name}: {'error' if 'error' in out[name] else 'ok'} ({time.time() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
    return out


def _release() -> None:
    """Free compiled programs between cases (~80 decodes' executables exceed the per-process memory-map limit)."""
    from smcsd.runtime.engine import release_programs
    release_programs()


def _close(a, b, rel=1e-5) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or \
                not isinstance(b, (int, float)):
            return a == b
        return abs(a - b) <= rel * max(1.0, abs(a), abs(b))
    return a == b


def differences(want: dict, got: dict) -> list[str]:
    """Human-readable differences between two golden dicts (cases missing on either side included)."""
    diffs = []
    for name in sorted(set(want) | set(got)):
        if name not in got or name not in want:
            diffs.append(f"{name}: {'missing now' if name not in got else 'new case'}")
            continue
        w, g = want[name], got[name]
        if ("error" in w) != ("error" in g):
            diffs.append(f"{name}: was {w.get('error', 'ok')}, now {g.get('error', 'ok')} "
                         f"({g.get('message', w.get('message', ''))})")
        elif "error" in w:
            if (w["error"], w["message"]) != (g["error"], g["message"]):
                diffs.append(f"{name}: error {w['error']}: {w['message']!r} -> {g['error']}: {g['message']!r}")
        else:
            if w["tokens"] != g["tokens"]:
                diffs.append(f"{name}: tokens differ")
            for k in STATS:
                if not _close(w["stats"].get(k), g["stats"].get(k)):
                    diffs.append(f"{name}: stats.{k} {w['stats'].get(k)!r} -> {g['stats'].get(k)!r}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the stored file instead of writing it")
    ap.add_argument("--no-real", action="store_true", help="skip the SmolLM2 cases")
    ap.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                    help="only the cases whose name contains one of these (e.g. sd-tree smollm2); writing then "
                         "replaces just those cases in the stored file")
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    include_real = not args.no_real and real_available()
    names = [n for n, *_ in cases(include_real)]
    only = None
    if args.only is not None:
        only = {n for n in names if any(t in n for t in args.only)}
        if not only:
            ap.error(f"--only {' '.join(args.only)} matches no case (names look like {names[0]!r})")
    got = compute(include_real, verbose=True, only=only)
    if args.check:
        with open(GOLDEN) as f:
            want = json.load(f)["cases"]
        if not include_real:
            want = {k: v for k, v in want.items() if not k.startswith("smollm2")}
        if only is not None:
            want = {k: v for k, v in want.items() if k in only}
        diffs = differences(want, got)
        print("\n".join(diffs) if diffs else f"golden: {len(got)} cases reproduced")
        return 1 if diffs else 0
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    import jax
    if only is not None:  # replace just these cases
        with open(GOLDEN) as f:
            got = {**json.load(f)["cases"], **got}
    with open(GOLDEN, "w") as f:
        json.dump({"setting": SETTING, "prompts": PROMPTS, "jax": jax.__version__, "backend": jax.default_backend(),
                   "cases": got}, f, indent=0)
    n_err = sum("error" in v for v in got.values())
    print(f"wrote {GOLDEN}: {len(got)} cases ({n_err} record an error)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
