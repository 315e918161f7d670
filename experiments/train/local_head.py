"""Train a DeLS-Spec local head for a shipped pair (`smcsd.train.train_local_head`) and, with --export, ship it as the
pair's `dels` drafter (the head + `dels.json` naming the block drafter it is fused with and the fusion weights).

    python -m experiments.train.local_head --pair tiny-code --export                     # ships tiny-code `dels`
    python -m experiments.train.local_head --pair smollm2-135m --export
    python -m experiments.train.local_head --pair tiny-code --out /tmp/head --steps 100  # a quick one elsewhere

The head reads only the corpus and the target's token embedding (no target forward, no block drafter), so its
training is cheap next to the block drafter's; training.json records the command, wall time and held-out metrics.
Resumable (--resume) from the orbax checkpoints in checkpoints/<pair>-local-head-s<seed>/.
"""

from __future__ import annotations

import json
import os

from experiments.train import common as train_cli
from experiments import report

DEFAULTS = {  # per pair: sizes and a CPU budget (a few minutes); SmolLM2's rank 128 keeps the head at 13 MB (bf16)
    "tiny-code": dict(hidden=256, rank=128, seq_len=256, batch_size=16, steps=600, lr=3e-3, max_tokens=2_000_000,
                      export_dtype="float32", block="dflash-dpace"),
    "smollm2-135m": dict(hidden=256, rank=128, seq_len=256, batch_size=8, steps=600, lr=3e-3, max_tokens=None,
                         export_dtype="bfloat16", block="dflash-dpace"),
}


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--depth", type=int, default=8, help="window depth: the block positions the head serves")
    ap.add_argument("--seed", type=int, default=0)
    train_cli.add_size_args(ap, ("hidden", "rank", "seq_len", "batch_size", "steps"))
    ap.add_argument("--block", default=None, help="the pair's block drafter the exported `dels` fuses with")
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--beta", type=float, default=0.3)
    # its own schedule defaults, and no --cache-dir: no teacher forward to cache
    train_cli.add_training_args(ap, export_help="ship as the pair's `dels` drafter", eval_every=200, eval_rows=64,
                                ckpt_every=100, cache_dir=False)
    args = ap.parse_args(argv)
    train_cli.fill_defaults(args, DEFAULTS[args.pair])
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads
    train_cli.require_out_or_export(ap, args, "the head as the pair's `dels` drafter")

    import smcsd
    from smcsd.drafters import LocalHead
    from smcsd.train import train_local_head
    from experiments.train.block_drafter import corpus_for

    if args.block not in smcsd.available_drafters(args.pair):
        ap.error(f"pair {args.pair} has no block drafter {args.block!r}")
    target, _ = train_cli.load_pair(args.pair, drafter=None)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    head = LocalHead.create(target, hidden=args.hidden, rank=args.rank, seed=args.seed, name="dels")
    out = train_cli.output_dir(args, "dels")
    tag = f"{args.pair}-local-head-s{args.seed}"
    res, head = train_local_head(target, head, corpus, steps=args.steps, depth=args.depth, lr=args.lr, seed=args.seed,
                                 info={"fused_with": args.block},
                                 **train_cli.loop_kwargs(args, tag, out, report.command(__file__, argv)))
    if res.history["finished"]:
        with open(os.path.join(out, "dels.json"), "w") as f:
            json.dump({"schema": "smcsd.dels/1", "block": args.block, "alpha": args.alpha, "beta": args.beta,
                       "note": "DeLS-Spec: this directory holds the local head (trained by "
                               "experiments/train/local_head.py, see training.json); it is fused with the pair's "
                               "block drafter named by 'block'. Any block drafter of the same target can be fused "
                               "with it: smcsd.drafters.DeLSDrafter(block, LocalHead.load(dir))."}, f, indent=2)
    train_cli.print_summary(res, out)


if __name__ == "__main__":
    main()
