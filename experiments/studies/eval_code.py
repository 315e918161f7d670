"""Held-out bits per byte of the shipped tiny-code target and its drafters, and how often `sd` accepts each drafter.

    python -m experiments.studies.eval_code --windows 256
    python -m experiments.studies.eval_code --drafters ar ar-distilled --sd-prompts 64

Windows of --seq-len bytes (each after a BOS, as in training) from the held-out files (split by a
hash of the file path, see train/pair.py); all target nats are charged to the byte targets.
For every drafter (names from `smcsd.available_drafters("tiny-code")`):
- teacher-forced acceptance: the mean over held-out positions of Σ_x min(p_T(x), q(x)) at each temperature of
  --temperatures — the probability that `sd` accepts one drafted token given the true context;
- decoded acceptance: `sd` with K=--sd-k at T=0.7 from --sd-prompts held-out 64-byte prompts (64 new bytes each):
  acceptance rate and mean acceptance length (accepted draft tokens per draft block).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from experiments import code_data, report
from experiments.train import pair as tp
from smcsd.models.shipped import load_model_dir, load_shipped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pair-dir", default=None, help="a directory with target/ and draft/ (default: shipped)")
    ap.add_argument("--out", default=report.results_path("code_bpb.json"))
    ap.add_argument("--drafters", nargs="+", default=["ar"], help="drafter names of tiny-code to evaluate")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    ap.add_argument("--sd-prompts", type=int, default=0, help="held-out prompts for the decoded sd acceptance")
    ap.add_argument("--sd-k", type=int, default=4)
    args = ap.parse_args(argv)
    data = code_data.CodeData(args.seq_len)
    rng = np.random.default_rng(4321)
    starts = rng.integers(0, len(data.heldout) - args.seq_len, args.windows)
    rows = data._windows(data.heldout, starts)
    if args.pair_dir:
        models = {r: load_model_dir(os.path.join(args.pair_dir, r)) for r in ("target", "draft")}
    else:
        import smcsd
        models = {"target": load_shipped("tiny-code")[0]}
        models.update({name: smcsd.load("tiny-code", drafter=name)[1] for name in args.drafters})
    out = {"data": data.describe(), "windows": args.windows, "seq_len": args.seq_len}
    target = models["target"]
    for role, m in models.items():
        ev = tp.evaluate(m.config, m.params, rows, batch=16)
        out[role] = {"num_params": m.num_params, **ev}
        line = (f"{role}: {m.num_params / 1e6:.2f}M params, held-out {ev['bits_per_byte']:.3f} bits/byte "
                f"({ev['loss']:.3f} nats/token over {ev['tokens']} tokens)")
        if role != "target":
            out[role]["teacher_forced_acceptance"] = {
                str(T): teacher_forced_acceptance(target, m, rows, T) for T in args.temperatures}
            if args.sd_prompts:
                out[role]["sd"] = sd_acceptance(target, m, data, args.sd_prompts, args.sd_k)
            line += "; acceptance " + ", ".join(f"T={T}: {a:.3f}" for T, a in
                                                out[role]["teacher_forced_acceptance"].items())
            if args.sd_prompts:
                line += (f"; sd K={args.sd_k} T=0.7: acceptance {out[role]['sd']['acceptance_rate']:.3f}, mean "
                         f"acceptance length {out[role]['sd']['mean_acceptance_length']:.2f}")
        print(line, flush=True)
    report.write_json(args.out, out)


def teacher_forced_acceptance(target, draft, rows, temperature: float, batch: int = 16) -> float:
    """Mean over the rows' non-pad positions of Σ_x min(p_T(x), q_T(x)), both at `temperature`."""
    import jax
    import jax.numpy as jnp

    from smcsd.models import forward_full

    @jax.jit
    def acc(tp_, dp_, r):
        p = jax.nn.softmax(forward_full(target.config, tp_, r[:, :-1]) / temperature, -1)
        q = jax.nn.softmax(forward_full(draft.config, dp_, r[:, :-1]) / temperature, -1)
        mask = (r[:, 1:] != code_data.PAD).astype(jnp.float32)
        return (jnp.minimum(p, q).sum(-1) * mask).sum(), mask.sum()

    tot = cnt = 0.0
    for i in range(0, len(rows), batch):
        s, c = acc(target.params, draft.params, jnp.asarray(rows[i:i + batch]))
        tot, cnt = tot + float(s), cnt + float(c)
    return tot / cnt


def sd_acceptance(target, draft, data, n_prompts: int, k: int, prompt_bytes: int = 64, new: int = 64) -> dict:
    """`sd` (K=k, T=0.7) from held-out prompts: acceptance rate and accepted draft tokens per draft block."""
    import smcsd
    prompts = data.heldout_prompts(n_prompts, prompt_bytes)
    res = smcsd.decode(prompts, target=target, draft=draft, method="sd", num_speculative_tokens=k,
                       temperature=0.7, max_new_tokens=new, seed=0, eos_id=[])  # no stop: every row runs `new` tokens
    st = res.stats
    return {"acceptance_rate": st.num_accepted_tokens / st.num_draft_tokens,
            "mean_acceptance_length": st.num_accepted_tokens / max(st.num_drafts, 1), "prompts": n_prompts,
            "new_tokens": new, "K": k}


if __name__ == "__main__":
    main()
