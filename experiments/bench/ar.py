"""Compile time and tokens/s of `ar` for a small random model on this machine.

Prints a markdown table and writes JSON (default experiments/results/bench_ar.json).
Example: python -m experiments.bench.ar --batch 1 4 --max-new-tokens 128
"""

import argparse
import statistics
import time

import smcsd
from experiments import report
from smcsd.models import ByteTokenizer, ModelConfig, init_model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=report.results_path("bench_ar.json"))
    args = ap.parse_args(argv)
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048)
    model = init_model(cfg, 0, tokenizer=tok)
    rows = []
    for B in args.batch:
        prompts = ["def main():\n    x = 1"] * B
        kw = dict(target=model, method="ar", max_new_tokens=args.max_new_tokens, temperature=0.7, eos_id=[])
        t0 = time.perf_counter()
        first = smcsd.decode(prompts, seed=0, **kw)
        first_call = time.perf_counter() - t0
        runs = [smcsd.decode(prompts, seed=r + 1, **kw).stats for r in range(args.repeats)]
        tps = statistics.median(s.tokens_per_s for s in runs)
        rows.append(dict(batch=B, params_m=model.num_params / 1e6, max_new_tokens=args.max_new_tokens,
                         compile_time_s=first.stats.compile_time_s, first_call_s=first_call,
                         tokens_per_s=tps, ms_per_step=1000 * B / tps, cache_len=first.stats.cache_len))
    print(report.markdown_table(
        ["batch", "params (M)", "compile (s)", "tokens/s", "ms per step", "cache slots"],
        [[r["batch"], f"{r['params_m']:.2f}", f"{r['compile_time_s']:.2f}", f"{r['tokens_per_s']:.0f}",
          f"{r['ms_per_step']:.2f}", r["cache_len"]] for r in rows]))
    report.write_json(args.out, {"rows": rows, "args": vars(args)}, indent=2)


if __name__ == "__main__":
    main()
