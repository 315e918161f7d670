"""Train a SpecBlock drafter (smcsd/drafters/specblock.py) for a pair's target (`smcsd.train.train_specblock`).

    python experiments/train_specblock.py --pair tiny-code --export                 # ships tiny-code `specblock`
    python experiments/train_specblock.py --pair tiny-code --no-valid-prefix --out /tmp/sb-novp   # the ablation
    python experiments/train_specblock.py --pair smollm2-135m --export
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus and teacher as `train_block_drafter.py` (the same target layers, so SmolLM2's cached teacher is reused).
The drafter: --layers decoder layers at the target's width (2 in the paper), --slots positions per forward (4),
loss sum_k 0.8^k KL(p_T top-k || q_k) over a first and a chained block, under the valid-prefix mask unless
--no-valid-prefix; then (--rank-steps) the rank head on the frozen drafter, for rank-head trees. With --export the result goes to models/shipped/<pair>/drafters/specblock/ (with training.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULTS = {  # per pair: sizes and a CPU budget (the block drafters' data and anchors)
    "tiny-code": dict(layers=2, slots=4, seq_len=256, batch_size=16, num_anchors=8, steps=500, lr=2e-3,
                      max_tokens=2_000_000, topk=32, export_dtype="float32", rank_steps=200),
    "smollm2-135m": dict(layers=2, slots=4, seq_len=256, batch_size=8, num_anchors=6, steps=400, lr=1e-3,
                         max_tokens=None, topk=64, export_dtype="bfloat16", rank_steps=150),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(DEFAULTS), default="tiny-code")
    ap.add_argument("--seed", type=int, default=0)
    for k in ("layers", "slots", "seq_len", "batch_size", "num_anchors", "steps", "topk"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--no-valid-prefix", action="store_true", help="keep every position in the loss (ablation)")
    ap.add_argument("--rank-steps", type=int, default=None,
                    help="then train the rank head for this many steps on the frozen drafter (0: none)")
    ap.add_argument("--export-dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-rows", type=int, default=32)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/smcsd/teacher"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--export", action="store_true", help="export into the pair's shipped drafters as `specblock`")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.pair].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if not args.export and not args.out:
        ap.error("give --out DIR, or --export to ship the drafter as the pair's `specblock`")

    import smcsd
    from smcsd.drafters import SpecBlockDrafter
    from smcsd.train import train_specblock
    from experiments.train_block_drafter import corpus_for

    target, _ = smcsd.load(args.pair, drafter="prompt-lookup", dtype="float32" if args.pair == "smollm2-135m" else None)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    drafter = SpecBlockDrafter.create(target, num_layers=args.layers, block_size=args.slots, seed=args.seed,
                                      name="specblock")
    tag = f"{args.pair}-specblock{'-novp' if args.no_valid_prefix else ''}-s{args.seed}"
    out = os.path.join(REPO, "models", "shipped", args.pair, "drafters", "specblock") if args.export else args.out
    command = "python experiments/train_specblock.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res = train_specblock(
        target, drafter, corpus, steps=args.steps, valid_prefix=not args.no_valid_prefix, lr=args.lr,
        num_anchors=args.num_anchors, topk=args.topk, seed=args.seed,
        cache_dir=args.cache_dir if args.pair == "smollm2-135m" else None,
        ckpt_dir=os.path.join(REPO, "checkpoints", tag), resume=args.resume, overwrite=args.overwrite, out=out,
        export_dtype=args.export_dtype, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
        eval_rows=args.eval_rows, progress=not args.no_progress, stop_after=args.stop_after,
        curves_path=os.path.join(REPO, "experiments", "results", "train", tag), command=command)
    rank = None
    if res.history["finished"] and args.rank_steps:
        from smcsd.train import train_rank_head
        trained = SpecBlockDrafter(drafter.block_config, res.params, name="specblock").bind(target)
        rank, _ = train_rank_head(
            target, trained, corpus, steps=args.rank_steps, num_anchors=args.num_anchors, topk=args.topk,
            seed=args.seed, cache_dir=args.cache_dir if args.pair == "smollm2-135m" else None,
            ckpt_dir=os.path.join(REPO, "checkpoints", tag + "-rank"), resume=args.resume, overwrite=args.overwrite,
            out=out, export_dtype=args.export_dtype, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
            eval_rows=args.eval_rows, progress=not args.no_progress, command=command)
    print(json.dumps({"final_eval": res.history["eval"][-1] if res.history["eval"] else None,
                      "rank_eval": rank.history["eval"][-1] if rank and rank.history["eval"] else None,
                      "wall_s": round(res.history["wall_s"], 1), "out": out}, indent=1))


if __name__ == "__main__":
    main()
