"""Why a block drafter trails an AR draft: its first block position, teacher-forced, against the AR draft's next
token, on held-out prompts and on the target's own greedy continuations of them.

    python -m experiments.studies.block_first_position --pair tiny-code --drafter dflash-dpace --ar ar-distilled
    python -m experiments.studies.block_first_position --drafter-dir /tmp/dflash-run --out /tmp/bfp.json

For each prompt the target continues greedily (`ar`, T=0, --max-new-tokens); on the prompt alone and on prompt +
continuation, the target runs once teacher-forced (hidden states of the drafter's layers) and the block drafter
opens a block at every anchor a (`smcsd.train.dflash.block_train_logits`, exactly what `propose` computes at decode).
Reported per text: how often the block's position-1 argmax equals the target's argmax for x_{a+1}, how often the AR
draft's next-token argmax does, and the target's own agreement with the text. A gap already at position 1 says the
drafter is weak at what EAGLE-style drafters do best (the next token from the last context feature), not that the
parallel positions 2..K lose dependence. Then `sd` at K=8, T=0 per position (accepted drafts per cycle). JSON: --out.
"""

from __future__ import annotations

import argparse

from experiments import report

SCHEMA = "smcsd.block_first_position/1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code")
    ap.add_argument("--drafter", default="dflash-dpace", help="a block drafter of the pair")
    ap.add_argument("--drafter-dir", default=None,
                    help="a block drafter checkpoint directory (DFlashDrafter.save) measured instead of --drafter")
    ap.add_argument("--ar", default="ar-distilled", help="the AR draft to compare with")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=8, help="K of the sd run per position")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import jax.numpy as jnp
    import numpy as np

    import smcsd
    from experiments.common import pair_prompts
    from smcsd.models import forward_full
    from smcsd.runtime.engine import hidden_concat
    from smcsd.train.dflash import block_train_logits

    target, block = smcsd.load(args.pair, args.drafter)
    if args.drafter_dir:
        from smcsd.drafters import DFlashDrafter
        block = DFlashDrafter.load(args.drafter_dir, dtype=target.config.dtype).bind(target)
        args.drafter = block.name
    _, ar = smcsd.load(args.pair, args.ar)
    if getattr(block, "block_config", None) is None:
        raise SystemExit(f"--drafter {args.drafter} is not a block drafter of {args.pair}")
    prompts, stops, _ = pair_prompts(args.pair, target, args.prompts)

    def agreement(seq, start):
        seq = jnp.asarray(seq, jnp.int32)[None]
        logits, h = forward_full(target.config, target.params, seq, hidden_layers=block.hidden_layers)
        T = seq.shape[1]
        anchors = jnp.arange(max(start, 1), T - 2, dtype=jnp.int32)[None]
        lg, _, _ = block_train_logits(block.block_config, block.params, block.shared, seq, hidden_concat(h), anchors)
        a = anchors[0]
        t_next = jnp.argmax(logits[0], -1)[a]  # the target's argmax for x_{a+1}
        ar_logits = forward_full(ar.config, ar.params, seq)
        ar_logits = ar_logits[0] if isinstance(ar_logits, tuple) else ar_logits
        return (float(jnp.mean(jnp.argmax(lg[0, :, 0], -1) == t_next)),
                float(jnp.mean(jnp.argmax(ar_logits[0], -1)[a] == t_next)),
                float(jnp.mean(t_next == seq[0, a + 1])), int(a.shape[0]))

    rows = {"prompts": [], "continuations": []}
    for p in prompts:
        r = smcsd.decode(p, target=target, method="ar", temperature=0, max_new_tokens=args.max_new_tokens,
                         eos_id=stops)
        rows["prompts"].append(agreement(list(p), 2))
        new = r.tokens[0] if r.tokens and not isinstance(r.tokens[0], int) else r.tokens  # one request's tokens
        rows["continuations"].append(agreement(list(p) + list(new), len(p)))
    per_pos = {}
    for name, d in ((args.drafter, block), (args.ar, ar)):
        tot, cycles = np.zeros(args.k), 0
        for p in prompts:
            r = smcsd.decode(p, target=target, draft=d, method="sd", num_speculative_tokens=args.k, temperature=0,
                             max_new_tokens=64, eos_id=stops)
            tot += np.asarray(r.stats.accepted_per_position)
            cycles += r.stats.num_target_calls
        per_pos[name] = {"accepted_per_position": tot.tolist(), "cycles": cycles,
                         "mean_accepted": float(tot.sum() / cycles)}
    lines = ["| text | positions | block pos-1 = target argmax | AR draft = target argmax | target = text |",
             "|---|---:|---:|---:|---:|"]
    summary = {}
    for text, rs in rows.items():
        n = sum(r[3] for r in rs)
        m = [sum(r[i] * r[3] for r in rs) / n for i in range(3)]
        summary[text] = {"positions": n, "block_pos1": m[0], "ar": m[1], "target_vs_text": m[2]}
        lines.append(f"| {text} | {n} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} |")
    lines += ["", f"| drafter | sd K={args.k}, T=0: accepted drafts per position (per cycle) | mean accepted |",
              "|---|---|---:|"]
    for name, v in per_pos.items():
        pp = " ".join(f"{x / v['cycles']:.2f}" for x in v["accepted_per_position"])
        lines.append(f"| {name} | {pp} | {v['mean_accepted']:.2f} |")
    md = "\n".join(lines)
    print(md)
    out = args.out or report.results_path(f"block_first_position_{args.pair}.json")
    report.write_json(out, report.new_result(SCHEMA, machine=report.machine_info(), pair=args.pair,
                                             drafter=args.drafter, ar=args.ar, settings=vars(args),
                                             teacher_forced=summary, sd=per_pos, markdown=md,
                                             command=report.command(__file__, argv)))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
