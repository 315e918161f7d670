"""Prompt lookup on SmolLM2-135M-Instruct for copy-heavy prompts: `sd` with `PromptLookup` against `ar`, and
transformers' prompt-lookup decoding against its own AR, on the same GGUF weights.

    python -m experiments.bench.lookup                                        # ours only
    python -m experiments.bench.lookup --peer-python /path/to/venv/bin/python  # + transformers

Prompts (chat turns; the answer mostly copies from the prompt): `edit` (rename a variable in ~40 lines of Python
and return the whole code), `repeat` (repeat a ~300-token passage word for word), `summarise` (summarise it; less
copying). Batch 1, decoding stops at the chat's end of turn or `--max-new-tokens`. Each cell is timed over
`--repeats` seeds, interleaved with `ar` in every round; tokens/s = total new tokens / total wall time (compile
excluded). At T=0 every method emits the same tokens (greedy), so the ratio is a clean speed comparison; at T>0
the exact methods share one output law, so their lengths agree in distribution.

transformers (optional): `generate(prompt_lookup_num_tokens=K)` against `generate()`, float32, same prompt ids,
same stop tokens and limits, torch threads = this machine's cores; it runs in its own process after ours (the
machine is shared: compare ratios within one run). Prints a markdown table, writes JSON (--out).
"""

from __future__ import annotations

import argparse
import time

from experiments import report
from experiments.bench.real import load_peer, run_peer
from experiments.common import PASSAGE

CODE = '''def summarize_orders(orders, min_total=0.0):
    """Group orders by customer and return totals above a threshold."""
    totals = {}
    counts = {}
    for x in orders:
        customer = x["customer"]
        amount = float(x["amount"])
        if amount < 0:
            raise ValueError(f"negative amount in order {x['id']}")
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    result = []
    for customer, total in sorted(totals.items()):
        if total >= min_total:
            result.append({"customer": customer, "total": round(total, 2), "orders": counts[customer]})
    return result


def top_customers(orders, n=3):
    rows = summarize_orders(orders)
    rows.sort(key=lambda x: x["total"], reverse=True)
    return [x["customer"] for x in rows[:n]]
'''

PROMPTS = {
    "edit": [{"role": "user", "content": "Rename the loop variable `x` to `order` in this code. Reply with the "
                                         "complete updated code only.\n\n" + CODE}],
    "repeat": [{"role": "user", "content": "Repeat the following passage word for word.\n\n" + PASSAGE}],
    "summarise": [{"role": "user", "content": "Summarise this passage in a few sentences.\n\n" + PASSAGE}],
}


def run_ours(target, ids, stops, method, K, temperature, max_new, seed):
    import smcsd
    kw = dict(target=target, method=method, temperature=temperature, max_new_tokens=max_new, eos_id=stops, seed=seed)
    if method != "ar":
        kw.update(draft=smcsd.PromptLookup(), num_speculative_tokens=K)
    res = smcsd.decode([ids], **kw)
    return res


