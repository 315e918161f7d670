"""How far `smc`'s outputs are from the target's own (`ar`): the mean per-token target log-probability and the
length of the outputs, with 95 % confidence intervals, for smc at several N against ar on the same prompts.

    python -m experiments.studies.fidelity --pair tiny-arith --n 2 4 8 16 64 --samples 8
    python -m experiments.studies.fidelity --pair smollm2-135m --drafter dflash-dpace --n 2 4 8 16 64 --prompts 6 --samples 2
    python -m experiments.studies.fidelity --pair smollm2-135m --n 2 4 --k 2 3 --draft-temperature 0.7 0.4 --temperature 0.7

`ar` samples exactly from p_T, so its mean log p_T per token is what an exact sampler scores. `smc` is consistent,
not exact: at finite N its output law is sharper than p_T (resampling favours high-weight particles, i.e.
high-p_T continuations), so its mean log p_T lies *above* ar's; with a weak drafter and small N (N = 1 has no
correction at all) it lies below. Both directions are deviations from p_T. Every output is scored under the
target's processed distribution at the decoding temperature (the law `ar` samples), by one cache-free forward of
prompt + output. CIs: mean ± 1.96 standard errors over outputs (outputs of one prompt share it, so per-prompt
means are also reported; the table's CI treats outputs as independent). Prompts: tiny-arith's held-out test
problems, tiny-code's held-out 64-byte code windows (no stop token: every output runs --max-new-tokens), or
SmolLM2 chat requests outside its drafters' corpus. Writes JSON (--out) and prints a table.

Beside quality, each row carries diversity (distinct-1 / distinct-2: the share of an output's n-grams that are
distinct, averaged over outputs; finite-N smc is sharper than p_T, which shows here as lower values than ar's) and,
for smc, how its weights behaved (mean ESS/N, resampling rate; docs/smc_proposals.md, "Reading an smc run") and the
tokens per target call.
"""

from __future__ import annotations

import argparse
import math
import statistics

from experiments import report
from experiments.common import BENCH_PROMPTS, chat_prompts


