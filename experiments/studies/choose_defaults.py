"""Choose `decode`'s defaults for a pair by measurement, and store them with the pair
(`models/shipped/<pair>/decode_defaults.json`, read by `smcsd.defaults`).

    python -m experiments.studies.choose_defaults --pair tiny-code --write
    python -m experiments.studies.choose_defaults --pair tiny-arith --write
    python -m experiments.studies.choose_defaults --pair smollm2-135m --drafters ar-distilled dflash-dpace --write

Per drafter of the pair, the candidates are `ar`, `sd` at each K of --sd-ks, `sd-tree` at each tree of --trees and
`smc` at each N:K of --smc. With --temperature 0 the run chooses the greedy defaults (`decode(..., temperature=0)`),
stored beside the sampled ones under "greedy" (--write keeps the other regime's choice).
1. Speed on this machine (the "cpu" backend): batch 1, T = --temperature, every candidate on every prompt in
   --rounds interleaved rounds (drift hits all alike), tokens/s = new tokens / wall time (compile excluded).
2. Quality: `ar` and `sd` are exact (the enumeration tests), so they pass. `smc` is consistent, not exact, so each
   smc candidate is measured against `ar` on the same prompts: tiny-arith by accuracy on --quality-prompts test
   problems (pass: at most --arith-points below ar's), the others by the mean per-token target log-probability
   of the outputs (experiments/studies/fidelity.py's score; pass: at most --logp-tol nats/token below ar's — a lower
   mean log p_T is what a weak drafter with too few particles produces).
3. The "cpu" default is the fastest passing candidate; `ar` is a candidate, so the default is never slower than
   `ar`. The "accelerator" default (GPU/TPU) is the fastest passing candidate by the cost model
   (experiments/studies/cost_model.py, H100 preset, steady state at the prompt length + half the output), where a call
   over N·(K+1) tokens costs about one token's weight traffic; acceptance and quality are the ones measured here.
Prints a table per drafter, writes JSON (--out) and, with --write, the pair's decode_defaults.json (its backend-wide
choice). What pays differs between CPUs, so --write-machine stores the choice as this machine's own with the pair
(decode_defaults.machines/<machine>.json) and --write-user in your cache (`smcsd.defaults.user_defaults_path`); on
this machine `decode` prefers them (smcsd/defaults.py). To choose for your own machine:

    python -m experiments.studies.choose_defaults --pair smollm2-135m --drafters eagle --sd-ks 1 2 3 \\
        --trees 2,1:top --smc 4:3 --corpus-heldout experiments/data/corpus/smollm2-135m --batch-sizes 2 4 --write-user
    python -m experiments.studies.choose_defaults --pair smollm2-135m --drafters eagle --sd-ks 1 2 3 \\
        --trees 2,1:top --temperature 0 --corpus-heldout experiments/data/corpus/smollm2-135m --batch-sizes 2 4 \\
        --write-user

(the sampled run first: the greedy one adds its regime to the file the sampled one made)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from experiments import report
from experiments.common import pair_prompts


@dataclasses.dataclass(frozen=True)
class Cand:
    method: str
    n: int = 1
    k: int = 1
    tree: str | None = None  # sd-tree: the tree's string form (smcsd.TreeSpec.parse); k is its depth

    @classmethod
    def sd_tree(cls, tree: str) -> "Cand":
        from smcsd import TreeSpec
        return cls("sd-tree", 1, TreeSpec.parse(tree).depth, tree)

    @property
    def label(self) -> str:
        return label_of(self.entry())

    def kwargs(self) -> dict:
        if self.method == "ar":
            return dict(method="ar")
        if self.method == "sd-tree":
            return dict(method="sd-tree", tree=self.tree)
        kw = dict(method=self.method, num_speculative_tokens=self.k)
        if self.method == "smc":
            kw["num_particles"] = self.n
        return kw

    def entry(self) -> dict:
        e = dict(method=self.method, num_particles=self.n, num_speculative_tokens=self.k)
        return {**e, "tree": self.tree} if self.tree is not None else e


def label_of(c: dict) -> str:
    """A stored candidate's label: "ar", "sd K=2", "sd-tree 2,1:top", "smc N=4 K=3"."""
    if c["method"] == "ar":
        return "ar"
    if c["method"] == "sd":
        return f"sd K={c['num_speculative_tokens']}"
    if c["method"] == "sd-tree":
        return f"sd-tree {c['tree']}"
    return f"{c['method']} N={c['num_particles']} K={c['num_speculative_tokens']}"


