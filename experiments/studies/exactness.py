"""How far each method's output law is from the exact target law p_T, on enumerable toys.

    python -m experiments.studies.exactness                       # 20 000 samples per cell, N = 1 4 16 64
    python -m experiments.studies.exactness --quick               # 2 000 samples, N = 1 4 16

Toy: `tests/toys.tiny_pair()` (random target and a *different* random draft, vocab 6), prompt (4, 5),
3-token continuations (6**3 = 216 outcomes, EOS ignored), so p_T over whole continuations is
enumerated exactly (`tests/toys.exact_distribution`) and compared with the histogram of n decodes.

For every setting (temperature 1; temperature 0.7 with top-k 3) and every method — the exact ones
(`ar`, `sd`, `sd-multi`) and `smc` at N = 1, 4, 16, 64 — it reports:

- TV = ½ Σ |p̂ − p_T| (total variation of the empirical law from p_T);
- the sampling-noise floor: even a perfect sampler has E[TV] > 0 with n samples. E[TV] is computed
  exactly from the binomial mean absolute deviation (de Moivre): E|X − np| = 2ν(1−p)·Binom(ν; n, p),
  ν = ⌊np⌋ + 1, so E[TV] = Σ_i E|X_i − n p_i| / (2n). Its standard deviation comes from Monte Carlo
  multinomial draws; an exact method's TV should lie below `noise_bound` = E[TV] + 4 sd;
- Pearson's chi-square statistic of the counts against p_T (cells with expected count < 5 pooled, as
  `tests/toys.chi_square_pvalue`), its degrees of freedom, chi²/df (≈ 1 for an exact sampler, its
  noise floor; ≫ 1 for a biased one) and the p-value.

The exact methods sit on the noise floor; `smc` is consistent, its TV falls with N towards it — as long
as the draft's proposal covers p_T's support. `decode` lets smc's draft propose from its full tempered
distribution (top_k/top_p shape p_T only) for exactly this reason; `smc_limit_tv` computes the p_T mass
SMC could never reach (0 unless the proposal is truncated), which an earlier version that truncated the
draft too plateaued at.

JSON written to --out (default experiments/results/exactness.json):
  schema        "smcsd.exactness/1"
  created, device, jax_version
  settings      samples, batch, seed, prompt, length, vocab, sd_k, sd_multi_n, smc_k, num_particles,
                sampling settings by name
  rows          one per (setting, method[, N]): setting, method, label, num_particles,
                num_speculative_tokens, samples, tv, noise_tv (E[TV] of an exact sampler), noise_sd,
                noise_bound, within_noise (tv <= noise_bound), chi2, df, chi2_per_df, pvalue,
                acceptance_rate (speculative methods; smc counts every emitted draft token as accepted),
                smc_limit_tv (smc: TV of its N -> infinity limit, the p_T mass of outputs the draft can
                never propose; 0 with smc's untruncated proposal; else null), seconds
  plot          path of the PNG (TV vs N for smc, the exact methods and the noise floor), or null
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from experiments import report

DEFAULT_OUT = report.results_path("exactness.json")
DEFAULT_PLOT = report.results_path("exactness.png")
SCHEMA = "smcsd.exactness/1"
TOP_FIELDS = ("schema", "created", "device", "jax_version", "settings", "rows", "plot")
ROW_FIELDS = ("setting", "method", "label", "num_particles", "num_speculative_tokens", "samples", "tv", "noise_tv",
              "noise_sd", "noise_bound", "within_noise", "chi2", "df", "chi2_per_df", "pvalue", "acceptance_rate",
              "smc_limit_tv", "seconds")
SETTINGS = {
    "T=1": dict(temperature=1.0),
    "T=0.7 top-k 3": dict(temperature=0.7, top_k=3),
}
EXACT_METHODS = ("ar", "sd", "sd-multi")
PROMPT, LENGTH, VOCAB, TOY_SEED = (4, 5), 3, 6, 0
NOISE_SIGMAS = 4.0  # noise_bound = E[TV] + NOISE_SIGMAS * sd


def _toys():
    from tests import toys
    return toys


# ----------------------------------------------------------------------------------- statistics

def expected_tv_noise(probs, n: int) -> float:
    """Exact E[TV(empirical law of n i.i.d. draws, probs)] via the binomial mean absolute deviation."""
    from scipy import stats as sps
    p = np.asarray(probs, np.float64)
    p = p[p > 0]
    nu = np.floor(n * p) + 1
    mad = 2.0 * nu * (1.0 - p) * sps.binom.pmf(nu, n, p)  # E|X - np|, X ~ Binomial(n, p)
    return float(mad.sum() / (2.0 * n))


def tv_noise_sd(probs, n: int, reps: int = 2000, seed: int = 0) -> float:
    """Standard deviation of TV(empirical, probs) over `reps` Monte Carlo multinomial samples of size n."""
    p = np.asarray(probs, np.float64)
    p = p / p.sum()
    draws = np.random.default_rng(seed).multinomial(n, p, size=reps)
    tvs = 0.5 * np.abs(draws / n - p).sum(axis=1)
    return float(tvs.std(ddof=1))


def chi_square(counts, probs, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom, pooled as tests/toys.chi_square_pvalue does (the same
    function: `toys.chi_square_statistic`). Samples in zero-probability cells give inf."""
    return _toys().chi_square_statistic(counts, probs, min_expected)


