"""Train a DFlash block drafter (smcsd/drafters/dflash.py) for a pair's target with DFlash or D-PACE position weights.

    python -m experiments.train.block_drafter --pair tiny-code --weighting dflash --steps 600
    python -m experiments.train.block_drafter --pair tiny-code --weighting dpace --seed 1 --out /tmp/dpace-s1
    python -m experiments.train.block_drafter --pair smollm2-135m --weighting dpace --steps 400 --export
    python -m experiments.train.block_drafter --pair tiny-code --weighting dpace --variable-prefix --export
      (D²SD's variable-prefix drafter: starts from the pair's dflash-dpace drafter, each block shows its first p
      gold tokens, Pr(p) ∝ 0.9^p, loss after them; exported as the `d2sd` drafter's network)
    python -m experiments.train.block_drafter --pair tiny-code --weighting dpace --init-from DIR/export --steps 4000 \
        --out DIR2/export   (warm start from a saved drafter, a fresh warmup and cosine schedule)
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus:
- tiny-code with --continuations DIR [DIR ...]: the target's own continuations of training-file windows
  (`train/code_continuations.py`), the text `sd` verifies; their held-out shards measure the drafter.
- tiny-code: the interpreter's standard-library .py files that `train/pair.py` trains on (its held-out files,
  split by path hash, stay out: `studies/eval_code.py` measures on them), up to --max-tokens bytes; the target (5.4M)
  runs teacher-forced on the fly.
- smollm2-135m: the corpus of `train/smollm2_draft.py` (stdlib source, then the target's own chat answers), the
  teacher's top-k log-probs and hidden states cached as float16 under --cache-dir.
The drafter: --layers decoder layers at the target's width (sharing its embedding and LM head), reading the
target's hidden states at `default_target_layers` (up to 5 spread over the depth), block size --block-size.
Loss per position: --ce-weight · CE(gold) + --kl-weight · KL(p_T top-k ‖ q), weighted per --weighting.
With --export the result goes to models/shipped/<pair>/drafters/<dflash | dflash-dpace | dflash-distilled (with
--continuations)>/ (with training.json:
command, settings, wall time, final held-out metrics); otherwise to --out.
"""

from __future__ import annotations

import json

from experiments.train import common as train_cli
from experiments import report

DEFAULTS = {  # per pair: sizes and a CPU budget (about half an hour or less a run)
    "tiny-code": dict(layers=1, block_size=16, seq_len=256, batch_size=16, num_anchors=8, steps=600, lr=2e-3,
                      max_tokens=2_000_000, topk=32, export_dtype="float32"),
    "smollm2-135m": dict(layers=1, block_size=16, seq_len=256, batch_size=8, num_anchors=6, steps=400, lr=1e-3,
                         max_tokens=None, topk=64, export_dtype="bfloat16"),
}


