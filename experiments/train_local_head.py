"""Train a DeLS-Spec local head for a shipped pair (`smcsd.train.train_local_head`) and, with --export, ship it as the
pair's `dels` drafter (the head + `dels.json` naming the block drafter it is fused with and the fusion weights).

    python experiments/train_local_head.py --pair tiny-code --export                     # ships tiny-code `dels`
    python experiments/train_local_head.py --pair smollm2-135m --export
    python experiments/train_local_head.py --pair tiny-code --out /tmp/head --steps 100  # a quick one elsewhere

The head reads only the corpus and the target's token embedding (no target forward, no block drafter), so its
training is cheap next to the block drafter's; training.json records the command, wall time and held-out metrics.
Resumable (--resume) from the orbax checkpoints in checkpoints/<pair>-local-head-s<seed>/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (REPO, os.path.join(REPO, "experiments")):
    if p not in sys.path:
        sys.path.insert(0, p)

DEFAULTS = {  # per pair: sizes and a CPU budget (a few minutes); SmolLM2's rank 128 keeps the head at 13 MB (bf16)
    "tiny-code": dict(hidden=256, rank=128, seq_len=256, batch_size=16, steps=600, lr=3e-3, max_tokens=2_000_000,
                      export_dtype="float32", block="dflash-dpace"),
    "smollm2-135m": dict(hidden=256, rank=128, seq_len=256, batch_size=8, steps=600, lr=3e-3, max_tokens=None,
                         export_dtype="bfloat16", block="dflash-dpace"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(DEFAULTS), default="tiny-code")
    ap.add_argument("--depth", type=int, default=8, help="window depth: the block positions the head serves")
    ap.add_argument("--seed", type=int, default=0)
    for k in ("hidden", "rank", "seq_len", "batch_size", "steps"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--block", default=None, help="the pair's block drafter the exported `dels` fuses with")
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--beta", type=float, default=0.3)
    ap.add_argument("--export-dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-rows", type=int, default=64)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--export", action="store_true", help="ship as the pair's `dels` drafter")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.pair].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if not args.export and not args.out:
        ap.error("give --out DIR, or --export to ship the head as the pair's `dels` drafter")

    import smcsd
    from smcsd.drafters import LocalHead
    from smcsd.train import train_local_head
    from experiments.train_block_drafter import corpus_for

    if args.block not in smcsd.available_drafters(args.pair):
        ap.error(f"pair {args.pair} has no block drafter {args.block!r}")
    dtype = "float32" if args.pair == "smollm2-135m" else None
    target, _ = smcsd.load(args.pair, dtype=dtype)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    head = LocalHead.create(target, hidden=args.hidden, rank=args.rank, seed=args.seed, name="dels")
    out = os.path.join(REPO, "models", "shipped", args.pair, "drafters", "dels") if args.export else args.out
    tag = f"{args.pair}-local-head-s{args.seed}"
    command = "python experiments/train_local_head.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res, head = train_local_head(
        target, head, corpus, steps=args.steps, depth=args.depth, lr=args.lr, seed=args.seed,
        ckpt_dir=os.path.join(REPO, "checkpoints", tag), resume=args.resume, overwrite=args.overwrite, out=out,
        export_dtype=args.export_dtype, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
        eval_rows=args.eval_rows, progress=not args.no_progress, stop_after=args.stop_after,
        curves_path=os.path.join(REPO, "experiments", "results", "train", tag), command=command,
        info={"fused_with": args.block})
    if res.history["finished"]:
        with open(os.path.join(out, "dels.json"), "w") as f:
            json.dump({"schema": "smcsd.dels/1", "block": args.block, "alpha": args.alpha, "beta": args.beta,
                       "note": "DeLS-Spec: this directory holds the local head (trained by "
                               "experiments/train_local_head.py, see training.json); it is fused with the pair's "
                               "block drafter named by 'block'. Any block drafter of the same target can be fused "
                               "with it: smcsd.drafters.FusedDrafter(block, LocalHead.load(dir))."}, f, indent=2)
    print(json.dumps({"final_eval": res.history["eval"][-1] if res.history["eval"] else None,
                      "wall_s": round(res.history["wall_s"], 1), "out": out}, indent=1))


if __name__ == "__main__":
    main()
