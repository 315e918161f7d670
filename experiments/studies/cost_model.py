"""Predicted decoding speed (tokens/s) of `ar`, `sd`, `sd-multi` and `smc` for real model pairs on real
devices, from measured acceptance / ESS statistics and a memory-bandwidth roofline per call.

    python -m experiments.studies.cost_model                                   # presets + this machine's check
    python -m experiments.studies.cost_model --device h100 tpu-v5e --bench experiments/results/bench_speed.json
    python -m experiments.studies.cost_model --device cpu-measured --roofline experiments/results/roofline.json
    python -m experiments.studies.cost_model --device h100 --fitted h200_fit.json --bench experiments/results/bench_speed.json
        # also project on a device refitted from a measured run (smcsd device-check --fit; docs/device_check.md)

Assumptions (also printed with every run and stored in the JSON):
 1. Every model call (draft or target forward) is a roofline call:
        time = max(bytes / bandwidth, FLOPs / peak FLOP rate) + fixed overhead + sampling
        (on a CPU the sum bytes / bandwidth + FLOPs / peak: its cores don't overlap the two),
    bytes = weights read + KV bytes attended, FLOPs = 2 × matmul params × tokens + attention
    (experiments/studies/roofline.py: `call_bytes`, `call_flops`). Weights are read once per call, whatever
    the number of rows; KV bytes = rows × cache_len × layers × 2 × kv_heads × head_dim × dtype bytes
    (the whole fixed-shape cache buffer is attended). The fixed overhead of a call is (layers + 1) ×
    a per-layer overhead (dispatch/launch of the layer loop's kernels, plus the embedding, head and
    sampling steps as one more), so a 2-layer draft pays less than a 6-layer target. Sampling =
    rows × positions × the cost of turning one row of logits into a token (top-k/top-p processing
    sorts the vocabulary: ~25 µs per row on this 2-core CPU, measured by studies/roofline.py; neglected for
    the accelerator presets). Activations are not counted.
 2. Per cycle: `ar` 1 target call on B rows × 1 token. `sd`: K draft calls on B rows + 1 target call
    on B rows × (K+1) tokens; expected tokens per cycle = (1 − a^{K+1}) / (1 − a) for i.i.d. per-token
    acceptance a (a is solved from the measured mean acceptance length at the measured K, so the
    formula reproduces the measurement at that K and extrapolates to others). `sd-multi`: K draft
    calls + 1 target call on B·N rows, tokens per cycle from its measured mean acceptance length the
    same way. `smc`: K draft calls + 1 target call on B·N rows × (K+1) tokens, exactly K+1 tokens per
    cycle per request; the prompt's KV is read once per request (the particles share it: cascade
    attention, smcsd/methods/smc.py) and each particle reads its own slots after the prompt; plus, on the
    measured fraction of cycles that resample, a gather of the particles' own slots of both caches
    (read + write; the prompt never moves). A block drafter (DFlash, pair smollm2-135m+dflash) costs one
    call over rows × block tokens per cycle instead of K calls.
 3. Acceptance and resampling statistics come from a bench_speed JSON (--bench) or a quick
    measurement on the tiny pair on this machine; they are *transferred* to the real pairs, whose own
    acceptance differs — pass --acceptance to set a for sd (and, as a lower bound, sd-multi) instead.
 4. Presets predict steady-state decoding: no prefill, the cache holding --context tokens (cache
    buffer = context + headroom). `cpu-measured` predicts whole `decode` calls as the benchmark runs
    them: the prefill call(s), then ceil((M − 1) / tokens per cycle) cycles for M new tokens (the first
    token comes from the prefill).
 5. Device numbers: H100 SXM 3.35 TB/s HBM3, ~989 TFLOP/s dense bf16; TPU v5e 819 GB/s, 197 TFLOP/s
    bf16; a fixed overhead of --overhead-us (default 1 µs) per layer + 1 per call on both (~33 µs per
    8B target call). `cpu-measured`: bandwidth, float32 matmul rate and per-row sampling cost measured
    by experiments/studies/roofline.py (its JSON via --roofline, or measured now), and the per-layer overhead
    *fitted* from this machine's `ar` measurement (the only fitted number):
      overhead = (measured ar wall time − Σ call times without it) / Σ (layers + 1) over ar's calls (≥ 0).

`cpu-measured` compares the predicted speed-ups (method tokens/s ÷ ar tokens/s) with the measured ones
on the same pair and reports the relative error; `within_tolerance` is |error| ≤ 30%. Measured now, it
runs --repeats rounds; each round first measures the device constants (bandwidth, matmul rate,
sampling cost; unless --roofline gives them) and then runs every method --runs-per-round times
(bench_speed.run_grid, round-robin, medians and paired speed-ups within the round). Each round is
predicted from its own constants and its own ar fit, so a load change on a shared machine hits the
constants and the speeds alike; the speed-ups compared are the medians over rounds of the per-round
ratios (measured: paired with that round's ar runs).

JSON written to --out (default experiments/results/cost_model.json):
  schema "smcsd.cost_model/1", created, device (this machine), jax_version
  assumptions     the list above, as strings
  stats           the statistics used: source, acceptance_sd, sd_k, acceptance_sd_multi, sd_multi_k,
                  sd_multi_n, resample_rate, mean_ess_fraction, overridden (whether --acceptance was given)
  predictions     per device preset × pair × batch × method: device, pair, target, draft, batch_size,
                  method, num_particles, num_speculative_tokens, context, tokens_per_cycle, cycle_s,
                  target_call_s, draft_call_s, bound ("memory" | "compute"), tokens_per_s, speedup_vs_ar
  cpu_measured    (with --device cpu-measured; else null) model, bandwidth_gbs, gflops, logits_row_s,
                  fitted_overhead_s (per layer + 1), target_call_overhead_s, draft_call_overhead_s,
                  batch_size, max_new_tokens, settings, cells (the measured cells, pooled over rounds),
                  rounds (per round: constants, cells),
                  rows: per method label, method, num_particles,
                  num_speculative_tokens, measured_tokens_per_s, measured_ratio, predicted_tokens_per_s,
                  predicted_ratio, ratio_rel_error, within_tolerance; all_within_tolerance, tolerance
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys

from experiments import report

DEFAULT_OUT = report.results_path("cost_model.json")
SCHEMA = "smcsd.cost_model/1"
TOP_FIELDS = ("schema", "created", "device", "jax_version", "assumptions", "stats", "predictions", "cpu_measured")
PREDICTION_FIELDS = ("device", "pair", "target", "draft", "batch_size", "method", "num_particles",
                     "num_speculative_tokens", "context", "tokens_per_cycle", "cycle_s", "target_call_s",
                     "draft_call_s", "bound", "tokens_per_s", "speedup_vs_ar")
CPU_FIELDS = ("model", "bandwidth_gbs", "gflops", "logits_row_s", "fitted_overhead_s", "target_call_overhead_s",
              "draft_call_overhead_s", "batch_size", "max_new_tokens", "settings", "rows", "cells", "rounds",
              "all_within_tolerance", "tolerance")
CPU_ROW_FIELDS = ("label", "method", "num_particles", "num_speculative_tokens", "measured_tokens_per_s",
                  "measured_ratio", "predicted_tokens_per_s", "predicted_ratio", "ratio_rel_error",
                  "within_tolerance")
TOLERANCE = 0.30
ASSUMPTIONS = [
    "per call: time = max(bytes / bandwidth, FLOPs / peak) + (layers + 1) x per-layer overhead "
    "+ rows x positions x per-row sampling cost",
    "bytes = weights read (untied input embedding: only the gathered rows) + KV attended "
    "(rows x cache_len x layers x 2 x kv_heads x head_dim x dtype bytes); activations not counted",
    "ar: 1 target call (B rows x 1 token) per token",
    "sd: K draft calls (B rows) + 1 target call (B rows x K+1 tokens) per cycle; "
    "tokens/cycle = (1 - a^(K+1)) / (1 - a), a i.i.d. per-token acceptance solved from the measured mean "
    "acceptance length",
    "sd-multi: K draft calls + 1 target call on B*N rows per cycle; tokens/cycle from its measured acceptance, "
    "same formula",
    "smc: K draft calls + 1 target call on B*N rows x (K+1) tokens per cycle; K+1 tokens per cycle; "
    "the prompt's KV read once per request (shared prefix), each particle's own slots per row; "
    "plus resample_rate x (read + write of the particles' own KV slots of both models)",
    "block drafters (DFlash; pair smollm2-135m+dflash): 1 draft call per cycle over rows x block tokens",
    "acceptance / resampling statistics are measured on the tiny pair (or a bench_speed JSON) and transferred to the "
    "real pairs unless --acceptance is given",
    "presets: steady-state decode (no prefill), cache holding --context tokens; cpu-measured: whole decode calls "
    "(prefill + ceil((M-1)/tokens per cycle) cycles)",
    "presets: 1 us per-layer overhead (--overhead-us), sampling cost neglected; cpu-measured: bandwidth, float32 "
    "matmul rate and per-row sampling cost measured (experiments/studies/roofline.py); the per-layer overhead is fitted "
    "from the measured ar wall time (the only fitted number)",
]


# ----------------------------------------------------------------------------------- the model (smcsd/cost_model.py)

# The formulas, device presets and real shapes live in the library (smcsd/cost_model.py), which smcsd.device_check
# measures against and refits; this script re-exports them under the names its callers use.
from smcsd.cost_model import (DEVICES, DRAFT_BLOCK, DTYPE_BYTES, PAIR_NAMES, Device, call_overhead,  # noqa: E402,F401
                              call_time, cycle_cost, device_from_dict, expected_tokens, kv_bytes, matmul_params,
                              real_configs, smollm2_drafter_configs, solve_acceptance, steady_state,
                              tensor_parallel, weight_bytes)


def _rf():
    from experiments.studies import roofline
    return roofline


def overlap_pairs():
    """Pairs projected for sd-overlap: (name, config) of target and AR drafter."""
    pairs = {k: v for k, v in real_configs().items() if k == "llama3.1-8b+llama3.2-1b"}
    smol = real_configs()["smollm2-135m+dflash"][0]
    pairs["smollm2-135m+ar-distilled"] = (smol, smollm2_drafter_configs()["ar"])  # the shipped ar-distilled drafter
    return pairs


def overlap_projection(tcfg, dcfg, B: int, K: int, cache_len: int, dev: Device, stats: dict,
                       draft_block: int | None = None, hidden_bytes_per_token: int = 0) -> dict:
    """sd vs sd-overlap (MineDraft, smcsd/methods/sd_overlap.py) on `dev`, per cycle of sd at batch B. sd runs the batch's K draft
    calls, then its verification, on one group. sd-overlap gives the drafter a group of its own and alternates two
    half-batches, so a half-step costs max(t_verify, t_draft) + t_transfer (smcsd.methods.sd_overlap.overlap_step_model), where
    t_transfer moves the proposal's tokens + log q [h, K, V] float32 and the verified block back over the device link.
    Two settings:
    - same requests (`overlap_same_*`): the B requests split into halves of B/2. When calls are memory-bound a half
      costs about what the whole batch does (the weights are read either way), so two half-steps cost about twice
      max(t_verify, t_draft): this loses to sd until calls turn compute-bound.
    - MineDraft's (`overlap_doubled_*`): twice the requests in flight, halves of B, so each half-step serves as many
      requests as one sd cycle: throughput x (t_verify + t_draft) / (max(t_verify, t_draft) + t_transfer), which
      beats sd whenever t_transfer < min(t_verify, t_draft). It needs KV memory for 2B requests on the target group.
    Tokens per cycle per request from the measured acceptance (`stats["acceptance_sd"]`), the same for all.
    `draft_block`: the drafter is a block drafter (DFlash) of that block size, one call over rows x block tokens per
    cycle (as in `cycle_cost`); `hidden_bytes_per_token`: bytes of target hidden states it gets back per verified
    token (its layers x hidden size x dtype bytes), added to the transfer. Defaults: an AR drafter, nothing extra."""
    from smcsd.methods.sd_overlap import overlap_step_model
    tokens = expected_tokens(stats["acceptance_sd"], K) if stats.get("acceptance_sd") is not None else float("nan")

    def drafting(h):
        if draft_block:
            return call_time(dcfg, h, draft_block, cache_len, dev, logit_rows=h * K)[0]
        return K * call_time(dcfg, h, 1, cache_len, dev)[0]

    def halves(h):
        tv, _ = call_time(tcfg, h, K + 1, cache_len, dev)
        td = drafting(h)
        nbytes = h * K * tcfg.vocab_size * 4 + h * (2 * K + 8) * 4 + h * (K + 1) * hidden_bytes_per_token
        tx = 2 * dev.link_latency_s + (nbytes / dev.link_bw if dev.link_bw else float("inf"))
        return tv, td, tx, 2 * overlap_step_model(tv, td, tx)["overlap_step_s"]

    tv_b, td_b = call_time(tcfg, B, K + 1, cache_len, dev)[0], drafting(B)
    sd_cycle = tv_b + td_b
    tv, td, tx, same = halves(max(B // 2, 1))
    _, _, tx2, doubled = halves(B)  # a half-step per B requests: two of them serve 2B
    return dict(t_verify_s=tv_b, t_draft_s=td_b, t_transfer_s=tx2, t_verify_half_s=tv, t_draft_half_s=td,
                sd_cycle_s=sd_cycle, sd_tokens_per_s=B * tokens / sd_cycle,
                overlap_same_tokens_per_s=B * tokens / same, overlap_same_speedup=sd_cycle / same,
                overlap_doubled_tokens_per_s=2 * B * tokens / doubled, overlap_doubled_speedup=2 * sd_cycle / doubled,
                beats_sd_same=same < sd_cycle, beats_sd_doubled=doubled < 2 * sd_cycle, tokens_per_cycle=tokens)


def flex_cycle_times(cfg, B: int, K: int, group: int, adapter_layers: int, calib_hidden: int, cache_len: int,
                     dev: Device, with_bound: bool = False):
    """(parallel, sequential) seconds of one `flex` cycle (FlexDraft, smcsd/methods/flex.py) for B rows on `dev`, by the
    roofline of each call (weights read once per call, FLOPs counted per token and layer):
    parallel: one call over K+1 clean tokens through every layer plus (K+1) mask groups of `group` tokens through the
    last `adapter_layers` layers, LM head on the K+1 clean rows and on K draft rows (+ the calibration MLP);
    sequential: a draft call (1 clean token through every layer, one mask group through the last layers, head on
    1 + K rows + calibration) and a verify call (K clean tokens, head on K rows). Attention is counted on the cache
    for clean tokens and ignored for masks (they attend to their anchor's context: the same order).
    `with_bound`: also the bound of each mode ("memory" | "compute": of its one call, or of the sequential mode's
    verify call), as ((parallel s, bound), (sequential s, bound))."""
    L, H, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    head = V * H
    per_layer = (matmul_params(cfg) - head) / L
    calib = 2 * H * calib_hidden + calib_hidden * V
    b = DTYPE_BYTES.get(cfg.dtype, 2)
    weights = weight_bytes(cfg, B, K + 1) + adapter_layers * 4 * H * H * b + calib * b
    kv = kv_bytes(cfg, B, cache_len)

    def call(token_layers, head_rows, clean_tokens, calib_rows):
        flops = 2 * B * (per_layer * token_layers + head * head_rows + calib * calib_rows)
        flops += 4 * B * clean_tokens * cache_len * cfg.num_attention_heads * cfg.head_dim * L
        mem, comp = (weights + kv) / dev.bandwidth, flops / dev.flops
        t = (max(mem, comp) if dev.overlap else mem + comp) + call_overhead(cfg, dev) + \
            B * head_rows * dev.logits_row_s
        return t, ("memory" if mem >= comp else "compute")

    parallel, p_bound = call((K + 1) * L + (K + 1) * group * adapter_layers, (K + 1) + K, K + 1, K)
    (draft, _), (verify, s_bound) = call(L + group * adapter_layers, 1 + K, 1, K), call(K * L, K, K, 0)
    sequential = draft + verify
    if with_bound:
        return (parallel, p_bound), (sequential, s_bound)
    return parallel, sequential


def flex_switch_point(cfg, K: int, group: int, adapter_layers: int, calib_hidden: int, cache_len: int, dev: Device,
                      max_batch: int = 4096) -> int | None:
    """Smallest batch at which `flex`'s sequential mode is faster than its parallel mode on `dev` (None: never up to
    `max_batch`)."""
    B = 1
    while B <= max_batch:
        p, s = flex_cycle_times(cfg, B, K, group, adapter_layers, calib_hidden, cache_len, dev)
        if s < p:
            return B
        B *= 2
    return None


def whole_decode_time(method, tcfg, dcfg, B, N, K, prompt_len, cache_len, M, dev, stats) -> float:
    """Seconds of one `decode` call making M new tokens per request: prefill(s), then the cycles."""
    pre, _ = call_time(tcfg, B, prompt_len, cache_len, dev, logit_rows=B)
    if method != "ar":
        pd, _ = call_time(dcfg, B, prompt_len, cache_len, dev, logit_rows=B)
        pre += pd
    cycle, tokens, _, _, _ = cycle_cost(method, tcfg, dcfg, B, N, K, cache_len, dev, stats, prompt_len)
    cycles = M - 1 if method == "ar" else math.ceil((M - 1) / tokens)
    return pre + cycles * cycle


# ----------------------------------------------------------------------------------- statistics

def stats_from_cells(cells: list[dict], source: str) -> dict:
    """Acceptance (per-token, i.i.d.-equivalent) and resampling statistics from bench_speed cells."""
    def pick(method):
        return [c for c in cells if c.get("method") == method and c.get("mean_acceptance_length")]

    out = {"source": source, "acceptance_sd": None, "sd_k": None, "acceptance_sd_multi": None, "sd_multi_k": None,
           "sd_multi_n": None, "resample_rate": None, "mean_ess_fraction": None, "overridden": False}
    sd = pick("sd")
    if sd:
        out["sd_k"] = sd[0]["num_speculative_tokens"]
        out["acceptance_sd"] = statistics.mean(
            solve_acceptance(c["mean_acceptance_length"], c["num_speculative_tokens"]) for c in sd)
    multi = [c for c in cells if c.get("method") == "sd-multi" and c.get("tokens_per_target_call")]
    if multi:  # tokens per target call = mean accepted prefix + 1 (vLLM's definition, DecodeStats)
        out["sd_multi_k"], out["sd_multi_n"] = multi[0]["num_speculative_tokens"], multi[0]["num_particles"]
        out["acceptance_sd_multi"] = statistics.mean(
            solve_acceptance(c["tokens_per_target_call"], c["num_speculative_tokens"]) for c in multi)
    smc = [c for c in cells if c.get("method") == "smc"]
    rates = [c["resample_rate"] for c in smc if c.get("resample_rate") is not None]
    ess = [c["mean_ess_fraction"] for c in smc if c.get("mean_ess_fraction") is not None]
    out["resample_rate"] = statistics.mean(rates) if rates else 0.0
    out["mean_ess_fraction"] = statistics.mean(ess) if ess else None
    if out["acceptance_sd"] is None:
        out["acceptance_sd"] = 0.0
    if out["acceptance_sd_multi"] is None:  # a multi-draft tree accepts at least as much as one draft
        out["acceptance_sd_multi"] = out["acceptance_sd"]
    return out


def measure_rounds(target, draft, *, methods, B, M, K, N, rounds, runs_per_round=3, device_constants: bool,
                   progress=False):
    """`rounds` rounds on this machine. Each round measures the device constants (bandwidth, matmul rate,
    sampling cost; when `device_constants`) and then runs every method `runs_per_round` times
    (bench_speed.run_grid: round-robin, medians, paired speed-ups; EOS ignored), so a load change on a
    shared machine hits the constants and the speeds of that round alike.
    Returns [(constants | None, cells of the round)]."""
    rf = _rf()
    from experiments.bench import speed as bs
    import jax
    platform = jax.devices()[0].platform
    cells = [bs.Cell(m, B, None if m in ("ar", "sd") else N, None if m == "ar" else K) for m in methods]
    out = []
    for r in range(rounds):
        consts = None
        if device_constants:
            consts = {"bandwidth_gbs": rf.measure_bandwidth(128, 3, with_numpy=False)["roofline_gbs"],
                      "gflops": rf.measure_matmul(1024 if platform == "cpu" else 8192, 3, platform)["float32_gflops"],
                      "logits_row_s": rf.measure_logits(target.config.vocab_size, 5)}
        rows = bs.run_grid(cells, target, draft, model_name="cost-model", prompts=None, max_new_tokens=M,
                           temperature=1.0, top_k=0, top_p=1.0, seed=1 + 100 * r, warmup=1 if r == 0 else 0,
                           repeats=runs_per_round,
                           eos_id=[], ess_threshold=0.5, resampler="systematic", progress=False)
        out.append((consts, rows))
        if progress:
            print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{c['label']} {c['tokens_per_s']:.0f} tok/s" for c in rows)
                  + (f"; {consts['bandwidth_gbs']:.1f} GB/s" if consts else ""), flush=True)
    return out


def pool_rounds(per_round: list) -> list[dict]:
    """One bench_speed-like cell per method from per-round cells: tokens/s and wall time = medians over
    rounds, speed-up = median of the per-round paired ratios, acceptance / ESS statistics = means."""
    pooled = []
    for i, first in enumerate(per_round[0][1]):
        rs = [rows[i] for _, rows in per_round]
        cell = dict(first)
        cell["tokens_per_s_runs"] = [r["tokens_per_s"] for r in rs]
        cell["tokens_per_s"] = statistics.median(cell["tokens_per_s_runs"])
        cell["wall_s"] = statistics.median(r["wall_s"] for r in rs)
        cell["speedup_vs_ar"] = statistics.median(r["speedup_vs_ar"] for r in rs)
        for k in ("acceptance_rate", "mean_acceptance_length", "tokens_per_target_call", "mean_ess_fraction",
                  "resample_rate", "resamples", "target_calls", "draft_calls"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            cell[k] = statistics.mean(vals) if vals else None
        pooled.append(cell)
    return pooled


# ----------------------------------------------------------------------------------- cpu-measured check

def _prompt_width(B: int) -> int:
    _rf()
    from experiments.bench import speed as bs
    from smcsd.models import ByteTokenizer
    from smcsd.runtime.engine import bucket
    longest = max(len(ByteTokenizer().encode(p)) for p in bs.prompts_for("cost-model", B, None))
    return bucket(longest, 8)


def predict_this_machine(target, draft, cells: list[dict], consts: dict, B: int, M: int, stats: dict):
    """Predicted tokens/s per cell label of whole decode calls on this machine, and the fitted per-layer
    overhead: overhead = (ar wall − Σ ar call times without it) / Σ (layers + 1) over ar's calls (≥ 0)."""
    tcfg, dcfg = target.config, draft.config
    ar = next(c for c in cells if c["method"] == "ar")
    prompt_len = _prompt_width(B)
    import jax
    zero = Device("this machine", consts["bandwidth_gbs"] * 1e9, consts["gflops"] * 1e9, 0.0, consts["logits_row_s"],
                  overlap=jax.devices()[0].platform != "cpu")
    units = M * (tcfg.num_hidden_layers + 1)  # prefill + one target call per further token, (L + 1) units each
    base = whole_decode_time("ar", tcfg, dcfg, B, 1, 1, prompt_len, ar["cache_len"], M, zero, stats)
    dev = dataclasses.replace(zero, overhead_s=max(0.0, (ar["wall_s"] - base) / units))
    pred = {}
    for c in cells:
        wall = whole_decode_time(c["method"], tcfg, dcfg, B, c["num_particles"] or 1, c["num_speculative_tokens"] or 1,
                                 prompt_len, c["cache_len"], M, dev, stats)
        pred[c["label"]] = B * M / wall
    return pred, dev


