"""Where an `smc` cycle's time goes: draft, verify (target forward), vocabulary work (processing, bonus sampling,
weights), drafter observe, resampling, and the rest, with the prompt's KV shared by the particles or copied per
particle, side by side.

    python -m experiments.bench.profile_smc --pair tiny-code --drafter ar-distilled --n 4 8 --k 4
    python -m experiments.bench.profile_smc --pair smollm2-135m --drafter dflash-dpace --n 1 2 4 --k 4 --prompt-tokens 512

Each component is jitted alone and timed on a mid-generation particle state (after `--warm-cycles` cycles of the
real program), then the whole cycle alone, then the whole program (`lax.while_loop`) per cycle: "in loop" over
"cycle alone" is what the loop itself costs. "rest" = cycle alone − the components (bookkeeping: stats, token
writes, fusion differences). "gather / cycle" is one resampling's gather against a cycle; the loop gathers only
on cycles that resample ("resample rate", measured in the program runs), so "resampling share" = rate × that.
Bytes moved per resampling = every array the resampler gathers (both models' per-particle KV, outputs, pending
tokens). Prints a markdown table and writes JSON (--out).
"""

from __future__ import annotations

import argparse

from experiments import report

PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle, and what the message "
          "says about the town that used to stand on the cliff.")


def _tree_bytes(tree) -> int:
    import jax
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


def moved_bytes(state) -> int:
    """Bytes one resampling gathers: the rows' own buffers of both caches and the per-row arrays (a shared
    prefix stays where it is)."""
    from smcsd.models import KVCache

    def own(x):
        if isinstance(x, KVCache):
            return _tree_bytes((x.k, x.v, x.lengths))
        return _tree_bytes(x)

    import jax
    leaves = jax.tree_util.tree_leaves((state.cache_t, state.cache_d), is_leaf=lambda a: isinstance(a, KVCache))
    return sum(own(x) for x in leaves) + _tree_bytes((state.feed, state.feed_count, state.pending, state.out,
                                                      state.n, state.done))


