"""Cost-model projections of every decoding method (`ar`, `sd`, `sd-multi`, `sd-tree`, `smc`, `flex`, `sd-overlap`)
on H100 and TPU v5e, for SmolLM2-135M with its shipped drafters and for Llama-3.1-8B / -70B with Llama-3.2-1B.

    python -m experiments.studies.projections                       # writes experiments/results/projections.json
    python -m experiments.studies.projections --batch 8 --llama-acceptance 0.7 --out /tmp/projections.json

Nothing is decoded: every number comes from experiments/studies/cost_model.py (roofline calls, `steady_state`,
`overlap_projection`, `flex_cycle_times` / `flex_switch_point`, `tensor_parallel`), experiments/bench/tree.py
(`project`, how `sd-tree` is costed) and the measured results committed in experiments/results/. Per (device, pair,
method) one row: the settings, the acceptance used and the file it came from, tokens per cycle, cycle time, tokens/s,
the speed-up over `ar` on the same device and pair, and whether the target's call is memory- or compute-bound. A
method that cannot be projected for a pair gets its row with the reason instead of numbers.

Where the acceptance comes from (measured at temperature 0.7 on this repository's CPU runs, at batch 1 except
flex_study's, which decodes all its prompts as one batch):
- SmolLM2-135M pairs: `sd` / `sd-overlap` from bench_matrix.json when it has the cell, else bench_smollm2_pair.json
  (ar-distilled, dflash-dpace), else block_drafters_smollm2-135m.json (dflash); `sd-multi` and `sd-tree` from
  tree_bench_smollm2-135m.json (else `sd`'s acceptance, a lower bound); `flex` from bench_matrix.json, else
  flex_study_smollm2-135m.json (the shipped adapters, calibrated); `smc`'s resampling rate from bench_smollm2_pair.json.
  A per-token acceptance a is solved from a measured mean acceptance length at the measured K
  (`cost_model.solve_acceptance`) and extrapolated to other K by (1 - a^(K+1)) / (1 - a).
- Llama pairs: nothing is measured; a per-token acceptance is assumed (--llama-acceptance, default 0.81, the value of
  every Llama-8B/1B projection here) for the 1B drafter, and (--llama-flex-acceptance, default the same) for FlexDraft
  adapters, whose configuration is SmolLM2's shipped one with the adapted layers scaled to the same fraction of the
  depth. `sd-multi` and `sd-tree` get the chain's tokens per cycle (a lower bound: their gain is not modelled).
Chips: a pair runs on the fewest chips (a power of two) whose HBM holds its bf16 weights with --hbm-headroom to spare,
tensor-parallel (`cost_model.tensor_parallel`, two all-reduces of --allreduce-us per layer) when more than one: e.g.
Llama-3.1-70B + 1B on 4 H100s, as in the SMC-SD paper (experiments/studies/paper_check.py). `sd-overlap` puts the drafter on
a second group of as many chips. JSON: --out, with a top-level "markdown" (docs/benchmarks.md includes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from experiments import common, report
from experiments.common import REPO

SCHEMA = "smcsd.projections/1"
METHODS = ("ar", "sd", "sd-multi", "sd-tree", "smc", "flex", "sd-overlap")
DEVICE_NAMES = ("h100", "tpu-v5e")
HBM_BYTES = {"h100": 80e9, "tpu-v5e": 16e9}  # per chip: H100 SXM 80 GB HBM3, TPU v5e 16 GB HBM2e
SMOL_DRAFTERS = ("ar-distilled", "dflash-dpace", "dflash")
LLAMA_PAIRS = ("llama3.1-8b+llama3.2-1b", "llama3.1-70b+llama3.2-1b")
PAIR_NAMES = tuple(f"smollm2-135m+{d}" for d in SMOL_DRAFTERS) + LLAMA_PAIRS
DEFAULT_PAIRS = ("smollm2-135m+ar-distilled", "smollm2-135m+dflash-dpace") + LLAMA_PAIRS
SHIPPED = os.path.join(common.SHIPPED, "smollm2-135m", "drafters")
TEMPERATURE = 0.7  # of every measurement used
ROW_FIELDS = ("device", "device_desc", "chips", "pair", "target", "draft", "method", "settings", "K", "N", "tree",
              "tree_nodes", "flex_mode", "acceptance", "measured_tokens_per_cycle", "resample_rate",
              "acceptance_source", "tokens_per_cycle", "cycle_s", "tokens_per_s", "speedup_vs_ar", "bound", "skipped",
              "reason", "note")


@dataclasses.dataclass(frozen=True)
class Pair:
    name: str
    target: str
    tcfg: object
    draft: str
    dcfg: object
    kind: str  # "ar" (a small LM, K calls per cycle) | "block" (one call over a block per cycle)
    block: int | None  # block drafters: the block size
    hidden_layers: int  # target layers whose hidden states the drafter reads (block drafters), else 0
    drafter: str | None  # the shipped SmolLM2 drafter's name; None: an assumed-acceptance (Llama) pair


def _shipped_config(name: str) -> dict:
    path = os.path.join(SHIPPED, name, "config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def make_pairs(names) -> list[Pair]:
    """The pairs' configs: cost_model's (SmolLM2, its ar-distilled and DFlash drafters, Llama-8B/1B) and
    paper_check's Llama-70B, in bfloat16."""
    from experiments.studies import cost_model as cm
    from experiments.studies.paper_check import llama70b
    real = cm.real_configs()
    (sname, smol), (_, block) = real["smollm2-135m+dflash"]
    (l8name, l8), (l1name, l1) = real["llama3.1-8b+llama3.2-1b"]
    out = []
    for name in names:
        if name == "smollm2-135m+ar-distilled":
            (dname, dcfg) = cm.overlap_pairs()[name][1]
            out.append(Pair(name, sname, smol, dname, dcfg, "ar", None, 0, "ar-distilled"))
        elif name.startswith("smollm2-135m+"):
            drafter = name.split("+", 1)[1]
            shipped = _shipped_config(drafter)
            size = shipped.get("block_size", 16)
            layers = len(shipped.get("target_layers", [])) or 5
            out.append(Pair(name, sname, smol, f"{drafter} (1 layer, block {size})", block, "block", size, layers,
                            drafter))
        elif name == "llama3.1-8b+llama3.2-1b":
            out.append(Pair(name, l8name, l8, l1name, l1, "ar", None, 0, None))
        elif name == "llama3.1-70b+llama3.2-1b":
            out.append(Pair(name, "Llama-3.1-70B", llama70b(), l1name, l1, "ar", None, 0, None))
        else:
            raise ValueError(f"unknown pair {name!r}")
    return out


