"""Speed of the decoding methods on one machine: methods x particles N x draft length K x batch size.

    python -m experiments.bench.speed --methods ar sd sd-multi smc --num-particles 4 8 \\
        --num-speculative-tokens 2 4 --batch-sizes 1 4 --out experiments/results/bench_speed.json
    smcsd bench --model random --methods ar smc --batch-sizes 1 --repeats 3
    smcsd bench --cells ar sd,K=4 smc,N=8,K=4 --batch-sizes 1 8
    smcsd bench --model tiny-arith --accuracy experiments/results/arith --plot pareto.png

Cells: `ar` once per batch size, `sd` per K, `sd-multi` and `smc` per (N, K). Every cell first runs
once to compile (compile_time_s), then --warmup untimed runs, then --repeats timed *rounds*: each
round runs every cell once, round-robin (starting one cell later each round), so drift of a shared
machine hits every cell alike. tokens/s is the median over rounds; the speed-up vs `ar` is the median
over rounds of the paired ratio (cell tokens/s / `ar` tokens/s at the same batch size, same round).
EOS is ignored by default (--stop-at-eos to honour it), so each request makes --max-new-tokens tokens.
With --accuracy (JSON results of experiments/studies/eval_arith.py, or directories of them) it draws a
speed-vs-accuracy plot: one point per method/N/K (tokens/s at --plot-batch-size), the Pareto front marked.

JSON written to --out:
  schema            "smcsd.bench_speed/1"
  created           ISO time; device, platform, jax_version: where it ran
  model             {name, target, draft, target_params, draft_params}
  settings          the command-line settings (temperature, max_new_tokens, repeats, prompts, ...)
  cells             one object per cell:
    label             e.g. "smc N=4 K=4"; method, batch_size, num_particles, num_speculative_tokens
                      (null where the method has none: ar has neither, sd has no N)
    compile_time_s    seconds to compile the cell's program (0 if it was already compiled in-process)
    first_call_s      the whole first call, compile included
    tokens_per_s      median over rounds of generated tokens (all requests) / decode wall time
    tokens_per_s_runs the per-round values, in round order
    wall_s            median decode wall time of one call (all requests)
    speedup_vs_ar     median paired ratio to `ar` at the same batch size (null without an ar cell)
    tokens_per_request mean generated tokens per request
    target_calls      mean batched target forward passes per call, prefill included
    target_calls_per_token  target_calls / tokens_per_request (ar: 1; lower is better)
    tokens_per_target_call  vLLM's definition (DecodeStats.tokens_per_target_call)
    draft_calls       mean batched draft forward passes per call
    acceptance_rate, mean_acceptance_length   mean over rounds (null for ar)
    mean_ess_fraction smc: mean over cycles and requests of ESS / N, before resampling (else null)
    resamples         smc: mean resampling events per call, summed over requests (else null)
    resample_rate     smc: resampling events / (cycles x requests) (else null)
    cache_len         KV-cache slots of the compiled program
  accuracy          (with --accuracy) per matched eval: label, method, num_particles,
                    num_speculative_tokens, accuracy, n, tokens_per_s (from this bench), on_front, file
  plot              path of the speed-vs-accuracy PNG, or null
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import statistics
import sys

from experiments import report

DEFAULT_OUT = report.results_path("bench_speed.json")
SCHEMA = "smcsd.bench_speed/1"
# The documented JSON fields (module docstring); tests check the output against these.
TOP_FIELDS = ("schema", "created", "device", "platform", "jax_version", "model", "settings", "cells", "accuracy",
              "plot")
CELL_FIELDS = ("label", "method", "batch_size", "num_particles", "num_speculative_tokens", "compile_time_s",
               "first_call_s", "tokens_per_s", "tokens_per_s_runs", "wall_s", "speedup_vs_ar", "tokens_per_request",
               "target_calls", "target_calls_per_token", "tokens_per_target_call", "draft_calls", "acceptance_rate",
               "mean_acceptance_length", "mean_ess_fraction", "resamples", "resample_rate", "cache_len")
CODE_PROMPTS = ["def fibonacci(n):", "import numpy as np\n", "class Stack:\n    def __init__(self):",
                "for i in range(10):", "def parse_args(argv):", "with open(path) as f:",
                "if __name__ == \"__main__\":", "def quicksort(xs):"]


@dataclasses.dataclass(frozen=True)
class Cell:
    method: str
    batch_size: int
    num_particles: int | None = None
    num_speculative_tokens: int | None = None

    @property
    def label(self) -> str:
        parts = [self.method]
        if self.num_particles is not None:
            parts.append(f"N={self.num_particles}")
        if self.num_speculative_tokens is not None:
            parts.append(f"K={self.num_speculative_tokens}")
        return " ".join(parts)

    @property
    def key(self) -> tuple:
        """(method, N, K): what identifies a point of the speed-vs-accuracy plot."""
        return (self.method, self.num_particles, self.num_speculative_tokens)


def make_key(method: str, num_particles, num_speculative_tokens) -> tuple:
    """Normalise (method, N, K): ar uses neither, sd has one draft (no N)."""
    if method == "ar":
        return ("ar", None, None)
    if method == "sd":
        return ("sd", None, int(num_speculative_tokens))
    return (method, int(num_particles), int(num_speculative_tokens))


def make_cells(methods, batch_sizes, particles, spec_tokens) -> list[Cell]:
    cells = []
    for b in batch_sizes:
        for m in methods:
            ns = [None] if m in ("ar", "sd") else particles
            ks = [None] if m == "ar" else spec_tokens
            for n in ns:
                for k in ks:
                    c = Cell(m, b, n, k)
                    if c not in cells:
                        cells.append(c)
    return cells


def parse_cell_spec(text: str) -> tuple:
    """'smc,N=4,K=4' / 'sd,K=4' / 'ar' -> (method, N, K), normalised by `make_key`."""
    method, *opts = [t.strip() for t in text.split(",")]
    kv = {}
    for o in opts:
        name, _, value = o.partition("=")
        if name not in ("N", "K") or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"bad cell {text!r}: write METHOD[,N=n][,K=k], e.g. smc,N=4,K=4")
        kv[name] = int(value)
    from smcsd.cli import method_type
    method = method_type(method)
    if method != "ar" and "K" not in kv or method in ("sd-multi", "smc") and "N" not in kv:
        raise argparse.ArgumentTypeError(f"bad cell {text!r}: {method} needs "
                                         + ("N= and K=" if method in ("sd-multi", "smc") else "K="))
    return make_key(method, kv.get("N"), kv.get("K"))


def decode_kwargs(cell: Cell) -> dict:
    kw = {"method": cell.method}
    if cell.method != "ar":  # sd: N is unused, fix it so it never splits compiled programs
        kw["num_particles"] = cell.num_particles or 1
        kw["num_speculative_tokens"] = cell.num_speculative_tokens
    return kw


def prompts_for(model_name: str, batch_size: int, given: list[str] | None) -> list[str]:
    pool = given
    if not pool and model_name == "tiny-arith":
        from experiments import arith_data
        pool = [p.question for p in arith_data.test_set()[:16]]
    pool = pool or CODE_PROMPTS
    return [pool[i % len(pool)] for i in range(batch_size)]


# ----------------------------------------------------------------------------------- measuring

def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def summarize(cell: Cell, first, runs: list, ar_runs: list | None) -> dict:
    """One cell's row from its first call's stats and the timed rounds' stats."""
    tps = [s.tokens_per_s for s in runs]
    per_req = _mean([s.num_generated_tokens / max(s.batch_size, 1) for s in runs])
    calls = _mean([s.num_prefill_calls + s.num_target_calls for s in runs])
    row = dict(label=cell.label, method=cell.method, batch_size=cell.batch_size, num_particles=cell.num_particles,
               num_speculative_tokens=cell.num_speculative_tokens,
               compile_time_s=first["stats"].compile_time_s, first_call_s=first["call_s"],
               tokens_per_s=statistics.median(tps), tokens_per_s_runs=tps,
               wall_s=statistics.median(s.wall_time_s for s in runs),
               speedup_vs_ar=None, tokens_per_request=per_req, target_calls=calls,
               target_calls_per_token=calls / per_req if per_req else None,
               tokens_per_target_call=_mean([s.tokens_per_target_call for s in runs]),
               draft_calls=_mean([s.num_draft_calls for s in runs]),
               acceptance_rate=None, mean_acceptance_length=None,
               mean_ess_fraction=None, resamples=None, resample_rate=None, cache_len=first["stats"].cache_len)
    if cell.method != "ar":
        row["acceptance_rate"] = _mean([s.acceptance_rate for s in runs])
        row["mean_acceptance_length"] = _mean([s.mean_acceptance_length for s in runs])
    if ar_runs:
        row["speedup_vs_ar"] = statistics.median(s.tokens_per_s / a.tokens_per_s for s, a in zip(runs, ar_runs))
    ess = [s.ess_per_cycle for s in runs if s.ess_per_cycle]
    if ess and cell.num_particles:
        flat = [v for per_run in ess for cyc in per_run for v in (cyc if isinstance(cyc, list) else [cyc])]
        row["mean_ess_fraction"] = _mean(flat) / cell.num_particles if flat else None
    if any(s.num_resamples is not None for s in runs):
        row["resamples"] = _mean([s.num_resamples for s in runs])
        slots = [sum(len(c) if isinstance(c, list) else 1 for c in s.resampled_per_cycle)
                 for s in runs if s.resampled_per_cycle]
        row["resample_rate"] = (sum(s.num_resamples or 0 for s in runs) / sum(slots)) if sum(slots) else None
    return row


