"""FlexDraft (method `flex`) on a pair with shipped adapters (tiny-code by default), side by side in one run:

    python -m experiments.studies.flex --pair tiny-code
    python -m experiments.studies.flex --pair tiny-code --parts speed --batch-sizes 1 4 16

1. calibration: tokens per target call with the trained bonus-guided calibration vs the same adapters with it
   zeroed (`smcsd.train.flex.without_calibration`), K = 4 and 8, T = 0 and 0.7;
2. confidence cut: tau in --taus: drafts verified per cycle (stats.num_draft_tokens / num_drafts), tokens per call;
3. speed: tokens/s of `flex` parallel and sequential, `sd` with the pair's dflash-dpace drafter and `ar`, at each
   batch size (interleaved rounds, compile excluded, median of --repeats), which locates the parallel/sequential
   switch point on this machine;
4. pack (`--parts pack`): the sequential mode at the largest batch size, K = 8, T = 0.7, with the cut `--pack-tau`
   and each verify call's token budget in --budgets (0: unpacked, the width switch) — tokens/s against `ar`,
   tokens per call and drafts verified per cycle, interleaved rounds.
Prompts: held-out code (tiny-code) or chat requests (SmolLM2). JSON: --out (default
experiments/results/flex_study_<pair>.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from experiments import report

SCHEMA = "smcsd.flex_study/1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--parts", nargs="+", default=["calibration", "cut", "speed"])
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.01, 0.1, 0.3])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 64, 32, 16],
                    help="pack part: verify tokens per call across the batch (0: unpacked)")
    ap.add_argument("--pack-tau", type=float, default=0.1, help="pack part: the confidence cut")
    ap.add_argument("--sd-drafters", nargs="+", default=None,
                    help="separate drafters for the sd cells (default: the pair's best and dflash-dpace)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import smcsd
    from experiments.common import prompts_for
    from smcsd.train.flex import without_calibration
    from experiments.bench.tree import bootstrap_se, per_request, pooled

    dtype = "float32" if args.pair == "smollm2-135m" else None
    target, flex = smcsd.load(args.pair, drafter="flex", dtype=dtype)
    prompts = prompts_for(args.pair, target, args.prompts, args.prompt_tokens)
    rows, t0 = [], time.time()

    def run(d, K, T, timed=False, **kw):
        per, verified, drafts, toks, wall = [], 0, 0, 0, 0.0
        if timed:  # compile outside the timing
            smcsd.decode(prompts, target=target, draft=d, method="flex", num_speculative_tokens=K, temperature=T,
                         seed=0, max_new_tokens=args.max_new, **kw)
        for seed in range(args.seeds):
            r = smcsd.decode(prompts, target=target, draft=d, method="flex", num_speculative_tokens=K, temperature=T,
                             seed=seed, max_new_tokens=args.max_new, **kw)
            per += per_request(r)
            verified += r.stats.num_draft_tokens
            drafts += r.stats.num_drafts
            toks += r.stats.num_generated_tokens
            wall += r.stats.wall_time_s
        return (per, verified / max(drafts, 1)) + ((toks / wall,) if timed else ())

    if "calibration" in args.parts:
        plain = flex.with_params(without_calibration(flex.params))
        for T in args.temperatures:
            for K in args.ks:
                if K > flex.flex_config.group_size:
                    continue
                ref = None
                for label, d in (("calibrated", flex), ("no calibration", plain)):
                    per, _ = run(d, K, T)
                    row = {"part": "calibration", "setting": label, "K": K, "temperature": T,
                           "tokens_per_call": pooled(per), "se": bootstrap_se(per)}
                    if ref is not None:
                        row["vs_first"], row["vs_first_se"] = pooled(per) - pooled(ref), bootstrap_se(per, ref)
                    ref = ref or per
                    rows.append(row)
                    print(row, flush=True)
    if "cut" in args.parts:
        K = min(8, flex.flex_config.group_size)
        ref = None
        for tau in args.taus:  # batch of all prompts: the call's width follows its least confident row
            per, verified, tps = run(flex.with_options(tau=tau), K, 0.7, timed=True)
            row = {"part": "cut", "setting": f"tau={tau:g}", "K": K, "temperature": 0.7,
                   "tokens_per_call": pooled(per), "se": bootstrap_se(per), "verified_per_cycle": verified,
                   "tokens_per_s": tps}
            if ref is not None:
                row["vs_first"], row["vs_first_se"] = pooled(per) - pooled(ref), bootstrap_se(per, ref)
            ref = ref or per
            rows.append(row)
            print(row, flush=True)
    if "speed" in args.parts:
        names = args.sd_drafters or list(dict.fromkeys([smcsd.available_drafters(args.pair)[0], "dflash-dpace"]))
        separate = {n: smcsd.load(args.pair, drafter=n, dtype=dtype)[1] for n in names}
        speed = {}
        for B in args.batch_sizes:
            batch = (prompts * (B // len(prompts) + 1))[:B]
            cells = [("ar", dict(method="ar"))] + [
                (f"sd K=4 {n}", dict(method="sd", draft=d, num_speculative_tokens=4)) for n, d in separate.items()] + [
                     ("flex parallel K=4", dict(method="flex", draft=flex.with_options(mode="parallel"),
                                                num_speculative_tokens=4)),
                     ("flex sequential K=4", dict(method="flex", draft=flex.with_options(mode="sequential"),
                                                  num_speculative_tokens=4))]
            kw = dict(target=target, temperature=0.7, max_new_tokens=args.max_new)
            for _, c in cells:  # compile outside the timing
                smcsd.decode(batch, seed=0, **kw, **c)
            times = {label: [] for label, _ in cells}
            toks = {label: 0 for label, _ in cells}
            for rnd, (label, c) in report.round_robin(cells, args.repeats):
                t = time.perf_counter()
                r = smcsd.decode(batch, seed=rnd + 1, **kw, **c)
                times[label].append(time.perf_counter() - t)
                toks[label] = sum(len(x) for x in r.tokens)
            ar = toks["ar"] / statistics.median(times["ar"])
            for label, _ in cells:
                tps = toks[label] / statistics.median(times[label])
                rows.append({"part": "speed", "setting": label, "batch": B, "tokens_per_s": tps, "vs_ar": tps / ar})
                speed[(label, B)] = tps
                print(rows[-1], flush=True)
        # Where sequential overtakes parallel: measured here, and by the cost model on accelerators.
        seq_wins = [B for B in args.batch_sizes
                    if speed[("flex sequential K=4", B)] > speed[("flex parallel K=4", B)]]
        rows.append({"part": "switch", "setting": "this CPU (measured)", "batch": min(seq_wins) if seq_wins else None,
                     "note": "smallest measured batch where sequential beats parallel"
                             + ("" if seq_wins else f" (none up to {max(args.batch_sizes)})")})
        from experiments.studies import cost_model as cm
        fc = flex.flex_config
        configs = {"SmolLM2-135M (bf16)": cm.real_configs()["smollm2-135m+dflash"][0][1],
                   "Llama-3.1-8B (bf16)": cm.real_configs()["llama3.1-8b+llama3.2-1b"][0][1]}
        for dev in ("h100", "tpu-v5e"):
            for name, cfg in configs.items():
                sw = cm.flex_switch_point(cfg, 4, fc.group_size, fc.adapter_layers, fc.calib_hidden,
                                          args.prompt_tokens + args.max_new + 5, cm.DEVICES[dev])
                rows.append({"part": "switch", "setting": f"{dev}, {name} (cost model)", "batch": sw,
                             "note": "smallest power of two where sequential beats parallel"
                                     + ("" if sw else " (none up to 4096)")})
                print(rows[-1], flush=True)
    if "pack" in args.parts:
        B, K = max(args.batch_sizes), min(8, flex.flex_config.group_size)
        batch = (prompts * (B // len(prompts) + 1))[:B]
        seq = flex.with_options(mode="sequential", tau=args.pack_tau)
        cells = [("ar", dict(method="ar"))] + [
            (f"budget={b or 'none'}", dict(method="flex", num_speculative_tokens=K,
                                            draft=seq.with_options(token_budget=b or None))) for b in args.budgets]
        kw = dict(target=target, temperature=0.7, max_new_tokens=args.max_new)
        for _, c in cells:  # compile outside the timing
            smcsd.decode(batch, seed=0, **kw, **c)
        times = {label: [] for label, _ in cells}
        stats = {label: [] for label, _ in cells}
        for rnd, (label, c) in report.round_robin(cells, args.repeats):
            t = time.perf_counter()
            r = smcsd.decode(batch, seed=rnd + 1, **kw, **c)
            times[label].append(time.perf_counter() - t)
            stats[label].append(r)
        def rate(label):
            return [sum(len(x) for x in r.tokens) / t for r, t in zip(stats[label], times[label])]
        ar = statistics.median(rate("ar"))
        for label, _ in cells[1:]:
            rs = stats[label]
            tps = statistics.median(rate(label))
            rows.append({"part": "pack", "setting": f"{label}, tau={args.pack_tau:g}", "batch": B, "temperature": 0.7,
                         "tokens_per_s": tps, "vs_ar": tps / ar,
                         # per request and cycle (the sequential mode's cycle is two calls): 1 + accepted drafts
                         "tokens_per_call": 1 + sum(r.stats.num_accepted_tokens for r in rs)
                         / max(1, sum(r.stats.num_drafts for r in rs)),
                         "verified_per_cycle": sum(r.stats.num_draft_tokens for r in rs)
                         / max(1, sum(r.stats.num_drafts for r in rs))})
            print(rows[-1], flush=True)
        rows.append({"part": "pack", "setting": "ar", "batch": B, "tokens_per_s": ar, "vs_ar": 1.0})
    cols = ["part", "setting", "K / batch", "T", "tokens per call", "± se", "vs first row", "verified per cycle",
            "tok/s", "vs ar"]
    table = [[r["part"], r["setting"], r.get("K", r.get("batch")), r.get("temperature", "–"),
              report.fmt(r.get("tokens_per_call"), ".3f"), report.fmt(r.get("se"), ".3f"),
              f"{r['vs_first']:+.3f} ± {r['vs_first_se']:.3f}" if "vs_first" in r else "–",
              report.fmt(r.get("verified_per_cycle"), ".2f"), report.fmt(r.get("tokens_per_s"), ".1f"),
              report.fmt(r.get("vs_ar"), ".2f")] for r in rows if r["part"] != "switch"]
    markdown = report.markdown_table(cols, table)
    switch = [r for r in rows if r["part"] == "switch"]
    if switch:
        markdown += "\n\n" + report.markdown_table(["switch point", "batch", "note"],
                                                    [[r["setting"], report.fmt(r["batch"], "d"), r["note"]]
                                                     for r in switch])
    print(markdown)
    out = report.new_result(SCHEMA, command=report.command(__file__, argv), pair=args.pair,
                            machine=report.machine_info(), prompts=len(prompts), max_new_tokens=args.max_new,
                            seeds=args.seeds, rows=rows, markdown=markdown, wall_s=round(time.time() - t0, 1))
    path = args.out or report.results_path(f"flex_study_{args.pair}.json")
    report.write_json(path, report.json_safe(out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