# ----------------------------------------------------------------------------------- measured acceptance

class Evidence:
    """The committed results the SmolLM2 acceptance figures come from (each JSON loaded once; missing: None)."""

    FILES = ("bench_matrix.json", "bench_smollm2_pair.json", "tree_bench_smollm2-135m.json",
             "flex_study_smollm2-135m.json", "block_drafters_smollm2-135m.json", "choose_defaults_smollm2-135m.json")

    def __init__(self, results_dir: str):
        self.dir = results_dir
        self.data = {}
        for f in self.FILES:
            path = os.path.join(results_dir, f)
            if os.path.exists(path):
                with open(path) as fh:
                    self.data[f] = json.load(fh)

    def _matrix_cells(self, method, drafter, K):
        m = self.data.get("bench_matrix.json")
        if not m:
            return []
        return [c for s in m.get("suites", []) if s.get("suite", {}).get("pair") == "smollm2-135m"
                and s["suite"].get("temperature", TEMPERATURE) == TEMPERATURE for c in s.get("cells", []) if c.get("method") == method and c.get("batch") == 1
                and (drafter is None or c.get("drafter") == drafter) and (K is None or c.get("K") == K)
                and c.get("tokens_per_target_call")]

    def chain(self, method: str, drafter: str | None, K: int):
        """(a, measured tokens per cycle at K or None, source) of an `sd` chain (or `flex`, drafter None) at K, or
        None. A measurement at K is preferred; else the mean of the a's solved at the measured Ks."""
        from experiments.studies import cost_model as cm
        found = []  # (K, tokens per cycle, source)
        for c in self._matrix_cells(method, drafter, None):
            tpc = c.get("mean_acceptance_length") or c["tokens_per_target_call"]
            found.append((c["K"], tpc, f"bench_matrix.json ({c.get('label', method)}, B=1)"))
        if not found and method == "sd":
            pair = self.data.get("bench_smollm2_pair.json")
            for r in (pair or {}).get("rows", []):
                if r["method"] == "sd" and r["drafter"] == drafter and r["batch"] == 1 and r.get("drafted"):
                    found.append((r["K"], 1 + r["accepted"] * r["K"] / r["drafted"],
                                  f"bench_smollm2_pair.json (sd K={r['K']}, B=1)"))
        if not found and method == "sd":
            blocks = self.data.get("block_drafters_smollm2-135m.json")
            for r in (blocks or {}).get("rows", []):
                if r["method"] == "sd" and r["drafter"] == drafter and r["temperature"] == TEMPERATURE:
                    # its mean_acceptance_length is accepted drafts per cycle (without the bonus token)
                    found.append((r["K"], 1 + r["mean_acceptance_length"],
                                  f"block_drafters_smollm2-135m.json (sd K={r['K']}, B=1)"))
        if not found and method == "flex":
            flex = self.data.get("flex_study_smollm2-135m.json")
            batch = (flex or {}).get("prompts")
            for r in (flex or {}).get("rows", []):
                if r["part"] == "calibration" and r["setting"] == "calibrated" and r["temperature"] == TEMPERATURE:
                    found.append((r["K"], r["tokens_per_call"],
                                  f"flex_study_smollm2-135m.json (calibrated, K={r['K']}, B={batch})"))
        if not found:
            return None
        exact = [f for f in found if f[0] == K]
        if exact:
            k, tpc, src = exact[0]
            return cm.solve_acceptance(tpc, k), tpc, src
        a = sum(cm.solve_acceptance(t, k) for k, t, _ in found) / len(found)
        return a, None, "; ".join(s for _, _, s in found) + f" (mean a, extrapolated to K={K})"

    def multi(self, drafter: str, N: int, K: int):
        """(a, measured tokens per cycle at K or None, source) of `sd-multi` with N drafts, or None."""
        from experiments.studies import cost_model as cm
        tree = self.data.get("tree_bench_smollm2-135m.json")
        for r in (tree or {}).get("rows", []):
            if r["method"] == "sd-multi" and r["drafter"] == drafter and r["N"] == N and r.get("tokens_per_call"):
                at_k = r["K"] == K
                return (cm.solve_acceptance(r["tokens_per_call"], r["K"]), r["tokens_per_call"] if at_k else None,
                        f"tree_bench_smollm2-135m.json ({r['label']})" + ("" if at_k else f", extrapolated to K={K}"))
        return None

    def tree(self, drafter: str, shape: str):
        """(measured tokens per cycle, source) of `sd-tree` with this tree shape (with its sampling suffix), or None."""
        tree = self.data.get("tree_bench_smollm2-135m.json")
        for r in (tree or {}).get("rows", []):
            if r["method"] == "sd-tree" and r["drafter"] == drafter and r["tree"] == shape and r.get("tokens_per_call"):
                return r["tokens_per_call"], f"tree_bench_smollm2-135m.json ({r['label']})"
        return None

    def resample_rate(self, drafter: str, N: int, K: int):
        """(rate, source) of `smc`'s resampling per cycle at (N, K), batch 1, or None."""
        pair = self.data.get("bench_smollm2_pair.json")
        for r in (pair or {}).get("rows", []):
            if r["method"] == "smc" and r["drafter"] == drafter and r["N"] == N and r["K"] == K and r["batch"] == 1 \
                    and r.get("resample_rate") is not None:
                return r["resample_rate"], f"bench_smollm2_pair.json (smc N={N} K={K}, B=1)"
        return None

    def smc_quality(self, drafter: str, N: int, K: int) -> str | None:
        """The fidelity verdict of choose_defaults on `smc` at (N, K) when it failed, else None."""
        cd = self.data.get("choose_defaults_smollm2-135m.json")
        for c in (cd or {}).get("candidates", {}).get(drafter, []):
            cand = c.get("candidate", {})
            if cand.get("method") == "smc" and cand.get("num_particles") == N \
                    and cand.get("num_speculative_tokens") == K and c.get("passes") is False:
                return f"failed the fidelity check ({c.get('why')}, choose_defaults_smollm2-135m.json)"
        return None