def run_grid(cells: list[Cell], target, draft, *, model_name: str, prompts: list[str] | None, max_new_tokens: int,
             temperature: float, top_k: int, top_p: float, seed: int, warmup: int, repeats: int, eos_id,
             ess_threshold: float, resampler: str, progress: bool = True) -> list[dict]:
    """Compile every cell, warm up, then `repeats` round-robin rounds; one summary row per cell."""
    import time

    from tqdm import tqdm

    import smcsd

    common = dict(target=target, draft=draft, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                  top_p=top_p, eos_id=eos_id, ess_threshold=ess_threshold, resampler=resampler)
    batches = {c.batch_size: prompts_for(model_name, c.batch_size, prompts) for c in cells}

    def run(cell: Cell, s: int):
        return smcsd.decode(batches[cell.batch_size], seed=s, **common, **decode_kwargs(cell)).stats

    bar = tqdm(total=len(cells) * (1 + warmup + repeats), desc="bench", unit="run", disable=not progress,
               dynamic_ncols=True)
    first = {}
    for c in cells:  # compile (the first call of each cell)
        bar.set_postfix_str(f"compile {c.label} B={c.batch_size}")
        t = time.perf_counter()
        stats = run(c, seed)
        first[c] = {"stats": stats, "call_s": time.perf_counter() - t}
        bar.update()
    for w in range(warmup):
        for c in cells:
            bar.set_postfix_str(f"warm-up {c.label} B={c.batch_size}")
            run(c, seed + 1 + w)
            bar.update()
    runs = {c: [None] * repeats for c in cells}
    for r, c in report.round_robin(cells, repeats):  # every cell once per round, starting one later each round
        bar.set_postfix_str(f"round {r + 1}/{repeats} {c.label} B={c.batch_size}")
        runs[c][r] = run(c, seed + 1000 + r)
        bar.update()
    bar.close()
    ar_cells = {c.batch_size: c for c in cells if c.method == "ar"}
    rows = []
    for c in cells:
        ar = ar_cells.get(c.batch_size)
        rows.append(summarize(c, first[c], runs[c], runs[ar] if ar is not None else None))
    return rows


