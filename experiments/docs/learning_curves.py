"""Held-out acceptance of SmolLM2's drafters against training tokens (log axis): the data-scaling curve on the real
target, from the training histories the recipes write (experiments/results/train/<tag>.json), and a power-law
extrapolation of each curve to the tokens it would need to reach a first-draft acceptance of 0.7.

    python -m experiments.docs.learning_curves [--out docs/figures/learning_curves.png]

Metrics, per recipe (all held-out, teacher-forced, first draft position):
- `accept1` / `accept_pos1` / `accept_lb`: Σ_x min(p_T, q) at position 1 (acceptance of the first draft at T = 1);
- `greedy1` (EAGLE): agreement of the first draft's argmax with the target's (first-draft acceptance at T = 0).
Tokens seen = step x batch_size x seq_len, plus a curve file's `tokens_before` (a stage warm-started from an earlier
run's weights: the tokens those had seen).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

from experiments.common import CURVES, DOCS, RESULTS

FIRST = ("accept1", "accept_pos1", "accept_lb")  # T = 1 first-draft acceptance, by recipe


def curves(pattern: str = "smollm2*") -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(CURVES, pattern + ".json"))):
        with open(path) as f:
            d = json.load(f)
        run, ev = d.get("run", {}), d.get("eval", [])
        if not ev:
            continue
        per_step = run.get("batch_size", 8) * run.get("seq_len", 256)
        before = int(d.get("tokens_before", 0))  # a warm-started stage: the tokens its starting weights had seen
        key = next((k for k in FIRST if k in ev[-1]), None)
        if key is None:
            continue
        pts = [(before + max(e["step"], 1) * per_step, e[key], e.get("greedy1")) for e in ev]
        lens = [(before + max(e["step"], 1) * per_step, e["accept_len"]) for e in ev if "accept_len" in e]
        out[os.path.basename(path)[:-5]] = {"recipe": run.get("recipe"), "metric": key, "points": pts,
                                            "accept_len": lens}
    return out


def extrapolate(points, goal: float = 0.7):
    """Fit 1 - a = c * tokens^(-b) through the last half of a curve (log-log least squares); tokens to reach `goal`."""
    pts = [(t, a) for t, a, _ in points if t > 0 and 0 < a < 1]
    pts = pts[len(pts) // 2:]
    if len(pts) < 3:
        return None
    xs = [math.log(t) for t, _ in pts]
    ys = [math.log(1 - a) for _, a in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope >= 0:
        return {"slope": slope, "tokens_to_goal": None}
    tokens = math.exp(mx + (math.log(1 - goal) - my) / slope)
    return {"slope": slope, "tokens_to_goal": tokens}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pattern", default="smollm2*")
    ap.add_argument("--out", default=os.path.join(DOCS, "figures", "learning_curves.png"))
    ap.add_argument("--json", default=os.path.join(RESULTS, "learning_curves.json"))
    args = ap.parse_args(argv)
    cs = curves(args.pattern)
    summary = {}
    for name, c in cs.items():
        last = c["points"][-1]
        greedy = [(t, g, None) for t, _, g in c["points"] if g is not None]
        summary[name] = {"recipe": c["recipe"], "metric": c["metric"], "tokens_seen": last[0], "first_draft": last[1],
                         "greedy1": last[2], "accept_len": c["accept_len"][-1][1] if c["accept_len"] else None,
                         "extrapolation_to_0.7": extrapolate(c["points"]),
                         "greedy_extrapolation_to_0.7": extrapolate(greedy) if greedy else None}
        print(f"{name:45s} {c['metric']:12s} tokens {last[0]:>10,}  first-draft {last[1]:.3f}"
              + (f"  greedy {last[2]:.3f}" if last[2] is not None else ""))
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for name, c in cs.items():
        ts = [p[0] for p in c["points"]]
        line, = ax.plot(ts, [p[1] for p in c["points"]], marker=".", label=f"{name} ({c['metric']}, T=1)")
        if any(p[2] is not None for p in c["points"]):
            ax.plot(ts, [p[2] for p in c["points"]], ls="--", color=line.get_color(), label=f"{name} (greedy, T=0)")
        if c["accept_len"]:
            ax2.plot([t for t, _ in c["accept_len"]], [a for _, a in c["accept_len"]], marker=".",
                     color=line.get_color(), label=name)
    ax.axhline(0.7, color="grey", lw=0.8, ls=":")
    for a in (ax, ax2):
        a.set_xscale("log")
        a.set_xlabel("training tokens seen")
        a.grid(alpha=0.3)
    ax.set_ylabel("held-out first-draft acceptance")
    ax2.set_ylabel("held-out expected accepted length (drafts per block)")
    ax.set_title("SmolLM2-135M drafters: acceptance against training tokens")
    ax.legend(fontsize=6)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("wrote", args.out, args.json)


if __name__ == "__main__":
    main()
