"""`ar` on the real SmolLM2-135M-Instruct target against this machine's weights-only ceiling and transformers.

    python -m experiments.bench.real                                   # ours + ceiling
    python -m experiments.bench.real --peer-python /path/to/venv/bin/python   # + transformers (needs torch,
                                                                       #   transformers, gguf, accelerate there)

For each batch size (1, 4, 16) and prompt (a short chat turn, a ~300-token passage to summarise), one run
measures, side by side:
- ours: `smcsd.decode(method="ar")`, T=0.7, no stop token, `--new-tokens` new tokens per row; end-to-end
  tokens/s = rows x new tokens / the program's wall time (prefill included, compile excluded; median of
  --repeats); decode tokens/s = rows x (new tokens - 1) / (that time - the time of the same call with one
  new token), i.e. the steady decode rate with the prefill taken out;
- the ceiling: a jitted chain of this model's weight matmuls for one token per row (q, k, v, o, gate, up,
  down per layer and the LM head; per-layer weight buffers, no attention, no sampling): rows / its time
  is the most tokens/s any decoder of these float32 weights can reach here;
- transformers (optional, in the --peer-python interpreter, torch threads = this machine's cores): the
  same GGUF loaded in float32, `generate(do_sample=True, temperature=0.7, top_k=0)` with
  min_new_tokens = max_new_tokens, same prompt ids, timed the same way (both rates).
Rounds interleave ours and the ceiling; the peer runs in its own process after them (the machine is
shared: compare ratios within one run). Prints a markdown table, writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from experiments import report
from experiments.common import PASSAGE, REPO

PROMPTS = {
    "short": [{"role": "user", "content": "Give me three tips for writing clear Python code."}],
    "long": [{"role": "user", "content": "Summarise this passage in a few sentences.\n\n" + PASSAGE}],
}


def ceiling_time(model, rows: int, repeats: int) -> float:
    """Median seconds of the weights-only matmul chain for one token per row (per-layer weight buffers)."""
    import jax
    import jax.numpy as jnp

    params = model.decode_params() if hasattr(model, "decode_params") else model.params
    from smcsd.models.transformer import unstack_layers
    params = unstack_layers(params)
    emb = params["embed_tokens"]["embedding"]
    head = emb if model.config.tie_word_embeddings else params["lm_head"]

    def chain(layers, head, x):
        for p in layers:
            a, m = p["self_attn"], p["mlp"]
            q, k, v = x @ a["q_proj"]["kernel"], x @ a["k_proj"]["kernel"], x @ a["v_proj"]["kernel"]
            x = x + q @ a["o_proj"]["kernel"] + 0.0 * (k[:, :1] + v[:, :1])
            x = x + (jax.nn.silu(x @ m["gate_proj"]["kernel"]) * (x @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
        return jnp.einsum("bd,vd->bv", x, head)

    fn = jax.jit(chain)
    x = jnp.ones((rows, model.config.hidden_size), model.config.jnp_dtype)
    return report.timed(lambda: fn(params["layers"], head, x), repeats, warmup=1)[0]


def ours(target, ids, rows: int, new_tokens: int, seed: int) -> float:
    import smcsd
    res = smcsd.decode([ids] * rows, target=target, method="ar", temperature=0.7, max_new_tokens=new_tokens,
                       eos_id=[], seed=seed)
    assert all(len(t) == new_tokens for t in res.tokens)
    return res.stats.wall_time_s


def run_peer(python: str, job: dict, module: str = "experiments.bench.real") -> dict:
    """Run `python -m module --peer-worker IN OUT` from the repository root in another interpreter (with
    transformers) on `job` (JSON in) and return its JSON result; for this module: {cell key: [seconds, seconds of
    a one-token call]}."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        report.write_json(inp, job, indent=None)
        proc = subprocess.run([python, "-m", module, "--peer-worker", inp, out], cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"the transformers run in {python} failed (exit {proc.returncode}); it needs torch, "
                               "transformers, gguf and accelerate installed there")
        with open(out) as f:
            return json.load(f)