# ----------------------------------------------------------------------------------- the projections

def chips_for(dname: str, pair: Pair, headroom: float, forced: int | None) -> int:
    """Fewest chips (a power of two) whose HBM holds the pair's bf16 weights with `headroom` of it to spare."""
    if forced:
        return forced
    need = 2 * (pair.tcfg.num_params + pair.dcfg.num_params)
    chips = 1
    while need > (1 - headroom) * chips * HBM_BYTES[dname]:
        chips *= 2
    return chips


def tree_shape(spec: str) -> tuple[list[int], int]:
    """(children per node at each depth, nodes) of a tree "w1,w2,...": w1 children of the root, w2 below each, ..."""
    widths = [int(w) for w in spec.split(":")[0].split(",")]
    nodes, level = 0, 1
    for w in widths:
        level *= w
        nodes += level
    return widths, nodes


def flex_config_for(pair: Pair) -> dict:
    """FlexDraft adapters of the pair's target: SmolLM2's shipped ones; for another target the same group size and
    calibration MLP, and the adapted layers scaled to the same fraction of the target's depth."""
    shipped = _shipped_config("flex").get("flex", {"adapter_layers": 4, "group_size": 8, "calib_hidden": 256})
    if pair.drafter is not None:
        return dict(shipped, scaled=False)
    L0 = _shipped_config("flex").get("target", {}).get("num_hidden_layers", 30)
    layers = max(1, round(shipped["adapter_layers"] * pair.tcfg.num_hidden_layers / L0))
    return dict(shipped, adapter_layers=layers, scaled=True)


