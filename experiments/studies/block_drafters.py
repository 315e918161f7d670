"""Block (DFlash) drafters against the AR drafters of a pair: acceptance length, drafting cost per cycle and `sd` speed.

    python -m experiments.studies.block_drafters --pair tiny-code                       # ar, ar-distilled, dflash, dflash-dpace
    python -m experiments.studies.block_drafters --pair tiny-code --drafters dflash path:/tmp/dflash-s1 --ks 4 8 15
    python -m experiments.studies.block_drafters --pair smollm2-135m --ks 4 8 --prompts 4 --new-tokens 96

For every drafter (a name of the pair, or `path:DIR` for a block drafter or an AR model saved elsewhere, e.g. another
seed),
every K in --ks and every temperature in --temperatures, `sd` decodes --new-tokens from each held-out prompt
(tiny-code: --prompt-tokens bytes of the held-out stdlib files `train/pair.py` keeps out of training;
smollm2-135m: chat requests on topics outside the drafters' corpus), batch --batch (default: all prompts at
once on toys, 1 on SmolLM2), no stop token. Reported per cell:
- mean acceptance length: accepted draft tokens per draft block (0..K); a cycle emits that + 1 tokens per row;
- drafting cost per cycle: drafter calls (K for an AR drafter, 1 for a block drafter); weights read, relative to
  the target's (AR: K passes over its params; block: one pass over its own layers, the shared LM head counted
  once) — what a memory-bound step pays; and matmul FLOPs relative to one target token (AR: K tokens through its
  layers and LM head; block: B tokens through its layers plus K through the shared LM head) — what a
  compute-bound step pays;
- wall-clock tokens/s and its ratio to `ar` at the same temperature (interleaved: each round runs every cell once;
  compile excluded by a warm-up run). On the toy pairs speed is per-op overhead, not the memory-bound regime
  speculative decoding is for: read it on SmolLM2.
Prints a markdown table, writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os


from experiments import report
from experiments.common import prompts_for
from smcsd.cost_model import matmul_params

def draft_flops(drafter, target_config, K: int) -> float:
    """The drafter's matmul FLOPs per cycle over one target token's (2 x matmul params each)."""
    from smcsd.drafters import ARDrafter, DFlashDrafter
    tgt = matmul_params(target_config)
    if isinstance(drafter, DFlashDrafter):
        c = drafter.block_config
        m = c.model
        head = m.vocab_size * m.hidden_size
        layers = matmul_params(m) - head  # the drafter's decoder layers (its config counts the shared head)
        ctx_proj = c.context_size * m.hidden_size  # fc, run on the accepted tokens by observe: count ~1 per token
        return (c.block_size * layers + K * head + ctx_proj) / tgt
    return K * matmul_params((drafter.model if isinstance(drafter, ARDrafter) else drafter).config) / tgt


def draft_weight_reads(drafter, target_config, K: int) -> float:
    """Bytes of weights the drafter streams per cycle over the target's per call (same dtype assumed)."""
    from smcsd.drafters import ARDrafter, DFlashDrafter
    tgt = matmul_params(target_config)
    if isinstance(drafter, DFlashDrafter):
        return matmul_params(drafter.block_config.model) / tgt  # its layers + the shared head, once
    return K * matmul_params((drafter.model if isinstance(drafter, ARDrafter) else drafter).config) / tgt