def smc_support_gap(toys, target, draft, K: int, sampling: dict) -> float:
    """p_T mass of the continuations SMC can never emit: a position the draft proposes (positions 1..K
    of each (K+1)-token cycle after x_0) holding a token outside the support of smc's proposal (the
    draft at the draft temperature, untruncated, as `decode` runs it). SMC's output law tends to p_T
    restricted to the rest as N grows, so this is the TV it converges to (0 when q covers p_T)."""
    import itertools

    import jax.numpy as jnp

    from smcsd.sampling import SamplingParams, process_logits
    V = target.config.vocab_size
    conts = np.array(list(itertools.product(range(V), repeat=LENGTH)), np.int32)
    seqs = np.concatenate([np.broadcast_to(np.asarray(PROMPT, np.int32), (len(conts), len(PROMPT))), conts], 1)
    proposal = SamplingParams.make(sampling.get("temperature", 1.0))  # smc's draft: no top-k/top-p
    logq = process_logits(draft(jnp.asarray(seqs))[:, len(PROMPT) - 1:-1], proposal)
    per_tok = np.take_along_axis(np.asarray(logq), conts[..., None], axis=-1)[..., 0]  # [S, LENGTH]
    drafted = np.array([j >= 1 and (j - 1) % (K + 1) < K for j in range(LENGTH)])
    unreachable = np.any(np.isneginf(per_tok[:, drafted]), axis=1)
    probs = toys.exact_distribution(target, PROMPT, LENGTH, **sampling)
    return float(probs[unreachable].sum())


# ----------------------------------------------------------------------------------- sampling

def method_cells(num_particles, sd_k: int, sd_multi_n: int, smc_k: int) -> list[dict]:
    cells = [dict(method="ar", label="ar", num_particles=None, num_speculative_tokens=None),
             dict(method="sd", label=f"sd K={sd_k}", num_particles=None, num_speculative_tokens=sd_k),
             dict(method="sd-multi", label=f"sd-multi N={sd_multi_n} K={sd_k}", num_particles=sd_multi_n,
                  num_speculative_tokens=sd_k)]
    for n in num_particles:
        cells.append(dict(method="smc", label=f"smc N={n} K={smc_k}", num_particles=n, num_speculative_tokens=smc_k))
    return cells


def counts_and_stats(toys, cell: dict, target, draft, samples: int, batch: int, seed: int, sampling: dict):
    """Histogram over continuations of `samples` decodes, and the mean acceptance rate (speculative methods)."""
    import smcsd
    V = target.config.vocab_size
    kw = dict(sampling)
    if cell["method"] != "ar":
        kw.update(num_speculative_tokens=cell["num_speculative_tokens"], num_particles=cell["num_particles"] or 1)
    counts = np.zeros(V ** LENGTH, np.int64)
    acc, done = [], 0
    while done < samples:
        res = smcsd.decode([list(PROMPT)] * batch, target=target, draft=draft if cell["method"] != "ar" else None,
                           method=cell["method"], max_new_tokens=LENGTH, seed=seed + done, eos_id=[], **kw)
        toks = np.asarray(res.tokens)
        assert toks.shape == (batch, LENGTH), toks.shape
        counts += np.bincount(toys.continuation_index(toks, V), minlength=V ** LENGTH)
        if cell["method"] != "ar" and not math.isnan(res.stats.acceptance_rate):
            acc.append(res.stats.acceptance_rate)
        done += batch
    return counts, (float(np.mean(acc)) if acc else None)