def by_batch(target, draft, entry, prompts, stops, args) -> dict:
    """{batch size: {default, speedup_vs_ar, candidates}} for each of --batch-sizes: ar and each method's best passing
    batch-1 setting measured at that batch size, the fastest the default (quality verdicts carry over from batch 1)."""
    contenders = [Cand("ar")] + [cand_of(c) for c in entry["methods"].values()]
    out = {}
    for b in sorted(set(args.batch_sizes)):
        speed = measure_speed(target, draft, contenders, prompts, stops, args.temperature, args.max_new_tokens,
                              args.rounds, batch=b)
        cands = [dict(candidate=c.entry(), label=c.label, tokens_per_s=speed[c]["tokens_per_s"],
                      speedup_vs_ar=speed[c]["speedup_vs_ar"]) for c in contenders]
        best = max(cands, key=lambda r: r["speedup_vs_ar"])
        out[str(b)] = dict(default=best["candidate"], speedup_vs_ar=best["speedup_vs_ar"], candidates=cands)
        print(f"  batch {b}: " + ", ".join(f"{r['label']} {r['speedup_vs_ar']:.2f}x" for r in cands), flush=True)
    return out


def cand_of(entry: dict) -> Cand:
    """The candidate a stored entry names."""
    return Cand(entry["method"], entry.get("num_particles", 1), entry.get("num_speculative_tokens", 1),
                entry.get("tree"))


def heldout_prompts(corpus_dir: str, target, n_speed: int, n_quality: int):
    """(speed prompts, quality prompts): the first n_speed and the next n_quality held-out chat requests of a
    self-distillation corpus."""
    from experiments.common import heldout_chat_prompts
    render = heldout_chat_prompts(corpus_dir, target)
    if len(render) < n_speed + n_quality:
        raise SystemExit(f"--corpus-heldout {corpus_dir} has {len(render)} held-out chat requests; --prompts + "
                         f"--quality-prompts asks for {n_speed + n_quality}")
    return render[:n_speed], render[n_speed:n_speed + n_quality]


def measure_speed(target, draft, cands, prompts, stops, temperature, max_new, rounds, progress=True, batch=1):
    """Tokens/s of each candidate (and its ratio to ar's) over `rounds` interleaved rounds of the prompts, `batch`
    requests per call (batch i takes prompts i*batch.. cyclically)."""
    import smcsd
    acc = {c: dict(tokens=0, wall=0.0, accepted=0, drafts=0, resamples=0, calls=0) for c in cands}
    groups = [[prompts[(i * batch + j) % len(prompts)] for j in range(batch)] for i in range(len(prompts))]

    def run(c, group, seed):
        kw = dict(target=target, temperature=temperature, max_new_tokens=max_new, eos_id=stops, seed=seed, **c.kwargs())
        if c.method != "ar":
            kw["draft"] = draft
        return smcsd.decode(group, **kw).stats

    for c in cands:
        run(c, groups[0], 0)  # compile + warm up
    for r in range(rounds):
        for prompt in groups:
            for c in cands:
                st = run(c, prompt, r + 1)
                a = acc[c]
                a["tokens"] += st.num_generated_tokens
                a["wall"] += st.wall_time_s
                a["accepted"] += st.num_accepted_tokens or 0
                a["drafts"] += st.num_drafts or 0
                a["resamples"] += st.num_resamples or 0
                a["calls"] += st.num_target_calls
        if progress:
            print(f"  speed round {r + 1}/{rounds}" + (f" (batch {batch})" if batch > 1 else ""), flush=True)
    ar_tps = acc[Cand("ar")]["tokens"] / acc[Cand("ar")]["wall"]
    out = {}
    for c, a in acc.items():
        tps = a["tokens"] / a["wall"]
        out[c] = dict(tokens_per_s=tps, speedup_vs_ar=tps / ar_tps,
                      mean_acceptance_length=(a["accepted"] / a["drafts"] + 1)
                      if c.method in ("sd", "sd-tree") and a["drafts"] else None,
                      resample_rate=a["resamples"] / a["calls"] if c.method == "smc" else None)
    return out