# ----------------------------------------------------------------------------------- reporting

def markdown_table(rows: list[dict]) -> str:
    fmt = report.fmt
    return report.markdown_table(
        ["method", "B", "N", "K", "compile (s)", "tokens/s", "speed-up vs ar", "target calls/token",
         "tokens/target call", "acceptance", "mean accept len", "ESS/N", "resamples"],
        [[r["method"], r["batch_size"], fmt(r["num_particles"], "d"), fmt(r["num_speculative_tokens"], "d"),
          fmt(r["compile_time_s"], ".1f"), fmt(r["tokens_per_s"], ".0f"),
          fmt(r["speedup_vs_ar"], ".2f") + ("×" if r["speedup_vs_ar"] is not None else ""),
          fmt(r["target_calls_per_token"], ".3f"), fmt(r["tokens_per_target_call"], ".2f"),
          fmt(r["acceptance_rate"], ".2f"), fmt(r["mean_acceptance_length"], ".2f"),
          fmt(r["mean_ess_fraction"], ".2f"), fmt(r["resamples"], ".1f")] for r in rows])


# ----------------------------------------------------------------------------------- speed vs accuracy

def _warn(message: str) -> None:
    print(f"bench_speed: warning: {message}", file=sys.stderr)


def read_accuracy(paths: list[str]) -> list[dict]:
    """eval_arith JSON results (files, or directories of *.json) as dicts with a `file` entry."""
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True)) if os.path.isdir(p) else [p]
    out = []
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"--accuracy {f}: no such file")
        with open(f) as fh:
            try:
                d = json.load(fh)
            except ValueError as e:
                raise ValueError(f"--accuracy {f}: not valid JSON ({e})") from None
        if not isinstance(d, dict) or "accuracy" not in d or "method" not in d.get("settings", {}):
            _warn(f"--accuracy {f}: not an eval_arith result (needs accuracy and settings.method); skipped")
            continue
        d["file"] = f
        out.append(d)
    return out


