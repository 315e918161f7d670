"""The cost model (experiments/studies/cost_model.py) held against the SMC-SD paper's headline measurement: Llama-3.1-70B
target, Llama-3.2-1B draft, 4×H100 (tensor-parallel), batch 1, prompt 256, output 512, T = 0.7, SMC-SD at
(K, N) = (8, 8): AR 65.0, SD 140.8, SMC-SD 342.0 tokens/s (arXiv 2604.15672; ../shared/PAPERS.md).

    python -m experiments.studies.paper_check                      # writes experiments/results/paper_check.json

The model is the one the library uses for every projection, with a 4-GPU tensor-parallel device: 4× one H100's HBM
bandwidth and FLOP rate, and per layer the fixed overhead plus two all-reduces (after attention and after the MLP)
of a latency --allreduce-us each (NVLink, small messages). What the paper does not state is assumed and printed: the
per-token acceptance a of SD (--acceptance, default 0.81, the value every Llama-8B/1B projection here uses) and
SD's draft length (--sd-k, default 4). SMC-SD needs no acceptance: every particle gains K + 1 tokens per cycle; its
resampling (block-table moves, no KV copies in the paper's engine) is counted as free.
Two rows per method: the pure roofline (nothing fitted) and the same with the HBM bandwidth scaled so that AR
matches the paper (one number fitted on AR; SD and SMC-SD stay predictions). Prints the table (prediction, paper,
relative error) and, where |error| > 25 %, what the model leaves out.
"""

from __future__ import annotations

import argparse
import dataclasses

from experiments import report

PAPER = {"ar": 65.0, "sd": 140.8, "smc": 342.0}
MISSES = {
    "ar": "The model leaves out the serving engine's per-step host work (scheduling, sampling, detokenisation, which "
          "SGLang runs on the CPU between steps) and launches beyond one per layer; and it streams weights at the "
          "HBM's peak, which real kernels reach to ~70-80 %.",
    "sd": "SD's acceptance and draft length are not in the paper (assumed here: a wrong guess moves this row most); "
          "the per-step host work as for AR is paid once per draft call and once per verification.",
    "smc": "The per-step host work as for AR is paid once per draft call (K = 8 per cycle) and per verification, and "
           "the 1B draft at tensor-parallel 4 is launch-bound, not bandwidth-bound; attention over the particles' "
           "paged caches runs below peak bandwidth.",
}


def llama70b():
    from smcsd.models import ModelConfig
    return ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                       num_attention_heads=64, num_key_value_heads=8, head_dim=128, dtype="bfloat16",
                       max_position_embeddings=131072)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acceptance", type=float, default=0.81)
    ap.add_argument("--sd-k", type=int, default=4)
    ap.add_argument("--smc-k", type=int, default=8)
    ap.add_argument("--smc-n", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--allreduce-us", type=float, default=8.0)
    ap.add_argument("--overhead-us", type=float, default=1.0)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--out", default=report.results_path("paper_check.json"))
    args = ap.parse_args(argv)

    from experiments.studies import cost_model as cm
    h100 = cm.DEVICES["h100"]
    g = args.gpus
    dev = cm.tensor_parallel(dataclasses.replace(h100, overhead_s=args.overhead_us * 1e-6), g, args.allreduce_us * 1e-6)
    dev = dataclasses.replace(dev, name=f"{g}×H100 tensor-parallel")
    target = llama70b()
    draft = cm.real_configs()["llama3.1-8b+llama3.2-1b"][1][1]
    context = args.prompt_len + args.output_len // 2
    stats = {"acceptance_sd": args.acceptance, "acceptance_sd_multi": args.acceptance, "resample_rate": 0.0}
    def predict(d):
        out = {}
        for method, K, N in (("ar", 1, 1), ("sd", args.sd_k, 1), ("smc", args.smc_k, args.smc_n)):
            out[method] = (K, N, cm.steady_state(method, target, draft, 1, N, K, context, d, stats, args.prompt_len))
        return out

    # Two models: the pure roofline (nothing fitted), and the same with the bandwidth scaled so that AR matches the
    # paper (one number fitted on AR; SD and SMC-SD are then predictions).
    pure = predict(dev)
    eff = 1.0
    for _ in range(30):  # bandwidth efficiency with AR's prediction = the paper's (monotone: fixed-point steps)
        eff *= PAPER["ar"] / predict(dataclasses.replace(dev, bandwidth=eff * dev.bandwidth))["ar"][2]["tokens_per_s"]
    fitted = predict(dataclasses.replace(dev, bandwidth=eff * dev.bandwidth))
    rows = []
    for model, preds in (("roofline", pure), (f"roofline, bandwidth x {eff:.2f} (fitted on AR)", fitted)):
        ar_p = preds["ar"][2]["tokens_per_s"]
        for method, (K, N, r) in preds.items():
            pred, paper = r["tokens_per_s"], PAPER[method]
            err = (pred - paper) / paper
            rows.append(dict(model=model, method=method, K=None if method == "ar" else K,
                             N=N if method == "smc" else None, predicted_tokens_per_s=pred, paper_tokens_per_s=paper,
                             error=None if (model != "roofline" and method == "ar") else err,
                             cycle_s=r.get("cycle_s"), tokens_per_cycle=r.get("tokens_per_cycle"),
                             predicted_speedup_vs_ar=pred / ar_p, paper_speedup_vs_ar=paper / PAPER["ar"],
                             misses=MISSES[method] if abs(err) > 0.25 else None))
    table = report.markdown_table(
        ["model", "method", "K", "N", "predicted tok/s", "paper tok/s", "error", "predicted vs ar", "paper vs ar"],
        [[r["model"], r["method"], report.fmt(r["K"], "d"), report.fmt(r["N"], "d"),
          f"{r['predicted_tokens_per_s']:.1f}", f"{r['paper_tokens_per_s']:.1f}",
          "fitted" if r["error"] is None else f"{r['error']:+.0%}", f"{r['predicted_speedup_vs_ar']:.2f}×",
          f"{r['paper_speedup_vs_ar']:.2f}×"] for r in rows])
    notes = [f"- {r['method']}, {r['model']} (error {r['error']:+.0%}): {r['misses']}" for r in rows
             if r["misses"] and r["error"] is not None]
    markdown = table + ("\n\n" + "\n".join(notes) if notes else "")
    print(markdown)
    result = report.new_result(
        "smcsd.paper_check/1", device=dev.name, target="Llama-3.1-70B (bf16)", draft="Llama-3.2-1B (bf16)",
        assumptions=dict(acceptance_sd=args.acceptance, sd_k=args.sd_k, allreduce_us=args.allreduce_us,
                         overhead_us=args.overhead_us, context=context, resampling="free (block tables)"),
        fitted_bandwidth_efficiency=eff,
        rows=rows, markdown=markdown, command=report.command(__file__, argv))
    print("wrote", report.write_json(args.out, result, indent=2))


if __name__ == "__main__":
    main()