def run(samples: int, batch: int, seed: int, num_particles, sd_k: int, sd_multi_n: int, smc_k: int,
        settings=None, progress: bool = True) -> list[dict]:
    toys = _toys()
    target, draft = toys.tiny_pair(VOCAB, TOY_SEED)
    batch = min(batch, samples)
    samples = batch * math.ceil(samples / batch)
    rows = []
    for s_name in (settings or SETTINGS):
        sampling = SETTINGS[s_name]
        probs = toys.exact_distribution(target, PROMPT, LENGTH, **sampling)
        noise = expected_tv_noise(probs, samples)
        sd = tv_noise_sd(probs, samples, seed=seed)
        gap = smc_support_gap(toys, target, draft, smc_k, sampling)
        for i, cell in enumerate(method_cells(num_particles, sd_k, sd_multi_n, smc_k)):
            t0 = time.perf_counter()
            counts, acc = counts_and_stats(toys, cell, target, draft, samples, batch, seed + 100_000 * i, sampling)
            tv = toys.total_variation(counts, probs)
            stat, df = chi_square(counts, probs)
            row = dict(setting=s_name, **cell, samples=int(counts.sum()), tv=tv, noise_tv=noise, noise_sd=sd,
                       noise_bound=noise + NOISE_SIGMAS * sd, within_noise=bool(tv <= noise + NOISE_SIGMAS * sd),
                       chi2=stat, df=df, chi2_per_df=(stat / df if df else None),
                       pvalue=toys.chi_square_pvalue(counts, probs), acceptance_rate=acc,
                       smc_limit_tv=gap if cell["method"] == "smc" else None,
                       seconds=time.perf_counter() - t0)
            rows.append({k: row[k] for k in ROW_FIELDS})
            if progress:
                print(f"  {s_name:>14} | {cell['label']:<22} TV {tv:.4f} (noise {noise:.4f}) "
                      f"chi2/df {report.fmt(row['chi2_per_df'], '.2f')}  [{row['seconds']:.1f}s]", flush=True)
    return rows


# ----------------------------------------------------------------------------------- reporting

def markdown_table(rows: list[dict]) -> str:
    fmt = report.fmt  # an infinite chi²/df (samples where p_T is 0) prints as "inf"
    return report.markdown_table(
        ["setting", "method", "TV", "noise floor E[TV]", "bound (+4 sd)", "within noise", "chi²/df", "p-value",
         "acceptance", "smc TV limit (N→∞)"],
        [[r["setting"], r["label"], fmt(r["tv"], ".4f"), fmt(r["noise_tv"], ".4f"), fmt(r["noise_bound"], ".4f"),
          "yes" if r["within_noise"] else "no", fmt(r["chi2_per_df"], ".2f"), fmt(r["pvalue"], ".3g"),
          fmt(r["acceptance_rate"], ".2f"), fmt(r["smc_limit_tv"], ".4f")] for r in rows])


