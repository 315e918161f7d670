"""How much of a decode step is the weight matmuls alone: the target's own layer weights (decode layout) run as a bare
chain of matmuls — q/k/v/o and the SwiGLU MLP per layer, then the LM head, no attention, norms or cache — in a jitted
loop, per step at T tokens per call.

    python -m experiments.bench.weight_stream                        # SmolLM2-135M, T = 1 2 3 4
    python -m experiments.bench.weight_stream --pair tiny-code --ts 1 2 --steps 8

Compare with `experiments.bench.cycle_cost` (the real in-loop step): what the chain does not cover is attention,
norms, RoPE, the cache writes and sampling. Each cell is the best of --repeats runs of --steps steps (compile
excluded), with and without the head. GB/s counts the weights read once per step. Prints a table, writes JSON (--out).
"""

from __future__ import annotations

import argparse
import time

from experiments import report


def chain_step_seconds(params, T: int, steps: int, repeats: int, with_head: bool) -> float:
    """Best seconds per step of the bare matmul chain over `params` (decode layout) at T tokens."""
    import jax
    import jax.numpy as jnp

    from smcsd.models.transformer import HEAD_T

    layers, head = params["layers"], params[HEAD_T]
    H = head.shape[0]

    def layer(x, p):
        a, m = p["self_attn"], p["mlp"]
        q = x @ a["q_proj"]["kernel"]
        kv = x @ a["k_proj"]["kernel"] + x @ a["v_proj"]["kernel"]
        h = q + jnp.tile(kv, (1, q.shape[-1] // kv.shape[-1]))  # keeps every product live (GQA widths)
        x = x + h @ a["o_proj"]["kernel"]
        return (x + (jax.nn.silu(x @ m["gate_proj"]["kernel"]) * (x @ m["up_proj"]["kernel"]))
                @ m["down_proj"]["kernel"]) * 0.5

    def body(_, x):
        for p in layers:
            x = layer(x, p)
        if with_head:
            x = x + (x @ head)[:, :H] * 1e-6
        return x

    f = jax.jit(lambda x: jax.lax.fori_loop(0, steps, body, x))
    x = jnp.full((T, H), 0.01, head.dtype)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--ts", type=int, nargs="+", default=[1, 2, 3, 4], help="tokens per call")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if any(t < 1 for t in args.ts) or args.steps < 1 or args.repeats < 1:
        ap.error("--ts, --steps and --repeats must all be >= 1")

    import jax
    import numpy as np
    import smcsd
    from smcsd.models.transformer import HEAD_T, unstack_layers, with_transposed_head

    target = smcsd.load(args.pair)[0]
    params = target.decode_params()
    if HEAD_T not in params:  # an accelerator's layout: per-layer buffers and the [D, V] head, as on CPU
        params = with_transposed_head(target.config, unstack_layers(params))
    size = lambda a: int(np.prod(a.shape)) * a.dtype.itemsize  # noqa: E731
    nbytes = sum(size(a) for a in jax.tree_util.tree_leaves(params["layers"]) if a.ndim == 2)
    head_bytes = size(params[HEAD_T])
    rows = []
    for T in args.ts:
        full = chain_step_seconds(params, T, args.steps, args.repeats, True)
        bare = chain_step_seconds(params, T, args.steps, args.repeats, False)
        rows.append(dict(T=T, ms_per_step=1e3 * full, ms_without_head=1e3 * bare, head_ms=1e3 * (full - bare),
                         gb_per_s=(nbytes + head_bytes) / full / 1e9))
    base = rows[0]["ms_per_step"]
    for r in rows:
        r["vs_first"] = r["ms_per_step"] / base
    print(report.markdown_table(["T", "ms per step", "× first T", "without head", "head", "GB/s"],
                                [[r["T"], f"{r['ms_per_step']:.2f}", f"{r['vs_first']:.2f}",
                                  f"{r['ms_without_head']:.2f}", f"{r['head_ms']:.2f}", f"{r['gb_per_s']:.1f}"]
                                 for r in rows]))
    if args.out:
        report.write_json(args.out, report.new_result(
            "smcsd.weight_stream/1", pair=args.pair, steps=args.steps, repeats=args.repeats,
            layer_weight_bytes=nbytes, head_bytes=head_bytes, rows=rows,
            command=report.command(__file__, argv), machine=report.machine_info()))


if __name__ == "__main__":
    main()