def cpu_check(target, draft, per_round: list, B: int, M: int, stats: dict, model_name: str) -> dict:
    """Predicted vs measured speed-ups on this machine. `per_round` = [(device constants, cells)]: each
    round is predicted with its own constants and its own ar fit; the predicted and the measured
    speed-ups compared are the medians over rounds (of per-round ratios)."""
    tcfg, dcfg = target.config, draft.config
    preds, devs = [], []
    for consts, cells in per_round:
        pred, dev = predict_this_machine(target, draft, cells, consts, B, M, stats)
        ar_label = next(c["label"] for c in cells if c["method"] == "ar")
        preds.append({k: (v, v / pred[ar_label]) for k, v in pred.items()})
        devs.append(dev)
    pooled = pool_rounds(per_round)
    rows = []
    for c in pooled:
        p_tps = statistics.median(p[c["label"]][0] for p in preds)
        p_ratio = statistics.median(p[c["label"]][1] for p in preds)
        m_ratio = c["speedup_vs_ar"]
        err = p_ratio / m_ratio - 1.0
        rows.append({"label": c["label"], "method": c["method"], "num_particles": c["num_particles"],
                     "num_speculative_tokens": c["num_speculative_tokens"],
                     "measured_tokens_per_s": c["tokens_per_s"], "measured_ratio": m_ratio,
                     "predicted_tokens_per_s": p_tps, "predicted_ratio": p_ratio,
                     "ratio_rel_error": err, "within_tolerance": bool(abs(err) <= TOLERANCE)})
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {"model": model_name, "bandwidth_gbs": med(d.bandwidth / 1e9 for d in devs),
            "gflops": med(d.flops / 1e9 for d in devs), "logits_row_s": med(d.logits_row_s for d in devs),
            "fitted_overhead_s": med(d.overhead_s for d in devs),
            "target_call_overhead_s": med(call_overhead(tcfg, d) for d in devs),
            "draft_call_overhead_s": med(call_overhead(dcfg, d) for d in devs), "batch_size": B, "max_new_tokens": M,
            "rows": rows, "cells": pooled, "rounds": [{"constants": c, "cells": cells} for c, cells in per_round],
            "all_within_tolerance": all(r["within_tolerance"] for r in rows), "tolerance": TOLERANCE}


