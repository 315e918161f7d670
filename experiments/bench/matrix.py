"""One benchmark matrix from one config file: methods × drafters × (N, K) × batch size, per pair, side by side.

    python -m experiments.bench.matrix --config experiments/bench_matrix.toml
    smcsd bench --config experiments/bench_matrix.toml                 # the same, from the command line
    python -m experiments.bench.matrix --config my.toml --only smollm2-135m --repeats 1

The config (TOML or JSON) has top-level defaults and a list of suites, one per pair:

    out = "experiments/results/bench_matrix.json"   # JSON; the plots go next to it (<stem>_*.png)
    repeats = 2                                      # timed rounds (interleaved)
    [[suites]]
    pair = "smollm2-135m"                            # a shipped pair (smcsd.available_models())
    methods = ["ar", "sd", "sd-tree", "smc", "flex", "sd-overlap"]
    drafters = ["ar-distilled", "dflash-dpace", "prompt-lookup"]   # names of smcsd.available_drafters(pair)
    ks = [4]                                          # draft lengths
    ns = [2]                                          # particles (smc) / drafts (sd-multi)
    batch_sizes = [1]
    max_new_tokens = 48
    temperature = 0.7
    prompts = 4                                       # requests per batch row set (cycled to fill a batch)
    quality = "fidelity"                              # "fidelity" (mean log p_T per token) or "accuracy" (tiny-arith)

Cells: `ar` once per batch size; `flex` with the pair's FlexDraft adapters per K; every other method per drafter and
K (and N for `sd-multi` / `smc`). A cell that does not apply is skipped with the reason (a drafter the pair does not
ship, `smc` with a drafter that does not cover the vocabulary, `sd-tree` with a chain-only drafter, K above what the
drafter drafts, FlexDraft adapters with another method, ...) and listed in the JSON.

Each cell runs once to compile, then --repeats rounds in which every cell of a (pair, batch size) group runs once,
round-robin (drift of a shared machine hits all alike). Per cell: tokens/s (median over rounds) and the speed-up
against `ar` (median of the paired per-round ratios), tokens per target call, mean acceptance length, accepted
fraction per draft position, for `smc` the mean ESS / N per cycle, and the quality of the outputs with a 95 %
bootstrap interval over requests × rounds: the target's mean log-probability per generated token under the processed
law (`fidelity`: `ar` and every exact method sample the same law, so their intervals must overlap) or, on
tiny-arith, exact-match accuracy.

Plots (matplotlib, per suite): speed-up vs quality with the 95 % intervals and the Pareto front marked, axes spanning
the data (not zero-based); mean acceptance length by drafter and K; smc's ESS over cycles; accepted fraction per
position. JSON: schema "smcsd.bench_matrix/1" with the config, the cells, the skipped cells with reasons, the plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

from experiments import common, report
from experiments.common import REPO

SCHEMA = "smcsd.bench_matrix/1"
SUITE_DEFAULTS = dict(methods=["ar", "sd"], drafters=None, ks=[4], ns=[2], batch_sizes=[1], max_new_tokens=48,
                      temperature=0.7, prompts=4, quality="fidelity", seed=0)
METHODS_WITH_N = ("sd-multi", "smc")


def load_config(path: str) -> dict:
    """The config file (TOML or JSON), with every suite's defaults filled in and its names checked."""
    if not os.path.isfile(path):
        raise SystemExit(f"--config {path}: no such file")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        if path.endswith(".json"):
            cfg = json.loads(raw)
        else:
            import tomllib
            cfg = tomllib.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise SystemExit(f"--config {path}: cannot parse it ({e})") from None
    suites = cfg.get("suites")
    if not isinstance(suites, list) or not suites:
        raise SystemExit(f"--config {path}: needs a non-empty list of [[suites]] (one per pair)")
    import smcsd
    out = []
    for i, s in enumerate(suites):
        unknown = sorted(set(s) - set(SUITE_DEFAULTS) - {"pair"})
        if unknown:
            raise SystemExit(f"--config {path}: suite {i} has unknown keys {unknown}; valid: pair, "
                             f"{', '.join(SUITE_DEFAULTS)}")
        if s.get("pair") not in smcsd.available_models():
            raise SystemExit(f"--config {path}: suite {i}: pair must be one of {smcsd.available_models()}, "
                             f"got {s.get('pair')!r}")
        s = {**SUITE_DEFAULTS, **s}
        bad = [m for m in s["methods"] if m not in smcsd.available_methods()]
        if bad:
            raise SystemExit(f"--config {path}: suite {i}: unknown methods {bad}; choose from "
                             f"{smcsd.available_methods()}")
        if s["quality"] not in ("fidelity", "accuracy"):
            raise SystemExit(f"--config {path}: suite {i}: quality must be 'fidelity' or 'accuracy'")
        if s["quality"] == "accuracy" and s["pair"] != "tiny-arith":
            raise SystemExit(f"--config {path}: suite {i}: quality 'accuracy' needs the tiny-arith pair")
        out.append(s)
    return {"out": cfg.get("out", report.results_path("bench_matrix.json")), "repeats": int(cfg.get("repeats", 2)),
            "suites": out}


