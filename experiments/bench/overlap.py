"""`sd-overlap` (MineDraft) against plain `sd` on 8 host CPU devices, SmolLM2-135M with a drafter of its pair:
step time per batch, a timeline showing the two groups' programs overlapping, and the throughput model's prediction
next to each measurement; then cost-model projections to H100 and TPU v5e.

    python -m experiments.bench.overlap                                  # batch 8 16 32 64, ar-distilled, K=4
    python -m experiments.bench.overlap --batch-sizes 8 16 --max-new-tokens 16 --repeats 1

Cells per batch B (every cell on the same 8 devices; B consecutive chat prompts, stop at end of turn):
- `sd` data-parallel over all 8 devices (`smcsd.make_mesh(data=8)`): the plain baseline on the same devices;
- `sd` on one device (what a CPU user runs; on this host one device already uses both cores);
- `sd-overlap` sequential: the runner with each program waited for before the next (same programs, same tokens):
  the no-overlap control;
- `sd-overlap`: target on devices 0-3, drafter on 4-7, each half-batch data-parallel over its group.
A step is one cycle of the whole batch (sd: one target call; sd-overlap: one verification of each half).
Timings are over `--repeats` interleaved rounds, compile and a warm-up excluded.

The model: per half-batch, t_verify and t_draft are the mean durations of the verify and drafter-step programs in
a sequential traced run (nothing else running), and t_transfer the measured device-to-device copy of one proposal
(tokens + log q [B/2, K, V] float32) and one observation. Predicted step: sequential 2 (t_verify + t_draft + t_transfer),
overlapped 2 (max(t_verify, t_draft) + t_transfer) (`smcsd.methods.sd_overlap.overlap_step_model`).

What this CPU can and cannot show: the 8 "devices" are threads over the same 2 cores and one memory bus. Two programs
do run at the same time (the timeline's both-busy seconds), but they share the cores, so the overlap hides drafting
only to the extent that a program leaves the cores idle (per-op dispatch gaps, memory stalls). On accelerators each
group has its own compute and HBM; the projections use the cost model (experiments/studies/cost_model.py) for that.
"""

from __future__ import annotations

import os

