"""Train a SpecBlock drafter (smcsd/drafters/specblock.py) for a pair's target (`smcsd.train.train_specblock`).

    python -m experiments.train.specblock --pair tiny-code --export                 # ships tiny-code `specblock`
    python -m experiments.train.specblock --pair tiny-code --no-valid-prefix --out /tmp/sb-novp   # the ablation
    python -m experiments.train.specblock --pair smollm2-135m --export
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus and teacher as `train/block_drafter.py` (the same target layers, so SmolLM2's cached teacher is reused).
The drafter: --layers decoder layers at the target's width (2 in the paper), --slots positions per forward (4),
loss sum_k 0.8^k KL(p_T top-k || q_k) over a first and a chained block, under the valid-prefix mask unless
--no-valid-prefix; then (--rank-steps) the rank head on the frozen drafter, for rank-head trees. With --export the result goes to models/shipped/<pair>/drafters/specblock/ (with training.json).
"""

from __future__ import annotations

import json
import os

from experiments import report
from experiments.common import CHECKPOINTS
from experiments.train import common as train_cli

DEFAULTS = {  # per pair: sizes and a CPU budget (the block drafters' data and anchors)
    "tiny-code": dict(layers=2, slots=4, seq_len=256, batch_size=16, num_anchors=8, steps=500, lr=2e-3,
                      max_tokens=2_000_000, topk=32, export_dtype="float32", rank_steps=200),
    "smollm2-135m": dict(layers=2, slots=4, seq_len=256, batch_size=8, num_anchors=6, steps=400, lr=1e-3,
                         max_tokens=None, topk=64, export_dtype="bfloat16", rank_steps=150),
}


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--seed", type=int, default=0)
    train_cli.add_size_args(ap, ("layers", "slots", "seq_len", "batch_size", "num_anchors", "steps", "topk"))
    ap.add_argument("--no-valid-prefix", action="store_true", help="keep every position in the loss (ablation)")
    ap.add_argument("--rank-steps", type=int, default=None,
                    help="then train the rank head for this many steps on the frozen drafter (0: none)")
    train_cli.add_training_args(ap, export_help="export into the pair's shipped drafters as `specblock`")
    args = ap.parse_args(argv)
    train_cli.fill_defaults(args, DEFAULTS[args.pair])
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads
    train_cli.require_out_or_export(ap, args, "the drafter as the pair's `specblock`")

    from smcsd.drafters import SpecBlockDrafter
    from smcsd.train import train_specblock
    from experiments.train.block_drafter import corpus_for

    target, _ = train_cli.load_pair(args.pair)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    drafter = SpecBlockDrafter.create(target, num_layers=args.layers, block_size=args.slots, seed=args.seed,
                                      name="specblock")
    tag = f"{args.pair}-specblock{'-novp' if args.no_valid_prefix else ''}-s{args.seed}"
    out = train_cli.output_dir(args, "specblock")
    command = report.command(__file__, argv)
    res = train_specblock(target, drafter, corpus, steps=args.steps, valid_prefix=not args.no_valid_prefix,
                          lr=args.lr, num_anchors=args.num_anchors, topk=args.topk, seed=args.seed,
                          cache_dir=train_cli.teacher_cache_dir(args),
                          **train_cli.loop_kwargs(args, tag, out, command))
    rank = None
    if res.history["finished"] and args.rank_steps:
        from smcsd.train import train_rank_head
        trained = SpecBlockDrafter(drafter.block_config, res.params, name="specblock").bind(target)
        rank, _ = train_rank_head(
            target, trained, corpus, steps=args.rank_steps, num_anchors=args.num_anchors, topk=args.topk,
            seed=args.seed, cache_dir=train_cli.teacher_cache_dir(args),
            ckpt_dir=os.path.join(CHECKPOINTS, tag + "-rank"), resume=args.resume, overwrite=args.overwrite,
            out=out, export_dtype=args.export_dtype, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
            eval_rows=args.eval_rows, progress=not args.no_progress, command=command)
    print(json.dumps({"final_eval": train_cli.last_eval(res),  # rank_eval second, so not print_summary
                      "rank_eval": train_cli.last_eval(rank) if rank else None,
                      "wall_s": round(res.history["wall_s"], 1), "out": out}, indent=1))


if __name__ == "__main__":
    main()
