"""Exact-match accuracy of a decoding method on the tiny-arith test set.

    python -m experiments.studies.eval_arith --method ar --temperature 0.7 --limit 500
    python -m experiments.studies.eval_arith --model draft --temperature 0

Prompt = the question up to and including "A:" (with BOS); the model generates until EOS or
--max-new-tokens; the answer is the integer of the first "#### N" line. Problems go through
`smcsd.decode` in batches of --batch-size prompts. Writes a JSON result (accuracy, n, settings,
tokens/s) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import smcsd
from experiments import arith_data
from experiments import report
from smcsd.models.shipped import load_model_dir, load_shipped


def load_pair(pair_dir: str | None):
    if pair_dir:
        return (load_model_dir(os.path.join(pair_dir, "target"), name="target"),
                load_model_dir(os.path.join(pair_dir, "draft"), name="draft"))
    return load_shipped("tiny-arith")


def evaluate(target, draft, problems, *, method="ar", batch_size=64, max_new_tokens=64, temperature=0.7,
             top_k=0, top_p=1.0, seed=0, progress=True, **method_kwargs) -> dict:
    """Accuracy of `method` (target = the model sampled by `ar`) on `problems`."""
    from tqdm import tqdm
    correct, n_tokens, wall, compile_s, samples = 0, 0, 0.0, 0.0, []
    stats_acc, smc_acc = [], []
    bar = tqdm(total=len(problems), desc=f"arith {method} T={temperature}", disable=not progress, file=sys.stdout)
    for i in range(0, len(problems), batch_size):
        chunk = list(problems[i:i + batch_size])
        pad = batch_size - len(chunk)  # keep one compiled shape: pad the last batch with repeats
        prompts = [p.question for p in chunk] + [chunk[-1].question] * pad
        t = time.perf_counter()
        res = smcsd.decode(prompts, target=target, draft=draft, method=method, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, seed=seed + i, **method_kwargs)
        wall += time.perf_counter() - t
        compile_s += res.stats.compile_time_s or 0.0
        for p, text, toks in zip(chunk, res.texts, res.tokens):
            got = arith_data.parse_answer(text)
            correct += int(got == p.answer)
            n_tokens += len(toks)
            if len(samples) < 5:
                samples.append({"question": p.question, "output": text, "answer": p.answer, "parsed": got})
        if res.stats.ess_per_cycle:  # smc: how even the weights stayed, how often it resampled
            smc_acc.append((res.stats.mean_ess_fraction, res.stats.resample_rate))
        drafted = getattr(res.stats, "num_draft_tokens", 0) or 0
        if drafted:
            stats_acc.append((res.stats.num_accepted_tokens, drafted, res.stats.num_target_calls,
                              res.stats.num_drafts))
        bar.update(len(chunk))
        bar.set_postfix(acc=f"{correct / min(i + batch_size, len(problems)):.3f}")
    bar.close()
    n = len(problems)
    out = {"accuracy": correct / n, "correct": correct, "n": n, "generated_tokens": n_tokens,
           "wall_s": round(wall, 2), "compile_s": round(compile_s, 2),
           "tokens_per_s": round(n_tokens / max(wall - compile_s, 1e-9), 1), "samples": samples}
    if smc_acc:
        out["mean_ess_fraction"] = float(sum(e for e, _ in smc_acc) / len(smc_acc))
        out["resample_rate"] = float(sum(r for _, r in smc_acc) / len(smc_acc))
    if stats_acc:
        accepted, drafted, calls, drafts = (sum(col) for col in zip(*stats_acc))
        out["acceptance_rate"] = accepted / drafted
        out["num_target_calls"] = int(calls)
        # accepted draft tokens per draft block (sd: per verification of one request), the bonus not counted
        out["mean_acceptance_length"] = accepted / max(drafts, 1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="ar", help="any registered smcsd method (ar, sd, sd-multi, smc, ...)")
    ap.add_argument("--model", choices=["target", "draft"], default="target",
                    help="which model is the target of the decode ('draft' evaluates the draft alone)")
    ap.add_argument("--pair-dir", default=None, help="a directory with target/ and draft/ (default: shipped)")
    ap.add_argument("--drafter", default=None,
                    help="a shipped drafter of tiny-arith by name (smcsd.available_drafters('tiny-arith'), e.g. "
                         "ar-distilled) instead of the pair's draft/")
    ap.add_argument("--num-particles", type=int, default=4)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=500, help="number of test problems (max 1000)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON result path (default: experiments/results/arith/...)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    target, draft = load_pair(args.pair_dir)
    if args.drafter:
        draft = smcsd.load("tiny-arith", drafter=args.drafter)[1]
    if args.model == "draft":
        target, draft = draft, None
    problems = arith_data.test_set()[:args.limit]
    kwargs = {}
    if args.method != "ar":
        kwargs = dict(num_particles=args.num_particles, num_speculative_tokens=args.num_speculative_tokens)
    res = evaluate(target, draft if args.method != "ar" else None, problems, method=args.method,
                   batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, progress=not args.no_progress, **kwargs)
    res["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "no_progress")}
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=1))
    out = args.out or report.results_path(
        "arith", f"{args.model}{'-' + args.drafter if args.drafter else ''}_{args.method}_T{args.temperature}"
                 f"_n{len(problems)}.json")
    print("wrote", report.write_json(out, res))


if __name__ == "__main__":
    main()
