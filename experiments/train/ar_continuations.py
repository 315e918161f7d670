"""Warm-start tiny-code's AR draft on the target's own continuations (the matched-data control of issue 33, item 6).

    python -m experiments.train.ar_continuations --out experiments/data/drafters/tiny-code-ar-continuations
    (resumable: add --resume after a kill)

The same data and schedule as the shipped `dflash-distilled` block drafter
(`experiments/data/runs/tiny-code-dflash-distilled/`): the continuations built by `train/code_continuations.py`
(greedy and T = 0.7 by default), 16 rows × 256 tokens a step, lr 1e-3, cosine schedule, starting from the pair's
`ar` draft; loss 0.5 · CE + 0.5 · KL(p_T top-32 ‖ q) (`smcsd.train.distill_ar_drafter`). It answers whether the
block drafter's gain is its own or the data's: train the AR draft on the same text and compare them in `sd`
(`python -m experiments.studies.block_drafters --drafters ar path:OUT dflash-distilled`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

CORPORA = [os.path.join("experiments", "data", "corpus", d) for d in ("tiny-code-greedy", "tiny-code-t07")]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--continuations", nargs="+", default=CORPORA, metavar="DIR")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", required=True, help="export directory")
    ap.add_argument("--ckpt-dir", default=None, help="default: OUT/../<name>-ckpt")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")

    import smcsd
    from experiments.train.code_continuations import continuations_corpus
    from smcsd.train import distill_ar_drafter

    target, draft = smcsd.load("tiny-code", drafter="ar")
    corpus = continuations_corpus(args.continuations, seq_len=256, batch_size=16)
    out = os.path.abspath(args.out)
    ckpt = args.ckpt_dir or out.rstrip("/") + "-ckpt"
    command = shlex.join(["python", "-m", "experiments.train.ar_continuations"] + list(
        sys.argv[1:] if argv is None else argv))
    res = distill_ar_drafter(target, draft, corpus, steps=args.steps, lr=args.lr, ckpt_dir=ckpt, out=out,
                             eval_every=args.eval_every, ckpt_every=args.ckpt_every, resume=args.resume,
                             overwrite=args.overwrite, progress=False, curves_path=os.path.join(out, "curve"),
                             command=command)
    print(res.history["eval"][-1], flush=True)


if __name__ == "__main__":
    main()
