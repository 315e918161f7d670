"""A pair on this machine (SmolLM2-135M by default): `ar` against `sd` and `smc` with drafters of the pair, and
`decode`'s own default (method left out: the pair's measured choice, smcsd/defaults.py), side by side.

    python -m experiments.bench.smollm2_pair                          # drafter ar-distilled, batch 1, T=0.7
    python -m experiments.bench.smollm2_pair --sd-ks 3 4 --smc 2:3 4:3 --repeats 2
    python -m experiments.bench.smollm2_pair --drafters ar-distilled dflash-dpace --sd-ks 3 4 8 --smc 2:4
    python -m experiments.bench.smollm2_pair --drafters eagle --sd-ks 2 --sd-cuts 3:0.3 4:0.3 --temperature 0
    python -m experiments.bench.smollm2_pair --pair tiny-code --drafters ar-distilled dflash-dpace --batch-sizes 1 8

Prompts: for SmolLM2, chat requests that are not in the drafter's training corpus (other topics and tasks than
`experiments/data/smollm2_chat.jsonl`), stop at the end of turn or `--max-new-tokens`; for the tiny pairs, held-out
code (tiny-code) or test problems (tiny-arith). A batch of B takes B consecutive prompts. Every cell is
timed over `--repeats` rounds; each round runs every cell once on every prompt (interleaved, so drift in the
shared machine's speed hits all cells alike) with the round's seed. tokens/s = all new tokens / all wall time
(compile excluded, one warm-up call per cell first). `sd` is exact (same output law as `ar`); `smc` is
consistent, not exact — its finite-N output law is measured in the SMC engine's issue, not here.
Prints a markdown table and writes JSON (--out).
"""

from __future__ import annotations

import argparse

from experiments import report
from experiments.common import BENCH_PROMPTS as PROMPTS, pair_prompts



def parse_cell(spec: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in spec.split(":"))
    except ValueError:
        raise SystemExit(f"--smc cells are N:K pairs of integers (e.g. 2:3), got {spec!r}")
    return n, k


def parse_cut(spec: str) -> tuple[int, float]:
    try:
        k, cut = spec.split(":")
        k, cut = int(k), float(cut)
    except ValueError:
        raise SystemExit(f"--sd-cuts cells are K:CUT pairs (e.g. 3:0.3: sd K=3 with confidence_cut=0.3), got {spec!r}")
    if k < 1 or not 0 < cut < 1:
        raise SystemExit(f"--sd-cuts {spec}: K must be >= 1 and the cut in (0, 1)")
    return k, cut


def resample_rate(a: dict, batch: int) -> float | None:
    """Fraction of (request, cycle) pairs that resampled (num_resamples counts per request)."""
    return a["resamples"] / (a["cycles"] * batch) if a.get("ran") == "smc" and a["cycles"] else None