def plot(rows: list[dict], path: str, title: str) -> str:
    plt = report.pyplot()
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = plt.subplots(1, len(settings), figsize=(5.2 * len(settings), 4.0), squeeze=False, sharey=True)
    styles = {"ar": ("tab:green", "-"), "sd": ("tab:orange", "--"), "sd-multi": ("tab:purple", ":")}
    for ax, s in zip(axes[0], settings):
        rs = [r for r in rows if r["setting"] == s]
        smc = sorted((r for r in rs if r["method"] == "smc"), key=lambda r: r["num_particles"])
        ns = [r["num_particles"] for r in smc]
        if smc:
            ax.plot(ns, [r["tv"] for r in smc], "o-", color="tab:blue", label="smc (TV vs N)")
            if smc[0].get("smc_limit_tv"):
                ax.axhline(smc[0]["smc_limit_tv"], color="tab:blue", ls="-.", lw=1,
                           label="smc N→∞ limit (draft support gap)")
        for r in rs:
            if r["method"] in styles:
                c, ls = styles[r["method"]]
                ax.axhline(r["tv"], color=c, ls=ls, lw=1.5, label=f"{r['label']} (exact)")
        noise, bound = rs[0]["noise_tv"], rs[0]["noise_bound"]
        lo = 0.5 * min([noise] + [r["tv"] for r in rs if r["tv"] > 0])
        ax.axhspan(lo, bound, color="grey", alpha=0.15, label="noise floor E[TV] of n exact draws (line; band: +4 sd)")
        ax.axhline(noise, color="grey", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(lo, 1.2)
        if ns:
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("particles N")
        ax.set_title(f"{s}, n = {rs[0]['samples']}")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("TV(output law, exact p_T)")
    handles = {}
    for ax in axes[0]:  # one legend for both panels, below them
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, (h, lab))
    fig.legend([h for h, _ in handles.values()], [lab for _, lab in handles.values()], loc="lower center",
               ncol=3, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return report.savefig(fig, path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=None, help="decodes per cell (default 20000; --quick 2000)")
    ap.add_argument("--batch", type=int, default=2000, help="requests per decode call")
    ap.add_argument("--num-particles", type=int, nargs="+", default=None,
                    help="N ladder for smc (default 1 4 16 64; --quick 1 4 16)")
    ap.add_argument("--sd-k", type=int, default=2, help="draft length K of sd and sd-multi")
    ap.add_argument("--sd-multi-n", type=int, default=3, help="drafts per request of sd-multi")
    ap.add_argument("--smc-k", type=int, default=1, help="draft length K of smc")
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=None, help="sampling settings to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSON results")
    ap.add_argument("--plot", default=DEFAULT_PLOT, help="PNG plot ('' for none)")
    ap.add_argument("--quick", action="store_true", help="small run: 2000 samples, N = 1 4 16")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    samples = args.samples or (2000 if args.quick else 20000)
    ns = args.num_particles or ([1, 4, 16] if args.quick else [1, 4, 16, 64])
    for name, v in (("--samples", samples), ("--batch", args.batch), ("--sd-k", args.sd_k),
                    ("--sd-multi-n", args.sd_multi_n), ("--smc-k", args.smc_k)) + tuple(("--num-particles", n)
                                                                                      for n in ns):
        if v < 1:
            build_parser().error(f"argument {name}: must be >= 1, got {v}")
    import jax
    rows = run(samples, args.batch, args.seed, ns, args.sd_k, args.sd_multi_n, args.smc_k, settings=args.settings,
               progress=not args.no_progress)
    result = report.new_result(
        SCHEMA, device=report.device_info(host_cores=False)[0], jax_version=jax.__version__,
        settings={"samples": rows[0]["samples"] if rows else samples, "batch": min(args.batch, samples),
                  "seed": args.seed, "prompt": list(PROMPT), "length": LENGTH, "vocab": VOCAB,
                  "toy": f"tests/toys.tiny_pair(vocab={VOCAB}, seed={TOY_SEED})", "sd_k": args.sd_k,
                  "sd_multi_n": args.sd_multi_n, "smc_k": args.smc_k, "num_particles": ns,
                  "sampling": {k: SETTINGS[k] for k in (args.settings or SETTINGS)}, "noise_sigmas": NOISE_SIGMAS},
        rows=rows, plot=None)
    print(f"\nexactness on enumerable toys: vocab {VOCAB}, prompt {list(PROMPT)}, {LENGTH}-token outputs "
          f"({VOCAB ** LENGTH} outcomes), n = {result['settings']['samples']} samples per cell")
    print(markdown_table(rows))
    if args.plot:
        result["plot"] = plot(rows, args.plot, f"exactness: TV from exact p_T (toy vocab {VOCAB}, "
                                               f"{LENGTH}-token outputs, n = {result['settings']['samples']})")
        print("wrote", args.plot)
    print("wrote", report.write_json(args.out, report.json_safe(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
