"""Train an EAGLE-3 drafter (smcsd/drafters/eagle.py) for a pair's target with training-time test (smcsd/train/eagle.py).

    python -m experiments.train.eagle --pair tiny-code --steps 600 --out /tmp/eagle-tiny
    python -m experiments.train.eagle --pair smollm2-135m --draft-vocab 16384 --steps 4000 --export
    python -m experiments.train.eagle --pair smollm2-135m --steps 20 --batch-size 4 --seq-len 128 --out /tmp/e
      (a smoke run)
    (resumable: add --resume after a kill; --overwrite restarts)

Corpus:
- smollm2-135m: the self-distillation corpus `--corpus` (default experiments/data/corpus/smollm2-135m, built by
  experiments/train/build_corpus.py; read as it stands, so a corpus still growing gives a new teacher-cache key): its
  training conversations (prompt + the target's own answer) and, unless --no-text, its local text documents, packed
  into --seq-len rows; its held-out conversations (prompts no training row holds) are the held-out rows; with
  --loss-on answers (default) only predicting the answers' tokens (and the local text) is supervised and measured. The
  teacher's top-k log-probs and the three feature layers' hidden states are cached as float16 under --cache-dir.
- tiny-code: the interpreter's standard-library .py files (as train/block_drafter.py), the target run on the fly.
Draft vocabulary (--draft-vocab V′, 0 = the full vocabulary): the V′ most frequent tokens of the corpus's answers
(`SelfDistilledCorpus.answer_frequencies`; tiny-code: of the training rows), the target's EOS / end-of-turn ids
always kept. Drafter: one decoder layer initialised from the target's last layer (--init random: not), reading the
target layers `default_target_layers` (EAGLE-3's (1, L//2-1, L-4)). Loss per unrolled step k = 1..--ttt-steps:
--kl-weight · KL(p_T top-k over the draft vocabulary ‖ q_k) + --ce-weight · CE(gold), weighted --step-decay^(k-1);
step 1 at every position, steps 2..K at --ttt-rows random positions per sequence.
With --export the result goes to models/shipped/<pair>/drafters/eagle/ (EAGLE / SpecForge layout, with
training.json: command, settings, wall time, final held-out metrics); otherwise to --out.
"""

from __future__ import annotations

import resource

from experiments import report
from experiments.common import CORPUS
from experiments.train import common as train_cli

DEFAULTS = {  # per pair: sizes and a budget
    "tiny-code": dict(draft_vocab=0, ttt_steps=5, seq_len=256, batch_size=16, steps=600, lr=2e-3, topk=32,
                      max_tokens=2_000_000, export_dtype="float32"),
    "smollm2-135m": dict(draft_vocab=16384, ttt_steps=5, seq_len=256, batch_size=8, steps=4000, lr=1e-3, topk=64,
                         max_tokens=None, export_dtype="bfloat16"),
}


def corpus_and_counts(args, target):
    """(a TextCorpus / TokenCorpus, token counts of the target's outputs the draft vocabulary ranks)."""
    import numpy as np
    V = target.config.vocab_size
    if args.pair == "tiny-code":
        from experiments.train.block_drafter import corpus_for
        corpus = corpus_for("tiny-code", target, args)
        return corpus, np.bincount(corpus.train_rows.ravel(), minlength=V)
    from smcsd.train.corpus import SelfDistilledCorpus
    from smcsd.train.eagle import token_corpus
    sdc = SelfDistilledCorpus(args.corpus, tokenizer=target.tokenizer)
    corpus = token_corpus(sdc, seq_len=args.seq_len, batch_size=args.batch_size, include_text=not args.no_text,
                          max_tokens=args.max_tokens, loss_on=args.loss_on, seed=args.data_seed)
    return corpus, sdc.answer_frequencies(V)


