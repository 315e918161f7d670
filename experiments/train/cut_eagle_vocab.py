"""Cut a trained EAGLE-3 head to a smaller draft vocabulary without retraining (FR-Spec's trade: a drafter step's
cost falls with V′, its proposals lose the mass of the dropped tokens): keep the V′ most frequent of its kept tokens
by the self-distillation corpus's answer counts (the stop ids always kept), and the head rows of those.

    python -m experiments.train.cut_eagle_vocab --size 8192 --out /tmp/eagle8k
    python -m experiments.train.cut_eagle_vocab --size 4096 --out models/shipped/smollm2-135m/drafters/eagle \
        --from /tmp/eagle16k

Writes the drafter directory (EAGLE / SpecForge layout, `--dtype`) with a training.json that records the source, the
command, the kept share of the corpus's answer tokens before and after, and the source's own training.json.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments import report
from experiments.common import CORPUS, SHIPPED


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--from", dest="source", default=None,
                    help="the EAGLE drafter directory to cut (default: the pair's shipped eagle)")
    ap.add_argument("--size", type=int, required=True, help="V′ after the cut (smaller than the source's)")
    ap.add_argument("--corpus", default=CORPUS, help="the self-distillation corpus whose answer counts rank the tokens")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)

    import smcsd
    from smcsd.drafters import EagleDrafter, stop_ids_of
    from smcsd.train.corpus import SelfDistilledCorpus

    source = args.source or os.path.join(SHIPPED, args.pair, "drafters", "eagle")
    target = smcsd.load(args.pair, drafter=None, dtype="float32")[0]
    drafter = EagleDrafter.load(source, dtype="float32").bind(target)
    if drafter.vocab is None:
        raise SystemExit(f"{source} drafts over the full vocabulary: cut it with DraftVocab.from_counts instead")
    if os.path.abspath(source) == os.path.abspath(args.out):
        raise SystemExit("--out must differ from the source directory (copy the source elsewhere first)")
    counts = SelfDistilledCorpus(args.corpus, tokenizer=target.tokenizer).answer_frequencies(target.config.vocab_size)
    vocab = drafter.vocab.top(counts, args.size, required_ids=stop_ids_of(target))
    cut = drafter.with_draft_vocab(vocab)
    info_path = os.path.join(source, "training.json")
    source_info = None
    if os.path.isfile(info_path):
        with open(info_path) as f:
            source_info = json.load(f)
    info = {"recipe": "cut_eagle_vocab", "source": os.path.relpath(source), "size_before": len(drafter.vocab),
            "size": len(vocab), "answer_coverage_before": drafter.vocab.coverage(counts),
            "answer_coverage": vocab.coverage(counts), "command": report.command(__file__, argv),
            "source_training": source_info}
    cut.save(args.out, dtype=args.dtype, info=info)
    print(f"{source} (V′={len(drafter.vocab)}, covers {info['answer_coverage_before']:.4f} of the answer tokens) -> "
          f"{args.out} (V′={len(vocab)}, covers {info['answer_coverage']:.4f}; {cut.num_params / 1e6:.2f}M params)")


if __name__ == "__main__":
    main()
