"""Peers on the same weights, one run: SmolLM2-135M-Instruct decoded by smcsd and by transformers, each plain (AR),
with our distilled AR drafter (ours: `sd`; transformers: assisted generation with the same drafter exported by
`models.save_pretrained`), and with prompt lookup (ours: `sd` + `PromptLookup`; transformers:
`prompt_lookup_num_tokens`).

    python -m experiments.bench.peers --peer-python /path/to/venv/bin/python   # torch, transformers, gguf there

Per prompt (a chat turn; a passage to summarise, where lookup has material to copy) and temperature (0: greedy; 0.7),
batch 1, `--max-new-tokens` new tokens, stop at the end of turn: tokens/s over --repeats runs (median; compile and a
warm-up excluded), and each framework's speed-up over its own AR. Both load the same GGUF in float32 (ours computes
in float32 on CPU too); the drafter is the shipped `ar-distilled` (15M params), exported to a Hugging Face folder
for transformers. K: ours `--k` draft tokens per cycle; transformers' assisted generation adapts its number of
assistant tokens (its default schedule, starting at 20 for 0.x versions, 5 in newer ones: printed), its prompt lookup
drafts `--peer-k` tokens. Greedy outputs of every exact cell equal their AR's (checked and printed). Ours runs first,
then the peer in its own process (the machine is shared: read ratios within a framework, tokens/s across).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from experiments import report
from experiments.bench.real import load_peer, run_peer
from experiments.common import PASSAGE

PROMPTS = {
    "chat": [{"role": "user", "content": "Give me three tips for writing clear Python code."}],
    "summarise": [{"role": "user", "content": "Summarise this passage in a few sentences.\n\n" + PASSAGE}],
}


def peer_worker(inp: str, out: str) -> None:
    """Inside the peer interpreter: transformers generate() plain, assisted by our exported drafter, and with prompt
    lookup, on the same GGUF and prompt ids."""
    torch, model, job, results = load_peer(inp)
    from transformers import AutoModelForCausalLM
    assistant = AutoModelForCausalLM.from_pretrained(job["assistant"], dtype=torch.float32).eval()
    results["assistant_num_tokens"] = getattr(assistant.generation_config, "num_assistant_tokens", None)
    for cell in job["cells"]:
        ids = torch.tensor([cell["ids"]])
        kw = dict(max_new_tokens=job["new_tokens"], pad_token_id=job["pad"], eos_token_id=job["stops"],
                  attention_mask=torch.ones_like(ids))
        kw.update(dict(do_sample=True, temperature=cell["temperature"], top_k=0, top_p=1.0) if cell["temperature"]
                  else dict(do_sample=False))
        modes = {"ar": {}, "assisted": {"assistant_model": assistant},
                 "lookup": {"prompt_lookup_num_tokens": job["peer_k"]}}
        for mode, extra in modes.items():
            with torch.inference_mode():
                model.generate(ids, **{**kw, **extra, "max_new_tokens": 4})  # warm-up
                times, toks, outs = [], [], []
                for r in range(job["repeats"]):
                    torch.manual_seed(r)
                    t = time.perf_counter()
                    o = model.generate(ids, **kw, **extra)
                    times.append(time.perf_counter() - t)
                    toks.append(int(o.shape[1] - ids.shape[1]))
                    outs.append(o[0, ids.shape[1]:].tolist())
            results[f"{cell['key']}/{mode}"] = dict(tokens_per_s=statistics.median(n / s for n, s in zip(toks, times)),
                                                     tokens=toks, first_output=outs[0])
            print(f"  transformers {cell['key']} {mode}: {results[cell['key'] + '/' + mode]['tokens_per_s']:.1f} "
                  "tokens/s", flush=True)
    report.write_json(out, results, indent=None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--k", type=int, default=4, help="our draft tokens per cycle")
    ap.add_argument("--peer-k", type=int, default=10, help="transformers' prompt_lookup_num_tokens (its default 10)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-python", default=None, help="a Python with torch + transformers + gguf + accelerate")
    ap.add_argument("--out", default=report.results_path("bench_peers.json"))
    ap.add_argument("--peer-worker", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_worker:
        return peer_worker(*args.peer_worker)

    import smcsd
    from smcsd.models import registry, save_pretrained

    target, draft_model = smcsd.load("smollm2-135m", drafter="ar-distilled", dtype="float32")
    tok = target.tokenizer
    stops = list(tok.end_of_turn_ids)
    ids = {k: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for k, m in PROMPTS.items()}
    cells = {"ar": dict(method="ar"),
             "sd ar-distilled": dict(method="sd", draft=draft_model, num_speculative_tokens=args.k),
             "sd prompt lookup": dict(method="sd", draft=smcsd.PromptLookup(), num_speculative_tokens=args.k)}
    rows, greedy = [], {}
    for p, pid in ids.items():
        for T in args.temperatures:
            base = None
            for name, kw in cells.items():
                run = lambda s: smcsd.decode([pid], target=target, temperature=T, max_new_tokens=args.max_new_tokens,  # noqa: E731
                                             eos_id=stops, seed=s, **kw)
                run(0)
                rs = [run(r + 1) for r in range(args.repeats)]
                tps = statistics.median(r.stats.tokens_per_s for r in rs)
                base = tps if name == "ar" else base
                if T == 0:
                    greedy[(p, "ours", name)] = rs[0].tokens[0]
                rows.append(dict(framework="smcsd", prompt=p, temperature=T, cell=name, tokens_per_s=tps,
                                 vs_own_ar=tps / base, tokens=statistics.median(len(r.tokens[0]) for r in rs),
                                 mean_acceptance_length=None if name == "ar" else
                                 statistics.fmean(r.stats.mean_acceptance_length for r in rs)))
                print(rows[-1], flush=True)
    peer = None
    if args.peer_python:
        with tempfile.TemporaryDirectory() as tmp:
            assistant = os.path.join(tmp, "assistant")
            save_pretrained(draft_model, assistant)
            job = dict(gguf=registry.cached_path("smollm2-135m"), assistant=assistant, new_tokens=args.max_new_tokens,
                       repeats=args.repeats, peer_k=args.peer_k, stops=stops, pad=tok.pad_id or 0,
                       cells=[dict(key=f"{p}-T{T}", ids=pid, temperature=T) for p, pid in ids.items()
                              for T in args.temperatures])
            peer = run_peer(args.peer_python, job, module="experiments.bench.peers")
        names = {"ar": "ar", "assisted": "assisted (ar-distilled)", "lookup": f"prompt lookup ({args.peer_k})"}
        for p in ids:
            for T in args.temperatures:
                base = peer[f"{p}-T{T}/ar"]["tokens_per_s"]
                for mode, name in names.items():
                    r = peer[f"{p}-T{T}/{mode}"]
                    if T == 0:
                        greedy[(p, "transformers", mode)] = r["first_output"]
                    rows.append(dict(framework="transformers", prompt=p, temperature=T, cell=name,
                                     tokens_per_s=r["tokens_per_s"], vs_own_ar=r["tokens_per_s"] / base,
                                     tokens=statistics.median(r["tokens"]), mean_acceptance_length=None))
    # Greedy identity within each framework (exact methods reproduce their AR's tokens).
    checks = {}
    for (p, fw, name), toks in greedy.items():
        ref = greedy.get((p, fw, "ar"))
        checks[f"{fw} {p} {name}"] = ref is not None and toks[:len(ref)] == ref[:len(toks)]
    table = report.markdown_table(
        ["framework", "prompt", "T", "cell", "tok/s", "vs its own ar", "new tokens", "mean accept len"],
        [[r["framework"], r["prompt"], r["temperature"], r["cell"], f"{r['tokens_per_s']:.1f}",
          f"{r['vs_own_ar']:.2f}×", r["tokens"], report.fmt(r["mean_acceptance_length"])] for r in rows])
    print(table)
    print("greedy identity with own ar:", checks)
    result = report.new_result(
        "smcsd.bench_peers/1", machine=report.machine_info(), model="SmolLM2-135M-Instruct (GGUF, float32)",
        drafter="ar-distilled", settings=dict(max_new_tokens=args.max_new_tokens, temperatures=args.temperatures,
                                              k=args.k, peer_k=args.peer_k, repeats=args.repeats),
        peer_versions=(peer or {}).get("versions"), assistant_num_tokens=(peer or {}).get("assistant_num_tokens"),
        greedy_identity=checks, rows=rows, markdown=table, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