def profile_cell(target, drafter, prompt_ids, n, k, temperature, max_new, warm_cycles, repeats, shared):
    import jax
    import jax.numpy as jnp

    import smcsd
    from smcsd.decode import prepare
    from smcsd.runtime.engine import verify_call
    from smcsd.sampling import process_logits, sample
    from smcsd.methods.smc import weight_increment, take_rows, prefix_sharing, program_parts

    kw = dict(target=target, draft=drafter, method="smc", num_particles=n, num_speculative_tokens=k,
              temperature=temperature, max_new_tokens=max_new, eos_id=[], seed=1)
    with prefix_sharing(shared):
        p = prepare([prompt_ids], **kw)
        d, spec, (tp, dp, inp) = p.draft, p.spec, p.args
        init, cycle, _ = program_parts(target.config, d, spec)
        init_j = jax.jit(init)
        state = init_j(tp, dp, inp)
        prefill = report.timed(lambda: init_j(tp, dp, inp), max(2, repeats // 2), warmup=1)[0]
        cyc = jax.jit(cycle)
        for _ in range(warm_cycles):
            state = cyc(tp, dp, inp, state)
        key = jax.random.PRNGKey(3)
        R = state.pending.shape[0]

        draft = jax.jit(lambda dp, s, key: d.propose(dp, s.cache_d, s.feed, s.feed_count, key, inp.draft_sampling, k))
        prop = draft(dp, state, key)
        block = jnp.concatenate([state.pending[:, None], prop.tokens], axis=1)
        verify = jax.jit(lambda tp, s, block: verify_call(target.config, tp, block, s.cache_t,
                                                          hidden_layers=d.hidden_layers))
        logits, _, hidden = verify(tp, state, block)

        def vocab_fn(logits, logq, x, key):
            logp = process_logits(logits, inp.sampling)
            bonus = sample(key, logp[:, k])
            lp = jnp.take_along_axis(logp[:, :k], x[..., None], axis=-1)[..., 0]
            lq = jnp.take_along_axis(logq, x[..., None], axis=-1)[..., 0]
            return bonus, jnp.sum(weight_increment(lp, lq, inp.alpha), axis=1)

        vocab = jax.jit(vocab_fn)
        observe = jax.jit(lambda dp, ds, block, hidden, start: d.observe(dp, ds, block, hidden, start,
                                                                         jnp.full((R,), k + 1, jnp.int32)))
        from smcsd.models import KVCache
        moved = (state.cache_t, state.feed, state.feed_count, state.pending, state.out, state.n, state.done)
        anc = (jnp.arange(R, dtype=jnp.int32) // n) * n  # every particle takes its request's first: all rows move
        resample = jax.jit(lambda m, dstate, a: (jax.tree_util.tree_map(lambda x: take_rows(x, a), m,
                                                                         is_leaf=lambda x: isinstance(x, KVCache)),
                                                  d.gather(dstate, a)))
        parts = {
            "draft": report.timed(lambda: draft(dp, state, key), repeats, warmup=1)[0],
            "verify": report.timed(lambda: verify(tp, state, block), repeats, warmup=1)[0],
            "vocab": report.timed(lambda: vocab(logits, prop.logq, prop.tokens, key), repeats, warmup=1)[0],
            "observe": report.timed(lambda: observe(dp, prop.state, block, hidden, state.cache_t.lengths),
                                    repeats, warmup=1)[0],
            "resample": report.timed(lambda: resample(moved, state.cache_d, anc), repeats, warmup=1)[0],
        }
        alone = report.timed(lambda: cyc(tp, dp, inp, state), repeats, warmup=1)[0]
        # the whole program, per cycle, less its prefill (compile and one warm-up excluded)
        smcsd.decode([prompt_ids], **kw)
        runs = [smcsd.decode([prompt_ids], **{**kw, "seed": s}).stats for s in range(2, 2 + max(1, repeats // 3))]
        cycles = sum(r.num_target_calls for r in runs)
        in_loop = (sum(r.wall_time_s for r in runs) - len(runs) * prefill) / cycles
        tokens_per_s = sum(r.num_generated_tokens for r in runs) / sum(r.wall_time_s for r in runs)
        rate = sum(r.num_resamples for r in runs) / cycles
        cache_bytes = state.cache_t.nbytes + (state.cache_d.nbytes if isinstance(state.cache_d, KVCache) else 0)
        return dict(N=n, K=k, shared=shared, rows=R, prompt_tokens=len(prompt_ids), prefill_ms=prefill * 1e3,
                    cycle_alone_ms=alone * 1e3, cycle_in_loop_ms=in_loop * 1e3,
                    parts_ms={name: t * 1e3 for name, t in parts.items()},
                    rest_ms=(alone - sum(parts.values())) * 1e3, resample_rate=rate,
                    resample_share=parts["resample"] / alone, resample_share_effective=rate * parts["resample"] / alone,
                    moved_bytes=moved_bytes(state),
                    cache_bytes=cache_bytes, cache_len=spec.cache_len, out_len=spec.out_len,
                    tokens_per_s=tokens_per_s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code")
    ap.add_argument("--drafter", default=None, help="a drafter of the pair (default: its default drafter)")
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="repeat the prompt up to this many tokens (0: the prompt as it is)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--warm-cycles", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shared", choices=["both", "on", "off"], default="both")
    ap.add_argument("--out", default=None, help="JSON path (default: results/profile_smc_<pair>.json)")
    args = ap.parse_args(argv)

    import smcsd

    target, drafter = smcsd.load(args.pair, drafter=args.drafter) if args.drafter else smcsd.load(args.pair)
    ids = target.tokenizer.encode(PROMPT)
    if args.prompt_tokens:
        ids = (ids * (args.prompt_tokens // len(ids) + 1))[:args.prompt_tokens]
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.shared]
    rows, body = [], []
    for n in args.n:
        for shared in modes:
            r = profile_cell(target, drafter, ids, n, args.k, args.temperature, args.max_new_tokens, args.warm_cycles,
                             args.repeats, shared)
            rows.append(r)
            pm = r["parts_ms"]
            body.append([n, args.k, "shared" if shared else "copied", f"{r['cycle_in_loop_ms']:.1f}",
                         f"{r['cycle_alone_ms']:.1f}", f"{pm['draft']:.1f}", f"{pm['verify']:.1f}", f"{pm['vocab']:.1f}",
                         f"{pm['observe']:.1f}", f"{pm['resample']:.2f}", f"{r['rest_ms']:.1f}",
                         f"{100 * r['resample_share']:.1f} %", f"{r['resample_rate']:.2f}",
                         f"{100 * r['resample_share_effective']:.1f} %", f"{r['moved_bytes'] / 2**20:.2f}",
                         f"{r['tokens_per_s']:.1f}"])
            print(report.markdown_row(body[-1]), flush=True)
    table = report.markdown_table(["N", "K", "prompt KV", "cycle in loop ms", "cycle alone ms", "draft", "verify",
                                   "vocab", "observe", "resample", "rest", "gather / cycle", "resample rate",
                                   "resampling share", "MiB moved/resample",
                                   "tok/s"], body)
    print(table)
    result = report.new_result(
        "smcsd.profile_smc/1", machine=report.machine_info(), pair=args.pair,
        drafter=getattr(drafter, "describe", lambda: str(drafter))(),
        settings=dict(k=args.k, temperature=args.temperature, prompt_tokens=len(ids), max_new_tokens=args.max_new_tokens,
                      warm_cycles=args.warm_cycles, repeats=args.repeats, batch=1),
        rows=rows, markdown=table, command=report.command(__file__, argv))
    out = args.out or report.results_path(f"profile_smc_{args.pair}.json")
    print("wrote", report.write_json(out, result, indent=2))


if __name__ == "__main__":
    main()