NUM_DEVICES = 8
if __name__ == "__main__":  # must happen before jax is imported (importing this module changes nothing)
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (_flags + f" --xla_force_host_platform_device_count={NUM_DEVICES}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments import report  # noqa: E402


def measure_transfer(meshes, rows: int, K: int, V: int, hidden: int, repeats: int = 5) -> float:
    """Seconds to copy one proposal drafter -> target and one observation target -> drafter for `rows` rows."""
    from smcsd.methods.sd_overlap import place_rows
    prop = place_rows(meshes.drafter, (jnp.zeros((rows, K), jnp.int32), jnp.zeros((rows, K, V), jnp.float32)))
    obs = place_rows(meshes.target, (jnp.zeros((rows, K + 1), jnp.int32), jnp.zeros((rows, 6), jnp.int32))
                      + ((jnp.zeros((rows, K + 1, hidden), jnp.float32),) if hidden else ()))
    jax.block_until_ready((prop, obs))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        jax.block_until_ready((place_rows(meshes.target, prop), place_rows(meshes.drafter, obs)))
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def program_times(events) -> dict:
    """Mean seconds per program name (from a sequential traced run: each program ran alone)."""
    out = {}
    for name in ("verify", "drafter_step"):
        d = [e["end"] - e["start"] for e in events if e["program"] == name]
        out[name] = float(np.mean(d)) if d else float("nan")
    return out


def projections(stats: dict, batch_sizes, K: int, context: int = 512) -> list[dict]:
    """Cost-model projections (experiments/studies/cost_model.py) of sd vs sd-overlap per full-batch cycle."""
    from experiments.studies import cost_model as cm
    rows = []
    for dev_name in ("h100", "tpu-v5e"):
        dev = cm.DEVICES[dev_name]
        for pair in ("llama3.1-8b+llama3.2-1b", "smollm2-135m+ar-distilled"):
            (tname, tcfg), (dname, dcfg) = cm.overlap_pairs()[pair]
            for B in batch_sizes:
                p = cm.overlap_projection(tcfg, dcfg, B, K, context + K + 1, dev, stats)
                rows.append(dict(device=dev_name, pair=pair, batch=B, **p))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--drafter", default="ar-distilled")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=report.results_path("overlap_bench.json"))
    args = ap.parse_args(argv)

    import smcsd
    from experiments.common import BENCH_PROMPTS, chat_prompts
    from smcsd.runtime import engine
    from smcsd.decode import prepare
    from smcsd.methods.sd_overlap import OverlapMeshes, overlap_seconds, overlap_step_model

    if len(jax.devices()) < NUM_DEVICES:
        raise SystemExit(f"needs {NUM_DEVICES} devices (XLA_FLAGS was set before jax was imported elsewhere?)")
    devs = jax.devices()[:NUM_DEVICES]
    target, drafter = smcsd.load(args.pair, drafter=args.drafter, dtype="float32")
    drafter = smcsd.drafters.as_drafter(drafter).bind(target)  # an AR draft model comes as a LanguageModel
    stops = list(target.tokenizer.end_of_turn_ids) if args.pair == "smollm2-135m" else []
    prompts = chat_prompts(target, BENCH_PROMPTS)
    V = target.config.vocab_size
    hidden = len(drafter.hidden_layers) * target.config.hidden_size

    def kw(seed):
        return dict(target=target, draft=drafter, num_speculative_tokens=args.K, temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens, eos_id=stops, seed=seed)

    rows = []
    for B in args.batch_sizes:
        batch = [prompts[j % len(prompts)] for j in range(B)]
        half = B // 2
        groups = OverlapMeshes(smcsd.make_mesh(data=int(np.gcd(4, half)), model=1, devices=devs[:int(np.gcd(4, half))]),
                               smcsd.make_mesh(data=int(np.gcd(4, half)) if drafter.supports_mesh else 1, model=1,
                                               devices=devs[4:4 + (int(np.gcd(4, half)) if drafter.supports_mesh
                                                                   else 1)]))
        sd_mesh = smcsd.make_mesh(data=int(np.gcd(8, B)), model=1, devices=devs[:int(np.gcd(8, B))]) \
            if drafter.supports_mesh else None
        p = prepare(batch, method="sd-overlap", mesh=groups, **kw(0))
        runner, _ = engine.compiled_program(p.method, p.target.config, p.draft, p.spec, p.args, mesh=p.mesh)

        def run_overlap(seed, sequential=False, trace=False):
            pp = prepare(batch, method="sd-overlap", mesh=groups, **kw(seed))
            runner.sequential, runner.trace = sequential, trace
            start = time.perf_counter()
            raw = runner(*pp.args)
            wall = time.perf_counter() - start
            runner.sequential = runner.trace = False
            st = raw["stats"]
            return dict(wall_s=wall, tokens=int(np.asarray(raw["lengths"]).sum()),
                        steps=int(st["num_target_calls"]) / 2, accepted=int(st["num_accepted_tokens"]),
                        drafts=int(st["num_drafts"]))

        def run_sd(seed, mesh=sd_mesh):
            res = smcsd.decode(batch, method="sd", mesh=mesh, **kw(seed))
            st = res.stats
            return dict(wall_s=st.wall_time_s, tokens=st.num_generated_tokens, steps=st.num_target_calls,
                        accepted=st.num_accepted_tokens, drafts=st.num_drafts)

        cells = {"sd (8 devices)": run_sd, "sd (1 device)": lambda s: run_sd(s, None),
                 "sd-overlap sequential": lambda s: run_overlap(s, sequential=True),
                 "sd-overlap": run_overlap}
        for fn in cells.values():  # compile + warm up
            fn(0)
        acc = {name: dict(wall_s=0.0, tokens=0, steps=0.0, accepted=0, drafts=0) for name in cells}
        for r in range(args.repeats):
            for name, fn in cells.items():
                for k, v in fn(r + 1).items():
                    acc[name][k] += v
        # The model's inputs: each program alone (sequential, traced), and the transfers.
        run_overlap(args.repeats + 1, sequential=True, trace=True)
        alone = program_times(runner.last_timeline)
        t_transfer = measure_transfer(groups, half, args.K, V, hidden)
        run_overlap(args.repeats + 1, trace=True)
        timeline = overlap_seconds(runner.last_timeline)
        model = overlap_step_model(alone["verify"], alone["drafter_step"], t_transfer)
        for name, a in acc.items():
            step = a["wall_s"] / max(a["steps"], 1)
            pred = {"sd-overlap": 2 * model["overlap_step_s"],
                    "sd-overlap sequential": 2 * (model["sd_step_s"] + t_transfer)}.get(name)
            rows.append(dict(batch=B, cell=name, step_ms=1e3 * step, tokens_per_s=a["tokens"] / a["wall_s"],
                             mean_acceptance_length=1 + a["accepted"] / max(a["drafts"], 1),
                             predicted_step_ms=None if pred is None else 1e3 * pred,
                             error=None if pred is None else (pred - step) / step, **a))
        rows.append(dict(batch=B, cell="model inputs", t_verify_ms=1e3 * alone["verify"],
                         t_draft_ms=1e3 * alone["drafter_step"], t_transfer_ms=1e3 * t_transfer,
                         timeline={k: round(v, 4) for k, v in timeline.items()},
                         overlap_fraction=timeline["both_busy_s"] / max(timeline["wall_s"], 1e-9)))
        print(f"batch {B} done", flush=True)

    body = []
    for r in rows:
        if r["cell"] == "model inputs":
            continue
        base = next(x for x in rows if x["batch"] == r["batch"] and x["cell"] == "sd (8 devices)")
        mi = next(x for x in rows if x["batch"] == r["batch"] and x["cell"] == "model inputs")
        body.append([r["batch"], r["cell"], f"{r['step_ms']:.1f}", report.fmt(r["predicted_step_ms"], ".1f"),
                     report.fmt(r["error"], "+.0%"), f"{r['tokens_per_s']:.1f}",
                     f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}×", f"{r['mean_acceptance_length']:.2f}",
                     f"{mi['t_verify_ms']:.1f} / {mi['t_draft_ms']:.1f} / {mi['t_transfer_ms']:.1f}"
                     if r["cell"] == "sd-overlap" else "",
                     f"{mi['overlap_fraction']:.0%}" if r["cell"] == "sd-overlap" else ""])
    table = report.markdown_table(["batch", "cell", "step ms", "model ms", "model error", "tok/s", "vs sd",
                                   "mean accept len", "t_verify / t_draft / t_transfer (ms, half)",
                                   "both groups busy"], body)
    print(table)
    stats = {"acceptance_sd": None}
    ov = [r for r in rows if r["cell"] == "sd-overlap"]
    if ov:
        from experiments.studies import cost_model as cm
        mal = float(np.mean([r["mean_acceptance_length"] for r in ov]))
        stats = {"acceptance_sd": cm.solve_acceptance(mal, args.K), "source": f"measured here ({mal:.2f} tokens/cycle)"}
    proj = projections(stats, args.batch_sizes, args.K)
    ptable = report.markdown_table(
        ["device", "pair", "batch", "t_verify / t_draft ms (B)", "t_transfer ms", "sd tok/s",
         "sd-overlap, same B: tok/s", "vs sd", "sd-overlap, 2B in flight: tok/s", "vs sd"],
        [[p["device"], p["pair"], p["batch"], f"{1e3 * p['t_verify_s']:.3f} / {1e3 * p['t_draft_s']:.3f}",
          f"{1e3 * p['t_transfer_s']:.4f}", f"{p['sd_tokens_per_s']:.0f}", f"{p['overlap_same_tokens_per_s']:.0f}",
          f"{p['overlap_same_speedup']:.2f}×", f"{p['overlap_doubled_tokens_per_s']:.0f}",
          f"{p['overlap_doubled_speedup']:.2f}×"] for p in proj])
    print(ptable)
    result = report.new_result(
        "smcsd.overlap_bench/1", machine=report.machine_info(), pair=args.pair, drafter=args.drafter,
        devices=NUM_DEVICES, settings=dict(K=args.K, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                           repeats=args.repeats, batch_sizes=args.batch_sizes),
        rows=rows, markdown=table, projections=proj, projections_markdown=ptable, projection_stats=stats,
        command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
