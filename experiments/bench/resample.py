"""Times every resampling scheme, jit-compiled and vmapped over a batch of requests.

For each scheme and particle count N it compiles ``jit(vmap(scheme))`` over ``--batch``
requests (num_samples = N), warms up, then reports the median (and min) wall time of
``--repeats`` calls. Prints a markdown table and writes JSON.

    python -m experiments.bench.resample [--out experiments/results/bench_resample.json]
"""

import argparse
import functools
import platform
import time

import jax

from smcsd import resample
from experiments import report


def time_scheme(name: str, num_particles: int, batch: int, repeats: int, warmup: int) -> dict:
    """Compile time and per-call wall times (seconds) of one scheme at one size."""
    fn = functools.partial(resample.get_resampler(name), num_samples=num_particles)
    batched = jax.jit(jax.vmap(fn))
    keys = jax.random.split(jax.random.key(0), batch)
    # Log-weights spread over ~±10 nats, as after a few SMC-SD cycles.
    log_weights = 3.0 * jax.random.normal(jax.random.key(1), (batch, num_particles))

    start = time.perf_counter()
    batched(keys, log_weights).block_until_ready()
    compile_s = time.perf_counter() - start
    median, times = report.timed(lambda: batched(keys, log_weights), repeats, warmup)
    return {
        "scheme": name,
        "num_particles": num_particles,
        "batch": batch,
        "compile_s": compile_s,
        "median_s": median,
        "min_s": min(times),
        "times_s": times,
    }


def markdown_table(results: list[dict], schemes: list[str], sizes: list[int]) -> str:
    """Median µs per batched call: one row per N, one column per scheme."""
    cell = {(r["num_particles"], r["scheme"]): r["median_s"] * 1e6 for r in results}
    return report.markdown_table(["N", *schemes], [[n, *(f"{cell[n, s]:.1f}" for s in schemes)] for n in sizes],
                                 align="---:")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=report.results_path("bench_resample.json"), help="JSON output path")
    parser.add_argument("--particles", type=int, nargs="+", default=[8, 64, 1024])
    parser.add_argument("--batch", type=int, default=64, help="requests per call (vmapped)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--schemes", nargs="+", default=list(resample.available_resamplers()))
    args = parser.parse_args(argv)

    results = [
        time_scheme(name, n, args.batch, args.repeats, args.warmup)
        for n in args.particles
        for name in args.schemes
    ]
    device = jax.devices()[0]
    result = {
        "benchmark": "resample schemes, jit(vmap(scheme)), num_samples = N",
        "unit": "seconds per batched call",
        "batch": args.batch,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device": str(device.device_kind),
        "python": platform.python_version(),
        "results": results,
    }
    print(f"median µs per call, {args.batch} requests vmapped, "
          f"{jax.default_backend()} ({device.device_kind}), {args.repeats} repeats\n")
    print(markdown_table(results, args.schemes, args.particles))
    report.write_json(args.out, result, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