# ----------------------------------------------------------------------------------- cells

def expand(suite: dict, drafters: dict) -> tuple[list[dict], list[dict]]:
    """(cells, skipped) of a suite. `drafters` maps name -> the loaded drafter (or the error loading it)."""
    cells, skipped = [], []

    def skip(method, name, reason, **kw):
        skipped.append(dict(pair=suite["pair"], method=method, drafter=name, reason=reason, **kw))

    for B in suite["batch_sizes"]:
        for method in suite["methods"]:
            if method == "ar":
                cells.append(dict(pair=suite["pair"], method="ar", drafter=None, N=None, K=None, batch=B))
                continue
            names = ["flex"] if method == "flex" else [n for n in suite["drafters"] if n != "flex"]
            if method != "flex" and "flex" in suite["drafters"] and B == suite["batch_sizes"][0]:
                skip(method, "flex", "FlexDraft adapters draft only inside method 'flex'")
            for name in names:
                d = drafters.get(name)
                if isinstance(d, Exception) or d is None:
                    if B == suite["batch_sizes"][0]:
                        skip(method, name, f"{suite['pair']} ships no drafter {name!r}" if d is None else str(d))
                    continue
                for K in suite["ks"]:
                    reason = applies(method, d, K)
                    if reason:
                        if B == suite["batch_sizes"][0]:
                            skip(method, name, reason, K=K)
                        continue
                    for N in (suite["ns"] if method in METHODS_WITH_N else [None]):
                        cells.append(dict(pair=suite["pair"], method=method, drafter=name, N=N, K=K, batch=B))
    return cells, skipped


def applies(method: str, drafter, K: int) -> str | None:
    """Why `method` cannot run with `drafter` at K (None: it can)."""
    limit = getattr(drafter, "max_tokens_per_proposal", None)
    if limit is not None and K > limit:
        return f"K={K} is more than {drafter.describe()} drafts per proposal ({limit})"
    if method == "smc" and not drafter.full_support:
        return f"smc weights by p/q and {drafter.describe()} does not give every token positive probability"
    if method == "sd-overlap" and getattr(drafter, "learns_online", False):
        return "sd-overlap does not pass sd's online feedback between its device groups"
    if method == "sd-tree":
        from smcsd.defaults import default_tree
        try:
            drafter.check_tree(default_tree(drafter, K))
        except ValueError as e:
            return str(e)
    return None


def label(c: dict) -> str:
    parts = [c["method"]]
    if c["drafter"] and c["method"] != "flex":
        parts.append(c["drafter"])
    if c["N"]:
        parts.append(f"N={c['N']}")
    if c["K"]:
        parts.append(f"K={c['K']}")
    return " ".join(parts)


# ----------------------------------------------------------------------------------- measuring

