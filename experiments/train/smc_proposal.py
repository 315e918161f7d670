"""Fine-tune a pair's autoregressive drafter into an SMC proposal: distilled towards the target at the temperature
SMC will propose at, with a χ² / Rényi, reverse-KL, forward-KL or mixed objective (`smcsd.train.Objective`).

    python -m experiments.train.smc_proposal --pair tiny-arith --divergence renyi --alpha 2 --steps 600 --export
    python -m experiments.train.smc_proposal --pair tiny-arith --divergence renyi_kl_mix --alpha 1.5 --out DIR

SMC-SD weighs each drafted block by p_T/q; its N/ESS per token grows like 1 + χ²(p_τ ‖ q_τ) = exp D_2, so a
proposal trained on D_2 (Rényi-2) keeps particles alive where a forward-KL drafter (what `sd` wants) lets one
particle take all the weight. The run warm-starts from the pair's `--from` drafter (default: its best AR drafter),
trains on the pair's training text (tiny-arith: generated word problems, disjoint from the test set; tiny-code:
standard-library source outside the held-out files) with the target's full distribution as the teacher
(`topk=None`: these vocabularies are small), and exports into `models/shipped/<pair>/drafters/<--name>` with
`--export`, which `decode(method="smc")` then uses for that pair when no `draft=` is given.
Resumable (`--resume`); curves in experiments/results/train/<pair>-smc-<divergence>...json.
"""

from __future__ import annotations

import argparse
import os

from experiments import report
from experiments.common import CHECKPOINTS, CURVES, SHIPPED
from experiments.train import common as train_cli

DEFAULTS = {
    "tiny-arith": dict(seq_len=128, batch_size=32, steps=600, lr=5e-4, problems=6_000),
    "tiny-code": dict(seq_len=256, batch_size=16, steps=600, lr=5e-4, problems=None),
}


def corpus_for(pair: str, target, args):
    from smcsd.train import TextCorpus
    if pair == "tiny-arith":
        from experiments import arith_data
        texts, step = [], 0
        while len(texts) < args.problems:  # the training problems of train/pair.py's schedule, never a test problem
            texts += arith_data.train_texts(1, step, 256)
            step += 1
        # one problem per row (pack=False): the drafter is trained in the context it drafts in, a problem alone
        return TextCorpus(texts[:args.problems], tokenizer=target.tokenizer, seq_len=args.seq_len,
                          batch_size=args.batch_size, heldout_frac=0.02, seed=0, pack=False)
    from experiments.train.block_drafter import corpus_for as block_corpus
    args.max_tokens = args.max_tokens or 2_000_000
    return block_corpus(pair, target, args)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=sorted(DEFAULTS), default="tiny-arith")
    ap.add_argument("--from", dest="from_drafter", default=None,
                    help="the pair's drafter to start from (default: its best AR drafter)")
    ap.add_argument("--divergence", choices=["forward_kl", "reverse_kl", "renyi", "renyi_kl_mix"], default="renyi")
    ap.add_argument("--alpha", type=float, default=2.0, help="Rényi order (> 1)")
    ap.add_argument("--temperature", type=float, default=0.7, help="the temperature SMC will propose at")
    ap.add_argument("--mix-kl-weight", type=float, default=0.5, help="renyi_kl_mix: weight of the KL term")
    ap.add_argument("--ce-weight", type=float, default=0.0, help="weight of the gold-token CE")
    ap.add_argument("--div-weight", type=float, default=1.0, help="weight of the divergence")
    for k in ("seq_len", "batch_size", "steps", "problems"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--name", default="smc-proposal", help="exported drafter name")
    train_cli.add_schedule_args(ap, eval_every=50, eval_rows=32, ckpt_every=50)
    train_cli.add_output_args(ap, export_help="export into the pair's shipped drafters (as --name)")
    train_cli.add_run_flags(ap)
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.pair].items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    import smcsd
    from smcsd.train import Objective, distill_ar_drafter

    objective = Objective(args.divergence, alpha=args.alpha, temperature=args.temperature,
                          mix_kl_weight=args.mix_kl_weight)  # checks the settings before anything loads
    target, draft = smcsd.load(args.pair, drafter=args.from_drafter)
    if draft is None or not hasattr(draft, "config"):
        raise SystemExit(f"pair {args.pair} has no autoregressive drafter to start from (--from); available: "
                         f"{', '.join(smcsd.available_drafters(args.pair))}")
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows; from {draft.name}; "
          f"objective {objective}", flush=True)
    tag = f"{args.pair}-smc-{args.divergence}" + (f"-a{args.alpha:g}" if "renyi" in args.divergence else "") + \
        f"-t{args.temperature:g}"
    out = os.path.join(SHIPPED, args.pair, "drafters", args.name) if args.export else args.out
    res = distill_ar_drafter(
        target, draft, corpus, steps=args.steps, lr=args.lr, warmup=max(1, args.steps // 20),
        ce_weight=args.ce_weight, kl_weight=args.div_weight, topk=None, objective=objective,
        cache_dir=args.cache_dir, ckpt_dir=os.path.join(CHECKPOINTS, tag), resume=args.resume,
        overwrite=args.overwrite, out=out, eval_every=args.eval_every, eval_rows=args.eval_rows,
        ckpt_every=args.ckpt_every, progress=not args.no_progress, stop_after=args.stop_after,
        curves_path=os.path.join(CURVES, tag),
        command=report.command(__file__, argv))
    train_cli.print_summary(res, out)


if __name__ == "__main__":
    main()
