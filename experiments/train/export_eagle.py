"""Export the latest training checkpoint of an EAGLE run (orbax, under checkpoints/<tag>/) as a drafter directory in
the EAGLE / SpecForge layout, without finishing the run: for a long training stopped by time, to ship or benchmark
what it has learnt so far (the run itself resumes from the same checkpoint with `train/eagle.py ... --resume`).

    python -m experiments.train.export_eagle --ckpt checkpoints/smollm2-135m-eagle-v16384-k4-s0 \
        --draft-vocab 16384 --out models/shipped/smollm2-135m/drafters/eagle
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from experiments.common import CORPUS, CURVES, REPO



def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--ckpt", required=True, help="the run's checkpoint directory")
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--draft-vocab", type=int, required=True, help="the run's V′ (0: full vocabulary)")
    ap.add_argument("--curves", default=None, help="the run's curves JSON (default: experiments/results/train/<tag>.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)

    import orbax.checkpoint as ocp

    import smcsd
    from smcsd.drafters import DraftVocab, EagleDrafter, stop_ids_of
    from smcsd.train.corpus import SelfDistilledCorpus
    from smcsd.train.loop import checkpoint_manager

    target, _ = smcsd.load(args.pair, dtype="float32")
    vocab = None
    if args.draft_vocab:
        counts = SelfDistilledCorpus(args.corpus, target.tokenizer).answer_frequencies(target.config.vocab_size)
        vocab = DraftVocab.from_counts(counts, args.draft_vocab, required_ids=stop_ids_of(target))
    mngr = checkpoint_manager(args.ckpt)
    step = mngr.latest_step()
    if step is None:
        raise SystemExit(f"--ckpt {args.ckpt}: no checkpoint there")
    raw = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    drafter = EagleDrafter.create(target, draft_vocab=vocab, from_target=False)
    import jax
    params = jax.tree_util.tree_map(lambda a, b: jax.numpy.asarray(b, a.dtype), drafter.params, raw["state"]["params"])
    tag = os.path.basename(os.path.normpath(args.ckpt))
    curves = args.curves or os.path.join(CURVES, tag + ".json")
    info = {"checkpoint": os.path.relpath(args.ckpt, REPO), "step": step, "meta": raw["meta"],
            "exported_by": "python -m experiments.train.export_eagle " + " ".join(sys.argv[1:] if argv is None else argv)}
    if os.path.exists(curves):
        with open(curves) as f:
            c = json.load(f)
        info.update(run=c.get("run"), last_eval=(c.get("eval") or [None])[-1], wall_s=c.get("wall_s"),
                    commands=c.get("commands"))
    drafter.with_params(params).save(args.out, dtype=args.dtype, info=info)
    print(f"exported step {step} of {args.ckpt} to {args.out}")


if __name__ == "__main__":
    main()
