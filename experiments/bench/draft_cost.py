"""Drafting cost per cycle, measured: one drafter `propose` of K tokens plus its `observe` of a verified cycle, next to
the target's verification call over K + 1 tokens, for each drafter of a pair and each batch size (SmolLM2 default).

    python -m experiments.bench.draft_cost --drafters ar-distilled dflash-dpace pard2 dels --ks 4 --batch-sizes 1 8

Each call is jitted alone and timed (median of --repeats after warm-up) from the state a real decode has after its
prefill: a chat prompt (SmolLM2) or held-out code (tiny pairs), right-padded to one length per batch. Drafters that
read target hidden states get them from the prefill, as in `sd`; the verification call returns those layers too,
as `sd` does with that drafter. The ratio draft / verify is the share of a cycle `sd` spends drafting (the rest:
sampling and rejection, measured elsewhere). JSON: --out (default experiments/results/draft_cost_<pair>.json).
"""

from __future__ import annotations

import argparse
import sys
import time

from experiments import report

SCHEMA = "smcsd.draft_cost/1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--drafters", nargs="+", default=None, help="names from smcsd.available_drafters(pair)")
    ap.add_argument("--ks", type=int, nargs="+", default=[4])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import smcsd
    from experiments.common import prompts_for
    from smcsd.drafters import as_drafter, initial_feed
    from smcsd.runtime.engine import prefill, verify_call
    from smcsd.sampling import SamplingParams

    smol = args.pair == "smollm2-135m"
    dtype = "float32" if smol else None
    target, _ = smcsd.load(args.pair, dtype=dtype)
    names = args.drafters or [n for n in smcsd.available_drafters(args.pair) if n != "prompt-lookup"]
    tc, tp = target.config, target.params
    sampling = SamplingParams.make(args.temperature)
    rows, t0 = [], time.time()
    for B in args.batch_sizes:
        prompts = prompts_for(args.pair, target, B, 64)
        Tp = max(len(p) for p in prompts)
        prompt = jnp.asarray([list(p) + [0] * (Tp - len(p)) for p in prompts], jnp.int32)
        plen = jnp.asarray([len(p) for p in prompts], jnp.int32)
        cache_len = Tp + 64
        for name in names:
            d = as_drafter(smcsd.load(args.pair, drafter=name, dtype=dtype)[1]).bind(target)
            dp = d.drafter_params()
            hl = d.hidden_layers
            pre = jax.jit(prefill, static_argnums=(0, 4, 5, 6))(tc, tp, prompt, plen, cache_len, 1, hl)
            state = jax.jit(d.init, static_argnums=(3, 4))(dp, prompt, plen, cache_len, 1, pre[2] if hl else None)
            first = jnp.argmax(pre[0], -1).astype(jnp.int32)
            feed, count = initial_feed(first)
            for K in args.ks:
                propose = jax.jit(d.propose, static_argnums=6)
                keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 * args.repeats + 8))
                draft_s, _ = report.timed(lambda: propose(dp, state, feed, count, next(keys), sampling, K).tokens,
                                          args.repeats, warmup=2)
                block = jnp.concatenate([first[:, None], propose(dp, state, feed, count, next(keys), sampling,
                                                                 K).tokens], 1)
                verify = jax.jit(lambda c, b: verify_call(tc, tp, b, c, hidden_layers=hl)[0])
                verify_s, _ = report.timed(lambda: verify(pre[1], block), args.repeats, warmup=2)
                # observe: what the drafter does with a verified cycle (all K + 1 tokens committed here)
                hidden = verify_call(tc, tp, block, pre[1], hidden_layers=hl)[2] if hl else None
                pstate = propose(dp, state, feed, count, next(keys), sampling, K).state
                observe = jax.jit(d.observe)
                start = pre[1].lengths
                nv = jnp.full((B,), K + 1, jnp.int32)
                observe_s, _ = report.timed(lambda: observe(dp, pstate, block, hidden, start, nv), args.repeats,
                                            warmup=2)
                cycle = draft_s + observe_s
                row = {"drafter": name, "kind": d.kind, "batch": B, "K": K, "propose_ms": 1e3 * draft_s,
                       "observe_ms": 1e3 * observe_s, "draft_ms": 1e3 * cycle, "verify_ms": 1e3 * verify_s,
                       "draft_over_verify": cycle / verify_s, "draft_calls": d.calls_per_proposal(K)}
                rows.append(row)
                print(f"batch {B} {name:>14} K={K}: propose {row['propose_ms']:7.2f} ms  observe "
                      f"{row['observe_ms']:6.2f} ms  verify {row['verify_ms']:7.2f} ms  ratio "
                      f"{row['draft_over_verify']:.2f}", flush=True)
    table = report.markdown_table(
        ["batch", "drafter", "K", "drafter calls", "propose ms", "observe ms", "drafting per cycle ms",
         "verify ms (K+1 tokens)", "drafting / verify"],
        [[r["batch"], r["drafter"], r["K"], r["draft_calls"], report.fmt(r["propose_ms"], ".1f"),
          report.fmt(r["observe_ms"], ".1f"), report.fmt(r["draft_ms"], ".1f"), report.fmt(r["verify_ms"], ".1f"),
          report.fmt(r["draft_over_verify"], ".2f")] for r in rows])
    print(table)
    out = args.out or report.results_path(f"draft_cost_{args.pair}.json")
    report.write_json(out, report.new_result(SCHEMA, machine=report.machine_info(), pair=args.pair,
                                             settings=vars(args), rows=rows, markdown=table,
                                             wall_s=time.time() - t0,
                                             command=report.command(__file__, argv)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