def match_accuracy(rows: list[dict], evals: list[dict], batch_size: int, temperature: float) -> list[dict]:
    """One point per (method, N, K) present in both: accuracy from the eval, tokens/s from this bench."""
    speed = {make_key(r["method"], r["num_particles"], r["num_speculative_tokens"]): r
             for r in rows if r["batch_size"] == batch_size}
    points = {}
    for e in evals:
        s = e["settings"]
        if s.get("model", "target") != "target":
            continue  # the draft evaluated alone has no bench cell
        key = make_key(s["method"], s.get("num_particles", 1), s.get("num_speculative_tokens", 1))
        if key not in speed:
            _warn(f"accuracy result {e['file']} ({' '.join(str(k) for k in key if k is not None)}) has no "
                  f"bench cell at batch size {batch_size}; not plotted")
            continue
        if s.get("temperature") is not None and abs(float(s["temperature"]) - temperature) > 1e-9:
            _warn(f"accuracy result {e['file']} is at temperature {s['temperature']}, the bench at {temperature}; "
                  "not plotted")
            continue
        if key in points and points[key]["n"] >= e.get("n", 0):
            continue  # keep the eval over the most problems
        r = speed[key]
        points[key] = dict(label=r["label"], method=r["method"], num_particles=r["num_particles"],
                           num_speculative_tokens=r["num_speculative_tokens"], accuracy=float(e["accuracy"]),
                           n=int(e.get("n", 0)), tokens_per_s=r["tokens_per_s"], file=e["file"])
    pts = list(points.values())
    front = pareto_front([(p["tokens_per_s"], p["accuracy"]) for p in pts])
    for i, p in enumerate(pts):
        p["on_front"] = i in front
    return pts


def pareto_front(xy: list[tuple[float, float]]) -> set[int]:
    """Indices of the points no other point beats in both speed (x) and accuracy (y)."""
    front, best_y = set(), -math.inf
    for i in sorted(range(len(xy)), key=lambda i: (-xy[i][0], -xy[i][1])):
        if xy[i][1] > best_y:
            front.add(i)
            best_y = xy[i][1]
    return front


