"""Token trees at equal verification budget: chain vs sd-multi vs AR-draft tree vs block-drafter tree vs D²SD tree.

    python -m experiments.bench.tree --pair tiny-code                       # acceptance study (seeds x prompts)
    python -m experiments.bench.tree --pair smollm2-135m --timing           # + wall clock at batch 1, side by side
    python -m experiments.bench.tree --pair tiny-code --quick               # a small run (tests)

The budget of a configuration is the number of tokens its target call verifies per request and cycle (the root
x_0 included): `sd` K → K+1, `sd-multi` N×K → N·(K+1) (N rows), a tree of M nodes → M+1 (one row). At each
budget (5, 9, 13, 17 by default) the families are:
- chain: the block drafter (dflash-dpace) with `sd`, K = budget − 1 (one block forward whatever K);
- sd-multi: the block drafter with `sd-multi`, N chains of K = 4 (budget N·5: 10, 15);
- ar-tree: the distilled AR drafter with `sd-tree`, trees "1,1,1,1", "2,1,1,1", "3,1,1,1", "4,1,1,1" (root children
  drawn i.i.d., chains below: sd-multi's forest in one row);
- block-tree: the block drafter with `sd-tree`, the same shapes with root children drawn without replacement;
- d2sd: the D²SD drafter with `sd-tree`, the main chain of 4 plus 0..3 re-anchored branches ("1,1,1,1+B").
Reported per configuration: mean accepted tokens per target call (stats.mean_acceptance_length: accepted + the
correction/bonus token, averaged over runs), the bootstrap standard error (over requests x seeds) of the pooled
tokens per call, the gain over the chain at the same (or the next lower) budget, paired by request with its
bootstrap standard error, and with --timing the
wall-clock tokens/s at batch 1 (every configuration on every prompt in interleaved rounds; the first round
compiles and is not timed) with the speed-up over `ar` measured in the same rounds. The cost model
(experiments/studies/cost_model.py: roofline calls on H100 / TPU v5e) projects each configuration's tokens/s from its
measured tokens per call, its target call over `budget` tokens and its drafter calls.
JSON: --out (default experiments/results/tree_bench_<pair>.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time

from experiments import report

SCHEMA = "smcsd.tree_bench/1"


@dataclasses.dataclass(frozen=True)
class Config:
    family: str
    drafter: str | None
    method: str
    budget: int
    K: int = 4
    N: int = 1
    tree: str | None = None

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "ar"
        shape = self.tree if self.tree else (f"N={self.N} K={self.K}" if self.method == "sd-multi" else f"K={self.K}")
        return f"{self.family} {shape}"

    def kwargs(self) -> dict:
        kw = {"method": self.method}
        if self.method in ("sd", "sd-multi"):
            kw["num_speculative_tokens"] = self.K
        if self.method == "sd-multi":
            kw["num_particles"] = self.N
        if self.tree:
            kw["tree"] = self.tree
        return kw


def configs(budgets, block: str, ar_name: str | None, d2sd: str | None, timing: bool) -> list[Config]:
    out = [Config("ar", None, "ar", 1)] if timing else []
    for b in budgets:
        width = (b - 1) // 4  # children of the root for the depth-4 trees of this budget
        if b - 1 <= 15:
            out.append(Config("chain", block, "sd", b, K=b - 1))
        if b % 5 == 0 and b // 5 >= 2:
            out.append(Config("sd-multi", block, "sd-multi", b, K=4, N=b // 5))
        if (b - 1) % 4 == 0 and width >= 1:
            shape = ",".join([str(width), "1", "1", "1"])
            if ar_name:
                out.append(Config("ar-tree", ar_name, "sd-tree", b, tree=shape + ":sample"))
            if width > 1:
                out.append(Config("block-tree", block, "sd-tree", b, tree=shape + ":distinct"))
            if d2sd and width - 1 <= 4:
                out.append(Config("d2sd", d2sd, "sd-tree", b, tree="1,1,1,1" + (f"+{width - 1}" if width > 1 else "")))
    return out


def per_request(res) -> list[tuple[int, int]]:
    """(new tokens after the prefill's, live target calls) of each request of a decode."""
    calls = res.stats.target_calls_per_request or []
    return [(len(t) - 1, c) for t, c in zip(res.tokens, calls) if c > 0]


def pooled(pairs) -> float:
    """Tokens per target call over all requests: Σ tokens / Σ calls."""
    return sum(t for t, _ in pairs) / max(1, sum(c for _, c in pairs))


def bootstrap_se(pairs, ref=None, resamples: int = 2000, seed: int = 0) -> float:
    """Standard error of `pooled(pairs)` (or of pooled(pairs) − pooled(ref), resampling the same requests of both:
    a paired comparison) by the bootstrap over requests."""
    import numpy as np
    a = np.asarray(pairs, float)
    b = None if ref is None else np.asarray(ref, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), (resamples, len(a)))
    stat = a[idx, 0].sum(1) / np.maximum(a[idx, 1].sum(1), 1)
    if b is not None:
        stat = stat - b[idx, 0].sum(1) / np.maximum(b[idx, 1].sum(1), 1)
    return float(stat.std(ddof=1))