def measure_quality(pair, target, draft, c, prompts, stops, problems, temperature, max_new, samples):
    """Accuracy (tiny-arith) or the mean per-token log p_T of the outputs, over prompts x samples."""
    import smcsd
    from experiments.studies.fidelity import score
    kw = dict(target=target, temperature=temperature, max_new_tokens=max_new, eos_id=stops, **c.kwargs())
    if c.method != "ar":
        kw["draft"] = draft
    outs, src = [], []
    for s in range(samples):
        res = smcsd.decode(prompts, seed=77 + 1000 * s, **kw)
        outs += res.texts if problems is not None else res.tokens
        src += prompts
    if problems is not None:
        from experiments import arith_data
        right = [arith_data.parse_answer(t) == p.answer for t, p in zip(outs, problems * samples)]
        return dict(metric="accuracy", value=statistics.fmean(right), outputs=len(right))
    scored = [lp for lp, n in score(target, src, outs, temperature) if n > 0]
    return dict(metric="mean_logp", value=statistics.fmean(scored), outputs=len(scored),
                stderr=statistics.stdev(scored) / len(scored) ** 0.5 if len(scored) > 1 else None)


def projected(pair, target, draft, c, speed_row, prompt_len, out_len):
    """Tokens/s the cost model projects on an H100 for this candidate (acceptance as measured here)."""
    from experiments.studies import cost_model
    from smcsd.drafters import DFlashDrafter
    dev = cost_model.DEVICES["h100"]
    tcfg = target.config
    block = draft.block_config.block_size if isinstance(draft, DFlashDrafter) else None
    dcfg = draft.block_config.model if isinstance(draft, DFlashDrafter) else getattr(draft, "config", None)
    if dcfg is None and hasattr(draft, "eagle_config"):  # EAGLE: one decoder layer, its head over V′ tokens
        import dataclasses
        ec = draft.eagle_config
        dcfg = dataclasses.replace(ec.model, vocab_size=ec.draft_vocab_size or ec.model.vocab_size)
    context = prompt_len + out_len // 2
    stats = {"acceptance_sd": 0.0, "resample_rate": speed_row.get("resample_rate") or 0.0}
    if c.method in ("sd", "sd-tree"):  # a tree: the chain acceptance giving its measured tokens per cycle
        stats["acceptance_sd"] = cost_model.solve_acceptance(speed_row["mean_acceptance_length"], c.k)
    if c.method == "sd-tree":
        from smcsd import TreeSpec
        widths = TreeSpec.parse(c.tree).level_widths
        cycle, tokens = cost_model.cycle_cost(c.method, tcfg, dcfg, 1, 1, c.k, context + c.k + 1, dev, stats,
                                              prompt_len, block, tree_widths=widths)[:2]
        return tokens / cycle
    r = cost_model.steady_state(c.method, tcfg, dcfg, 1, c.n, c.k, context, dev, stats, prompt_len, block)
    return r["tokens_per_s"]