def peer_worker(inp: str, out: str) -> None:
    """Inside the peer interpreter: transformers generate() with and without prompt lookup."""
    torch, model, job, results = load_peer(inp)
    for cell in job["cells"]:
        ids = torch.tensor([cell["ids"]])
        T = cell["temperature"]
        kw = dict(max_new_tokens=job["max_new_tokens"], eos_token_id=job["stops"], pad_token_id=job["stops"][0],
                  attention_mask=torch.ones_like(ids))
        kw.update(dict(do_sample=True, temperature=T, top_k=0, top_p=1.0) if T > 0 else dict(do_sample=False))
        runs = {}
        with torch.inference_mode():
            for mode in ("ar", "lookup"):
                extra = {"prompt_lookup_num_tokens": cell["K"]} if mode == "lookup" else {}
                model.generate(ids, **{**kw, **extra, "max_new_tokens": 4})  # warm-up
            for mode in ("ar", "lookup"):
                runs[mode] = {"tokens": 0, "wall_s": 0.0}
            for r in range(job["repeats"]):  # interleaved rounds
                for mode in ("ar", "lookup"):
                    extra = {"prompt_lookup_num_tokens": cell["K"]} if mode == "lookup" else {}
                    torch.manual_seed(r)
                    t = time.perf_counter()
                    o = model.generate(ids, **kw, **extra)
                    runs[mode]["wall_s"] += time.perf_counter() - t
                    runs[mode]["tokens"] += int(o.shape[1] - ids.shape[1])
        results[cell["key"]] = runs
        tps = {m: v["tokens"] / v["wall_s"] for m, v in runs.items()}
        print(f"  transformers {cell['key']}: ar {tps['ar']:.1f} tok/s, prompt lookup {tps['lookup']:.1f} tok/s "
              f"({tps['lookup'] / tps['ar']:.2f}x)", flush=True)
    report.write_json(out, results, indent=None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", nargs="+", default=["edit", "repeat", "summarise"], choices=sorted(PROMPTS))
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8], help="draft lengths K for sd + PromptLookup")
    ap.add_argument("--peer-k", type=int, default=10, help="transformers' prompt_lookup_num_tokens (its default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-python", default=None, help="a Python with torch + transformers + gguf + accelerate")
    ap.add_argument("--out", default=report.results_path("bench_lookup.json"))
    ap.add_argument("--peer-worker", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_worker:
        return peer_worker(*args.peer_worker)

    import smcsd
    from smcsd.models import registry

    target, _ = smcsd.load("smollm2-135m")
    stops = list(target.tokenizer.end_of_turn_ids)
    ids = {n: target.tokenizer.apply_chat_template(m, tokenize=True) for n, m in PROMPTS.items()}
    configs = [("ar", 0)] + [("sd", k) for k in args.ks]
    rows = []
    for p in args.prompts:
        for T in args.temperatures:
            for m, k in configs:  # compile
                run_ours(target, ids[p], stops, m, k, T, args.max_new_tokens, 0)
            acc = {(m, k): dict(tokens=0, wall_s=0.0, calls=0, accepted=0, drafted=0) for m, k in configs}
            for r in range(args.repeats):  # interleaved rounds
                for m, k in configs:
                    res = run_ours(target, ids[p], stops, m, k, T, args.max_new_tokens, r + 1)
                    a, st = acc[(m, k)], res.stats
                    a["tokens"] += len(res.tokens[0])
                    a["wall_s"] += st.wall_time_s
                    a["calls"] += st.num_target_calls
                    a["accepted"] += st.num_accepted_tokens if m != "ar" else 0
                    a["drafted"] += st.num_draft_tokens if m != "ar" else 0
            ar_tps = acc[("ar", 0)]["tokens"] / acc[("ar", 0)]["wall_s"]
            for (m, k), a in acc.items():
                tps = a["tokens"] / a["wall_s"]
                row = dict(prompt=p, prompt_tokens=len(ids[p]), temperature=T, method=m, K=k, **a, tps=tps,
                           speedup=tps / ar_tps, tokens_per_call=a["tokens"] / max(a["calls"], 1),
                           acceptance=(a["accepted"] / a["drafted"]) if a["drafted"] else None)
                rows.append(row)
                print(f"{p} T={T} {m}{'' if m == 'ar' else f' K={k}'}: {tps:.1f} tok/s ({row['speedup']:.2f}x ar), "
                      f"{row['tokens_per_call']:.2f} tok/call, {a['tokens']} tokens", flush=True)
    peer = None
    if args.peer_python:
        cells = [dict(key=f"{p}-T{T}", ids=ids[p], temperature=T, K=args.peer_k)
                 for p in args.prompts for T in args.temperatures]
        peer = run_peer(args.peer_python, {"gguf": registry.cached_path("smollm2-135m"), "cells": cells,
                                           "stops": stops, "max_new_tokens": args.max_new_tokens,
                                           "repeats": args.repeats}, module="experiments.bench.lookup")
    body = [[r["prompt"], f"{r['temperature']:g}", "ar" if r["method"] == "ar" else f"sd + prompt lookup K={r['K']}",
             f"{r['tps']:.1f}", f"{r['speedup']:.2f}×", f"{r['tokens_per_call']:.2f}", report.fmt(r["acceptance"]),
             r["tokens"]] for r in rows]
    if peer:
        for key, runs in peer.items():
            if key == "versions":
                continue
            p, T = key.rsplit("-T", 1)
            ar_tps = runs["ar"]["tokens"] / runs["ar"]["wall_s"]
            for mode, v in runs.items():
                tps = v["tokens"] / v["wall_s"]
                name = "transformers ar" if mode == "ar" else f"transformers prompt lookup ({args.peer_k})"
                body.append([p, f"{float(T):g}", name, f"{tps:.1f}", f"{tps / ar_tps:.2f}×", "–", "–",
                             v["tokens"]])
    table = report.markdown_table(["prompt", "T", "method", "tok/s", "vs ar", "tokens/target call", "acceptance",
                                   "new tokens"], body)
    print(table)
    result = report.new_result(
        "smcsd.bench_lookup/1", machine=report.machine_info(),
        model=dict(name="smollm2-135m", params=target.num_params, dtype=target.config.dtype),
        settings=dict(max_new_tokens=args.max_new_tokens, repeats=args.repeats, ks=args.ks, peer_k=args.peer_k,
                      drafter=smcsd.PromptLookup().describe()),
        peer=peer, rows=rows, markdown=table, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