def corpus_for(pair: str, target, args):
    from smcsd.train import TextCorpus
    # tiny-code's own continuations (train/code_continuations.py); other scripts share this with their own flags
    if getattr(args, "continuations", None) is not None:
        from experiments.train.code_continuations import continuations_corpus
        return continuations_corpus(args.continuations, seq_len=args.seq_len, batch_size=args.batch_size,
                                    max_tokens=args.max_tokens, heldout_frac=0.02)
    if pair == "tiny-code":
        from experiments.code_data import is_heldout, stdlib_files
        texts, total = [], 0
        for rel, path in stdlib_files():
            if not is_heldout(rel):
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
                total += len(texts[-1])
                if args.max_tokens and total > args.max_tokens:  # bytes = tokens here: stop reading early
                    break
        return TextCorpus(texts, tokenizer=target.tokenizer, seq_len=args.seq_len, batch_size=args.batch_size,
                          heldout_frac=0.02, max_tokens=args.max_tokens, seed=0)
    from experiments.train import smollm2_draft as sm
    tok = target.tokenizer
    with open(sm.CHAT_FILE) as f:
        chats = [json.loads(line) for line in f]
    chat_texts = [tok.apply_chat_template([{"role": "user", "content": c["prompt"]},
                                           {"role": "assistant", "content": c["answer"]}], tokenize=False,
                                          add_generation_prompt=False) for c in chats]
    return TextCorpus(sm.code_texts(900_000) + chat_texts, tokenizer=tok, seq_len=args.seq_len,
                      batch_size=args.batch_size, heldout_frac=0.04, seed=0, max_tokens=args.max_tokens)


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--weighting", choices=["dflash", "dpace", "uniform"], default="dflash")
    ap.add_argument("--seed", type=int, default=0, help="init and anchor seed")
    train_cli.add_size_args(ap, ("layers", "block_size", "seq_len", "batch_size", "num_anchors", "steps", "topk"),
                            lr=False)
    # its own order (--export-dtype before --lr, --variable-prefix before --resume) and helps: in pieces
    ap.add_argument("--export-dtype", choices=train_cli.EXPORT_DTYPES, default=None,
                    help="stored dtype (default: float32 on tiny-code, bfloat16 on smollm2-135m; computed in float32 on CPU)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--target-layers", type=int, nargs="+", default=None,
                    help="target layers the drafter reads (default: smcsd.drafters.dflash.default_target_layers)")
    ap.add_argument("--ce-weight", type=float, default=0.5)
    ap.add_argument("--kl-weight", type=float, default=0.5)
    train_cli.add_schedule_args(ap)
    ap.add_argument("--ckpt-dir", default=None, help="default: checkpoints/<pair>-<weighting>-s<seed>")
    train_cli.add_output_args(ap, export_help="export into the pair's shipped drafters",
                              out_help="export directory (default: none unless --export)")
    ap.add_argument("--variable-prefix", action="store_true",
                    help="train D²SD's variable-prefix drafter (warm-started from the pair's dflash-dpace drafter)")
    ap.add_argument("--prefix-decay", type=float, default=0.9, help="Pr(p) ∝ decay^p with --variable-prefix")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="warm start: begin from the block drafter saved in DIR (an --out export, a shipped drafter's "
                         "directory) with a fresh schedule; its config.json sets the architecture, so --layers, "
                         "--block-size and --target-layers are not given with it")
    ap.add_argument("--continuations", nargs="+", default=None, metavar="DIR",
                    help="tiny-code: train on the target's own continuations built by train/code_continuations.py "
                         "(e.g. experiments/data/corpus/tiny-code-greedy; several directories are mixed) instead of "
                         "the standard-library text (give --max-tokens: the pair's default keeps 2M tokens)")
    train_cli.add_run_flags(ap)
    train_cli.add_device_args(ap)
    args = ap.parse_args(argv)
    if args.continuations is not None and args.pair != "tiny-code":
        ap.error("--continuations is tiny-code's corpus of its target's continuations; smollm2-135m trains on its "
                 "own self-distillation corpus")
    if args.init_from is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("layers", "block_size", "target_layers")
                 if getattr(args, k) is not None]
        if given:
            ap.error(f"--init-from takes the architecture from {args.init_from}/config.json; drop {', '.join(given)}")
        if args.variable_prefix:
            ap.error("--variable-prefix warm-starts from the pair's dflash-dpace drafter itself; drop --init-from")
    train_cli.fill_defaults(args, DEFAULTS[args.pair])  # this script does not require --out or --export
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads

    from smcsd.drafters import DFlashDrafter
    from smcsd.train import train_block_drafter

    target, _ = train_cli.load_pair(args.pair)
    corpus = corpus_for(args.pair, target, args)
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows", flush=True)
    name = "dflash-dpace" if args.weighting == "dpace" else "dflash"
    if args.continuations is not None:  # self-distilled: exported as the pair's `dflash-distilled` drafter
        name = "dflash-distilled"
    if args.variable_prefix:  # warm start: the variable-prefix drafter shares the main drafter's architecture
        from smcsd.pairs import drafter_dir
        name = "d2sd"
        drafter = DFlashDrafter.load(drafter_dir(args.pair, "dflash-dpace"), dtype="float32", name=name).bind(target)
    elif args.init_from is not None:  # bind() checks that it was made for this target's width and vocabulary
        drafter = DFlashDrafter.load(args.init_from, dtype="float32", name=name).bind(target)
    else:
        drafter = DFlashDrafter.create(target, num_layers=args.layers, block_size=args.block_size, seed=args.seed,
                                      target_layers=args.target_layers, name=name)
    tag = (f"{args.pair}-{args.weighting}{'-vp' if args.variable_prefix else ''}"
           f"{'-cont' if args.continuations else ''}-s{args.seed}")
    out = train_cli.output_dir(args, name)
    res = train_block_drafter(
        target, drafter, corpus, steps=args.steps, weighting=args.weighting, lr=args.lr,
        num_anchors=args.num_anchors, ce_weight=args.ce_weight, kl_weight=args.kl_weight, topk=args.topk,
        seed=args.seed, cache_dir=train_cli.teacher_cache_dir(args),
        prefix_decay=args.prefix_decay if args.variable_prefix else None,
        **train_cli.loop_kwargs(args, tag, out, report.command(__file__, argv), ckpt_dir=args.ckpt_dir))
    train_cli.print_summary(res, out)


if __name__ == "__main__":
    main()