def _is_block_dir(path: str) -> bool:
    """Whether `path` holds a block drafter (`DFlashDrafter.save`'s config names it) rather than an AR model."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        raise SystemExit(f"--drafters path:{path}: no config.json there (a saved block drafter or AR model directory)")
    with open(cfg) as f:
        return json.load(f).get("drafter") == "dflash"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code", choices=["tiny-code", "smollm2-135m"])
    ap.add_argument("--drafters", nargs="+", default=None, help="names of the pair's drafters, or path:DIR")
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8, 15])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--prompts", type=int, default=None, help="default: 32 on tiny-code, 4 on smollm2-135m")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: 128 on tiny-code, 96 on smollm2-135m")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    big = args.pair == "smollm2-135m"
    n = args.prompts or (4 if big else 32)
    new = args.new_tokens or (96 if big else 128)
    batch = args.batch or (1 if big else n)

    import smcsd
    from smcsd.drafters import DFlashDrafter

    target, _ = smcsd.load(args.pair, drafter="prompt-lookup")
    names = args.drafters or [d for d in smcsd.available_drafters(args.pair) if d != "prompt-lookup"]
    drafters = {}
    for name in names:
        if name.startswith("path:") and _is_block_dir(name[5:]):
            drafters[name] = DFlashDrafter.load(name[5:], dtype=target.config.dtype).bind(target)
        elif name.startswith("path:"):  # an AR drafter's export (config.json + model.safetensors)
            from smcsd.models.shipped import load_model_dir
            drafters[name] = load_model_dir(name[5:], tokenizer=target.tokenizer)
        else:
            drafters[name] = smcsd.load(args.pair, drafter=name)[1]
    prompts = prompts_for(args.pair, target, n, args.prompt_tokens)
    chunks = [prompts[i:i + batch] for i in range(0, n, batch)]
    cells = [("ar", None, 0, T) for T in args.temperatures]
    for name, d in drafters.items():
        limit = getattr(d, "max_tokens_per_proposal", None)
        cells += [("sd", name, k, T) for k in args.ks if limit is None or k <= limit for T in args.temperatures]

    def run(cell, chunk, seed):
        method, name, k, T = cell
        kw = dict(target=target, method=method, temperature=T, max_new_tokens=new, eos_id=[], seed=seed)
        if method == "sd":
            kw.update(draft=drafters[name], num_speculative_tokens=k)
        return smcsd.decode(chunk, **kw).stats

    for cell in cells:  # compile + warm up
        run(cell, chunks[0], 0)
    acc = {c: dict(tokens=0, wall_s=0.0, calls=0, draft_calls=0, accepted=0, drafts=0) for c in cells}
    for r in range(args.repeats):
        for i, chunk in enumerate(chunks):
            for cell in cells:
                st = run(cell, chunk, 1 + r * len(chunks) + i)
                a = acc[cell]
                a["tokens"] += st.num_generated_tokens
                a["wall_s"] += st.wall_time_s
                a["calls"] += st.num_target_calls
                a["draft_calls"] += st.num_draft_calls or 0
                a["accepted"] += st.num_accepted_tokens or 0
                a["drafts"] += st.num_drafts or 0
        print(f"round {r + 1}/{args.repeats} done", flush=True)

    ar_tps = {T: acc[("ar", None, 0, T)]["tokens"] / acc[("ar", None, 0, T)]["wall_s"] for T in args.temperatures}
    rows, body = [], []
    for (method, name, k, T), a in acc.items():
        tps = a["tokens"] / a["wall_s"]
        row = dict(method=method, drafter=name, K=k or None, temperature=T, **a, tps=tps, speedup=tps / ar_tps[T])
        if method == "sd":
            row.update(mean_acceptance_length=a["accepted"] / max(a["drafts"], 1),
                       drafter_calls_per_cycle=a["draft_calls"] / max(a["calls"], 1),
                       draft_weight_reads_per_cycle=draft_weight_reads(drafters[name], target.config, k),
                       draft_flops_per_cycle=draft_flops(drafters[name], target.config, k))
        rows.append(row)
        body.append([name or "–", method, k or "–", T, report.fmt(row.get("mean_acceptance_length")),
                     report.fmt(row.get("drafter_calls_per_cycle"), ".0f"),
                     report.fmt(row.get("draft_weight_reads_per_cycle")), report.fmt(row.get("draft_flops_per_cycle")),
                     f"{tps:.1f}", f"{row['speedup']:.2f}×"])
    table = report.markdown_table(["drafter", "method", "K", "T", "mean acceptance length", "drafter calls/cycle",
                                   "draft weight reads/cycle (target = 1)", "draft FLOPs/cycle (target tokens)",
                                   "tok/s", "vs ar"], body)
    print(table)
    info = {name: dict(kind=getattr(d, "kind", "ar"), params=int(getattr(d, "num_params", 0) or 0),
                       training=_training_info(args.pair, name)) for name, d in drafters.items()}
    result = report.new_result("smcsd.block_drafters/1", machine=report.machine_info(), pair=args.pair,
                               drafters=info, settings=dict(ks=args.ks, temperatures=args.temperatures, prompts=n,
                                                            prompt_tokens=args.prompt_tokens, new_tokens=new,
                                                            batch=batch, repeats=args.repeats),
                               rows=rows, markdown=table, command=report.command(__file__, argv))
    out = args.out or report.results_path(f"block_drafters_{args.pair}.json")
    print("wrote", report.write_json(out, result, indent=2))


def _training_info(pair: str, name: str):
    """Wall time and final held-out metrics from a drafter's training.json, when it has one."""
    import json

    from smcsd.models.shipped import SHIPPED_DIR
    path = name[5:] if name.startswith("path:") else os.path.join(SHIPPED_DIR, pair, "drafters", name)
    f = os.path.join(path, "training.json")
    if not os.path.isfile(f):
        return None
    with open(f) as fh:
        t = json.load(fh)
    return {k: t.get(k) for k in ("train_wall_s", "final_eval", "weighting", "recipe")}


if __name__ == "__main__":
    main()