def load_peer(inp: str):
    """Inside the peer interpreter: (torch, the job's GGUF loaded by transformers in float32, the job read
    from `inp`, a results dict holding the versions), torch on all of this machine's cores."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    with open(inp) as f:
        job = json.load(f)
    torch.set_num_threads(os.cpu_count() or 1)
    folder, name = os.path.split(job["gguf"])
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return torch, model, job, {"versions": {"transformers": transformers.__version__, "torch": torch.__version__}}


def peer_worker(inp: str, out: str) -> None:
    """Runs inside the peer interpreter: transformers generate() on the same GGUF and prompt ids."""
    torch, model, job, results = load_peer(inp)
    n = job["new_tokens"]
    for cell in job["cells"]:
        ids = torch.tensor([cell["ids"]] * cell["rows"])
        kw = dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n,
                  pad_token_id=0, attention_mask=torch.ones_like(ids))
        with torch.inference_mode():
            model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
            times = []
            for r in range(job["repeats"]):
                torch.manual_seed(r)
                t = time.perf_counter()
                model.generate(ids, **kw)
                times.append(time.perf_counter() - t)
            first = []
            for r in range(job["repeats"]):
                t = time.perf_counter()
                model.generate(ids, **{**kw, "max_new_tokens": 1, "min_new_tokens": 1})
                first.append(time.perf_counter() - t)
        results[cell["key"]] = [statistics.median(times), statistics.median(first)]
        print(f"  transformers {cell['key']}: {cell['rows'] * n / results[cell['key']][0]:.1f} tokens/s", flush=True)
    report.write_json(out, results, indent=None)


def decode_rate(rows: int, new_tokens: int, wall: float, wall_one: float) -> float:
    """Steady decode tokens/s: the tokens after the first over the time they added to a one-token call."""
    return rows * (new_tokens - 1) / max(wall - wall_one, 1e-9)


def markdown_table(rows: list[dict], with_peer: bool) -> str:
    columns = ["batch", "prompt", "prompt tokens", "ours tok/s (end to end)", "ours decode tok/s", "ceiling tok/s",
               "ours decode / ceiling"]
    if with_peer:
        columns += ["transformers tok/s (end to end)", "transformers decode tok/s",
                    "ours / transformers (end to end, decode)"]
    cells = []
    for r in rows:
        cells.append([r["batch"], r["prompt"], r["prompt_tokens"], f"{r['ours_tps']:.1f}",
                      f"{r['ours_decode_tps']:.1f}", f"{r['ceiling_tps']:.1f}",
                      f"{r['ours_decode_tps'] / r['ceiling_tps']:.0%}"])
        if with_peer:
            p, pd = r.get("peer_tps"), r.get("peer_decode_tps")
            cells[-1] += ([f"{p:.1f}", f"{pd:.1f}", f"{r['ours_tps'] / p:.2f}×, {r['ours_decode_tps'] / pd:.2f}×"]
                          if p else ["–", "–", "–"])
    return report.markdown_table(columns, cells)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompts", nargs="+", default=["short", "long"], choices=sorted(PROMPTS))
    ap.add_argument("--new-tokens", type=int, default=64, help="new tokens per row (default 64)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-python", default=None, help="a Python with torch + transformers + gguf + accelerate")
    ap.add_argument("--out", default=report.results_path("bench_real.json"))
    ap.add_argument("--peer-worker", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_worker:
        return peer_worker(*args.peer_worker)

    import smcsd
    from smcsd.models import registry

    target, _ = smcsd.load("smollm2-135m")
    ids = {name: target.tokenizer.apply_chat_template(m, tokenize=True) for name, m in PROMPTS.items()}
    cells = [dict(key=f"{p}-{b}", prompt=p, rows=b, ids=ids[p]) for p in args.prompts for b in args.batches]
    rows = []
    for cell in cells:
        b, p = cell["rows"], cell["prompt"]
        ours(target, ids[p], b, args.new_tokens, seed=0)  # compile
        ours(target, ids[p], b, 1, seed=0)
        ceiling_time(target, b, 1)
        runs, ones, ceil = [], [], []
        for r in range(args.repeats):  # interleaved: ours, ours with one new token, the ceiling, each round
            runs.append(ours(target, ids[p], b, args.new_tokens, seed=r + 1))
            ones.append(ours(target, ids[p], b, 1, seed=r + 1))
            ceil.append(ceiling_time(target, b, 5))
        wall, one, c = statistics.median(runs), statistics.median(ones), statistics.median(ceil)
        row = dict(batch=b, prompt=p, prompt_tokens=len(ids[p]), new_tokens=args.new_tokens, ours_wall_s=wall,
                   ours_runs_s=runs, ours_one_token_s=one, ours_tps=b * args.new_tokens / wall,
                   ours_decode_tps=decode_rate(b, args.new_tokens, wall, one), ceiling_step_s=c, ceiling_tps=b / c)
        rows.append(row)
        print(f"ours {cell['key']}: {row['ours_tps']:.1f} tokens/s end to end, {row['ours_decode_tps']:.1f} decode; "
              f"ceiling {row['ceiling_tps']:.1f}", flush=True)
    peer = None
    if args.peer_python:
        peer = run_peer(args.peer_python, {"gguf": registry.cached_path("smollm2-135m"), "cells": cells,
                                           "new_tokens": args.new_tokens, "repeats": args.repeats})
        for row, cell in zip(rows, cells):
            row["peer_wall_s"], row["peer_one_token_s"] = peer[cell["key"]]
            row["peer_tps"] = row["batch"] * args.new_tokens / row["peer_wall_s"]
            row["peer_decode_tps"] = decode_rate(row["batch"], args.new_tokens, row["peer_wall_s"],
                                                 row["peer_one_token_s"])
    table = markdown_table(rows, peer is not None)
    print(table)
    result = report.new_result(
        "smcsd.bench_real/1", machine=report.machine_info(),
        model=dict(name="smollm2-135m", params=target.num_params, dtype=target.config.dtype),
        settings=dict(new_tokens=args.new_tokens, repeats=args.repeats, temperature=0.7),
        peer_versions=(peer or {}).get("versions"), rows=rows, markdown=table, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