def _row(dname, dev, chips, pair: Pair, method, **kw) -> dict:
    row = dict.fromkeys(ROW_FIELDS)
    row.update(device=dname, device_desc=dev.name, chips=chips, pair=pair.name, target=pair.target, draft=pair.draft,
               method=method, skipped=False)
    row.update(kw)
    return row


def _skip(dname, dev, chips, pair, method, reason, **kw) -> dict:
    return _row(dname, dev, chips, pair, method, skipped=True, reason=reason, **kw)


def project_pair(dname: str, pair: Pair, ev: Evidence, args) -> list[dict]:
    """Every method's row for one (device, pair)."""
    from experiments.studies import cost_model as cm
    from experiments.bench.tree import Config, project

    chips = chips_for(dname, pair, args.hbm_headroom, args.chips)
    dev = dataclasses.replace(cm.DEVICES[dname], overhead_s=args.overhead_us * 1e-6)
    dev = cm.tensor_parallel(dev, chips, args.allreduce_us * 1e-6)
    B, K, P = args.batch, args.k, args.prompt_len
    context = args.prompt_len + args.output_len // 2
    tcfg, dcfg, block = pair.tcfg, pair.dcfg, pair.block
    measured = pair.drafter is not None
    no_sd = None  # why the chain's acceptance is missing
    rows = []

    def done(method, r, **kw):
        rows.append(_row(dname, dev, chips, pair, method, tokens_per_cycle=r["tokens_per_cycle"], cycle_s=r["cycle_s"],
                         tokens_per_s=r["tokens_per_s"], bound=r["bound"], **kw))

    # ar: the reference of every ratio
    done("ar", cm.steady_state("ar", tcfg, dcfg, B, 1, 1, context, dev, {}), settings="–",
         acceptance_source="– (one token per target call)")

    # the chain's per-token acceptance (sd, sd-overlap, and the lower bound of sd-multi / sd-tree)
    if measured:
        chain = ev.chain("sd", pair.drafter, K)
        if chain is None:
            no_sd = f"no measured sd acceptance for {pair.drafter} in {ev.dir} (looked in {', '.join(ev.FILES[:2])}, " \
                    f"{ev.FILES[4]})"
            a_sd = meas_sd = src_sd = None
        else:
            a_sd, meas_sd, src_sd = chain
    else:
        a_sd, meas_sd, src_sd = args.llama_acceptance, None, "assumed (--llama-acceptance)"

    # sd
    if a_sd is None:
        rows.append(_skip(dname, dev, chips, pair, "sd", no_sd, K=K, settings=f"K={K}"))
    else:
        r = cm.steady_state("sd", tcfg, dcfg, B, 1, K, context, dev, {"acceptance_sd": a_sd}, P, block)
        done("sd", r, K=K, settings=f"K={K}", acceptance=a_sd, measured_tokens_per_cycle=meas_sd,
             acceptance_source=src_sd)

    # sd-multi: N independent drafts in one call of B*N rows
    N = args.multi_n
    multi = ev.multi(pair.drafter, N, K) if measured else None
    if multi is not None:
        a_m, meas_m, src_m = multi
        note_m = None
    else:
        a_m, meas_m = a_sd, None
        src_m = f"sd's: {src_sd}" if a_sd is not None else None
        note_m = "tokens/cycle of a single chain: a lower bound (no multi-draft measurement for this pair at this N)"
    if a_m is None:
        rows.append(_skip(dname, dev, chips, pair, "sd-multi", no_sd, K=K, N=N, settings=f"N={N} K={K}"))
    else:
        r = cm.steady_state("sd-multi", tcfg, dcfg, B, N, K, context, dev, {"acceptance_sd_multi": a_m}, P, block)
        done("sd-multi", r, K=K, N=N, settings=f"N={N} K={K}", acceptance=a_m, measured_tokens_per_cycle=meas_m,
             acceptance_source=src_m, note=note_m)

    # sd-tree: one row verifying the whole tree (tree_bench.project: batch 1)
    widths, nodes = tree_shape(args.tree)
    shape = args.tree.split(":")[0] + (":distinct" if pair.kind == "block" and widths[0] > 1 else ":sample")
    tree_kw = dict(tree=shape, tree_nodes=nodes, settings=f"tree {shape} ({nodes} nodes)")
    tree = ev.tree(pair.drafter, shape) if measured else None
    if B != 1:
        rows.append(_skip(dname, dev, chips, pair, "sd-tree", f"the tree projection (tree_bench.project) is for batch "
                                                              f"1 only; this table is at batch {B}", **tree_kw))
    elif tree is None and a_sd is None:
        rows.append(_skip(dname, dev, chips, pair, "sd-tree", no_sd, **tree_kw))
    else:
        if tree is not None:
            tokens, src_t, a_t, note_t = tree[0], tree[1], None, None
        else:
            tokens, src_t, a_t = cm.expected_tokens(a_sd, len(widths)), f"sd's: {src_sd}", a_sd
            note_t = f"tokens/cycle of a chain of depth {len(widths)}: a lower bound (no tree measurement for " \
                     "this pair and shape)"
        cfg = Config("tree", pair.drafter or "ar", "sd-tree", nodes + 1, tree=shape)
        tps = project(cfg, tokens, tcfg, dcfg, pair.kind, block or 16, context, dev)
        _, bound = cm.call_time(tcfg, 1, nodes + 1, context + nodes + 1, dev)
        done("sd-tree", dict(tokens_per_cycle=tokens, cycle_s=tokens / tps, tokens_per_s=tps, bound=bound), **tree_kw,
             acceptance=a_t, measured_tokens_per_cycle=tokens if tree is not None else None, acceptance_source=src_t,
             note=note_t)

    # smc: K+1 tokens per particle and cycle, no acceptance; resampling gathers the particles' own KV slots
    Ns, Ks = args.smc_n, args.smc_k
    rate = ev.resample_rate(pair.drafter, Ns, Ks) if measured else None
    if rate is not None:
        rr, src_r = rate
    elif measured:
        rr, src_r = 1.0, "not measured at this (N, K): every cycle assumed (an upper bound on its cost)"
    else:
        rr, src_r = args.llama_resample_rate, "assumed (--llama-resample-rate)"
    quality = ev.smc_quality(pair.drafter, Ns, Ks) if measured else None
    r = cm.steady_state("smc", tcfg, dcfg, B, Ns, Ks, context, dev, {"resample_rate": rr}, P, block)
    done("smc", r, K=Ks, N=Ns, settings=f"N={Ns} K={Ks}", resample_rate=rr,
         acceptance_source=f"none needed; resampling rate: {src_r}",
         note="approximate" + (f"; {quality}" if quality else ""))

    # flex: the target drafts for itself through mask adapters (no separate drafter)
    fc = flex_config_for(pair)
    flex_kw = dict(K=K)
    if K > fc["group_size"]:
        rows.append(_skip(dname, dev, chips, pair, "flex", f"K={K} is more than the adapters' group size "
                                                           f"({fc['group_size']})", settings=f"K={K}", **flex_kw))
    else:
        if measured:
            fx = ev.chain("flex", None, K)
            a_f, meas_f, src_f = fx if fx else (None, None, None)
            own = f"the shipped SmolLM2 `flex` adapters, not {pair.drafter}: the same row for every SmolLM2 pair"
        else:
            a_f = args.llama_flex_acceptance if args.llama_flex_acceptance is not None else args.llama_acceptance
            meas_f = None
            src_f = "assumed (" + ("--llama-flex-acceptance" if args.llama_flex_acceptance is not None
                                   else "= --llama-acceptance") + ")"
            own = f"no FlexDraft adapters exist for {pair.target}: SmolLM2's shipped configuration scaled, " \
                  f"{fc['adapter_layers']} of {tcfg.num_hidden_layers} layers adapted"
        settings = f"K={K}, {fc['adapter_layers']} adapter layers, group {fc['group_size']}"
        if a_f is None:
            rows.append(_skip(dname, dev, chips, pair, "flex", f"no measured flex acceptance in {ev.dir} (looked in "
                                                               f"{ev.FILES[0]}, {ev.FILES[3]})", settings=settings,
                              **flex_kw))
        else:
            cache_len = context + K + 1
            (par, pb), (seq, sb) = cm.flex_cycle_times(tcfg, B, K, fc["group_size"], fc["adapter_layers"],
                                                       fc["calib_hidden"], cache_len, dev, with_bound=True)
            switch = cm.flex_switch_point(tcfg, K, fc["group_size"], fc["adapter_layers"], fc["calib_hidden"],
                                          cache_len, dev)
            mode, cycle, bound = ("parallel", par, pb) if par <= seq else ("sequential", seq, sb)
            tokens = cm.expected_tokens(a_f, K)
            switch_txt = f"sequential faster from B={switch}" if switch else "faster at every B up to 4096"
            done("flex", dict(tokens_per_cycle=tokens, cycle_s=cycle, tokens_per_s=B * tokens / cycle, bound=bound),
                 settings=f"{settings}, {mode} mode ({switch_txt})", flex_mode=mode, acceptance=a_f,
                 measured_tokens_per_cycle=meas_f, acceptance_source=src_f, note=own, **flex_kw)

    # sd-overlap: two half-batches, drafter and target on separate device groups (MineDraft)
    if a_sd is None:
        rows.append(_skip(dname, dev, chips, pair, "sd-overlap", no_sd, K=K, settings=f"K={K}"))
    else:
        Be = B + B % 2  # an odd batch gets one padding row (smcsd/methods/sd_overlap.py): halves of Be / 2
        hidden = pair.hidden_layers * tcfg.hidden_size * 2  # block drafters get the target's hidden states back
        stats = {"acceptance_sd": a_sd}
        same = cm.overlap_projection(tcfg, dcfg, Be, K, context + K + 1, dev, stats, block, hidden)
        mine = cm.overlap_projection(tcfg, dcfg, B, K, context + K + 1, dev, stats, block, hidden)
        tokens = same["tokens_per_cycle"]
        cycle = Be * tokens / same["overlap_same_tokens_per_s"]  # two half-steps: every request gains one cycle
        _, bound = cm.call_time(tcfg, Be // 2, K + 1, context + K + 1, dev)
        pad = " (one padding)" if B % 2 else ""
        own = "its own chip" if chips == 1 else f"its own {chips} chips"
        note = (f"drafter on {own}; MineDraft's setting, {2 * B} requests in flight (halves of {B}): "
                f"{mine['overlap_doubled_tokens_per_s']:.0f} tok/s in all, {mine['overlap_doubled_speedup']:.2f}× sd")
        done("sd-overlap", dict(tokens_per_cycle=tokens, cycle_s=cycle, tokens_per_s=B * tokens / cycle, bound=bound),
             K=K, settings=f"K={K}, 2 halves of {Be // 2} request(s){pad}", acceptance=a_sd,
             measured_tokens_per_cycle=meas_sd, acceptance_source=src_sd, note=note)

    ar_tps = rows[0]["tokens_per_s"]
    for r in rows:
        if not r["skipped"]:
            r["speedup_vs_ar"] = r["tokens_per_s"] / ar_tps
    return rows


# ----------------------------------------------------------------------------------- reporting

def _device_label(r) -> str:
    return r["device"] if r["chips"] == 1 else f"{r['device']} ×{r['chips']} (TP)"


def _acceptance_cell(r) -> str:
    if r["method"] == "ar":
        return "–"
    if r["method"] == "smc":
        return f"– (resample {r['resample_rate']:.2f})"
    if r["method"] == "sd-tree" and r["acceptance"] is None and r["measured_tokens_per_cycle"] is not None:
        return f"{r['measured_tokens_per_cycle']:.3f} tok/cycle"
    return "–" if r["acceptance"] is None else f"a={r['acceptance']:.3f}"


def table(rows) -> str:
    body = []
    for r in rows:
        body.append([_device_label(r), r["pair"], r["method"], r["settings"] or "–", _acceptance_cell(r),
                     r["acceptance_source"] or "–", report.fmt(r["tokens_per_cycle"], ".2f"),
                     report.fmt(None if r["cycle_s"] is None else 1e3 * r["cycle_s"], ".3f"),
                     report.fmt(r["tokens_per_s"], ".0f"),
                     "–" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.2f}×", r["bound"] or "–",
                     ("skipped: " + r["reason"]) if r["skipped"] else (r["note"] or "")])
    return report.markdown_table(["device", "pair", "method", "settings", "acceptance", "source", "tokens/cycle",
                                  "cycle (ms)", "tokens/s", "vs ar", "bound", "note"], body)


