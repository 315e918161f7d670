"""The corpus card (docs/corpus.md): sources, sizes, settings, build commands and wall time of a self-distillation
corpus, read from its manifest (nothing is regenerated).

    python -m experiments.docs.corpus_card [--corpus experiments/data/corpus/smollm2-135m] [--out docs/corpus.md]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from experiments.common import CORPUS, DOCS, REPO



# Commands recorded before the experiments became a package name the script's old path; the card shows the module
# that runs the same code now (the manifest keeps them as they ran).
_OLD_SCRIPTS = {"python experiments/build_corpus.py": "python -m experiments.train.build_corpus"}


def as_module_command(command: str) -> str:
    for old, new in _OLD_SCRIPTS.items():
        if command == old or command.startswith(old + " "):
            return new + command[len(old):]
    return command


def card(path: str) -> str:
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    text = {}
    if os.path.exists(os.path.join(path, "text.json")):
        with open(os.path.join(path, "text.json")) as f:
            text = json.load(f)
    phases: dict = {}
    for e in m["shards"]:
        p = phases.setdefault(e["phase"], {"shards": 0, "jobs": 0, "answer_tokens": 0, "prompt_tokens": 0,
                                           "finished": 0, "heldout": 0, "wall_s": 0.0})
        for k in ("jobs", "answer_tokens", "prompt_tokens", "finished", "heldout"):
            p[k] += e[k]
        p["shards"] += 1
        p["wall_s"] += e["wall_s"] or 0.0
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**", "*.npz"), recursive=True))
    t = m["totals"]
    rel = os.path.relpath(path, REPO)
    lines = [
        f"# Corpus card: `{rel}`", "",
        f"The self-distillation corpus of **{m['target']['name']}** (params fingerprint `{m['target']['fingerprint']}`, "
        f"tokenizer `{m['tokenizer']}`), built by `smcsd.train.corpus.build_corpus` "
        "(`experiments/train/build_corpus.py`; the format and phases are in that module's docstring). "
        "Generated here, on 2 CPU cores; resumable and exact under resume, so each session extends it.", "",
        "## Sizes", "",
        "| phase | shards | conversations | answer tokens | prompt tokens | stopped by itself | held out | wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("self-instruct", "chat", "follow-up"):
        if name in phases:
            p = phases[name]
            lines.append(f"| {name} | {p['shards']} | {p['jobs']:,} | {p['answer_tokens']:,} | {p['prompt_tokens']:,} | "
                         f"{p['finished'] / max(p['jobs'], 1):.0%} | {p['heldout']} | {p['wall_s'] / 3600:.2f} h |")
    lines.append(f"| **all generated** | {len(m['shards'])} | {t['conversations']:,} | {t['answer_tokens']:,} | "
                 f"{t['prompt_tokens']:,} | | | {t['wall_s'] / 3600:.2f} h |")
    if text:
        lines.append(f"| teacher-forced local text | {text['shards']} | {text['documents']:,} documents | "
                     f"{text['tokens']:,} ({text['code_tokens']:,} code, {text['prose_tokens']:,} prose) | | | | "
                     f"{text['wall_s']:.0f} s |")
    total = t["answer_tokens"] + t["prompt_tokens"] + text.get("tokens", 0)
    lines += ["", f"All tokens: **{total:,}**; on disk {size / 1e6:.1f} MB (compressed uint16 ids).", "",
              "Targets of issue 33: >= 1.5M generated answer tokens, >= 5M tokens in all; the build continues "
              "from the first missing shard each session.", "",
              "## Sources", "",
              "- **chat**: one-turn requests from `smcsd.train.prompts`: topic x task x style templates "
              "(8 topic groups, 50 task templates, 10 style modifiers), requests about real standard-library "
              "functions (names and docstrings read with `inspect`), and the requests the target wrote itself "
              "(self-instruct), de-duplicated; answered with the chat template at T=0.7, every 5th greedily "
              "(by the request's hash), stopping at the end of turn or 192 tokens;",
              "- **self-instruct**: the target asked to write a user request about a topic (T=0.9, <= 48 tokens); "
              "the cleaned, finished ones join the chat pool;",
              "- **follow-up**: a second user turn (\"Can you give me an example?\", ...) after one in three "
              "finished conversations of the four chat shards before it;",
              "- **local text**: this interpreter's standard-library source (code) and offline package "
              "documentation plus pydoc renderings of common modules (prose), de-duplicated by content.",
              "- **split**: by request (stable hash, 2 %): a held-out request and every conversation grown from it "
              "are held out; the benchmark prompts of `experiments/bench/smollm2_pair.py` are excluded from the pool.",
              "", "## Settings", "", "```json", json.dumps(m["settings"], indent=1), "```", "",
              "## Build commands", ""]
    lines += [f"- `{as_module_command(c)}`" for c in m.get("commands", [])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--out", default=os.path.join(DOCS, "corpus.md"))
    args = ap.parse_args(argv)
    text = card(args.corpus)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