def render(rows: list[dict]) -> str:
    body = []
    for r in rows:
        method, k, n = r["method"], r["K"], r["N"]
        label = {"ar": "ar", "sd": f"sd K={k}", "smc": f"smc N={n} K={k}", "sd-tree": f"sd-tree {k}",
                 "sd-cut": f"sd K={k} cut={r.get('cut')}"}.get(method, f"default ({r['ran']})")
        body.append([r["batch"], r["drafter"] or "–", label, f"{r['tps']:.1f}", f"{r['speedup']:.2f}×",
                     f"{r['tokens_per_call']:.2f}", report.fmt(r.get("verified_per_cycle")), report.fmt(r["acceptance"]),
                     report.fmt(r.get("first_draft_acceptance")), report.fmt(r["resample_rate"]),
                     r["tokens"]])
    return report.markdown_table(["batch", "drafter", "method", "tok/s", "vs ar", "tokens/target call",
                                  "drafts verified per cycle (sd)",
                                  "acceptance (sd)", "first-draft acceptance (sd)",
                                  "resampling rate (smc)", "new tokens"], body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--no-default", action="store_true", help="leave out the cell of decode's own default")
    ap.add_argument("--drafters", nargs="+", default=None,
                    help="drafter names of the pair, each run with every sd / smc cell (default: its best)")
    ap.add_argument("--sd-ks", type=int, nargs="*", default=[2, 3, 4, 6])
    ap.add_argument("--sd-cuts", nargs="*", default=[], metavar="K:CUT",
                    help="sd cells with a confidence cut (smcsd.SD(num_speculative_tokens=K, confidence_cut=CUT))")
    ap.add_argument("--smc", nargs="*", default=["1:3", "2:3", "2:4", "4:3"], help="N:K cells for smc")
    ap.add_argument("--trees", nargs="*", default=[], metavar="TREE",
                    help="sd-tree cells, each a tree string (e.g. 2,1 or 2,1,1:sample; smcsd.TreeSpec.parse)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=None,
                    help="how many of the prompts to use (default: all: the built-in six, or every held-out request "
                         "of --corpus-heldout)")
    ap.add_argument("--corpus-heldout", default=None, metavar="DIR",
                    help="SmolLM2: take the prompts from this self-distillation corpus's held-out chat requests "
                         "(requests no training split contains; see smcsd.train.corpus) instead of the built-in six")
    ap.add_argument("--draft-dir", nargs="*", default=[], metavar="NAME=DIR",
                    help="extra EAGLE drafters from checkpoint directories (e.g. eagle=runs/eagle/export), bound to "
                         "the target")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="default: results/bench_smollm2_pair.json, or bench_pair_<pair>.json")
    args = ap.parse_args(argv)

    import smcsd

    pair = args.pair
    from smcsd.defaults import default_drafter as stored_default_drafter
    default_name = stored_default_drafter(pair)  # what smcsd.load(pair) gives: the stored default, else the best model drafter
    if default_name not in smcsd.available_drafters(pair):
        default_name = smcsd.available_drafters(pair)[0]
    names = args.drafters or [default_name]
    target = smcsd.load(pair, drafter="prompt-lookup")[0]
    from_dirs = {spec.partition("=")[0] for spec in args.draft_dir}
    drafters = {name: smcsd.load(pair, drafter=name)[1] for name in names if name not in from_dirs}
    for spec in args.draft_dir:
        name, _, path = spec.partition("=")
        from smcsd.drafters import EagleDrafter
        if not name.startswith("eagle"):
            raise SystemExit(f"--draft-dir {spec}: only EAGLE checkpoints load from a directory here (name eagle...)")
        drafters[name] = EagleDrafter.load(path, dtype=target.config.dtype, name=name).bind(target)
    if pair == "smollm2-135m":
        stops = list(target.tokenizer.end_of_turn_ids)
        requests = [[{"role": "user", "content": p}] for p in PROMPTS]
        prompts = [target.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
                   for m in requests]
        if args.corpus_heldout:
            from experiments.common import heldout_chat_prompts
            prompts = heldout_chat_prompts(args.corpus_heldout, target)
    else:
        prompts, stops, _ = pair_prompts(pair, target, len(PROMPTS))
    if args.prompts is not None and args.prompts < 1:
        raise SystemExit(f"--prompts must be >= 1, got {args.prompts}")
    prompts = prompts[:args.prompts]  # None: all of them
    cells = [("ar", None, 0, 0)]
    if not args.no_default:
        cells.append(("default", default_name, 0, 0))
    for name, d in drafters.items():
        limit = getattr(d, "max_tokens_per_proposal", None)
        fits = lambda k: limit is None or k <= limit  # noqa: E731
        cells += [("sd", name, 0, k) for k in args.sd_ks if fits(k)]
        cells += [("sd-cut", name, 0, kc) for kc in map(parse_cut, args.sd_cuts) if fits(kc[0])]
        cells += [("smc", name, n, k) for n, k in map(parse_cell, args.smc) if fits(k)]
        cells += [("sd-tree", name, 0, t) for t in args.trees]

    default_drafter = drafters[default_name] if default_name in drafters else smcsd.load(pair)[1]

    def run(cell, batch, seed):
        method, name, n, k = cell
        kw = dict(target=target, temperature=args.temperature, max_new_tokens=args.max_new_tokens, eos_id=stops,
                  seed=seed)
        if method == "default":  # what decode picks with the pair's default drafter and no method
            kw.update(draft=default_drafter)
        elif method == "sd-cut":
            kw.update(method=smcsd.SD(num_speculative_tokens=k[0], confidence_cut=k[1]), draft=drafters[name])
        else:
            kw.update(method=method)
        if method == "sd-tree":  # the tree fixes K (its depth)
            kw.update(draft=drafters[name], tree=k)
        elif method not in ("ar", "default", "sd-cut"):
            kw.update(draft=drafters[name], num_speculative_tokens=k)
        if method == "smc":
            kw.update(num_particles=n)
        return smcsd.decode(batch, **kw)

    grid = [(B, c) for B in args.batch_sizes for c in cells]
    batches = {B: [[prompts[(i * B + j) % len(prompts)] for j in range(B)] for i in range(len(prompts))]
               for B in args.batch_sizes}
    for B, cell in grid:  # compile + warm up
        run(cell, batches[B][0], 0)
    acc = {g: dict(tokens=0, wall_s=0.0, calls=0, accepted=0, drafted=0, drafts=0, first_accepted=0, resamples=0,
                   cycles=0) for g in grid}
    for r in range(args.repeats):
        for i in range(len(prompts)):
            for B, cell in grid:
                res = run(cell, batches[B][i], r + 1)
                st = res.stats
                acc[(B, cell)]["ran"] = st.method  # what decode ran (the default cell: its choice)
                a = acc[(B, cell)]
                a["tokens"] += st.num_generated_tokens
                a["wall_s"] += st.wall_time_s
                a["calls"] += st.num_target_calls
                a["accepted"] += st.num_accepted_tokens
                a["drafted"] += st.num_draft_tokens
                a["drafts"] += st.num_drafts
                a["first_accepted"] += (st.accepted_per_position or [0])[0]
                a["resamples"] += st.num_resamples or 0
                a["cycles"] += len(st.resampled_per_cycle or [])
        print(f"round {r + 1}/{args.repeats} done", flush=True)

    rows = []
    for (B, (method, name, n, k)), a in acc.items():
        ar = acc[(B, ("ar", None, 0, 0))]
        tps = a["tokens"] / a["wall_s"]
        cut = None
        if method == "sd-cut":
            k, cut = k
        rows.append(dict(batch=B, method=method, drafter=name, N=n or None, K=k or None, cut=cut, **a, tps=tps,
                         verified_per_cycle=a["drafted"] / a["drafts"] if a.get("ran") == "sd" and a["drafts"] else None,
                         speedup=tps / (ar["tokens"] / ar["wall_s"]), tokens_per_call=a["tokens"] / max(a["calls"], 1),
                         acceptance=a["accepted"] / a["drafted"] if a.get("ran") == "sd" and a["drafted"] else None,
                         first_draft_acceptance=(a["first_accepted"] / a["drafts"]
                                                 if a.get("ran") in ("sd", "sd-tree") and a["drafts"] else None),
                         resample_rate=resample_rate(a, B)))
    table = render(rows)
    print(table)
    from smcsd.defaults import choose
    # what decode runs with the default drafter and no method, at this temperature (at T=0 the greedy entry where
    # the file has one) and batch 1: the method and (N, K) it chose and the stored file it read them from
    chosen = choose(target, default_drafter, None, temperature=args.temperature)
    result = report.new_result(
        "smcsd.bench_smollm2_pair/3", machine=report.machine_info(), pair=pair,
        model=dict(name=pair, params=target.num_params, dtype=target.config.dtype),
        drafters={name: dict(kind=getattr(d, "kind", "ar"), params=getattr(d, "num_params", None))
                  for name, d in drafters.items()},
        default=dict(drafter=default_name, temperature=args.temperature,
                     choice=dict(method=chosen.method, N=chosen.num_particles, K=chosen.num_speculative_tokens,
                                 tree=chosen.tree),
                     source=chosen.source),
        settings=dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                      prompts=len(prompts), batch_sizes=args.batch_sizes),
        rows=rows, markdown=table, command=report.command(__file__, argv))
    out = args.out or report.results_path("bench_smollm2_pair.json" if pair == "smollm2-135m" else f"bench_pair_{pair}.json")
    print("wrote", report.write_json(out, result, indent=2))


if __name__ == "__main__":
    main()
