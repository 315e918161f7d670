"""Build (or resume) tiny-code's self-distillation corpus: the target's own continuations of windows of its training
files, the text a drafter meets in `sd` (issue 33, item 6).

    python -m experiments.train.code_continuations                       # 16 shards x 512 (~4.2M tokens), ~20 min
    python -m experiments.train.code_continuations --shards 2 --out /tmp/cc   # a small one

Each document is [BOS] + --prompt-bytes bytes of a random window of the training files (`code_data.CodeData.train`;
the held-out files stay out) + the target's continuation of --new-tokens bytes (greedy, or sampled at
--temperature), cut after the target's EOS, so a document is at most 1 + prompt + new tokens long. Shard i draws its
windows with `numpy.random.default_rng([seed, i])` and decodes them in one batch, so the shards do not depend on one
another: kill the build at any time and the same command resumes at the first missing shard and reproduces the
uninterrupted corpus. A held-out shard (`heldout.npz`, --heldout windows of the held-out files, drawn with another
seed than the studies' prompts) measures the drafter during training.

Stored compactly in --out: `shard-NNNN.npz` / `heldout.npz` (uint16 token ids, compressed, with each document's
prompt length), and `build.json` (the command, settings, the target's fingerprint, wall time per shard).
`load_continuations(dir)` returns the documents; `experiments.train.block_drafter --continuations DIR` trains on them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "corpus",
                           "tiny-code-greedy")
HELDOUT_SEED = 7  # not the studies' prompt seed (99): the held-out shard and the decoded studies draw other windows


def _windows(stream: np.ndarray, rng, count: int, prompt_bytes: int, bos: int) -> list[list[int]]:
    starts = rng.integers(0, len(stream) - prompt_bytes, count)
    return [[bos] + stream[s:s + prompt_bytes].tolist() for s in starts]


def _save(path: str, docs: list[list[int]], prompt_len: int) -> None:
    lens = np.array([len(d) for d in docs], np.int32)
    flat = np.concatenate([np.asarray(d, np.uint16) for d in docs])
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, tokens=flat, lengths=lens, prompt_len=np.int32(prompt_len))
    os.replace(tmp, path)  # atomic: a kill never leaves a half-written shard under the final name


def _load(path: str) -> list[np.ndarray]:
    with np.load(path) as z:
        flat, lens = z["tokens"].astype(np.int32), z["lengths"]
    return np.split(flat, np.cumsum(lens)[:-1])


def load_continuations(path: str, max_shards: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(training documents, held-out documents) of a corpus built by this script (arrays of token ids)."""
    if not os.path.isfile(os.path.join(path, "build.json")):
        raise ValueError(f"{path} has no build.json: build it with `python -m experiments.train.code_continuations "
                         f"--out {path}`")
    names = sorted(f for f in os.listdir(path) if f.startswith("shard-") and f.endswith(".npz"))
    if max_shards is not None:
        names = names[:max_shards]
    if not names:
        raise ValueError(f"{path} holds no shards yet")
    train = [d for n in names for d in _load(os.path.join(path, n))]
    held = _load(os.path.join(path, "heldout.npz")) if os.path.exists(os.path.join(path, "heldout.npz")) else []
    return train, held


def continuations_corpus(paths, *, seq_len: int, batch_size: int, max_tokens: int | None = None,
                         heldout_frac: float = 0.05):
    """A `TokenCorpus` of the continuations in the directories `paths` (mixed, in order), measured on their held-out
    shards (without any, the last `heldout_frac` of the rows)."""
    from smcsd.train.eagle import TokenCorpus
    train, held = [], []
    for path in paths:
        t, h = load_continuations(path)
        train, held = train + t, held + h
    return TokenCorpus(train, seq_len=seq_len, batch_size=batch_size, heldout_documents=held or None,
                       heldout_frac=heldout_frac, max_tokens=max_tokens, seed=0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=512, help="documents per shard (one decode batch)")
    ap.add_argument("--prompt-bytes", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=191, help="continuation length (1 + prompt + new = 256)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--heldout", type=int, default=256, help="held-out documents (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("shards", "shard_size", "prompt_bytes", "new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.heldout < 0 or args.temperature < 0:
        ap.error("--heldout and --temperature must be >= 0")

    import smcsd
    from experiments import code_data

    os.makedirs(args.out, exist_ok=True)
    target, _ = smcsd.load("tiny-code", drafter="ar")
    from smcsd.train import params_fingerprint
    fingerprint = params_fingerprint(target.params)
    settings = {k: getattr(args, k) for k in ("shard_size", "prompt_bytes", "new_tokens", "temperature", "seed")}
    meta_path = os.path.join(args.out, "build.json")
    meta = {"recipe": "tiny-code continuations", "settings": settings, "target_fingerprint": fingerprint,
            "shards": {}}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            old = json.load(f)
        if old["settings"] != settings or old.get("target_fingerprint") != fingerprint:
            raise SystemExit(f"{args.out} was built with other settings or another target ({old['settings']}); "
                             "pass another --out")
        meta = old
    meta["command"] = "python -m experiments.train.code_continuations " + " ".join(
        sys.argv[1:] if argv is None else argv)
    data = code_data.CodeData(args.prompt_bytes)
    stop = [code_data.EOS]

    def run(name, stream, rng, count):
        path = os.path.join(args.out, name)
        if os.path.exists(path):
            return
        t = time.time()
        prompts = _windows(stream, rng, count, args.prompt_bytes, code_data.BOS)
        res = smcsd.decode(prompts, target=target, method="ar", max_new_tokens=args.new_tokens,
                           temperature=args.temperature, seed=int(rng.integers(2**31)), eos_id=stop)
        docs = [p + list(map(int, c)) for p, c in zip(prompts, res.tokens)]
        _save(path, docs, 1 + args.prompt_bytes)
        meta["shards"][name] = {"documents": len(docs), "tokens": int(sum(map(len, docs))),
                                "wall_s": round(time.time() - t, 1)}
        with open(meta_path + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(meta_path + ".tmp", meta_path)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {len(docs)} documents, {meta['shards'][name]['tokens']} tokens, "
              f"{meta['shards'][name]['wall_s']} s", flush=True)

    if args.heldout:
        run("heldout.npz", data.heldout, np.random.default_rng([HELDOUT_SEED, args.seed]), args.heldout)
    for i in range(args.shards):
        run(f"shard-{i:04d}.npz", data.train, np.random.default_rng([args.seed, i]), args.shard_size)
    total = sum(s["tokens"] for k, s in meta["shards"].items() if k.startswith("shard-"))
    print(f"done: {args.shards} shards, {total} training tokens in {args.out}", flush=True)


if __name__ == "__main__":
    main()