def bootstrap_ci(values, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95 % percentile-bootstrap interval over `values`."""
    import numpy as np
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    if len(v) == 1:
        return float(v[0]), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (reps, len(v)))].mean(axis=1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def prompts_for(pair: str, target, count: int):
    """(prompt token lists, stop ids, answers or None): chat requests for SmolLM2, held-out code for tiny-code,
    test problems for tiny-arith."""
    if pair == "tiny-arith":
        from experiments import arith_data
        probs = arith_data.test_set()[:count]
        return [target.tokenizer.encode(p.question) for p in probs], None, [p.answer for p in probs]
    if pair == "smollm2-135m":
        ps = common.chat_prompts(target, (common.BENCH_PROMPTS * (count // len(common.BENCH_PROMPTS) + 1))[:count])
        return ps, list(target.tokenizer.end_of_turn_ids), None
    prompts, stops, _ = common.pair_prompts(pair, target, count)
    return prompts, stops, None


def run_suite(suite: dict, repeats: int, progress: bool = True) -> dict:
    from tqdm import tqdm

    import smcsd
    from experiments.studies.fidelity import score

    pair = suite["pair"]
    dtype = "float32" if pair == "smollm2-135m" else None
    target = smcsd.load(pair, drafter="prompt-lookup", dtype=dtype)[0]
    shipped = smcsd.available_drafters(pair)
    drafters = {}
    for name in dict.fromkeys((suite["drafters"] or shipped) + (["flex"] if "flex" in suite["methods"] else [])):
        if name not in shipped:
            drafters[name] = None
            continue
        try:
            drafters[name] = smcsd.drafters.as_drafter(smcsd.load(pair, drafter=name, dtype=dtype)[1]).bind(target)
        except (ValueError, OSError) as e:
            drafters[name] = e
    suite = {**suite, "drafters": suite["drafters"] or [n for n in shipped if n != "flex"]}
    cells, skipped = expand(suite, drafters)
    prompts, stops, answers = prompts_for(pair, target, suite["prompts"])

    def batches_of(B):
        """Every prompt once per round: ceil(prompts / B) batches of B consecutive prompts (cycled)."""
        n = len(prompts)
        return [[prompts[(i * B + j) % n] for j in range(B)] for i in range(-(-n // B))]

    def run(c, seed):
        """One round of a cell: every batch once. Returns its stats pooled, and (prompts, outputs) pairs."""
        kw = dict(target=target, method=c["method"], temperature=suite["temperature"],
                  max_new_tokens=suite["max_new_tokens"], eos_id=stops)
        if c["method"] != "ar":
            kw.update(draft=drafters[c["drafter"]], num_speculative_tokens=c["K"])
        if c["N"]:
            kw["num_particles"] = c["N"]
        if c["method"] == "sd-tree":
            from smcsd.defaults import default_tree
            kw.pop("num_speculative_tokens")
            kw["tree"] = default_tree(drafters[c["drafter"]], c["K"])
        pooled = dict(tokens=0, wall=0.0, compile=0.0, accepted=0, drafts=0, emitted_after_first=0, live_calls=0,
                      per_position=[], ess=[])
        outputs = []
        for i, batch in enumerate(batches_of(c["batch"])):
            st_res = smcsd.decode(batch, seed=seed * 1000 + i, **kw)
            st = st_res.stats
            pooled["tokens"] += st.num_generated_tokens
            pooled["wall"] += st.wall_time_s
            pooled["compile"] += st.compile_time_s or 0.0
            pooled["accepted"] += st.num_accepted_tokens
            pooled["drafts"] += st.num_drafts
            pooled["emitted_after_first"] += sum(max(len(t) - 1, 0) for t in st_res.tokens)
            pooled["live_calls"] += sum(st.target_calls_per_request or [])
            app = list(st.accepted_per_position or [])
            pooled["per_position"] = [a + b for a, b in zip(app, pooled["per_position"] + [0] * len(app))] \
                if app else pooled["per_position"]
            pooled["ess"] += [[float(v) for v in (e if isinstance(e, (list, tuple)) else [e])]
                              for e in (st.ess_per_cycle or [])]
            outputs += list(zip(batch, st_res.tokens, st_res.texts or [None] * len(batch)))
        return pooled, outputs

    bar = tqdm(total=len(cells) * (1 + repeats), desc=f"bench {pair}", unit="run", disable=not progress,
               dynamic_ncols=True)
    rows = {id(c): dict(c, label=label(c), runs=[], quality=[]) for c in cells}
    for c in cells:  # compile (and a first, untimed round)
        bar.set_postfix_str(f"compile {label(c)} B={c['batch']}")
        t = time.perf_counter()
        pooled, _ = run(c, suite["seed"])
        rows[id(c)]["compile_s"] = pooled["compile"]
        rows[id(c)]["first_round_s"] = time.perf_counter() - t
        bar.update()
    for r, c in report.round_robin(cells, repeats):
        bar.set_postfix_str(f"round {r + 1}/{repeats} {label(c)} B={c['batch']}")
        p, outputs = run(c, suite["seed"] + 1 + r)
        row = rows[id(c)]
        row["runs"].append(dict(round=r, tokens_per_s=p["tokens"] / p["wall"], tokens=p["tokens"],
                                tokens_per_target_call=p["emitted_after_first"] / max(p["live_calls"], 1),
                                mean_acceptance_length=None if c["method"] == "ar" or not p["drafts"]
                                else 1 + p["accepted"] / p["drafts"],
                                accepted_per_position=p["per_position"], num_drafts=p["drafts"], ess=p["ess"]))
        if suite["quality"] == "accuracy":
            from experiments import arith_data
            key = {tuple(pr): a for pr, a in zip(prompts, answers)}
            row["quality"] += [float(arith_data.parse_answer(text) == key[tuple(pr)]) for pr, _, text in outputs]
        else:
            row["quality"] += [lp for lp, n in score(target, [o[0] for o in outputs], [o[1] for o in outputs],
                                                     suite["temperature"]) if n]
        bar.update()
    bar.close()

    out = []
    by_group = {}
    for c in cells:
        by_group.setdefault(c["batch"], []).append(rows[id(c)])
    for B, group in by_group.items():
        ar = next((g for g in group if g["method"] == "ar"), None)
        ar_by_round = {x["round"]: x["tokens_per_s"] for x in ar["runs"]} if ar else {}
        for row in group:
            runs = row.pop("runs")
            q = row.pop("quality")
            mean, lo, hi = bootstrap_ci(q)
            ratios = [x["tokens_per_s"] / ar_by_round[x["round"]] for x in runs if x["round"] in ar_by_round]
            drafts = sum(x["num_drafts"] or 0 for x in runs)
            per_pos = None
            if drafts and any(x["accepted_per_position"] for x in runs):
                width = max(len(x["accepted_per_position"]) for x in runs)
                tot = [sum((x["accepted_per_position"] + [0] * width)[k] for x in runs) for k in range(width)]
                per_pos = [t / drafts for t in tot]
            ess_curve = None
            if row["N"] and row["method"] == "smc":
                longest = max((len(x["ess"]) for x in runs), default=0)
                ess_curve = [statistics.fmean(v for x in runs if k < len(x["ess"]) for v in x["ess"][k]) / row["N"]
                             for k in range(longest)]
            mal = [x["mean_acceptance_length"] for x in runs if x["mean_acceptance_length"] is not None]
            out.append(dict(row, tokens_per_s=statistics.median(x["tokens_per_s"] for x in runs),
                            speedup_vs_ar=statistics.median(ratios) if ratios else None,
                            speedup_range=[min(ratios), max(ratios)] if ratios else None,
                            tokens_per_target_call=statistics.fmean(x["tokens_per_target_call"] for x in runs),
                            mean_acceptance_length=statistics.fmean(mal) if mal else None,
                            accepted_per_position=per_pos, ess_fraction_per_cycle=ess_curve,
                            quality=suite["quality"], quality_mean=mean, quality_ci95=[lo, hi],
                            quality_n=len(q)))
    return dict(suite=suite, target=dict(name=pair, params=target.num_params), cells=out, skipped=skipped,
                prompts=len(prompts))


# ----------------------------------------------------------------------------------- plots

def pareto(points) -> set[int]:
    """Indices not dominated in (x, y), both higher-is-better."""
    front = set()
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.add(i)
    return front


def plot_suite(res: dict, stem: str) -> dict:
    plt = report.pyplot()
    pair, cells = res["suite"]["pair"], res["cells"]
    paths = {}
    for B in sorted({c["batch"] for c in cells}):
        pts = [c for c in cells if c["batch"] == B and c["speedup_vs_ar"] is not None
               and not math.isnan(c["quality_mean"])]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
        xy = [(c["speedup_vs_ar"], c["quality_mean"]) for c in pts]
        front = pareto(xy)
        for i, c in enumerate(pts):
            lo, hi = c["quality_ci95"]
            yerr = None if math.isnan(lo) else [[c["quality_mean"] - lo], [hi - c["quality_mean"]]]
            xr = c["speedup_range"]
            xerr = [[c["speedup_vs_ar"] - xr[0]], [xr[1] - c["speedup_vs_ar"]]] if xr else None
            ax.errorbar([c["speedup_vs_ar"]], [c["quality_mean"]], xerr=xerr, yerr=yerr, fmt="o", ms=5, capsize=2,
                        color="black" if c["method"] == "ar" else None, zorder=3)
            ax.annotate(c["label"], (c["speedup_vs_ar"], c["quality_mean"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=6.5)
        fr = sorted((xy[i] for i in front), key=lambda p: p[0])
        ax.plot([p[0] for p in fr], [p[1] for p in fr], ls="--", color="black", lw=1, label="Pareto front", zorder=2)
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("speed-up vs ar (tokens/s ratio, median of paired rounds; bars: range over rounds)")
        q = res["suite"]["quality"]
        ax.set_ylabel("accuracy (exact match)" if q == "accuracy" else "mean log p_T per generated token")
        ax.set_title(f"{pair}, batch {B}: speed vs quality (95 % bootstrap intervals)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths[f"pareto_b{B}"] = report.savefig(fig, f"{stem}_{pair}_pareto_b{B}.png")

    acc = [c for c in cells if c["method"] == "sd" and c["mean_acceptance_length"] is not None
           and c["batch"] == min(x["batch"] for x in cells)]
    if acc:
        fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
        names = list(dict.fromkeys(c["drafter"] for c in acc))
        ks = sorted({c["K"] for c in acc})
        w = 0.8 / max(len(ks), 1)
        for j, K in enumerate(ks):
            vals = [next((c["mean_acceptance_length"] for c in acc if c["drafter"] == n and c["K"] == K), 0)
                    for n in names]
            ax.bar([i + j * w for i in range(len(names))], vals, width=w, label=f"K={K}")
        ax.set_xticks([i + w * (len(ks) - 1) / 2 for i in range(len(names))], names, rotation=20, fontsize=8)
        ax.set_ylabel("mean acceptance length (sd)")
        ax.set_title(f"{pair}: tokens per target call by drafter and K", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths["acceptance"] = report.savefig(fig, f"{stem}_{pair}_acceptance.png")

    smc = [c for c in cells if c["ess_fraction_per_cycle"]]
    if smc:
        fig, ax = plt.subplots(figsize=(6.5, 3.4), dpi=120)
        for c in smc:
            ax.plot(range(1, len(c["ess_fraction_per_cycle"]) + 1), c["ess_fraction_per_cycle"],
                    label=f"{c['label']} B={c['batch']}")
        ax.set_xlabel("cycle")
        ax.set_ylabel("mean ESS / N (before resampling)")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{pair}: smc's effective sample size over cycles", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths["ess"] = report.savefig(fig, f"{stem}_{pair}_ess.png")

    pos = [c for c in cells if c["accepted_per_position"] and c["method"] in ("sd", "sd-overlap", "flex")]
    if pos:
        fig, ax = plt.subplots(figsize=(6.5, 3.4), dpi=120)
        for c in pos:
            ax.plot(range(1, len(c["accepted_per_position"]) + 1), c["accepted_per_position"], marker="o", ms=3,
                    label=f"{c['label']} B={c['batch']}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("fraction of drafts accepted there")
        ax.set_title(f"{pair}: acceptance per position", fontsize=9)
        ax.legend(fontsize=6.5)
        fig.tight_layout()
        paths["per_position"] = report.savefig(fig, f"{stem}_{pair}_per_position.png")
    return paths


def markdown(results: list[dict]) -> str:
    parts = []
    for res in results:
        pair, q = res["suite"]["pair"], res["suite"]["quality"]
        body = [[c["batch"], c["label"], f"{c['tokens_per_s']:.1f}", report.fmt(c["speedup_vs_ar"], ".2f") + "×",
                 f"{c['tokens_per_target_call']:.2f}", report.fmt(c["mean_acceptance_length"], ".2f"),
                 f"{c['quality_mean']:.3f} [{report.fmt(c['quality_ci95'][0], '.3f')}, "
                 f"{report.fmt(c['quality_ci95'][1], '.3f')}]"] for c in res["cells"]]
        qname = "accuracy [95 % CI]" if q == "accuracy" else "log p_T / token [95 % CI]"
        parts.append(f"**{pair}** ({res['target']['params'] / 1e6:.1f}M params, {res['prompts']} prompts, "
                     f"T={res['suite']['temperature']}, {res['suite']['max_new_tokens']} new tokens)\n\n"
                     + report.markdown_table(["batch", "cell", "tok/s", "vs ar", "tokens/target call",
                                              "mean accept len", qname], body))
        if res["skipped"]:
            parts.append("Skipped: " + "; ".join(
                f"{s['method']} + {s['drafter']}{' K=' + str(s['K']) if s.get('K') else ''} ({s['reason']})"
                for s in res["skipped"]))
    return "\n\n".join(parts)


def release_programs() -> None:
    """Drop every compiled program before a suite (`smcsd.runtime.engine.release_programs`: a full matrix after make_docs'
    other benchmarks compiles enough executables to exhaust the per-process memory-map limit)."""
    from smcsd.runtime.engine import release_programs as release
    release()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="TOML or JSON config (module docstring)")
    ap.add_argument("--only", nargs="+", default=None, help="run only these pairs' suites")
    ap.add_argument("--repeats", type=int, default=None, help="override the config's timed rounds")
    ap.add_argument("--out", default=None, help="override the config's JSON path")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    repeats = args.repeats or cfg["repeats"]
    out = args.out or cfg["out"]
    if not os.path.isabs(out):
        out = os.path.join(REPO, out)
    stem = os.path.splitext(out)[0]
    t0 = time.time()
    results = []
    for i, suite in enumerate(cfg["suites"]):
        if args.only and suite["pair"] not in args.only:
            continue
        release_programs()
        res = run_suite(suite, repeats, progress=not args.no_progress)
        res["plots"] = plot_suite(res, f"{stem}_{i + 1}")  # suites may share a pair: numbered
        results.append(res)
        print(markdown([res]), flush=True)
    md = markdown(results)
    plots = [os.path.relpath(p, REPO) for res in results for p in res["plots"].values()]
    result = report.new_result(SCHEMA, machine=report.machine_info(), plots=plots, config=os.path.relpath(args.config, REPO)
                               if os.path.isabs(args.config) else args.config, repeats=repeats, suites=results,
                               markdown=md, wall_s=round(time.time() - t0, 1), command=report.command(__file__, argv))
    print("wrote", report.write_json(out, report.json_safe(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