def plot_pareto(points: list[dict], path: str, title: str) -> str:
    plt = report.pyplot()
    colors = {"ar": "tab:gray", "sd": "tab:blue", "sd-multi": "tab:green", "smc": "tab:red"}
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for m in sorted({p["method"] for p in points}):
        ps = [p for p in points if p["method"] == m]
        ax.scatter([p["tokens_per_s"] for p in ps], [p["accuracy"] for p in ps], label=m,
                   color=colors.get(m, None), s=36, zorder=3)
    for p in points:
        ax.annotate(p["label"], (p["tokens_per_s"], p["accuracy"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
    front = sorted((p for p in points if p["on_front"]), key=lambda p: p["tokens_per_s"])
    if front:
        ax.step([p["tokens_per_s"] for p in front], [p["accuracy"] for p in front], where="post", color="black",
                lw=1, ls="--", zorder=2, label="Pareto front")
        ax.scatter([p["tokens_per_s"] for p in front], [p["accuracy"] for p in front], s=110, facecolors="none",
                   edgecolors="black", zorder=4)
    ax.set_xlabel("tokens / s (higher is faster)")
    ax.set_ylabel("accuracy (exact match)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return report.savefig(fig, path)


# ----------------------------------------------------------------------------------- main

def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from smcsd.cli import OneLineParser, add_model_args, fraction_type, nonneg_int, positive_int, temperature_type
    from smcsd.cli import method_type, resampler_type, top_p_type
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("grid")
    g.add_argument("--methods", nargs="+", type=method_type, default=["ar", "sd", "sd-multi", "smc"],
                   metavar="METHOD", help="methods to run (default: ar sd sd-multi smc)")
    g.add_argument("--num-particles", "-N", nargs="+", type=positive_int, default=[4], metavar="N",
                   help="particles (smc) / drafts (sd-multi) (default: 4)")
    g.add_argument("--num-speculative-tokens", "-K", nargs="+", type=positive_int, default=[4], metavar="K",
                   help="draft tokens per target call (default: 4)")
    g.add_argument("--cells", nargs="+", type=parse_cell_spec, default=None, metavar="SPEC",
                   help="explicit (method, N, K) points instead of the product of the three flags above, "
                        "e.g. ar sd,K=4 smc,N=4,K=4 (each at every batch size)")
    g.add_argument("--batch-sizes", "-B", nargs="+", type=positive_int, default=[1, 4], metavar="B",
                   help="requests decoded together (default: 1 4)")
    add_model_args(ap)
    s = ap.add_argument_group("decoding")
    s.add_argument("--temperature", type=temperature_type, default=0.7, metavar="T", help="(default: 0.7)")
    s.add_argument("--top-k", type=nonneg_int, default=0, metavar="K", help="(default: 0 = off)")
    s.add_argument("--top-p", type=top_p_type, default=1.0, metavar="P", help="(default: 1 = off)")
    s.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N", help="(default: 64)")
    s.add_argument("--ess-threshold", type=fraction_type, default=0.5, metavar="TAU", help="smc (default: 0.5)")
    s.add_argument("--resampler", type=resampler_type, default="systematic", help="smc (default: systematic)")
    s.add_argument("--stop-at-eos", action="store_true",
                   help="stop requests at EOS (default: ignore EOS, so every call makes --max-new-tokens)")
    s.add_argument("--prompts", nargs="+", default=None, metavar="TEXT",
                   help="prompts, cycled to fill a batch (default: code prompts; tiny-arith: test questions)")
    s.add_argument("--seed", type=nonneg_int, default=0)
    t = ap.add_argument_group("timing")
    t.add_argument("--repeats", type=positive_int, default=3,
                   help="timed rounds; tokens/s is their median (default: 3)")
    t.add_argument("--warmup", type=nonneg_int, default=1, help="untimed runs per cell after compiling (default: 1)")
    o = ap.add_argument_group("output")
    o.add_argument("--out", default=DEFAULT_OUT, metavar="JSON", help="(default: experiments/results/bench_speed.json)")
    o.add_argument("--accuracy", nargs="+", default=None, metavar="JSON",
                   help="eval_arith JSON results (or directories of them) for the speed-vs-accuracy plot")
    o.add_argument("--plot", default=None, metavar="PNG",
                   help="speed-vs-accuracy plot path (default with --accuracy: --out with .png)")
    o.add_argument("--plot-batch-size", type=positive_int, default=None, metavar="B",
                   help="batch size whose tokens/s the plot uses (default: the largest)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None, prog: str | None = None) -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    import jax

    from smcsd.cli import load_models

    plot_b = args.plot_batch_size or max(args.batch_sizes)
    if args.plot_batch_size and args.plot_batch_size not in args.batch_sizes:
        ap.error(f"argument --plot-batch-size: {args.plot_batch_size} is not one of --batch-sizes")
    evals = read_accuracy(args.accuracy) if args.accuracy else []  # fail early on a bad file
    if args.plot and not args.accuracy:
        ap.error("argument --plot: the speed-vs-accuracy plot needs --accuracy JSON results")

    model_name = args.model or ("local" if args.target else "tiny-code")
    target, draft = load_models(args.model, args.target, args.draft)
    if args.cells:
        cells = [Cell(m, b, n, k) for b in args.batch_sizes for (m, n, k) in dict.fromkeys(args.cells)]
    else:
        cells = make_cells(args.methods, args.batch_sizes, args.num_particles, args.num_speculative_tokens)
    if draft is None and any(c.method != "ar" for c in cells):
        ap.error("argument --draft: the speculative methods need a draft model (give --draft DIR)")
    rows = run_grid(cells, target, draft, model_name=model_name, prompts=args.prompts,
                    max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, warmup=args.warmup, repeats=args.repeats,
                    eos_id=None if args.stop_at_eos else [], ess_threshold=args.ess_threshold,
                    resampler=args.resampler, progress=not args.no_progress)

    device, platform = report.device_info(count=True)
    result = report.new_result(
        SCHEMA, device=device, platform=platform, jax_version=jax.__version__,
        model={"name": model_name, "target": target.name, "draft": draft.name if draft is not None else None,
               "target_params": target.num_params, "draft_params": draft.num_params if draft is not None else None},
        settings={k: v for k, v in vars(args).items() if k not in ("no_progress",)},
        cells=rows, accuracy=None, plot=None)
    print(f"\n{model_name} on {device}: temperature {args.temperature}, {args.max_new_tokens} new tokens, "
          f"median of {args.repeats} interleaved rounds")
    print(markdown_table(rows))
    if evals:
        points = match_accuracy(rows, evals, plot_b, args.temperature)
        result["accuracy"] = points
        if points:
            path = args.plot or os.path.splitext(args.out)[0] + ".png"
            title = (f"speed vs accuracy: {model_name}, T={args.temperature}, batch {plot_b}, "
                     f"{args.max_new_tokens} new tokens ({device})")
            result["plot"] = plot_pareto(points, path, title)
            print("wrote", path)
        else:
            print("no accuracy result matches a bench cell: no plot", file=sys.stderr)
    print("wrote", report.write_json(args.out, report.json_safe(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