def _smol_flex_vs_ar(rows) -> str:
    """The measured SmolLM2 per-token acceptance of the flex adapters next to the AR drafter's (a caveat on
    transferring one acceptance to both on Llama), or ""."""
    a = {}
    for r in rows:
        if r["pair"] == "smollm2-135m+ar-distilled" and r["method"] in ("sd", "flex") and r["acceptance"] is not None:
            a[r["method"]] = r["acceptance"]
    if len(a) < 2:
        return ""
    return (f"; no measurement supports it: on SmolLM2 the shipped adapters' a = {a['flex']:.2f}, the distilled AR "
            f"drafter's {a['sd']:.2f}")


def assumptions(args, context: int, rows=()) -> list[str]:
    la = args.llama_acceptance
    lf = args.llama_flex_acceptance if args.llama_flex_acceptance is not None else la
    return [
        f"steady-state decode at batch {args.batch}: no prefill, the cache holding prompt + output/2 = {context} "
        f"tokens (prompt {args.prompt_len}, output {args.output_len}); every call a roofline call, "
        f"max(bytes / bandwidth, FLOPs / peak) + {args.overhead_us:g} µs x (layers + 1), bf16 weights "
        "(experiments/studies/cost_model.py)",
        "acceptance: a = i.i.d. per-token acceptance, tokens/cycle = (1 - a^(K+1)) / (1 - a); SmolLM2 figures "
        f"measured at T={TEMPERATURE} on this repository's CPU runs (file and batch in the source column) and "
        "transferred to the accelerators (acceptance does not depend on the device)",
        f"Llama pairs: a = {la:g} assumed for the 1B drafter (--llama-acceptance) and {lf:g} for FlexDraft adapters "
        f"(--llama-flex-acceptance{_smol_flex_vs_ar(rows)}); sd-multi and sd-tree get the chain's tokens/cycle (a "
        f"lower bound); smc's resampling rate {args.llama_resample_rate:g} per cycle (--llama-resample-rate)",
        f"chips: the fewest (a power of two) whose HBM (H100 80 GB, v5e 16 GB) holds the bf16 weights with "
        f"{args.hbm_headroom:.0%} to spare; several: tensor-parallel, summed bandwidth and FLOP rate, "
        f"+2 all-reduces of {args.allreduce_us:g} µs per layer (as experiments/studies/paper_check.py)",
        "sd-tree: tree_bench.project (root children drawn i.i.d. for an AR drafter, without replacement for a block "
        "drafter; one draft call per level / one block call), batch 1 only",
        "flex: cost_model.flex_cycle_times, the faster of its parallel / sequential modes at this batch; the library's "
        "`auto` mode switches to sequential above 4 requests",
        "sd-overlap: cost_model.overlap_projection with the same requests split into two halves (an odd batch padded); "
        "the drafter gets its own group of chips; the note gives MineDraft's setting (twice the requests in flight)",
        "smc: K+1 tokens per particle and cycle, its prompt KV shared by the particles, resampling = a gather of the "
        "particles' own KV slots of both models; it is approximate, so its tokens/s is not comparable in quality "
        "with the exact methods'",
    ]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--devices", nargs="+", choices=DEVICE_NAMES, default=list(DEVICE_NAMES))
    ap.add_argument("--pairs", nargs="+", choices=PAIR_NAMES, default=list(DEFAULT_PAIRS),
                    help="pairs (default: SmolLM2 with ar-distilled and dflash-dpace, both Llama pairs)")
    ap.add_argument("--batch", type=int, default=1, help="requests decoded together (default 1)")
    ap.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (default 256)")
    ap.add_argument("--output-len", type=int, default=512, help="new tokens per request (default 512)")
    ap.add_argument("-K", "--k", type=int, default=4, help="draft length of sd, sd-multi, flex, sd-overlap (default 4)")
    ap.add_argument("--multi-n", type=int, default=2, help="sd-multi: drafts per request (default 2, as measured)")
    ap.add_argument("--tree", default="3,1,1,1",
                    help="sd-tree shape W,1,1,...: W children of the root, each the head of a chain (default 3,1,1,1: "
                         "12 nodes, as measured in tree_bench)")
    ap.add_argument("--smc-n", type=int, default=4, help="smc: particles (default 4)")
    ap.add_argument("--smc-k", type=int, default=4, help="smc: draft length (default 4)")
    ap.add_argument("--llama-acceptance", type=float, default=0.81,
                    help="Llama pairs: assumed per-token acceptance of the 1B drafter (default 0.81)")
    ap.add_argument("--llama-flex-acceptance", type=float, default=None,
                    help="Llama pairs: assumed per-token acceptance of FlexDraft adapters "
                         "(default: --llama-acceptance)")
    ap.add_argument("--llama-resample-rate", type=float, default=1.0,
                    help="Llama pairs: smc's resampling rate per cycle (default 1: every cycle, the costliest)")
    ap.add_argument("--chips", type=int, default=None, help="chips per pair (default: the fewest that hold it)")
    ap.add_argument("--hbm-headroom", type=float, default=0.2,
                    help="fraction of HBM kept free of weights when choosing the chips (default 0.2)")
    ap.add_argument("--overhead-us", type=float, default=1.0, help="fixed overhead per call per (layer + 1), µs")
    ap.add_argument("--allreduce-us", type=float, default=8.0, help="tensor parallel: one all-reduce's latency, µs")
    ap.add_argument("--results-dir", default=report.results_path(), help="where the measured results are read from")
    ap.add_argument("--out", default=report.results_path("projections.json"))
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("argument --batch: must be >= 1")
    try:
        widths, _ = tree_shape(args.tree)
    except ValueError:
        widths = []
    if not widths or widths[0] < 1 or any(w != 1 for w in widths[1:]):
        ap.error(f"argument --tree: {args.tree!r} is not of the form W,1,1,... (W >= 1 children of the root, then "
                 "chains: the family tree_bench measures and projects)")
    ev = Evidence(args.results_dir)
    pairs = make_pairs(args.pairs)
    rows = [r for d in args.devices for p in pairs for r in project_pair(d, p, ev, args)]
    context = args.prompt_len + args.output_len // 2
    notes = assumptions(args, context, rows)
    markdown = table(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    print(markdown)
    used = " ".join(f"{r['acceptance_source']} {r['note']}" for r in rows)
    sources = {f: os.path.relpath(os.path.join(ev.dir, f), REPO) for f in ev.data if f in used}
    result = report.new_result(
        SCHEMA, command=report.command(__file__, argv),
        settings=dict(devices=args.devices, pairs=args.pairs, batch=args.batch, prompt_len=args.prompt_len,
                      output_len=args.output_len, context=context, K=args.k, multi_n=args.multi_n, tree=args.tree,
                      smc_n=args.smc_n, smc_k=args.smc_k, llama_acceptance=args.llama_acceptance,
                      llama_flex_acceptance=args.llama_flex_acceptance, llama_resample_rate=args.llama_resample_rate,
                      chips=args.chips, hbm_headroom=args.hbm_headroom, overhead_us=args.overhead_us,
                      allreduce_us=args.allreduce_us, measured_temperature=TEMPERATURE),
        sources=sources, assumptions=notes, rows=rows, markdown=markdown)
    print("wrote", report.write_json(args.out, report.json_safe(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