def candidates_table(rows) -> str:
    return report.markdown_table(
        ["candidate", "tok/s", "vs ar (cpu)", "projected vs ar (H100)", "quality", "passes"],
        [[r["label"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_ar']:.2f}×", f"{r['projected_h100_speedup']:.2f}×",
          r["why"], "yes" if r["passes"] else "no"] for r in rows])


def markdown(backends, candidates) -> str:
    """The choice per backend and drafter, then every drafter's candidates."""
    head = report.markdown_table(["drafter", "cpu default", "accelerator default"],
                                 [[name, f"{label_of(backends['cpu'][name]['default'])} "
                                         f"({backends['cpu'][name]['speedup_vs_ar']:.2f}×)",
                                   f"{label_of(backends['accelerator'][name]['default'])} "
                                   f"({backends['accelerator'][name]['speedup_vs_ar']:.2f}× projected)"]
                                  for name in candidates])
    parts = [head] + [f"**{name}**\n\n{candidates_table(rows)}" for name, rows in candidates.items()]
    for name, entry in backends["cpu"].items():
        if entry.get("by_batch"):
            parts.append(f"**{name}, cpu, by batch size** (ar and each method's best batch-1 setting measured again; "
                         "the fastest is the default up to that size, ar past the largest)\n\n" + by_batch_table(entry))
    return "\n\n".join(parts)


def by_batch_table(entry: dict) -> str:
    sizes = sorted(entry["by_batch"], key=int)
    labels = [c["label"] for c in entry["by_batch"][sizes[0]]["candidates"]]
    rows = [[label] + [next(f"{c['speedup_vs_ar']:.2f}× ({c['tokens_per_s']:.1f} tok/s)"
                            for c in entry["by_batch"][b]["candidates"] if c["label"] == label) for b in sizes]
            for label in labels]
    rows.append(["default"] + [label_of(entry["by_batch"][b]["default"]) for b in sizes])
    return report.markdown_table(["candidate"] + [f"batch {b}" for b in sizes], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-code")
    ap.add_argument("--drafters", nargs="+", default=None, help="default: the pair's model and block drafters")
    ap.add_argument("--sd-ks", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--smc", nargs="*", default=["1:3", "2:3", "2:4", "4:3", "4:4", "8:3"], help="N:K cells")
    ap.add_argument("--trees", nargs="*", default=[], metavar="TREE",
                    help="sd-tree candidates, each a tree string (e.g. 2,1:top; smcsd.TreeSpec.parse)")
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="0 chooses the greedy defaults (stored under 'greedy'); any other value the sampled ones")
    ap.add_argument("--prompts", type=int, default=4, help="prompts of the speed runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[], metavar="B",
                    help="batch sizes > 1 at which ar and each method's best passing setting are measured again; "
                         "the fastest per size is stored as the cpu default for batches up to it (by_batch)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--quality-prompts", type=int, default=None, help="default: 200 (tiny-arith), 8 (others)")
    ap.add_argument("--quality-samples", type=int, default=None, help="default: 1 (tiny-arith), 4 (others)")
    ap.add_argument("--corpus-heldout", default=None, metavar="DIR",
                    help="SmolLM2: speed and quality prompts from this self-distillation corpus's held-out chat "
                         "requests (disjoint draws; prompts no training split contains) instead of the built-in ones")
    ap.add_argument("--arith-points", type=float, default=3.0)
    ap.add_argument("--logp-tol", type=float, default=0.1)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--write", action="store_true", help="store the choice with the pair as its backend-wide one "
                       "(decode_defaults.json), keeping the stored choices of drafters not measured in this run")
    where.add_argument("--write-machine", action="store_true", help="store it with the pair as this machine's own "
                       "(decode_defaults.machines/<machine>.json; smcsd.defaults.machine_key), preferred there over the "
                       "backend-wide one")
    where.add_argument("--write-user", action="store_true", help="store it in your cache as this machine's own "
                       "(smcsd.defaults.user_defaults_path), preferred over both of the pair's")
    ap.add_argument("--replace", action="store_true", help="with a --write*: drop the stored choices of other drafters")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.replace and not (args.write or args.write_machine or args.write_user):
        ap.error("--replace goes with --write, --write-machine or --write-user")
    if any(b < 2 for b in args.batch_sizes):  # before any measuring
        ap.error(f"--batch-sizes takes sizes >= 2 (batch 1 is the main run), got {args.batch_sizes}")

    import smcsd
    from smcsd.defaults import SCHEMA
    from smcsd.pairs import names_of_role

    pair = args.pair
    dest = destination(pair, args)
    names = args.drafters or [n for n in smcsd.available_drafters(pair) if n in names_of_role("model", "block", "eagle")]
    target = smcsd.load(pair)[0]
    prompts, stops, _ = pair_prompts(pair, target, args.prompts)
    qn = args.quality_prompts or (200 if pair == "tiny-arith" else 8)
    qs = args.quality_samples or (1 if pair == "tiny-arith" else 4)
    q_prompts, _, problems = pair_prompts(pair, target, qn, quality=True)
    if args.corpus_heldout:
        prompts, q_prompts = heldout_prompts(args.corpus_heldout, target, args.prompts, qn)
    prompt_len = int(statistics.fmean(len(p) for p in prompts))
    greedy = args.temperature == 0  # every candidate is exact there (no smc): no quality runs
    ar_quality = dict(metric="exact", value=None) if greedy else measure_quality(
        pair, target, None, Cand("ar"), q_prompts, stops, problems, args.temperature, args.max_new_tokens, qs)
    print(f"ar quality: {ar_quality}", flush=True)
    backends, drafters_out = {"cpu": {}, "accelerator": {}}, {}
    for name in names:
        draft = smcsd.load(pair, drafter=name)[1]
        limit = getattr(draft, "max_tokens_per_proposal", None)
        fits = lambda k: limit is None or k <= limit  # noqa: E731
        cands = [Cand("ar")] + [Cand("sd", 1, k) for k in args.sd_ks if fits(k)]
        cands += [t for t in map(Cand.sd_tree, args.trees) if fits(t.k)]
        if args.temperature > 0:  # smc samples; it has no greedy regime
            cands += [Cand("smc", *map(int, s.split(":"))) for s in args.smc if fits(int(s.split(":")[1]))]
        print(f"{pair} / {name}: speed of {len(cands)} candidates", flush=True)
        speed = measure_speed(target, draft, cands, prompts, stops, args.temperature, args.max_new_tokens, args.rounds)
        rows = []
        for c in cands:
            q = ar_quality if c.method == "ar" else None
            if c.method == "smc":
                q = measure_quality(pair, target, draft, c, q_prompts, stops, problems, args.temperature,
                                    args.max_new_tokens, qs)
            if c.method in ("sd", "sd-tree"):
                passes, why = True, "exact"
            elif c.method == "ar":
                passes, why = True, "reference"
            elif q["metric"] == "accuracy":
                passes = q["value"] >= ar_quality["value"] - args.arith_points / 100
                why = f"accuracy {100 * q['value']:.1f} % vs ar {100 * ar_quality['value']:.1f} %"
            else:
                passes = q["value"] >= ar_quality["value"] - args.logp_tol
                why = f"mean log p_T {q['value']:.3f} vs ar {ar_quality['value']:.3f}"
            proj = projected(pair, target, draft, c, speed[c], prompt_len, args.max_new_tokens)
            rows.append(dict(candidate=c.entry(), label=c.label, **speed[c], quality=q, passes=passes, why=why,
                             projected_h100_tokens_per_s=proj))
            print(f"  {c.label}: {speed[c]['speedup_vs_ar']:.2f}x, {why}, passes={passes}", flush=True)
        ok = [r for r in rows if r["passes"]]
        ar_proj = next(r for r in rows if r["label"] == "ar")["projected_h100_tokens_per_s"]
        for r in rows:
            r["projected_h100_speedup"] = r["projected_h100_tokens_per_s"] / ar_proj
        for backend, key in (("cpu", "speedup_vs_ar"), ("accelerator", "projected_h100_speedup")):
            best = max(ok, key=lambda r: r[key])
            methods = {}
            for m in ("sd", "sd-tree", "smc"):
                mine = [r for r in ok if r["candidate"]["method"] == m]
                if mine:
                    methods[m] = max(mine, key=lambda r: r[key])["candidate"]
            spec = [r[key] for r in ok if r["candidate"]["method"] != "ar"]
            backends[backend][name] = dict(default=best["candidate"], speedup_vs_ar=best[key], methods=methods,
                                           speculative_speedup=max(spec) if spec else None,
                                           basis="measured on this machine" if backend == "cpu" else
                                           "cost model (H100 preset) with acceptance and quality measured here")
        if args.batch_sizes:
            backends["cpu"][name]["by_batch"] = by_batch(target, draft, backends["cpu"][name], prompts, stops, args)
        drafters_out[name] = rows
        print(candidates_table(rows), flush=True)
    cmd = report.command(__file__, argv)
    settings = dict(temperature=args.temperature, prompts=len(prompts), corpus_heldout=args.corpus_heldout,
                    rounds=args.rounds,
                    max_new_tokens=args.max_new_tokens, quality_prompts=qn, quality_samples=qs, batch=1)
    if greedy:
        write_greedy(pair, args, dest, cmd, settings, backends, drafters_out)
        return
    commands = [cmd]
    ar_quality_of = {n: ar_quality for n in names}  # the ar reference each drafter's smc verdicts were made against
    greedy_choice = None  # the stored greedy regime, kept by --write
    if dest and not args.replace:  # keep the stored choices of drafters this run did not measure
        from smcsd.defaults import read_defaults
        old = read_defaults(dest)
        if old is not None:
            for backend in backends:
                for n, e in old.get("backends", {}).get(backend, {}).items():
                    backends[backend].setdefault(n, e)
            for n, rows in old.get("candidates", {}).items():
                if n not in drafters_out:
                    drafters_out[n] = rows
                    ar_quality_of[n] = old.get("ar_quality_of", {}).get(n, old["ar_quality"])
            commands = old.get("commands", [old.get("command")]) + commands
            greedy_choice = old.get("greedy")
    # the pair's default drafter per backend: the one whose default setting is fastest (`smcsd.load(pair)` gives it)
    # (ties, e.g. every drafter's default is ar itself, go to the drafter whose best speculative setting is fastest)
    default_drafter = {b: max(entries, key=lambda n: (entries[n]["speedup_vs_ar"],
                                                      entries[n].get("speculative_speedup") or 0.0))
                       for b, entries in backends.items() if entries}
    result = report.new_result(
        SCHEMA, pair=pair, command=cmd, commands=commands, machine=report.machine_info(),
        tolerance=dict(arith_points=args.arith_points, logp_nats_per_token=args.logp_tol),
        settings=settings, ar_quality=ar_quality, ar_quality_of=ar_quality_of, default_drafter=default_drafter,
        backends=backends, candidates=drafters_out, markdown=markdown(backends, drafters_out),
        **({"greedy": greedy_choice} if greedy_choice else {}))
    out = args.out or report.results_path(f"choose_defaults_{pair}{machine_suffix(args)}.json")
    print("wrote", report.write_json(out, result, indent=2))
    if dest:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        print("wrote", report.write_json(dest, result, indent=2))


def destination(pair: str, args) -> str | None:
    """The stored-choice file a --write* flag names (None: none): the pair's backend-wide one, this machine's with
    the pair, or this machine's in the user's cache (smcsd/defaults.py: the lookup order)."""
    from smcsd import defaults
    if args.write:
        return defaults.defaults_path(pair)
    if args.write_machine:
        return defaults.machine_defaults_path(pair)
    if args.write_user:
        return defaults.user_defaults_path(pair)
    return None


def machine_suffix(args) -> str:
    """"_<machine>" for a run that stores this machine's own choice (its JSON beside the backend-wide run's), else ""."""
    from smcsd.defaults import machine_key, machine_slug
    return f"_{machine_slug(machine_key())}" if args.write_machine or args.write_user else ""


def write_greedy(pair, args, dest, cmd, settings, backends, candidates):
    """The greedy regime (--temperature 0): its JSON (--out), and with a --write* the stored file `dest` with its
    "greedy" entry replaced (the drafters this run did not measure kept, unless --replace), the sampled choice left
    as it is."""
    from smcsd.defaults import read_defaults
    regime = dict(command=cmd, created=report.new_result("-")["created"], machine=report.machine_info(),
                  settings=settings, backends=backends, candidates=candidates, markdown=markdown(backends, candidates))
    out = args.out or report.results_path(f"choose_defaults_{pair}_greedy{machine_suffix(args)}.json")
    print("wrote", report.write_json(out, regime, indent=2))
    if not dest:
        return
    old = read_defaults(dest)
    if old is None:
        raise SystemExit(f"{dest} does not exist: choose the sampled defaults first (--temperature 0.7 with the same "
                         "--write* flag), then the greedy ones")
    prev = old.get("greedy") or {}
    if not args.replace:
        for backend in backends:
            for n, e in prev.get("backends", {}).get(backend, {}).items():
                backends[backend].setdefault(n, e)
        for n, rows in prev.get("candidates", {}).items():
            candidates.setdefault(n, rows)
        regime["markdown"] = markdown(backends, candidates)
    regime["commands"] = (prev.get("commands", []) if not args.replace else []) + [cmd]
    data = {**old, "greedy": regime}
    print("wrote", report.write_json(dest, data, indent=2))


if __name__ == "__main__":
    main()
