"""Build (or resume) the self-distillation corpus of a target: its own answers to >= 20k diverse requests, plus
teacher-forced local text. See `smcsd.train.corpus` for the format and the phases.

    python -m experiments.train.build_corpus --log experiments/data/corpus/smollm2-135m/build.log &   # background
    python -m experiments.train.build_corpus --max-answer-tokens 1500000                               # stop there

Kill it at any time; the same command resumes at the first missing shard and reproduces the uninterrupted corpus.
The benchmark prompts of experiments/bench/smollm2_pair.py and studies/block_drafters.py are excluded from the pool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from experiments.common import CHAT_PROMPTS, CORPUS  # CHAT_PROMPTS: the benchmarks', never in the corpus

DEFAULT_OUT = CORPUS



def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-jobs", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--max-answer-tokens", type=int, default=None, help="stop once the corpus holds this many")
    ap.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards")
    ap.add_argument("--text-tokens", type=int, default=3_600_000, help="teacher-forced local text (0: none)")
    ap.add_argument("--log", default=None, help="also append progress lines to this file")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--mesh", default=None, metavar="DATAxMODEL",
                    help="generate on a device mesh: batch slots over DATA (must divide --batch-size), the target's "
                         "weights over MODEL, e.g. 8x1 or 4x2 ('auto': every device on data)")
    ap.add_argument("--distributed", action="store_true",
                    help="jax.distributed.initialize() first (a multi-host TPU slice / GPU cluster); every process "
                         "runs the same command")
    args = ap.parse_args(argv)
    from smcsd.train.cli import mesh_of
    mesh = mesh_of(args)  # joins the other processes first with --distributed (gloo collectives on CPU)

    import smcsd
    from smcsd.train.corpus import BuildSettings, build_corpus, build_text_shards

    def log(msg):
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"
        print(line, flush=True)
        if args.log:
            with open(args.log, "a") as f:
                f.write(line + "\n")

    os.makedirs(args.out, exist_ok=True)
    target, _ = smcsd.load(args.pair, dtype="float32")
    command = "python -m experiments.train.build_corpus " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.text_tokens and not os.path.exists(os.path.join(args.out, "text.json")):
        build_text_shards(target.tokenizer, args.out, max_tokens=args.text_tokens, log=log)
    settings = BuildSettings(batch_size=args.batch_size, shard_jobs=args.shard_jobs, max_new_tokens=args.max_new_tokens)
    t0 = time.time()
    m = build_corpus(target, args.out, settings, exclude=CHAT_PROMPTS, max_shards=args.max_shards,
                     max_answer_tokens=args.max_answer_tokens, progress=not args.no_progress, command=command, log=log,
                     mesh=mesh)
    log(f"done for now: {json.dumps(m['totals'])} (this run {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