def ci95(values) -> tuple[float, float]:
    """(mean, half-width of its 95 % normal interval)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, float("nan")
    return m, 1.96 * statistics.stdev(values) / math.sqrt(len(values))


def distinct_n(outputs, n: int) -> float:
    """Mean over outputs (with at least n tokens) of |distinct n-grams| / |n-grams| (1: no n-gram repeats)."""
    vals = []
    for o in outputs:
        grams = [tuple(o[i:i + n]) for i in range(len(o) - n + 1)]
        if grams:
            vals.append(len(set(grams)) / len(grams))
    return statistics.fmean(vals) if vals else float("nan")


def score(target, prompts, outputs, temperature):
    """Per output: (mean log p_T per token, length), under the processed target law at `temperature`."""
    import jax.numpy as jnp
    import numpy as np

    from smcsd.sampling import SamplingParams, process_logits

    sp = SamplingParams.make(temperature, 0, 1.0)
    seqs = [list(p) + list(o) for p, o in zip(prompts, outputs)]
    width = max(len(s) for s in seqs)
    arr = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        arr[i, :len(s)] = s  # right padding never reaches earlier positions (causal)
    res = []
    for lo in range(0, len(seqs), 16):
        logits = target(jnp.asarray(arr[lo:lo + 16]))
        logp = np.asarray(process_logits(logits, sp))
        for j in range(logp.shape[0]):
            i = lo + j
            P, n = len(prompts[i]), len(outputs[i])
            if n == 0:
                res.append((float("nan"), 0))
                continue
            toks = np.asarray(outputs[i])
            lp = logp[j, P - 1:P - 1 + n][np.arange(n), toks]
            res.append((float(lp.mean()), n))
    return res


def load_prompts(pair, target, count):
    if pair == "tiny-arith":
        from experiments import arith_data
        return [target.tokenizer.encode(p.question) for p in arith_data.test_set()[:count]], None
    if pair == "tiny-code":  # 64-byte windows of the held-out standard-library files (after a BOS, as in training)
        from experiments import code_data
        return code_data.CodeData(256).heldout_prompts(count), []
    return chat_prompts(target, BENCH_PROMPTS[:count]), list(target.tokenizer.end_of_turn_ids)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-arith", choices=["tiny-arith", "tiny-code", "smollm2-135m"])
    ap.add_argument("--drafter", default=None, help="a drafter of the pair (default: its default)")
    ap.add_argument("--drafter-dir", default=None,
                    help="a drafter checkpoint directory instead (an AR model or an EAGLE-3 head a training run "
                         "wrote, e.g. a proposal before it ships)")
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[3], help="smc's draft length(s) K")
    ap.add_argument("--draft-temperature", type=float, nargs="+", default=[None],
                    help="the proposal's temperature(s) (default: --temperature); below it the proposal is sharper "
                         "than the target law, and smc's weights correct for it")
    ap.add_argument("--ess-threshold", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4, help="outputs per prompt and method (seeds)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=None, help="JSON path (default: results/fidelity_<pair>.json)")
    args = ap.parse_args(argv)
    for name, values in (("--k", args.k), ("--n", args.n)):
        if any(v < 1 for v in values):
            ap.error(f"{name} values must be >= 1, got {values}")
    if any(t is not None and not t > 0 for t in args.draft_temperature):
        ap.error(f"--draft-temperature values must be > 0, got {args.draft_temperature}")

    import smcsd

    if args.drafter_dir:
        if args.drafter:
            ap.error("give --drafter or --drafter-dir, not both")
        from smcsd.pairs import load_proposal_dir
        target = smcsd.load(args.pair)[0]
        drafter = load_proposal_dir(args.drafter_dir, target)
    else:
        target, drafter = smcsd.load(args.pair, drafter=args.drafter) if args.drafter else smcsd.load(args.pair)
    prompts, stops = load_prompts(args.pair, target, args.prompts)
    cells = [("ar", 1, None, None)] + [("smc", n, k, dt) for dt in args.draft_temperature for k in args.k
                                       for n in args.n]
    rows, body = [], []
    ar_mean = None
    for method, n, k, dtemp in cells:
        outs, src, ess, rate, tpc = [], [], [], [], []
        for s in range(args.samples):
            kw = dict(target=target, method=method, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      seed=1000 * s + 7, eos_id=stops)
            if method == "smc":
                kw.update(draft=drafter, num_particles=n, num_speculative_tokens=k,
                          ess_threshold=args.ess_threshold, draft_temperature=dtemp)
            res = smcsd.decode(prompts, **kw)
            if method == "smc":
                ess.append(res.stats.mean_ess_fraction)
                rate.append(res.stats.resample_rate)
            tpc.append(res.stats.tokens_per_target_call)
            outs += res.tokens
            src += prompts
        scored = score(target, src, outs, args.temperature)
        lps = [lp for lp, n_tok in scored if n_tok > 0]
        lens = [n_tok for _, n_tok in scored]
        P = len(prompts)  # outputs are sample-major: output i answers prompt i % P
        by_prompt = [[scored[i][0] for i in range(p, len(scored), P) if scored[i][1] > 0] for p in range(P)]
        per_prompt = [statistics.fmean(v) for v in by_prompt if v]
        m, h = ci95(lps)
        lm, lh = ci95(lens)
        pm, ph = ci95(per_prompt)
        ar_mean = m if method == "ar" else ar_mean
        smc = method == "smc"
        row = dict(method=method, N=n if smc else None, K=k, draft_temperature=(dtemp if dtemp is not None else
                                                                                args.temperature) if smc else None,
                   outputs=len(outs), mean_logp=m, mean_logp_ci=h,
                   per_prompt_mean_logp=pm, per_prompt_ci=ph, mean_length=lm, mean_length_ci=lh,
                   logp_minus_ar=None if method == "ar" else m - ar_mean,
                   distinct_1=distinct_n(outs, 1), distinct_2=distinct_n(outs, 2),
                   tokens_per_target_call=statistics.fmean(tpc),
                   mean_ess_fraction=statistics.fmean(ess) if ess else None,
                   resample_rate=statistics.fmean(rate) if rate else None)
        rows.append(row)
        label = "ar" if not smc else f"smc N={n}" + (f" K={k}" if len(args.k) > 1 else "") + (
            f" τ_q={row['draft_temperature']:g}" if len(args.draft_temperature) > 1 else "")
        body.append([label, len(outs), f"{m:.3f} ± {h:.3f}",
                     "–" if method == "ar" else f"{m - ar_mean:+.3f}", f"{pm:.3f} ± {ph:.3f}", f"{lm:.1f} ± {lh:.1f}",
                     f"{row['distinct_1']:.3f} / {row['distinct_2']:.3f}",
                     "–" if method == "ar" else f"{row['mean_ess_fraction']:.2f} / {row['resample_rate']:.2f}",
                     f"{row['tokens_per_target_call']:.2f}"])
        print(report.markdown_row(body[-1]), flush=True)
    table = report.markdown_table(["method", "outputs", "mean log p_T / token (95 % CI)", "vs ar",
                                   "per-prompt means (95 % CI)", "length (95 % CI)", "distinct-1 / -2",
                                   "ESS/N / resample rate", "tokens / target call"], body)
    print(table)
    result = report.new_result(
        "smcsd.fidelity/1", machine=report.machine_info(), pair=args.pair,
        drafter=getattr(drafter, "describe", lambda: str(drafter))(),
        settings=dict(k=args.k if len(args.k) > 1 else args.k[0], draft_temperature=args.draft_temperature,
                      ess_threshold=args.ess_threshold, temperature=args.temperature, prompts=len(prompts),
                      samples=args.samples, max_new_tokens=args.max_new_tokens),
        rows=rows, markdown=table, command=report.command(__file__, argv))
    out = args.out or report.results_path(f"fidelity_{args.pair}.json")
    print("wrote", report.write_json(out, result, indent=2))


if __name__ == "__main__":
    main()
