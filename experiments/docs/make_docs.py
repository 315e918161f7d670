"""Regenerate docs/benchmarks.md: run the speed benchmark(s), then write the page from the JSON results.

    python -m experiments.docs.make_docs              # full grid (minutes to an hour on a small CPU)
    python -m experiments.docs.make_docs --quick      # a 4-cell grid, B=1, 32 tokens: a couple of minutes
    python -m experiments.docs.make_docs --with-eval  # also run eval_arith for every plotted method/N/K
    python -m experiments.docs.make_docs --no-run     # only rewrite the page from the JSON already there

Steps:
1. `bench.speed` on the shipped tiny-code pair (a random pair if it isn't shipped) ->
   experiments/results/bench_speed.json (quick: experiments/results/quick/bench_speed.json).
2. If the tiny-arith pair is shipped and accuracy results exist (experiments/results/arith/*.json, or
   fresh ones with --with-eval), `bench.speed` on tiny-arith with those results -> the
   speed-vs-accuracy plot docs/figures/pareto_arith.png and its table.
3. Reads, when present, the JSON of experiments/studies/exactness.py, studies/roofline.py, studies/cost_model.py,
   bench/pair_cost.py, bench/ar.py and bench/resample.py (experiments/results/{exactness,roofline,
   cost_model,pair_cost,bench_ar,bench_resample}.json; see OTHER_RESULTS) and renders them as tables
   (a result JSON with a top-level "markdown" string is included verbatim); absent ones are skipped.
4. Writes docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys

from experiments import report
from experiments.common import DOCS, PACKAGE, REPO, RESULTS

FIGURES = os.path.join(DOCS, "figures")
# (file under experiments/results, section title, the script that writes it, preferred table columns or None)
SWEEP_COLUMNS = ["label", "accuracy", "n", "tokens_per_s", "speedup_vs_ar", "target_calls_per_token", "acceptance_rate",
                 "mean_ess_fraction"]
OTHER_RESULTS = [
    ("bench_real.json", "SmolLM2-135M-Instruct: ar against the weights-only ceiling and transformers",
     "python -m experiments.bench.real --peer-python PYTHON_WITH_TRANSFORMERS", None),
    ("bench_lookup.json", "SmolLM2-135M-Instruct: prompt lookup (sd + PromptLookup) on copy-heavy prompts, and "
     "transformers' prompt lookup on the same weights", "python -m experiments.bench.lookup --repeats 2 --peer-python "
     "PYTHON_WITH_TRANSFORMERS", None),
    ("bench_sampling.json", "Logits to a token at V = 49152: per-row cost, this sampler vs the sorting one",
     "python -m experiments.bench.sampling --baseline OLD_SAMPLING.py --rows 1 16 --repeats 10", None),
    ("bench_smollm2_pair.json", "SmolLM2-135M, side by side: ar, sd and smc with two drafters, and decode's default "
     "(batch 1 and 8, T=0.7)", "python -m experiments.bench.smollm2_pair --drafters ar-distilled dflash-dpace --sd-ks 2 4 "
     "--smc 1:4 2:4 4:4 --batch-sizes 1 8 --prompts 4 --repeats 1 --max-new-tokens 64", None),
    ("bench_pair_tiny-code.json", "tiny-code, side by side: ar, sd and smc with two drafters, and decode's default",
     "python -m experiments.bench.smollm2_pair --pair tiny-code --drafters ar-distilled dflash-dpace --sd-ks 2 4 --smc 1:4 "
     "2:4 4:4 8:4 --batch-sizes 1 8 --prompts 4 --repeats 2 --max-new-tokens 64", None),
    ("choose_defaults_tiny-code.json", "decode's defaults for tiny-code: candidates, speed, quality, the choice",
     "python -m experiments.studies.choose_defaults --pair tiny-code --quality-prompts 32 --quality-samples 4 --write", None),
    ("choose_defaults_tiny-arith.json", "decode's defaults for tiny-arith", "python -m experiments.studies.choose_defaults --pair "
     "tiny-arith --write", None),
    ("choose_defaults_smollm2-135m.json", "decode's defaults for SmolLM2-135M (T=0.7, the EAGLE-3 head; by batch size)",
     "python -m experiments.studies.choose_defaults --pair smollm2-135m --drafters eagle --sd-ks 2 3 4 --trees 2,1:top "
     "--smc 4:3 --corpus-heldout experiments/data/corpus/smollm2-135m --prompts 8 --rounds 2 --max-new-tokens 64 "
     "--batch-sizes 2 4 8 --write", None),
    ("choose_defaults_smollm2-135m_greedy.json", "decode's greedy defaults for SmolLM2-135M (T=0, the EAGLE-3 head; by "
     "batch size)", "python -m experiments.studies.choose_defaults --pair smollm2-135m --drafters eagle --temperature 0 "
     "--sd-ks 2 3 4 --trees 2,1:top 2,1,1:top --corpus-heldout experiments/data/corpus/smollm2-135m --prompts 8 "
     "--rounds 2 --max-new-tokens 64 --batch-sizes 2 4 8 --write", None),
    ("choose_defaults_smollm2-135m_intel-r-xeon-r-processor-2-cores.json", "decode's defaults for SmolLM2-135M on "
     "another CPU (Intel Xeon, 2 cores; this machine's own choice, T=0.7)", "python -m experiments.studies.choose_defaults "
     "--pair smollm2-135m --drafters eagle --sd-ks 1 2 3 --trees 2,1:top --smc 4:3 --corpus-heldout "
     "experiments/data/corpus/smollm2-135m --prompts 8 --rounds 2 --max-new-tokens 64 --batch-sizes 2 4 --write-machine",
     None),
    ("choose_defaults_smollm2-135m_greedy_intel-r-xeon-r-processor-2-cores.json", "decode's greedy defaults for "
     "SmolLM2-135M on another CPU (Intel Xeon, 2 cores; this machine's own choice, T=0)", "python -m "
     "experiments.studies.choose_defaults --pair smollm2-135m --drafters eagle --temperature 0 --sd-ks 1 2 3 --trees "
     "2,1:top --corpus-heldout experiments/data/corpus/smollm2-135m --prompts 8 --rounds 2 --max-new-tokens 64 "
     "--batch-sizes 2 4 --write-machine", None),
    ("bench_smollm2_eagle_batches_t07.json", "SmolLM2-135M with the EAGLE-3 head at batch 1, 2, 4 (T=0.7, 12 held-out "
     "requests): where sd stops paying", "python -m experiments.bench.smollm2_pair --corpus-heldout "
     "experiments/data/corpus/smollm2-135m --drafters eagle --sd-ks 2 --smc --trees 2,1:top --temperature 0.7 "
     "--max-new-tokens 96 --repeats 1 --batch-sizes 1 2 4 --prompts 12 --no-default", None),
    ("profile_smc_smollm2-135m.json", "Where an smc cycle goes on SmolLM2 (prompt 512): prompt KV shared vs copied",
     "python -m experiments.bench.profile_smc --pair smollm2-135m --drafter dflash-dpace --n 1 2 4 8 --k 4 --prompt-tokens 512 "
     "--repeats 5", None),
    ("profile_smc_tiny-code.json", "Where an smc cycle goes on tiny-code", "python -m experiments.bench.profile_smc --pair tiny-code "
     "--n 1 4 8 --k 4", None),
    ("fidelity_tiny-arith.json", "Fidelity of smc's outputs vs ar (tiny-arith): mean log p_T per token",
     "python -m experiments.studies.fidelity --pair tiny-arith --n 1 2 4 8 16 64 --k 3 --temperature 0.7 --prompts 64 --samples 4",
     None),
    ("fidelity_smollm2-135m.json", "Fidelity of smc's outputs vs ar (SmolLM2, dflash-dpace)",
     "python -m experiments.studies.fidelity --pair smollm2-135m --drafter dflash-dpace --n 1 2 4 8 16 64 --k 4 --prompts 6 "
     "--samples 2 --temperature 0.7 --max-new-tokens 48", None),
    ("tree_bench_tiny-code.json", "Token trees on tiny-code at equal verification budget (tokens per target call): "
     "chain, sd-multi, AR-draft tree, block-drafter tree, D²SD (T=0.7)", "python -m experiments.bench.tree --pair tiny-code "
     "--seeds 3", None),
    ("tree_bench_smollm2-135m.json", "Token trees on SmolLM2-135M, batch 1, side by side: tokens per call, tokens/s "
     "and projections", "python -m experiments.bench.tree --pair smollm2-135m --timing --budgets 5 9 10 13", None),
    ("pard2_study_tiny-code.json", "PARD-2 mask drafters on tiny-code: CAT vs uniform weights, one dual-mode drafter "
     "in both modes vs two separately trained ones (sd, K = 4 and 8, T = 0 and 0.7)", "python -m experiments.studies.pard2 "
     "--pair tiny-code --drafter cat=shipped uniform=DIR feat=DIR plain=DIR", None),
    ("bench_pard2_smollm2.json", "SmolLM2-135M, side by side: sd K=4 with the PARD-2 mask drafter vs the AR draft vs "
     "the DFlash drafter (batch 1 and 8, T=0.7)", "python -m experiments.bench.smollm2_pair --drafters ar-distilled "
     "dflash-dpace pard2 --sd-ks 4 --smc --batch-sizes 1 8 --prompts 4 --repeats 1 --max-new-tokens 64 --no-default "
     "--out experiments/results/bench_pard2_smollm2.json", None),
    ("pard2_study_smollm2-135m.json", "PARD-2 mask drafters on SmolLM2-135M: CAT vs uniform weights, dual mode vs "
     "specialised (sd, K = 4 and 8, T = 0 and 0.7)", "python -m experiments.studies.pard2 --pair smollm2-135m --prompts 8 "
     "--drafter cat=shipped uniform=DIR feat=DIR plain=DIR", None),
    ("draft_cost_smollm2-135m.json", "SmolLM2-135M: drafting cost per cycle (one propose) next to the verify call, "
     "each drafter, batch 1 and 8", "python -m experiments.bench.draft_cost --pair smollm2-135m --batch-sizes 1 8", None),
    ("dels_study_tiny-code.json", "DeLS-Spec on tiny-code: DFlash alone vs DFlash + local head, two block checkpoints, "
     "and the training cost of each", "python -m experiments.studies.dels --pair tiny-code", None),
    ("dels_study_smollm2-135m.json", "DeLS-Spec on SmolLM2-135M: DFlash alone vs DFlash + local head",
     "python -m experiments.studies.dels --pair smollm2-135m --prompts 8", None),
    ("specblock_study_tiny-code.json", "SpecBlock on tiny-code: chain vs DFlash with drafting cost, valid-prefix mask "
     "on/off, rank-head vs fixed top-k trees, online adaptation on a drifting workload",
     "python -m experiments.studies.specblock --pair tiny-code --novp DIR", None),
    ("flex_study_tiny-code.json", "FlexDraft on tiny-code: calibration on/off, confidence cut, and flex parallel / "
     "sequential vs sd and ar by batch size", "python -m experiments.studies.flex --pair tiny-code", None),
    ("bench_dels_specblock_smollm2.json", "SmolLM2-135M, batch 1, side by side: sd K=4 with DeLS-Spec (dels) and "
     "SpecBlock (specblock) against the DFlash drafter (dflash-dpace) and ar", "python -m experiments.bench.smollm2_pair "
     "--drafters dflash-dpace dels specblock --sd-ks 4 --smc --batch-sizes 1 --prompts 4 --repeats 2 "
     "--max-new-tokens 64 --no-default --out experiments/results/bench_dels_specblock_smollm2.json", None),
    ("specblock_study_smollm2-135m.json", "SpecBlock on SmolLM2-135M: chain vs DFlash with drafting cost, valid-prefix "
     "mask on/off, rank-head vs fixed top-k trees, online adaptation on a drifting workload",
     "python -m experiments.studies.specblock --pair smollm2-135m --novp DIR --prompts 8 --max-new 64 --drift-new 96", None),
    ("flex_study_smollm2-135m.json", "FlexDraft on SmolLM2-135M: calibration on/off, confidence cut, and flex parallel / "
     "sequential vs sd (the best separate drafters) and ar at batch 1, 4, 16; the switch point here and by the cost "
     "model", "python -m experiments.studies.flex --pair smollm2-135m --prompts 8 --seeds 2 --max-new 48 --repeats 2 "
     "--batch-sizes 1 4 16", None),
    ("flex_pack_smollm2-135m.json", "FlexDraft on SmolLM2-135M: the sequential mode's verify pass with ragged rows "
     "packed into a fixed token budget (batch 16, K = 8, tau = 0.1) against unpacked and ar",
     "python -m experiments.studies.flex --pair smollm2-135m --parts pack --prompts 8 --max-new 48 --repeats 2 "
     "--batch-sizes 16 --out experiments/results/flex_pack_smollm2-135m.json", None),
    ("overlap_bench.json", "sd-overlap (MineDraft) vs sd on 8 host devices, SmolLM2-135M + ar-distilled, batch 8-64: "
     "step time, the throughput model, the overlap timeline, projections", "python -m experiments.bench.overlap "
     "--batch-sizes 8 16 32 64 --max-new-tokens 16 --repeats 1", None),
    ("paper_check.json", "The cost model against the SMC-SD paper: Llama-3.1-70B + 3.2-1B on 4×H100, batch 1 (AR 65.0, "
     "SD 140.8, SMC-SD 342.0 tokens/s), pure roofline and with the bandwidth fitted on AR", "python -m experiments.studies.paper_check",
     None),
    ("projections.json", "Projected: every method (ar, sd, sd-multi, sd-tree, smc, flex, sd-overlap) on H100 / TPU v5e "
     "for SmolLM2-135M + its drafters, Llama-3.1-8B + 3.2-1B and Llama-3.1-70B + 3.2-1B (prompt 256, output 512, "
     "batch 1)", "python -m experiments.studies.projections", None),
    ("cost_model_8b1b.json", "Projected: Llama-3.1-8B + 3.2-1B on H100 / TPU v5e (prompt 256, output 512)",
     "python -m experiments.studies.cost_model --device h100 tpu-v5e --bench experiments/results/quick/bench_speed.json "
     "--acceptance 0.81 --pair llama3.1-8b+llama3.2-1b --batch-sizes 1 --num-particles 4 -K 4 "
     "--out experiments/results/cost_model_8b1b.json", None),
    ("cost_model_smollm2.json", "Projected: SmolLM2-135M + dflash-dpace on H100 / TPU v5e (prompt 256, output 512)",
     "python -m experiments.studies.cost_model --device h100 tpu-v5e --bench experiments/results/quick/bench_speed.json "
     "--acceptance 0.15 --pair smollm2-135m+dflash --batch-sizes 1 --num-particles 4 -K 4 "
     "--out experiments/results/cost_model_smollm2.json", None),
    ("sweep_arith.json", "tiny-arith: accuracy and speed of every method (the grid that picked the old defaults)",
     "python -m experiments.studies.sweep_arith", SWEEP_COLUMNS),
    ("sweep_arith_large_n.json", "tiny-arith: smc with many particles",
     "python -m experiments.studies.sweep_arith --sd-tokens --multi-particles --smc-particles 32 64 --smc-tokens 1 2 "
     "--out experiments/results/sweep_arith_large_n.json", SWEEP_COLUMNS),
    ("exactness.json", "Exactness: distance of each method's samples to p_T", "python -m experiments.studies.exactness",
     ["setting", "label", "samples", "tv", "noise_tv", "noise_bound", "within_noise", "chi2_per_df", "pvalue",
      "acceptance_rate"]),
    ("roofline.json", "Roofline", "python -m experiments.studies.roofline", None),
    ("cost_model.json", "Cost model", "python -m experiments.studies.cost_model", None),
    ("bench_sd.json", "Exact speculative baselines (sd, sd-multi) vs ar", "python -m experiments.bench.sd", None),
    ("pair_cost.json", "Per-token cost of draft vs target", "python -m experiments.bench.pair_cost", None),
    ("bench_ar.json", "ar alone: compile time and tokens/s", "python -m experiments.bench.ar", None),
    ("bench_resample.json", "Resampling schemes", "python -m experiments.bench.resample", None),
]

FULL = dict(methods=["ar", "sd", "sd-multi", "smc"], particles=[4, 8], spec_tokens=[2, 4], batch_sizes=[1, 8],
            max_new_tokens=64, repeats=5, warmup=1)
QUICK = dict(methods=["ar", "sd", "sd-multi", "smc"], particles=[4], spec_tokens=[4], batch_sizes=[1],
             max_new_tokens=32, repeats=2, warmup=1)
# The (method, N, K) points of the speed-vs-accuracy plot on tiny-arith (eval_arith runs one per point).
ARITH_FULL = [("ar", None, None), ("sd", None, 4), ("sd-multi", 4, 4), ("smc", 2, 4), ("smc", 4, 4), ("smc", 8, 4),
              ("smc", 4, 2)]
ARITH_QUICK = [("ar", None, None), ("sd", None, 4), ("smc", 4, 4)]


def _list(xs) -> list[str]:
    return [str(x) for x in xs]


def cell_spec(method, n, k) -> str:
    return method + (f",N={n}" if n else "") + (f",K={k}" if k else "")


def run_bench(out: str, model: str, grid: dict, *, temperature: float, accuracy: list[str] | None = None,
              plot: str | None = None, progress: bool = True, cells: list | None = None) -> dict:
    from experiments.bench import speed as bench_speed
    argv = ["--model", model]
    if cells:
        argv += ["--cells", *[cell_spec(*c) for c in cells]]
    else:
        argv += ["--methods", *grid["methods"], "--num-particles", *_list(grid["particles"]),
                 "--num-speculative-tokens", *_list(grid["spec_tokens"])]
    argv += ["--batch-sizes", *_list(grid["batch_sizes"]),
            "--max-new-tokens", str(grid["max_new_tokens"]), "--repeats", str(grid["repeats"]),
            "--warmup", str(grid["warmup"]), "--temperature", str(temperature), "--out", out]
    if accuracy:
        argv += ["--accuracy", *accuracy, "--plot", plot]
    if not progress:
        argv.append("--no-progress")
    print("+ bench_speed", " ".join(argv), flush=True)
    bench_speed.main(argv)
    with open(out) as f:
        return json.load(f)


def run_evals(points, out_dir: str, *, limit: int, temperature: float, progress: bool) -> list[str]:
    from experiments.studies import eval_arith
    paths = []
    for method, n, k in points:
        name = method + (f"_N{n}" if n else "") + (f"_K{k}" if k else "") + f"_T{temperature}_n{limit}.json"
        path = os.path.join(out_dir, name)
        argv = ["--method", method, "--temperature", str(temperature), "--limit", str(limit), "--out", path,
                "--batch-size", str(min(64, limit))]
        if n:
            argv += ["--num-particles", str(n)]
        if k:
            argv += ["--num-speculative-tokens", str(k)]
        if not progress:
            argv.append("--no-progress")
        print("+ eval_arith", " ".join(argv), flush=True)
        eval_arith.main(argv)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------- rendering

def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.3g}" if abs(v) < 1e3 else f"{v:.0f}"
    if isinstance(v, (list, dict)):
        return "…"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        elif not isinstance(v, list):
            out[name] = v
    return out


def table(rows: list[dict], columns: list[str] | None = None, max_columns: int = 14) -> str:
    flat = [_flatten(r) for r in rows]
    if columns is None:
        columns = []
        for r in flat:
            columns += [c for c in r if c not in columns]
        columns = columns[:max_columns]
    return report.markdown_table(columns, [[_cell(r.get(c)) for c in columns] for r in flat])


def render_generic(obj, columns: list[str] | None = None) -> str:
    """Best-effort markdown for a result JSON of unknown layout: its own `markdown` if it has one, else its
    scalar settings as a list, each list of records as a table (`columns` first choice, where present),
    each mapping of records as a table."""
    def records(rows):
        cols = None
        if columns:
            have = set().union(*(_flatten(r) for r in rows))
            cols = [c for c in columns if c in have] or None
        return table(rows, cols)

    if isinstance(obj, list):
        return records([o for o in obj if isinstance(o, dict)]) if any(isinstance(o, dict) for o in obj) else ""
    if not isinstance(obj, dict):
        return f"`{obj!r}`"
    if isinstance(obj.get("markdown"), str):
        return obj["markdown"]
    parts, scalars = [], []
    for k, v in obj.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            parts.append(f"**{k}**\n\n" + records(v))
        elif isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            parts.append(f"**{k}**\n\n" + table([{"": name, **x} for name, x in v.items()]))
        elif isinstance(v, dict):
            scalars += [(f"{k}.{kk}", vv) for kk, vv in _flatten(v).items()]
        elif not isinstance(v, list):
            scalars.append((k, v))
    head = "\n".join(f"- {k}: {_cell(v)}" for k, v in scalars[:20])
    return "\n\n".join(p for p in [head, *parts] if p)


def bench_section(res: dict, rel_json: str) -> str:
    from experiments.bench.speed import markdown_table
    s = res["settings"]
    m = res["model"]
    lines = [f"Model pair **{m['name']}** (target {m['target_params'] / 1e6:.2f}M params"
             + (f", draft {m['draft_params'] / 1e6:.2f}M" if m.get("draft_params") else "")
             + f") on `{res['device']}`, "
             f"jax {res['jax_version']}, {res['created']}. Temperature {s['temperature']}, top-k {s['top_k']}, "
             f"top-p {s['top_p']}; {s['max_new_tokens']} new tokens per request "
             + ("(EOS honoured)" if s.get("stop_at_eos") else "(EOS ignored)")
             + f"; tokens/s = median of {s['repeats']} interleaved rounds after {s['warmup']} warm-up run(s). "
             f"Raw numbers: [`{rel_json}`](../{rel_json}).", ""]
    if m["name"] == "random":
        lines += ["> **Random, untrained pair** (the shipped pair was not installed when this ran): acceptance and "
                  "ESS are not representative of trained models; the costs per call are.", ""]
    lines += [markdown_table(res["cells"]), ""]
    return "\n".join(lines)


COLUMNS_DOC = """\
Columns: **B** requests per batch; **N** particles (smc) or drafts (sd-multi); **K** draft tokens per
target call; **compile** seconds to compile the cell's program; **tokens/s** generated tokens over all
requests per second of decoding (compile excluded); **speed-up vs ar** the median over rounds of the
paired ratio to `ar` at the same B; **target calls/token** batched target forward passes (prefill
included) per generated token of a request (`ar` = 1); **tokens/target call** vLLM's
`tokens_per_target_call`; **acceptance** accepted / drafted tokens (smc never rejects: below 1 only
where EOS or max_new_tokens cuts a block);
**mean accept len** 1 + accepted per draft block; **ESS/N** smc's mean effective sample size over N
before resampling; **resamples** smc resampling events per call (all requests).
"""


def write_page(path: str, *, mode: str, command: str, code: dict | None, code_json: str | None,
               arith: dict | None, arith_json: str | None, pareto_png: str | None, others: list,
               matrix: dict | None = None, matrix_json: str | None = None) -> None:
    out = ["# Benchmarks", "",
           f"Generated by `{command}` ({mode} mode); do not edit by hand — rerun it. The numbers come from "
           "whatever machine ran it (shown with each table); on a shared CPU they are noisy, and speed-ups "
           "there say little about an accelerator, where a target call costs far more than a draft call.", ""]
    if matrix:  # the benchmark matrix leads: every method x drafter, speed vs quality
        out += ["## The benchmark matrix: every method × drafter", "",
                f"From `{matrix.get('command', 'smcsd bench --config experiments/bench_matrix.toml')}` "
                f"([`{matrix_json}`](../{matrix_json})): per pair, tokens/s and the speed-up over `ar` "
                "(median of paired interleaved rounds), tokens per target call, mean acceptance length, and the "
                "quality of the outputs with a 95 % bootstrap interval (mean log p_T per generated token, or "
                "exact-match accuracy on tiny-arith). The exact methods sample p_T itself, so their quality "
                "intervals must overlap `ar`'s; `smc` is consistent, not exact.", ""]
        for fig in _figures(matrix):
            out += [f"![{os.path.splitext(os.path.basename(fig))[0]}]({os.path.relpath(fig, DOCS)})", ""]
        out += [matrix["markdown"], ""]
    if code:
        out += ["## Speed", "", bench_section(code, code_json), COLUMNS_DOC]
    if arith and pareto_png:
        out += ["## Speed vs accuracy (tiny-arith)", ""]
        pts = arith.get("accuracy") or []
        out += [f"Accuracy: exact match on the tiny-arith test set (`experiments/studies/eval_arith.py`); speed: "
                f"`experiments.bench.speed` on the tiny-arith pair at batch size "
                f"{arith['settings'].get('plot_batch_size') or max(arith['settings']['batch_sizes'])}. "
                "Circled points are on the Pareto front (nothing is both faster and more accurate).", "",
                f"![speed vs accuracy]({os.path.relpath(pareto_png, DOCS)})", "",
                table(sorted(pts, key=lambda p: -p["tokens_per_s"]),
                      ["label", "tokens_per_s", "accuracy", "n", "on_front"]), "",
                bench_section(arith, arith_json)]
    for title, script, rel, obj, columns in others:
        out += [f"## {title}", "", f"From `{script}` ([`{rel}`](../{rel})).", ""]
        figure = _figure(obj, rel)
        if figure:
            out += [f"![{title}]({os.path.relpath(figure, DOCS)})", ""]
        for extra in _figures(obj):
            out += [f"![{os.path.splitext(os.path.basename(extra))[0]}]({os.path.relpath(extra, DOCS)})", ""]
        out += [render_generic(obj, columns), ""]
    missing = [f"`{script}`" for _, _, script, _ in OTHER_RESULTS if not any(o[1] == script for o in others)]
    if not code:
        missing.append("`experiments/bench/speed.py` (the tiny-pair speed grid: `docs/make_docs.py` without --no-run)")
    if not (arith and pareto_png):
        missing.append("the tiny-arith speed-vs-accuracy grid (`docs/make_docs.py --with-eval`)")
    if missing:
        out += ["## Not included", "", "No results yet from " + ", ".join(missing) + ".", ""]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(portable("\n".join(out)).rstrip() + "\n")


def portable(text: str) -> str:
    """`text` without this machine's paths: the repository's absolute path becomes relative, the home directory ~."""
    return text.replace(REPO + os.sep, "").replace(REPO, ".").replace(os.path.expanduser("~") + os.sep, "~/")


def _figure(obj, rel_json: str) -> str | None:
    """A result's own plot (its JSON's `plot` path, when the file exists), copied into docs/figures/."""
    src = obj.get("plot") if isinstance(obj, dict) else None
    if not isinstance(src, str):
        return None
    src = src if os.path.isabs(src) else os.path.join(REPO, src)
    if not os.path.isfile(src):
        return None
    os.makedirs(FIGURES, exist_ok=True)
    dst = os.path.join(FIGURES, os.path.splitext(os.path.basename(rel_json))[0] + os.path.splitext(src)[1])
    if os.path.abspath(src) != os.path.abspath(dst):
        shutil.copyfile(src, dst)
    return dst


def _figures(obj) -> list[str]:
    """A result's list of plots (its JSON's `plots`: paths), each copied into docs/figures/ under its own name."""
    paths = obj.get("plots") if isinstance(obj, dict) else None
    out = []
    for src in paths if isinstance(paths, list) else []:
        src = src if os.path.isabs(src) else os.path.join(REPO, src)
        if not os.path.isfile(src):
            continue
        os.makedirs(FIGURES, exist_ok=True)
        dst = os.path.join(FIGURES, os.path.basename(src))
        if os.path.abspath(src) != os.path.abspath(dst):
            shutil.copyfile(src, dst)
        out.append(dst)
    return out


def _load(path):
    if path and os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small grid (4 cells, B=1, 32 tokens, 2 rounds)")
    ap.add_argument("--no-run", action="store_true", help="run nothing: rewrite the page from existing JSON")
    ap.add_argument("--with-eval", action="store_true", help="run eval_arith for every point of the accuracy plot")
    ap.add_argument("--eval-limit", type=int, default=None, help="problems per eval (default 500; quick 50)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--model", default=None, help="pair for the speed table (default tiny-code, else random)")
    ap.add_argument("--out", default=os.path.join(DOCS, "benchmarks.md"))
    ap.add_argument("--matrix-config", default=os.path.join(PACKAGE, "bench_matrix.toml"),
                    help="the benchmark matrix's config (full mode runs it: experiments/bench/matrix.py)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    import smcsd
    shipped = smcsd.available_models()
    grid = QUICK if args.quick else FULL
    sub = os.path.join(RESULTS, "quick") if args.quick else RESULTS
    code_json = os.path.join(sub, "bench_speed.json")
    arith_json = os.path.join(sub, "bench_speed_arith.json")
    pareto_png = os.path.join(FIGURES, "pareto_arith.png")
    progress = not args.no_progress

    if not args.no_run:
        model = args.model or ("tiny-code" if "tiny-code" in shipped else "random")
        run_bench(code_json, model, grid, temperature=args.temperature, progress=progress)
    code = _load(code_json)

    arith = None
    if "tiny-arith" in shipped:
        acc_dir = os.path.join(RESULTS, "arith")
        points = ARITH_QUICK if args.quick else ARITH_FULL
        if args.with_eval and not args.no_run:
            limit = args.eval_limit or (50 if args.quick else 500)
            run_evals(points, os.path.join(acc_dir, "grid"), limit=limit, temperature=args.temperature,
                      progress=progress)
        acc_files = sorted(glob.glob(os.path.join(acc_dir, "**", "*.json"), recursive=True))
        if acc_files and not args.no_run:
            from experiments.bench.speed import make_key, read_accuracy
            for e in read_accuracy(acc_files):  # also bench every point that has an accuracy result
                st = e["settings"]
                same_t = abs(float(st.get("temperature", -1)) - args.temperature) < 1e-9
                if st.get("model", "target") == "target" and same_t:
                    key = make_key(st["method"], st.get("num_particles", 1), st.get("num_speculative_tokens", 1))
                    points = points + [key] if key not in points else points
            run_bench(arith_json, "tiny-arith", dict(grid, batch_sizes=[max(grid["batch_sizes"])]),
                      temperature=args.temperature, accuracy=[acc_dir], plot=pareto_png, progress=progress,
                      cells=points)
        arith = _load(arith_json)
    if arith is None or not arith.get("plot"):
        pareto_png_used = None
    else:
        pareto_png_used = arith["plot"]
        if os.path.abspath(pareto_png_used) != os.path.abspath(pareto_png):
            os.makedirs(FIGURES, exist_ok=True)
            shutil.copyfile(pareto_png_used, pareto_png)
        pareto_png_used = pareto_png

    matrix_path = os.path.join(sub, "bench_matrix.json")
    if not args.no_run and not args.quick:  # the matrix of every method x drafter (experiments/bench_matrix.toml)
        from experiments.bench import matrix as bench_matrix
        bench_matrix.main(["--config", args.matrix_config, "--out", matrix_path]
                          + ([] if progress else ["--no-progress"]))
    matrix = _load(matrix_path)

    others = []
    for fname, title, script, columns in OTHER_RESULTS:
        path = os.path.join(RESULTS, fname)
        obj = _load(path)
        if obj is not None:
            others.append((title, script, os.path.relpath(path, REPO), obj, columns))
    command = "python -m experiments.docs.make_docs" + (" --quick" if args.quick else "") + \
              (" --with-eval" if args.with_eval else "")
    write_page(args.out, mode="quick" if args.quick else "full", command=command, code=code,
               code_json=os.path.relpath(code_json, REPO), arith=arith,
               arith_json=os.path.relpath(arith_json, REPO) if arith else None, pareto_png=pareto_png_used,
               others=others, matrix=matrix, matrix_json=os.path.relpath(matrix_path, REPO) if matrix else None)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
