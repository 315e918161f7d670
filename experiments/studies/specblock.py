"""SpecBlock, four comparisons on one pair (tiny-code by default), each on the same prompts and seeds:

    python -m experiments.studies.specblock --pair tiny-code \\
        --novp checkpoints/specblock-study/tiny-code-novp
    python -m experiments.studies.specblock --pair smollm2-135m --prompts 4 --max-new 64 --parts chain trees

1. chain: `sd` with SpecBlock vs the DFlash drafter (dflash-dpace) at K = 4 (one forward each) and 8 (SpecBlock chains
   two blocks), T = 0 and 0.7: mean acceptance length, with each drafter's measured propose time per cycle (batch 1,
   median; experiments/bench/draft_cost.py's measurement), so acceptance can be read at equal drafting cost;
2. valid prefix: the shipped SpecBlock (valid-prefix mask) vs one trained without it (--novp DIR), same budget;
3. trees: `sd-tree` with the rank-head tree vs fixed "top" trees of the same node budget (one block forward each);
4. drift (opt-in online adaptation, `OnlineAdapt`): long generations whose prompts switch domain — code, then prose
   the drafter never saw — adaptation on vs off, K = 4 (the bias is learned per request from that request's
   own verifications, so it can follow the switch).
Reported: mean acceptance length (tokens per target call) and bootstrap SEs over requests x seeds; paired gains
against the first row of each comparison. JSON: --out (default experiments/results/specblock_study_<pair>.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from experiments import report

SCHEMA = "smcsd.specblock_study/1"
PROSE = ("The old lighthouse keeper walked along the shore every morning, counting the gulls and listening to the "
         "waves. He liked to say that the sea had a different voice each day, and that a patient ear could tell ")


def _runs(smcsd, prompts, target, draft, seeds, **kw):
    from experiments.bench.tree import per_request
    lens, per = [], []
    for seed in range(seeds):
        r = smcsd.decode(prompts, target=target, draft=draft, seed=seed, **kw)
        lens.append(r.stats.mean_acceptance_length)
        per += per_request(r)
    return statistics.mean(lens), per


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--parts", nargs="+", default=["chain", "valid-prefix", "trees", "drift"])
    ap.add_argument("--novp", default=None, help="a SpecBlock drafter trained without the valid-prefix mask")
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--trees", nargs="+", default=["2,2,1,1:top", "rank:14x4", "3,1,1,1:top", "rank:12x4"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--drift-new", type=int, default=160)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import jax
    import smcsd
    from experiments.common import prompts_for
    from smcsd.drafters import OnlineAdapt, SpecBlockDrafter, initial_feed
    from smcsd.runtime.engine import prefill
    from smcsd.sampling import SamplingParams
    from experiments.bench.tree import bootstrap_se, pooled

    smol = args.pair == "smollm2-135m"
    dtype = "float32" if smol else None
    target, sb = smcsd.load(args.pair, drafter="specblock", dtype=dtype)
    dflash = smcsd.load(args.pair, drafter="dflash-dpace", dtype=dtype)[1]
    prompts = prompts_for(args.pair, target, args.prompts, args.prompt_tokens)
    rows, t0 = [], time.time()

    def record(part, label, T, K, mean_len, per, ref=None, **extra):
        row = {"part": part, "drafter": label, "temperature": T, "K": K, "mean_acceptance_length": mean_len,
               "tokens_per_call": pooled(per), "se": bootstrap_se(per), "samples": len(per), **extra}
        if ref is not None:
            row["gain"], row["gain_se"] = pooled(per) - pooled(ref), bootstrap_se(per, ref)
        rows.append(row)
        print(f"[{part}] T={T} K={K} {label:24s} accept len {mean_len:.3f} ± {row['se']:.3f}"
              + (f"  gain {row['gain']:+.3f} ± {row['gain_se']:.3f}" if ref is not None else ""), flush=True)
        return per

    def draft_ms(d, K):
        """Median propose time (ms) at batch 1 from the first prompt's prefill (bench/draft_cost.py's measurement)."""
        import jax.numpy as jnp
        d = d.bind(target)
        dp = d.drafter_params()
        pr = jnp.asarray([prompts[0]], jnp.int32)
        pl = jnp.asarray([len(prompts[0])], jnp.int32)
        pre = jax.jit(prefill, static_argnums=(0, 4, 5, 6))(target.config, target.params, pr, pl, pr.shape[1] + 64,
                                                            1, d.hidden_layers)
        st = jax.jit(d.init, static_argnums=(3, 4))(dp, pr, pl, pr.shape[1] + 64, 1, pre[2])
        feed, cnt = initial_feed(jnp.argmax(pre[0], -1).astype(jnp.int32))
        f = jax.jit(d.propose, static_argnums=6)
        sp = SamplingParams.make(0.7)
        med, _ = report.timed(lambda: f(dp, st, feed, cnt, jax.random.PRNGKey(0), sp, K).tokens, 20, warmup=2)
        return 1e3 * med

    kw = dict(max_new_tokens=args.max_new)
    if "chain" in args.parts:
        for K in args.ks:
            cost = {"dflash-dpace": draft_ms(dflash, K), "specblock": draft_ms(sb, K)}
            for T in args.temperatures:
                ref = None
                for label, d in (("dflash-dpace", dflash), ("specblock", sb)):
                    m, per = _runs(smcsd, prompts, target, d, args.seeds, method="sd", num_speculative_tokens=K,
                                   temperature=T, **kw)
                    per = record("chain", label, T, K, m, per, ref, draft_ms=cost[label],
                                 draft_calls=d.calls_per_proposal(K))
                    ref = ref or per
    if "valid-prefix" in args.parts and args.novp:
        novp = SpecBlockDrafter.load(args.novp, dtype=target.config.dtype, name="specblock-novp").bind(target)
        for T in args.temperatures:
            ref = None
            for label, d in (("specblock (valid prefix)", sb), ("specblock (no mask)", novp)):
                m, per = _runs(smcsd, prompts, target, d, args.seeds, method="sd", num_speculative_tokens=4,
                               temperature=T, **kw)
                per = record("valid-prefix", label, T, 4, m, per, ref)
                ref = ref or per
    if "trees" in args.parts:
        for T in args.temperatures:
            ref = None
            for tree in args.trees:
                spec = smcsd.TreeSpec.parse(tree)
                m, per = _runs(smcsd, prompts, target, sb, args.seeds, method="sd-tree", tree=tree, temperature=T,
                               **kw)
                per = record("trees", f"specblock {tree}", T, spec.depth, m, per, ref, nodes=spec.num_nodes)
                ref = ref or per
    if "drift" in args.parts:
        tok = target.tokenizer
        if smol:  # chat prompts already mix code and prose requests; ask for long answers
            drift = prompts
        else:  # held-out code, then a prose paragraph the code-only drafter never saw
            drift = [list(p)[:max(8, args.prompt_tokens // 2)] + list(tok.encode(PROSE, add_bos=False)) for p in prompts]
        for T in args.temperatures:
            ref = None
            for label, d in (("specblock", sb), ("specblock + OnlineAdapt", sb.adaptive(OnlineAdapt()))):
                m, per = _runs(smcsd, drift, target, d, args.seeds, method="sd", num_speculative_tokens=4,
                               temperature=T, max_new_tokens=args.drift_new)
                per = record("drift", label, T, 4, m, per, ref)
                ref = ref or per
    cols = ["part", "drafter", "T", "K", "mean acceptance length", "± se", "vs first row (paired)", "draft ms"]
    table = [[r["part"], r["drafter"], r["temperature"], r["K"], report.fmt(r["mean_acceptance_length"], ".3f"),
              report.fmt(r["se"], ".3f"), f"{r['gain']:+.3f} ± {r['gain_se']:.3f}" if "gain" in r else "–",
              report.fmt(r.get("draft_ms"), ".2f")] for r in rows]
    markdown = report.markdown_table(cols, table)
    print(markdown)
    out = report.new_result(SCHEMA, command=report.command(__file__, argv), pair=args.pair,
                            machine=report.machine_info(), prompts=len(prompts), max_new_tokens=args.max_new,
                            seeds=args.seeds, rows=rows, markdown=markdown, wall_s=round(time.time() - t0, 1))
    path = args.out or report.results_path(f"specblock_study_{args.pair}.json")
    report.write_json(path, report.json_safe(out))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
