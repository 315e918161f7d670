"""Train FlexDraft adapters (models/flex.py) for a pair's target (`smcsd.train.train_flex`) and, with --export, ship
them as the pair's `flex` drafter, so `smcsd.decode(..., method="flex")` needs no draft.

    python experiments/train_flex.py --pair tiny-code --export
    python experiments/train_flex.py --pair tiny-code --adapter-layers 1 --out /tmp/flex-la1
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus as `train_block_drafter.py`; the target runs teacher-forced inside every step (the masks read its K/V) and
stays frozen: only the adapters of the last --adapter-layers layers, the mask vector and the calibration MLP learn
(their count is in training.json). training.json also records held-out acceptance with and without calibration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULTS = {  # per pair: sizes and a CPU budget
    "tiny-code": dict(adapter_layers=2, group_size=8, calib_hidden=256, seq_len=256, batch_size=8, num_anchors=16,
                      steps=500, lr=2e-3, max_tokens=2_000_000, topk=32, export_dtype="float32"),
    "smollm2-135m": dict(adapter_layers=4, group_size=8, calib_hidden=256, seq_len=128, batch_size=4, num_anchors=16,
                         steps=300, lr=1e-3, max_tokens=None, topk=64, export_dtype="bfloat16"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(DEFAULTS), default="tiny-code")
    ap.add_argument("--seed", type=int, default=0)
    for k in ("adapter_layers", "group_size", "calib_hidden", "seq_len", "batch_size", "num_anchors", "steps", "topk"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--export-dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-rows", type=int, default=32)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/smcsd/teacher"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--export", action="store_true", help="ship as the pair's `flex` drafter")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.pair].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if not args.export and not args.out:
        ap.error("give --out DIR, or --export to ship the adapters as the pair's `flex` drafter")

    import smcsd
    from smcsd.drafters import FlexDrafter
    from smcsd.train import train_flex
    from experiments.train_block_drafter import corpus_for

    target, _ = smcsd.load(args.pair, drafter="prompt-lookup", dtype="float32" if args.pair == "smollm2-135m" else None)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    drafter = FlexDrafter.create(target, adapter_layers=args.adapter_layers, group_size=args.group_size,
                                 calib_hidden=args.calib_hidden, seed=args.seed, name="flex")
    tag = f"{args.pair}-flex-la{args.adapter_layers}-s{args.seed}"
    out = os.path.join(REPO, "models", "shipped", args.pair, "drafters", "flex") if args.export else args.out
    command = "python experiments/train_flex.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res, _ = train_flex(
        target, drafter, corpus, steps=args.steps, lr=args.lr, num_anchors=args.num_anchors, topk=args.topk,
        seed=args.seed, cache_dir=args.cache_dir if args.pair == "smollm2-135m" else None,
        ckpt_dir=os.path.join(REPO, "checkpoints", tag), resume=args.resume, overwrite=args.overwrite, out=out,
        export_dtype=args.export_dtype, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
        eval_rows=args.eval_rows, progress=not args.no_progress, stop_after=args.stop_after,
        curves_path=os.path.join(REPO, "experiments", "results", "train", tag), command=command)
    print(json.dumps({"final_eval": res.history["eval"][-1] if res.history["eval"] else None,
                      "wall_s": round(res.history["wall_s"], 1), "trained_params": drafter.num_params, "out": out},
                     indent=1))


if __name__ == "__main__":
    main()
