"""Train FlexDraft adapters (smcsd/drafters/flex.py) for a pair's target (`smcsd.train.train_flex`) and, with --export, ship
them as the pair's `flex` drafter, so `smcsd.decode(..., method="flex")` needs no draft.

    python -m experiments.train.flex --pair tiny-code --export
    python -m experiments.train.flex --pair tiny-code --adapter-layers 1 --out /tmp/flex-la1
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus as `train/block_drafter.py`; the target runs teacher-forced inside every step (the masks read its K/V) and
stays frozen: only the adapters of the last --adapter-layers layers, the mask vector and the calibration MLP learn
(their count is in training.json). training.json also records held-out acceptance with and without calibration.
"""

from __future__ import annotations

from experiments.train import common as train_cli
from experiments import report

DEFAULTS = {  # per pair: sizes and a CPU budget
    "tiny-code": dict(adapter_layers=2, group_size=8, calib_hidden=256, seq_len=256, batch_size=8, num_anchors=16,
                      steps=500, lr=2e-3, max_tokens=2_000_000, topk=32, export_dtype="float32"),
    "smollm2-135m": dict(adapter_layers=4, group_size=8, calib_hidden=256, seq_len=128, batch_size=4, num_anchors=16,
                         steps=300, lr=1e-3, max_tokens=None, topk=64, export_dtype="bfloat16"),
}


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--seed", type=int, default=0)
    train_cli.add_size_args(ap, ("adapter_layers", "group_size", "calib_hidden", "seq_len", "batch_size",
                                 "num_anchors", "steps", "topk"))
    train_cli.add_training_args(ap, export_help="ship as the pair's `flex` drafter")
    args = ap.parse_args(argv)
    train_cli.fill_defaults(args, DEFAULTS[args.pair])
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads
    train_cli.require_out_or_export(ap, args, "the adapters as the pair's `flex` drafter")

    from smcsd.drafters import FlexDrafter
    from smcsd.train import train_flex
    from experiments.train.block_drafter import corpus_for

    target, _ = train_cli.load_pair(args.pair)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    drafter = FlexDrafter.create(target, adapter_layers=args.adapter_layers, group_size=args.group_size,
                                 calib_hidden=args.calib_hidden, seed=args.seed, name="flex")
    tag = f"{args.pair}-flex-la{args.adapter_layers}-s{args.seed}"
    out = train_cli.output_dir(args, "flex")
    res, _ = train_flex(target, drafter, corpus, steps=args.steps, lr=args.lr, num_anchors=args.num_anchors,
                        topk=args.topk, seed=args.seed, cache_dir=train_cli.teacher_cache_dir(args),
                        **train_cli.loop_kwargs(args, tag, out, report.command(__file__, argv)))
    train_cli.print_summary(res, out, trained_params=drafter.num_params)


if __name__ == "__main__":
    main()