def se(xs):
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")


def _drafter_config(drafter):
    """(config, tokens per draft call, calls) of the drafter for the cost model."""
    from smcsd.drafters import ARDrafter, DFlashDrafter, D2SDDrafter, as_drafter
    d = as_drafter(drafter)
    if isinstance(d, ARDrafter):
        return d.model_config, "ar"
    if isinstance(d, D2SDDrafter):
        return d.main.block_config.model, "block"
    if isinstance(d, DFlashDrafter):
        return d.block_config.model, "block"
    return None, None


def project(cfg: Config, tokens_per_call: float, tcfg, dcfg, kind, block_size: int, context: int, dev) -> float:
    """Projected tokens/s at batch 1 on `dev`: tokens per call / (drafting + one target call over the budget)."""
    from experiments.studies import cost_model as cm
    rows = cfg.N if cfg.method == "sd-multi" else 1  # sd-multi: N rows of K + 1 tokens, each with its own cache
    tcall, _ = cm.call_time(tcfg, rows, max(cfg.budget // rows, 1), context + cfg.budget, dev)
    if cfg.method == "ar":
        return 1.0 / tcall
    if kind == "block":
        draft, _ = cm.call_time(dcfg, rows, block_size, context, dev, logit_rows=rows * (cfg.budget - 1))
        if cfg.family == "d2sd" and cfg.tree and "+" in cfg.tree:
            nb = int(cfg.tree.split("+")[1].split(":")[0])
            d2, _ = cm.call_time(dcfg, nb, block_size, context, dev, logit_rows=nb * 4)
            draft += d2
    else:
        depth = cfg.K if cfg.method in ("sd", "sd-multi") else len(cfg.tree.split(":")[0].split(","))
        width = 1 if cfg.method != "sd-tree" else int(cfg.tree.split(",")[0])
        one, _ = cm.call_time(dcfg, rows, 1, context, dev)
        lvl, _ = cm.call_time(dcfg, rows, width, context, dev)
        draft = one + (depth - 1) * lvl
    return tokens_per_call / (draft + tcall)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--budgets", type=int, nargs="+", default=[5, 9, 10, 13, 15, 17])
    ap.add_argument("--prompts", type=int, default=None, help="default: 16 (tiny-code), 4 (smollm2-135m)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="tiny-code prompt length")
    ap.add_argument("--max-new", type=int, default=None, help="default: 64 (tiny-code), 96 (smollm2-135m)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seeds", type=int, default=3, help="acceptance study: seeds per configuration")
    ap.add_argument("--timing", action="store_true", help="batch 1 wall clock, interleaved rounds")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (after one untimed compile round)")
    ap.add_argument("--quick", action="store_true", help="tiny run (tests): 2 prompts, 16 tokens, budgets 5 9")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new, args.budgets, args.seeds, args.rounds = 2, 16, [5, 9], 1, 1
    smol = args.pair == "smollm2-135m"
    args.prompts = args.prompts or (4 if smol else 16)
    args.max_new = args.max_new or (96 if smol else 64)

    import smcsd
    from experiments.common import prompts_for
    from experiments.studies import cost_model as cm

    target, block = smcsd.load(args.pair, drafter="dflash-dpace", dtype="float32" if smol else None)
    names = smcsd.available_drafters(args.pair)
    drafters = {"dflash-dpace": block}
    ar_name = "ar-distilled" if "ar-distilled" in names else None
    if ar_name:
        drafters[ar_name] = smcsd.load(args.pair, drafter=ar_name, dtype="float32" if smol else None)[1]
    d2sd = "d2sd" if "d2sd" in names else None
    if d2sd:
        drafters[d2sd] = smcsd.load(args.pair, drafter=d2sd, dtype="float32" if smol else None)[1]
    cfgs = configs(sorted(set(args.budgets)), "dflash-dpace", ar_name, d2sd, args.timing)
    prompts = prompts_for(args.pair, target, args.prompts, args.prompt_tokens)
    print(f"{args.pair}: {len(cfgs)} configurations, {len(prompts)} prompts, {args.max_new} new tokens, "
          f"T={args.temperature}", flush=True)

    def run(c: Config, ps, seed):
        return smcsd.decode(ps, target=target, draft=drafters.get(c.drafter), max_new_tokens=args.max_new,
                            temperature=args.temperature, seed=seed, **c.kwargs())

    acc = {c: [] for c in cfgs}
    per_req = {c: [] for c in cfgs}  # tokens per target call of each request (the standard errors)
    speed = {c: [] for c in cfgs}
    ratio = {c: [] for c in cfgs}
    t0 = time.time()
    if not args.timing:  # acceptance: all prompts as one batch, several seeds
        for seed in range(args.seeds):
            for c in cfgs:
                r = run(c, prompts, seed)
                acc[c].append(r.stats.mean_acceptance_length)
                per_req[c] += per_request(r)
    else:  # batch 1: every configuration on each prompt in turn; round 0 compiles and is not timed
        for rnd in range(args.rounds + 1):
            for i, p in enumerate(prompts):
                ar_speed = None
                for c in cfgs:
                    r = run(c, [p], 1000 * rnd + i)
                    if rnd == 0:
                        continue
                    tps = r.stats.tokens_per_s
                    speed[c].append(tps)
                    if c.method == "ar":
                        ar_speed = tps
                    else:
                        acc[c].append(r.stats.mean_acceptance_length)
                        per_req[c] += per_request(r)
                    ratio[c].append(tps / ar_speed if ar_speed else float("nan"))
            print(f"round {rnd} done ({time.time() - t0:.0f}s)", flush=True)

    tcfg = target.config
    context = (len(prompts[0]) if prompts else 64) + args.max_new // 2
    rows = []
    for c in cfgs:
        tpc = statistics.mean(acc[c]) if acc[c] else 1.0
        dcfg, kind = _drafter_config(drafters.get(c.drafter)) if c.drafter else (None, None)
        t_acc = dataclasses.replace(tcfg, dtype="bfloat16")  # accelerators compute in bfloat16
        d_acc = dataclasses.replace(dcfg, dtype="bfloat16") if dcfg is not None else None
        proj = {name: project(c, tpc, t_acc, d_acc, kind, 16, context, dev) for name, dev in cm.DEVICES.items()}
        rows.append({"label": c.label, **dataclasses.asdict(c), "per_request": per_req[c],
                     "tokens_per_call": tpc if acc[c] else None,
                     "tokens_per_call_se": bootstrap_se(per_req[c]) if per_req[c] else None,
                     "samples": len(per_req[c]),
                     "tokens_per_s": statistics.median(speed[c]) if speed[c] else None,
                     "speedup_vs_ar": statistics.median(ratio[c]) if ratio[c] else None,
                     "projected_tokens_per_s": proj})
    t_acc = dataclasses.replace(tcfg, dtype="bfloat16")
    ar_proj = {k: project(Config("ar", None, "ar", 1), 1.0, t_acc, None, None, 16, context, d)
               for k, d in cm.DEVICES.items()}
    for r in rows:
        r["projected_speedup"] = {k: r["projected_tokens_per_s"][k] / ar_proj[k] for k in cm.DEVICES}
    # paired by request (same prompts, seeds and rounds in the same order for every configuration): each family's
    # gain over the chain at the largest chain budget <= its own, with the standard error of the paired differences
    chains = {c.budget: c for c in cfgs if c.family == "chain"}
    for r, c in zip(rows, cfgs):
        below = [b for b in chains if b <= c.budget]
        if c.family in ("chain", "ar") or not below or len(per_req[c]) != len(per_req[chains[max(below)]]):
            continue
        ref = chains[max(below)]
        r["vs_chain"] = {"chain_budget": ref.budget, "gain": pooled(per_req[c]) - pooled(per_req[ref]),
                         "gain_se": bootstrap_se(per_req[c], per_req[ref])}

    cols = ["config", "budget", "tokens/call", "± se", "gain vs chain (paired)"] + (["tok/s", "× ar"] if args.timing else []) + \
        ["H100 × ar (proj.)", "v5e × ar (proj.)"]
    table = [[r["label"], r["budget"], report.fmt(r["tokens_per_call"], ".3f"), report.fmt(r["tokens_per_call_se"], ".3f"),
              f"{r['vs_chain']['gain']:+.3f} ± {r['vs_chain']['gain_se']:.3f} (chain {r['vs_chain']['chain_budget']})"
              if "vs_chain" in r else "–"]
             + ([report.fmt(r["tokens_per_s"], ".1f"), report.fmt(r["speedup_vs_ar"], ".2f")] if args.timing else [])
             + [report.fmt(r["projected_speedup"]["h100"], ".2f"), report.fmt(r["projected_speedup"]["tpu-v5e"], ".2f")]
             for r in rows]
    markdown = report.markdown_table(cols, table)
    print(markdown)
    best = {}
    for r in rows:
        if r["method"] != "ar" and r["tokens_per_call"] is not None:
            fam = best.setdefault(r["family"], {})
            fam[r["budget"]] = r["tokens_per_call"]
    out = report.new_result(SCHEMA, command=report.command(__file__, argv), pair=args.pair,
                            machine=report.machine_info(), temperature=args.temperature, max_new_tokens=args.max_new,
                            prompts=len(prompts), seeds=args.seeds if not args.timing else None,
                            timing=args.timing, rounds=args.rounds if args.timing else None,
                            context_for_projection=context, rows=rows, by_family=best, markdown=markdown,
                            wall_s=round(time.time() - t0, 1))
    path = args.out or report.results_path(f"tree_bench_{args.pair}{'_quick' if args.quick else ''}.json")
    report.write_json(path, report.json_safe(out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
