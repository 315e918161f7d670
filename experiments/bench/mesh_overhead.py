"""What a device mesh costs `smc`: tokens/s on N forced host CPU devices vs one device, and the
collective ops XLA inserted into the decode loop (all-reduce / all-gather / reduce-scatter /
collective-permute / all-to-all), counted in the compiled HLO inside the main while body.

On one CPU the "devices" are threads sharing the same cores, so a mesh cannot be faster here: the
numbers measure the overhead of partitioning and collectives, not a speed-up. Run the same script
on a GPU/TPU host (drop --host-devices) to measure scaling.

    python -m experiments.bench.mesh_overhead                       # 8 host CPU devices, tiny model
    python -m experiments.bench.mesh_overhead --meshes 8x1,4x2 --batch 8 --num-particles 4 --repeats 3

Prints a table and writes experiments/results/mesh_overhead.json.
"""

from __future__ import annotations

import os
import sys


def _host_devices(argv) -> int:
    for i, a in enumerate(argv):
        if a == "--host-devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--host-devices="):
            return int(a.split("=", 1)[1])
    return 8


if __name__ == "__main__":  # must happen before jax is imported
    _n = _host_devices(sys.argv[1:])
    if _n > 0 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_n}"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402

from experiments import report  # noqa: E402

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_OP = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_CALLS = re.compile(r"(?:condition|body|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def hlo_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """{computation name: its instruction lines}, and the ENTRY computation's name."""
    comps: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m:
                current = m.group(1)
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
        elif line.startswith("}"):
            current = None
        else:
            comps[current].append(line)
    return comps, entry


def _callees(line: str) -> list[str]:
    names = _CALLS.findall(line)
    for group in _BRANCHES.findall(line):
        names += [n.strip().lstrip("%") for n in group.split(",") if n.strip()]
    return names


def _count(comps, name, dynamic: bool, seen=()) -> dict[str, int]:
    """Collectives in computation `name` and everything it calls; with `dynamic`, nested loops with a
    known trip count are multiplied by it (conditional branches are all counted: an upper bound)."""
    out = dict.fromkeys(COLLECTIVES, 0)
    if name not in comps or name in seen:
        return out
    for line in comps[name]:
        m = _OP.search(line)
        if m:
            out[m.group(1)] += 1
        trip = _TRIP.search(line) if dynamic and " while(" in line else None
        times = int(trip.group(1)) if trip else 1
        for callee in _callees(line):
            sub = _count(comps, callee, dynamic, seen + (name,))
            for k in out:
                out[k] += times * sub[k]
    return out


def _size(comps, name, seen=()) -> int:
    if name not in comps or name in seen:
        return 0
    return len(comps[name]) + sum(_size(comps, c, seen + (name,)) for line in comps[name] for c in _callees(line))


def loop_collectives(text: str) -> dict:
    """Collectives per decode cycle: the main loop is the largest while without a known trip count
    (the token/cycle loop is data-dependent; layer scans and sampler loops have fixed counts)."""
    comps, _ = hlo_computations(text)
    loops = []
    for lines in comps.values():
        for line in lines:
            if " while(" in line and not _TRIP.search(line):
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                loops.append((_size(comps, body), body))
    if not loops:
        return {"static": dict.fromkeys(COLLECTIVES, 0), "per_cycle": dict.fromkeys(COLLECTIVES, 0), "shapes": []}
    _, body = max(loops)
    shapes = []

    def collect(name, seen=()):
        if name not in comps or name in seen:
            return
        for line in comps[name]:
            m = _OP.search(line)
            if m:
                shape = line.split("=", 1)[1].strip().split(" ")[0] if "=" in line else "?"
                shapes.append(f"{m.group(1)} {shape}")
            for c in _callees(line):
                collect(c, seen + (name,))

    collect(body)
    static = _count(comps, body, dynamic=False)
    per_cycle = _count(comps, body, dynamic=True)
    return {"static": static, "static_total": sum(static.values()), "per_cycle": per_cycle,
            "per_cycle_total": sum(per_cycle.values()), "shapes": shapes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host-devices", type=int, default=8, help="forced host CPU devices (0: use real devices)")
    ap.add_argument("--meshes", default="8x1,4x2,2x4,1x8", help="DATAxMODEL,... (plus the 1-device baseline)")
    ap.add_argument("--method", default="smc")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--num-particles", type=int, default=4)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-baseline", action="store_true", help="skip the 1-device run (e.g. multi-host)")
    ap.add_argument("--out", default=report.results_path("mesh_overhead.json"))
    args = ap.parse_args(argv)

    import jax

    import smcsd
    from smcsd.models import ModelConfig, init_model
    from smcsd.runtime import engine

    V = 256
    tcfg = ModelConfig(vocab_size=V, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
                       max_position_embeddings=1024)
    dcfg = ModelConfig(vocab_size=V, hidden_size=args.hidden // 2, intermediate_size=3 * args.hidden // 2,
                       num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)
    target, draft = init_model(tcfg, 0, init_std=0.2), init_model(dcfg, 1, init_std=0.2)
    prompts = [[1 + b, 2 + b, 3 + b, 4 + b][: 2 + b % 3] for b in range(args.batch)]
    kw = dict(target=target, draft=draft, method=args.method, max_new_tokens=args.max_new_tokens,
              num_particles=args.num_particles, num_speculative_tokens=args.num_speculative_tokens,
              temperature=1.0, seed=0)

    rows = []
    meshes = ([] if args.no_baseline else [None]) + [tuple(int(v) for v in m.split("x"))
                                                      for m in args.meshes.split(",") if m]
    for shape in meshes:
        mesh = None if shape is None else smcsd.make_mesh(*shape)
        first = smcsd.decode(prompts, mesh=mesh, **kw)  # compiles
        runs = [smcsd.decode(prompts, mesh=mesh, **kw) for _ in range(args.repeats)]
        tps = statistics.median(r.stats.tokens_per_s for r in runs)
        row = {"mesh": "1 device" if shape is None else f"{shape[0]}x{shape[1]}",
               "devices": 1 if shape is None else shape[0] * shape[1],
               "tokens_per_s": tps, "wall_s": statistics.median(r.stats.wall_time_s for r in runs),
               "compile_s": first.stats.compile_time_s, "tokens": first.stats.num_generated_tokens,
               "cycles": first.stats.num_target_calls,
               "same_tokens_as_1_device": None if shape is None or not rows or rows[0]["devices"] != 1
               else first.tokens == rows[0]["_tokens"]}
        if shape is not None:
            # engine.compiled_program's cache key: (method, target config, drafter, spec, layout[, mesh])
            key = [k for k in engine.compiled_programs() if k[0] == args.method and len(k) == 6 and k[5] == mesh][-1]
            row["collectives"] = loop_collectives(engine.compiled_programs()[key].as_text())
        row["_tokens"] = first.tokens
        rows.append(row)
        print(f"  {row['mesh']}: {tps:.1f} tok/s", file=sys.stderr, flush=True)

    if jax.process_index() != 0:  # multi-host: every process ran the same programs; one reports
        return
    base = rows[0]["tokens_per_s"]
    print(f"\n{args.method} on {jax.device_count()} {jax.devices()[0].platform} devices "
          f"(B={args.batch}, N={args.num_particles}, K={args.num_speculative_tokens}, "
          f"max_new_tokens={args.max_new_tokens}, target {tcfg.num_params / 1e6:.2f}M params, {args.layers} layers)")
    head = f"{'mesh':>9} {'tok/s':>8} {'vs first':>8} {'compile s':>9} {'same tok':>8}  collectives in loop body: static / executed per cycle"
    print(head)
    print("-" * len(head))
    for r in rows:
        coll = r.get("collectives")
        if coll:
            desc = ", ".join(f"{k} {coll['static'][k]}/{coll['per_cycle'][k]}" for k in COLLECTIVES
                             if coll["static"][k])
            desc = f"{coll['static_total']}/{coll['per_cycle_total']}  ({desc or 'none'})"
        else:
            desc = "-"
        same = "-" if r["same_tokens_as_1_device"] is None else str(r["same_tokens_as_1_device"])
        print(f"{r['mesh']:>9} {r['tokens_per_s']:8.1f} {r['tokens_per_s'] / base:8.2f} {r['compile_s']:9.1f} "
              f"{same:>8}  {desc}")
    print("\nOne host CPU split into forced devices: this is partitioning/collective overhead, not a speed-up.")

    for r in rows:
        r.pop("_tokens")
    report.write_json(args.out, {
        "method": args.method, "platform": jax.devices()[0].platform, "num_devices": jax.device_count(),
        "batch": args.batch, "num_particles": args.num_particles, "num_speculative_tokens": args.num_speculative_tokens,
        "max_new_tokens": args.max_new_tokens, "target_params": tcfg.num_params, "draft_params": dcfg.num_params,
        "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