# ----------------------------------------------------------------------------------- reporting

def predictions_table(rows: list[dict]) -> str:
    return report.markdown_table(
        ["device", "pair", "B", "method", "N", "K", "tokens/cycle", "target call (ms)", "draft call (ms)",
         "cycle (ms)", "bound", "tokens/s", "vs ar"],
        [[r["device"], r["pair"], r["batch_size"], r["method"], r["num_particles"] or "–",
          r["num_speculative_tokens"] or "–", f"{r['tokens_per_cycle']:.2f}", f"{r['target_call_s'] * 1e3:.2f}",
          f"{r['draft_call_s'] * 1e3:.2f}", f"{r['cycle_s'] * 1e3:.2f}", r["bound"], f"{r['tokens_per_s']:.0f}",
          f"{r['speedup_vs_ar']:.2f}×"] for r in rows])


def cpu_table(cpu: dict) -> str:
    return report.markdown_table(
        ["method", "measured tokens/s", "measured vs ar", "predicted tokens/s", "predicted vs ar", "ratio error",
         "within 30%"],
        [[r["label"], f"{r['measured_tokens_per_s']:.0f}", f"{r['measured_ratio']:.2f}×",
          f"{r['predicted_tokens_per_s']:.0f}", f"{r['predicted_ratio']:.2f}×", f"{100 * r['ratio_rel_error']:+.1f}%",
          "yes" if r["within_tolerance"] else "NO"] for r in cpu["rows"]])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", nargs="+", choices=list(DEVICES) + ["cpu-measured"],
                    default=["h100", "tpu-v5e", "cpu-measured"])
    ap.add_argument("--pair", nargs="+", choices=PAIR_NAMES, default=list(PAIR_NAMES), help="real pairs (presets)")
    ap.add_argument("--bench", help="bench_speed JSON to read acceptance / ESS statistics (and, for cpu-measured, "
                                    "the measured speeds) from; default: measure now")
    ap.add_argument("--roofline", help="studies/roofline.py JSON with this machine's bandwidth; default: measure now")
    ap.add_argument("--model", default="tiny-code", help="tiny pair measured on this machine (roofline.load_pair)")
    ap.add_argument("--acceptance", type=float, default=None, help="override the per-token acceptance a of the presets")
    ap.add_argument("--num-speculative-tokens", "-K", type=int, default=4)
    ap.add_argument("--num-particles", "-N", type=int, default=4)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16], help="batch sizes of the presets")
    ap.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (presets; smc shares them)")
    ap.add_argument("--output-len", type=int, default=512, help="new tokens per request (presets)")
    ap.add_argument("--context", type=int, default=None,
                    help="tokens in the cache (presets; default prompt + half the output: the mean over a decode)")
    ap.add_argument("--fitted", nargs="+", default=[], metavar="FIT.json",
                    help="also project on each device refitted from a measured run (the JSON `smcsd device-check --fit "
                         "RUN --out FIT.json` writes): its fitted bandwidth, FLOP rate, overhead and sampling cost")
    ap.add_argument("--overhead-us", type=float, default=1.0,
                    help="presets: fixed overhead per call per (layer + 1), µs (default 1: ~33 µs per 8B call)")
    ap.add_argument("--batch", type=int, default=1, help="batch size of the cpu-measured comparison")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per request (cpu-measured)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="methods measured on this machine (default ar sd sd-multi smc; --quick ar sd smc)")
    ap.add_argument("--repeats", type=int, default=None, help="measurement rounds (default 7; --quick 5)")
    ap.add_argument("--runs-per-round", type=int, default=3, help="interleaved runs of every method per round")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, ar/sd/smc only, a smaller bandwidth test")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    rf = _rf()
    import jax
    K, N = args.num_speculative_tokens, args.num_particles
    methods = args.methods or (["ar", "sd", "smc"] if args.quick else ["ar", "sd", "sd-multi", "smc"])
    if "ar" not in methods:
        ap.error("argument --methods: ar is needed (the reference of every ratio)")
    repeats = args.repeats or (5 if args.quick else 7)
    device_desc, platform = report.device_info()

    cells, target, draft, model_name = None, None, None, args.model
    if args.bench:
        with open(args.bench) as f:
            bench = json.load(f)
        cells = bench["cells"]
        stats_source = f"bench_speed JSON {args.bench} ({bench.get('model', {}).get('name')} on {bench.get('device')})"
        if "cpu-measured" in args.device:
            B0 = {c["batch_size"] for c in cells if c["method"] == "ar"}
            if args.batch not in B0:
                ap.error(f"argument --bench: no ar cell at --batch {args.batch} in {args.bench}")
            cells = [c for c in cells if c["batch_size"] == args.batch]
            args.max_new_tokens = bench["settings"]["max_new_tokens"]
            model_name = bench["model"]["name"]
    need_measure = cells is None
    if need_measure or "cpu-measured" in args.device:
        target, draft, source = rf.load_pair(model_name if model_name in ("tiny-code", "tiny-arith", "random")
                                             else args.model)
        model_name = model_name if model_name == source else f"{model_name} ({source})"
        if args.bench and "cpu-measured" in args.device:
            want = bench.get("model", {}).get("target_params")
            if want is not None and want != target.num_params:
                ap.error(f"argument --bench: its pair ({bench['model'].get('name')}, target {want} params) is not "
                         f"the pair this machine would be modelled with ({target.num_params} params); give a bench "
                         "JSON of the shipped tiny-code / tiny-arith pair, or drop --bench to measure now")
    fixed_consts, consts_source = None, "measured in every round (roofline.measure_bandwidth / measure_matmul / " \
                                        "measure_logits)"
    if args.roofline:
        with open(args.roofline) as f:
            roof = json.load(f)
        fixed_consts = {"bandwidth_gbs": roof["bandwidth"]["roofline_gbs"], "gflops": roof["compute"]["float32_gflops"],
                        "logits_row_s": roof["compute"].get("logits_row_s")}
        consts_source = f"roofline JSON {args.roofline}"
    per_round = None
    if need_measure:
        print(f"measuring {', '.join(methods)} on {model_name}, B={args.batch}, {args.max_new_tokens} new tokens, "
              f"K={K}, N={N}: {repeats} interleaved rounds on {device_desc}", flush=True)
        per_round = measure_rounds(target, draft, methods=methods, B=args.batch, M=args.max_new_tokens, K=K, N=N,
                                   rounds=repeats, runs_per_round=args.runs_per_round,
                                   device_constants=fixed_consts is None and "cpu-measured" in args.device,
                                   progress=not args.no_progress)
        cells = pool_rounds(per_round)
        stats_source = f"measured now on {model_name} ({device_desc})"
    stats = stats_from_cells(cells, stats_source)
    if args.acceptance is not None:
        stats.update(acceptance_sd=args.acceptance, acceptance_sd_multi=args.acceptance, overridden=True)

    predictions = []
    pairs = real_configs()
    if args.context is None:
        args.context = args.prompt_len + args.output_len // 2
    devices = [(d, dataclasses.replace(DEVICES[d], overhead_s=args.overhead_us * 1e-6))
               for d in args.device if d in DEVICES]
    for path in args.fitted:  # measured constants: the fitted overhead is kept (no --overhead-us)
        with open(path) as f:
            fitted = json.load(f)
        if "fitted_device" not in fitted:
            ap.error(f"argument --fitted: {path} has no fitted_device (write it with smcsd device-check --fit RUN "
                     "--out FIT.json)")
        devices.append((f"fitted:{fitted.get('source') or os.path.basename(path)}",
                        device_from_dict(fitted["fitted_device"])))
    for dname, dev in devices:
        for pname in args.pair:
            (tname, tcfg), (dn, dcfg) = pairs[pname]
            for B in args.batch_sizes:
                ar_tps = None
                for method in ("ar", "sd", "sd-multi", "smc"):
                    r = steady_state(method, tcfg, dcfg, B, N, K, args.context, dev, stats, args.prompt_len,
                                     DRAFT_BLOCK.get(pname))
                    ar_tps = r["tokens_per_s"] if method == "ar" else ar_tps
                    predictions.append({"device": dname, "pair": pname, "target": tname, "draft": dn, "batch_size": B,
                                        "method": method, "num_particles": N if method in ("sd-multi", "smc") else None,
                                        "num_speculative_tokens": None if method == "ar" else K,
                                        "context": args.context, **r, "speedup_vs_ar": r["tokens_per_s"] / ar_tps})

    cpu = None
    if "cpu-measured" in args.device:
        if fixed_consts is None and per_round is None:  # --bench without --roofline: measure the constants once now
            fixed_consts = {"bandwidth_gbs": rf.measure_bandwidth(256, 10, with_numpy=False)["roofline_gbs"],
                            "gflops": rf.measure_matmul(1024 if platform == "cpu" else 8192, 5,
                                                        platform)["float32_gflops"]}
            consts_source = "measured once now (roofline.measure_bandwidth / measure_matmul / measure_logits)"
        if fixed_consts is not None and fixed_consts.get("logits_row_s") is None:
            fixed_consts["logits_row_s"] = rf.measure_logits(target.config.vocab_size, 10)
        if per_round is None:
            per_round = [(fixed_consts, cells)]
        elif fixed_consts is not None:
            per_round = [(fixed_consts, rows) for _, rows in per_round]
        cpu = cpu_check(target, draft, per_round, args.batch, args.max_new_tokens, stats, model_name)
        cpu["settings"] = {"constants_source": consts_source, "stats_source": stats_source, "rounds": len(per_round),
                           "num_speculative_tokens": K, "num_particles": N, "methods": [c["label"] for c in cells]}
        cpu = {k: cpu[k] for k in CPU_FIELDS}

    result = report.new_result(SCHEMA, device=device_desc, jax_version=jax.__version__, assumptions=ASSUMPTIONS,
                               stats=stats, predictions=predictions, cpu_measured=cpu)
    print("\ncost model assumptions:")
    for a in ASSUMPTIONS:
        print(f"  - {a}")
    print(f"\nstatistics ({stats['source']}): per-token acceptance sd a = {stats['acceptance_sd']:.3f}"
          f"{' (--acceptance)' if stats['overridden'] else ''}, sd-multi a = {stats['acceptance_sd_multi']:.3f}, "
          f"smc resample rate {stats['resample_rate']:.2f}"
          + (f", mean ESS/N {stats['mean_ess_fraction']:.2f}" if stats["mean_ess_fraction"] is not None else ""))
    if predictions:
        print(f"\npredicted steady-state decode speed (prompt {args.prompt_len}, context {args.context}, per-call overhead "
              f"{args.overhead_us:g} µs x (layers + 1), sampling cost neglected):")
        print(predictions_table(predictions))
    if cpu is not None:
        print(f"\nthis machine ({device_desc}), {cpu['model']}: bandwidth {cpu['bandwidth_gbs']:.1f} GB/s "
              f"({cpu['settings']['constants_source']}; median), float32 matmul {cpu['gflops']:.0f} GFLOP/s, "
              f"logits -> token {cpu['logits_row_s'] * 1e6:.0f} µs/row; overhead fitted from ar: "
              f"{cpu['fitted_overhead_s'] * 1e6:.0f} µs "
              f"x (layers + 1) = {cpu['target_call_overhead_s'] * 1e6:.0f} µs per target call, "
              f"{cpu['draft_call_overhead_s'] * 1e6:.0f} µs per draft call; B={cpu['batch_size']}, "
              f"{cpu['max_new_tokens']} new tokens")
        print(cpu_table(cpu))
        print(f"all predicted ratios within {100 * TOLERANCE:.0f}% of the measured ones: "
              f"{'yes' if cpu['all_within_tolerance'] else 'NO'}")
    print("wrote", report.write_json(args.out, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
