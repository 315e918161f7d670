"""Train a PARD-2 mask drafter (smcsd/drafters/pard2.py) for a pair's target, warm-started from its distilled AR draft.

    python -m experiments.train.mask_drafter --pair tiny-code --export                  # CAT, dual mode: `pard2`
    python -m experiments.train.mask_drafter --pair tiny-code --weighting uniform --out /tmp/pard2-uniform
    python -m experiments.train.mask_drafter --pair tiny-code --feature-drop 0 --out /tmp/pard2-feat   # features always
    python -m experiments.train.mask_drafter --pair tiny-code --no-features --out /tmp/pard2-plain    # never
    (resumable: add --resume after a kill; --overwrite restarts)

COD sequences (PARD: mask groups up to --depth, retain 0.7 per depth, at least 0.2), loss 0.1·CE + 1.0·KL(p_T ‖ q)
with CAT or uniform weights, target features of `default_feature_layers` (PARD-2's last layer and every 8th below
it) added to the inputs and dropped for a whole row with probability --feature-drop (smcsd/train/pard2.py). Corpus
and teacher as experiments/train/block_drafter.py's. With --export the result goes to
models/shipped/<pair>/drafters/pard2/ (with training.json: command, settings, wall time, final held-out metrics).
"""

from __future__ import annotations

from experiments.train import common as train_cli
from experiments import report

DEFAULTS = {  # per pair: sizes and a CPU budget (well under an hour a run)
    "tiny-code": dict(seq_len=128, batch_size=16, steps=400, lr=1e-3, max_tokens=2_000_000, topk=32,
                      export_dtype="float32"),
    "smollm2-135m": dict(seq_len=128, batch_size=4, steps=300, lr=5e-4, max_tokens=None, topk=64,
                         export_dtype="bfloat16"),
}


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """PARD-2's target layers [−1, −8, −16, −24] that exist; on a shallow target the last and the middle one."""
    L = int(num_layers)
    picked = sorted({L - d for d in (1, 8, 16, 24) if L - d >= 0})
    if len(picked) < 2 and L > 1:
        picked = sorted({L // 2, L - 1})
    return tuple(picked)


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--weighting", choices=["cat", "uniform"], default="cat")
    ap.add_argument("--no-features", action="store_true", help="target-independent only (no dual mode)")
    ap.add_argument("--feature-drop", type=float, default=0.2)
    ap.add_argument("--depth", type=int, default=8, help="mask groups of the COD sequences (K trained)")
    ap.add_argument("--seed", type=int, default=0)
    train_cli.add_size_args(ap, ("seq_len", "batch_size", "steps", "topk"))
    train_cli.add_training_args(ap, export_help="export into the pair's shipped drafters as pard2", ckpt_dir=True)
    args = ap.parse_args(argv)
    train_cli.fill_defaults(args, DEFAULTS[args.pair])  # this script does not require --out or --export
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads

    from smcsd.drafters import PARD2Drafter
    from smcsd.train.pard2 import train_mask_drafter
    from experiments.train.block_drafter import corpus_for

    target, draft = train_cli.load_pair(args.pair, drafter="ar-distilled")
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    layers = () if args.no_features else default_feature_layers(target.config.num_hidden_layers)
    drafter = PARD2Drafter.create(draft, target=target, feature_layers=layers, seed=args.seed, name="pard2")
    tag = f"{args.pair}-pard2-{args.weighting}-{'plain' if args.no_features else f'drop{args.feature_drop:g}'}-s{args.seed}"
    out = train_cli.output_dir(args, "pard2")
    res = train_mask_drafter(target, drafter, corpus, steps=args.steps, weighting=args.weighting, depth=args.depth,
                             feature_drop=args.feature_drop, lr=args.lr, topk=args.topk, seed=args.seed,
                             cache_dir=train_cli.teacher_cache_dir(args),
                             **train_cli.loop_kwargs(args, tag, out, report.command(__file__, argv),
                                                     ckpt_dir=args.ckpt_dir))
    train_cli.print_summary(res, out)


if __name__ == "__main__":
    main()