def main(argv=None):
    ap = train_cli.new_parser(__doc__, DEFAULTS)
    ap.add_argument("--corpus", default=CORPUS, help="self-distillation corpus directory (smollm2-135m)")
    ap.add_argument("--no-text", action="store_true", help="train on the corpus's conversations only")
    ap.add_argument("--loss-on", choices=["answers", "all"], default="answers",
                    help="smollm2-135m: supervise (and measure held out) only the target's answer tokens (default, "
                         "as EAGLE-3 trains on assistant turns), or every token of a conversation")
    ap.add_argument("--draft-vocab", type=int, default=None, help="V′ kept tokens of the head (0: full vocabulary)")
    train_cli.add_size_args(ap, ("ttt_steps", "seq_len", "batch_size", "steps", "topk"))
    ap.add_argument("--step-decay", type=float, default=0.8, help="weight of unrolled step k: decay^(k-1)")
    ap.add_argument("--ttt-rows", type=int, default=64,
                    help="positions per sequence unrolled for steps 2..K (0: every position)")
    ap.add_argument("--remat", action="store_true", help="recompute each step's head in the backward pass (memory)")
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--kl-weight", type=float, default=1.0)
    ap.add_argument("--init", choices=["target", "random"], default="target",
                    help="initialise the decoder layer / norm / head from the target (default) or randomly")
    ap.add_argument("--warm-start", default=None, help="start from this EAGLE checkpoint directory's weights")
    ap.add_argument("--smc-floor", type=float, default=0.02, help="ε of smc's floor mixture (stored with the drafter)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--renyi-weight", type=float, default=0.0,
                    help="weight of a Rényi-α term D_α(p̃ ‖ q) per unrolled step (a proposal trained for smc; with "
                         "--kl-weight it is the Rényi + KL mix, e.g. --renyi-weight 1 --alpha 1.5 --kl-weight 0.5)")
    ap.add_argument("--alpha", type=float, default=2.0, help="the Rényi order (> 1; 2: log(1 + χ²))")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="compare the target and the drafter both tempered at τ (a proposal for smc at T=0.7: 0.7)")
    ap.add_argument("--data-seed", type=int, default=0,
                    help="order of the training rows (epoch e visits the permutation drawn from (data-seed, e)); "
                         "a warm-started continuation takes a new one to see rows in a new order")
    ap.add_argument("--no-teacher-cache", action="store_true",
                    help="run the target on each batch instead of caching its outputs (smoke runs)")
    train_cli.add_training_args(ap, export_help="export into the pair's shipped drafters (models/shipped/<pair>/"
                                "drafters/eagle)", ckpt_dir=True)
    args = ap.parse_args(argv)
    train_cli.fill_defaults(args, DEFAULTS[args.pair])
    train_cli.start_devices(args)  # --distributed / --mesh, before the target loads

    from smcsd.drafters import DraftVocab, EagleDrafter, stop_ids_of
    from smcsd.train.eagle import train_eagle

    target, _ = train_cli.load_pair(args.pair)
    corpus, counts = corpus_and_counts(args, target)
    V = target.config.vocab_size
    vocab = None
    if args.draft_vocab:
        vocab = DraftVocab.from_counts(counts, args.draft_vocab, required_ids=stop_ids_of(target))
    print(f"corpus: {corpus.num_tokens} tokens, {len(corpus.train_rows)} train rows, {len(corpus.heldout_rows)} "
          f"held-out rows; draft vocabulary {'full' if vocab is None else len(vocab)} of {V}"
          + ("" if vocab is None else f" (covers {vocab.coverage(counts):.4f} of the answer tokens)"), flush=True)
    if args.warm_start:
        drafter = EagleDrafter.load(args.warm_start, dtype="float32").bind(target)
        if drafter.vocab != vocab:
            print("warm start: keeping the checkpoint's draft vocabulary", flush=True)
    else:
        drafter = EagleDrafter.create(target, draft_vocab=vocab, seed=args.seed, from_target=args.init == "target",
                                      smc_floor=args.smc_floor)
    print(f"drafter: {drafter!r}, {drafter.num_params / 1e6:.2f}M params", flush=True)
    tag = f"{args.pair}-eagle-v{len(drafter.vocab) if drafter.vocab is not None else 'full'}-k{args.ttt_steps}" \
          f"-s{args.seed}"
    out = train_cli.output_dir(args, "eagle")
    res = train_eagle(target, drafter, corpus, steps=args.steps, ttt_steps=args.ttt_steps, step_decay=args.step_decay,
                      ttt_rows=args.ttt_rows or None, remat=args.remat, seed=args.seed,
                      lr=args.lr, ce_weight=args.ce_weight, kl_weight=args.kl_weight, topk=args.topk,
                      renyi_weight=args.renyi_weight, alpha=args.alpha,
                      temperature=args.temperature,
                      cache_dir=None if args.no_teacher_cache else train_cli.teacher_cache_dir(args),
                      **train_cli.loop_kwargs(args, tag, out, report.command(__file__, argv), ckpt_dir=args.ckpt_dir))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB (Linux)
    train_cli.print_summary(res, out, steps_run=res.step, peak_rss_gib=round(peak, 2))


if __name__ == "__main__":
    main()
