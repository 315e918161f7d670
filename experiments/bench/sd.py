"""Acceptance and speed of the exact speculative methods side by side: `ar`, `sd` (K = 2, 4, 8) and
`sd-multi` (N = 4, 8 drafts of K = 4), at temperature 0.7, on one pair of models.

    python -m experiments.bench.sd                       # the random related pair (below)
    python -m experiments.bench.sd --pair tiny-code      # a shipped pair, once it exists

The random pair (default, `--pair random`): a byte-level target of --layers layers and an
*early-exit* draft made of its first --draft-layers layers plus the target's own embeddings, final
norm and LM head (self-speculation as in Draft & Verify, Zhang et al. 2023, and LayerSkip, Elhoushi
et al. 2024). A random network's later layers would otherwise rewrite its prediction completely, so
the output projections (o_proj, down_proj) of the layers the draft skips are scaled by --late-scale:
the target is the draft plus small residual refinements, so the draft is genuinely related to it and
acceptance is neither ~0 nor ~1. --init-std 0.2 gives a peaked target (entropy ~1.5 nats at T=0.7,
like a real LM's), unlike the near-uniform outputs of a default random init.

Every cell compiles on its first call, then --warmup untimed runs, then --repeats rounds; each round
runs every cell once, starting one cell later each round (interleaved, so drift of a shared machine
hits all cells alike). tokens/s is the median over rounds, speed-up the median paired ratio to `ar`
in the same round; acceptance metrics (vLLM definitions) are means over rounds. EOS is ignored, so
every request makes --max-new-tokens tokens. Prints a markdown table; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics


import jax
import jax.numpy as jnp

import smcsd
from experiments import report
from smcsd.models import ByteTokenizer, LanguageModel, ModelConfig, init_model

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "for i in range(10):"]


def random_pair(hidden: int, layers: int, draft_layers: int, init_std: float, late_scale: float, seed: int = 0,
                max_pos: int = 512):
    """(target, early-exit draft) as described in the module docstring."""
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_pos)
    base = init_model(cfg, seed, tokenizer=tok, init_std=init_std)
    scale = jnp.where(jnp.arange(layers) < draft_layers, 1.0, late_scale)[:, None, None]
    lay = base.params["layers"]
    lay = {**lay, "self_attn": {**lay["self_attn"], "o_proj": {"kernel": lay["self_attn"]["o_proj"]["kernel"] * scale}},
           "mlp": {**lay["mlp"], "down_proj": {"kernel": lay["mlp"]["down_proj"]["kernel"] * scale}}}
    params = {**base.params, "layers": lay}
    target = LanguageModel(cfg, params, tok, name=f"random-target-{layers}L")
    draft_params = {**params, "layers": jax.tree_util.tree_map(lambda x: x[:draft_layers], lay)}
    draft = LanguageModel(dataclasses.replace(cfg, num_hidden_layers=draft_layers), draft_params, tok,
                          name=f"early-exit-draft-{draft_layers}L")
    return target, draft


def load_pair(args):
    if args.pair == "random":
        return random_pair(args.hidden, args.layers, args.draft_layers, args.init_std, args.late_scale)
    from smcsd.models.shipped import load_shipped
    return load_shipped(args.pair)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="random", help="'random' or a shipped pair name (models.shipped)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--init-std", type=float, default=0.2)
    ap.add_argument("--late-scale", type=float, default=0.15)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--sd-k", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--multi-n", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--multi-k", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=report.results_path("bench_sd.json"))
    args = ap.parse_args(argv)

    target, draft = load_pair(args)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    cells = [dict(label="ar", method="ar")]
    cells += [dict(label=f"sd K={k}", method="sd", num_speculative_tokens=k) for k in args.sd_k]
    cells += [dict(label=f"sd-multi N={n} K={args.multi_k}", method="sd-multi", num_particles=n,
                   num_speculative_tokens=args.multi_k) for n in args.multi_n]
    common = dict(target=target, draft=draft, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  eos_id=[])

    def run(cell, seed):
        kw = {k: cell[k] for k in ("method", "num_speculative_tokens", "num_particles") if k in cell}
        return smcsd.decode(prompts, seed=seed, **common, **kw).stats

    for cell in cells:  # compile, then warm up
        cell["compile_time_s"] = run(cell, 0).compile_time_s
        for w in range(args.warmup):
            run(cell, 1 + w)
        cell["runs"] = []
    for r, cell in report.round_robin(cells, args.repeats):
        cell["runs"].append(run(cell, 100 + r))

    ar_tps = [s.tokens_per_s for s in cells[0]["runs"]]
    rows = []
    for cell in cells:
        runs = cell.pop("runs")
        tps = [s.tokens_per_s for s in runs]
        spec = cell["method"] != "ar"
        rows.append(dict(
            label=cell["label"], method=cell["method"], num_speculative_tokens=cell.get("num_speculative_tokens"),
            num_particles=cell.get("num_particles"), compile_time_s=cell["compile_time_s"],
            tokens_per_s=statistics.median(tps), tokens_per_s_runs=tps,
            speedup_vs_ar=statistics.median(t / a for t, a in zip(tps, ar_tps)),
            acceptance_rate=statistics.mean(s.acceptance_rate for s in runs) if spec else None,
            mean_acceptance_length=statistics.mean(s.mean_acceptance_length for s in runs) if spec else None,
            tokens_per_target_call=statistics.mean(s.tokens_per_target_call for s in runs),
            target_calls=statistics.mean(s.num_target_calls for s in runs),
            wall_s=statistics.median(s.wall_time_s for s in runs)))

    print(f"\npair: {target.name} ({target.num_params / 1e6:.2f}M) / {draft.name} ({draft.num_params / 1e6:.2f}M), "
          f"batch {args.batch}, {args.max_new_tokens} new tokens, T={args.temperature}, "
          f"median of {args.repeats} interleaved rounds, backend {jax.default_backend()}\n")
    print(report.markdown_table(
        ["method", "acceptance rate", "mean acceptance length", "tokens / target call", "target calls", "tokens/s",
         "speed-up vs ar"],
        [[r["label"], report.fmt(r["acceptance_rate"], ".3f"), report.fmt(r["mean_acceptance_length"], ".2f"),
          f"{r['tokens_per_target_call']:.2f}", f"{r['target_calls']:.1f}", f"{r['tokens_per_s']:.0f}",
          f"{r['speedup_vs_ar']:.2f}"] for r in rows]))
    report.write_json(args.out, report.new_result(
        "smcsd.bench_sd/1", backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
        model={"pair": args.pair, "target": target.name, "draft": draft.name, "target_params": target.num_params,
               "draft_params": draft.num_params},
        settings=vars(args), prompts=prompts, rows=rows), indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
