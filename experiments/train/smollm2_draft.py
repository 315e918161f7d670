"""The shipped AR drafter for SmolLM2-135M-Instruct: a small model with the target's tokenizer, distilled from the
target (KL to its top-k log-probs + CE) on a corpus this project generates, exported to
`models/shipped/smollm2-135m/drafters/ar-distilled/` (bfloat16 storage, <= 40 MB).

    python -m experiments.train.smollm2_draft gen-chat            # the target's own answers to varied chat prompts
    python -m experiments.train.smollm2_draft train --steps 900   # distil (resumable: add --resume after a kill)

Corpus: Python standard-library source (this interpreter's, a fixed selection by size) followed by the chat
transcripts (`experiments/data/smollm2_chat.jsonl`: prompt + the target's sampled answer at T=0.7, rendered with
its chat template), so the held-out tail is chat text — what the drafter serves. The teacher's top-k log-probs
are cached (float16) under `--cache-dir`, so epochs after the first and resumed runs do not rerun the target.

Initialisation: the drafter's tied embedding / LM head starts from the target's embedding projected on its top
`hidden` singular directions (U·S of the SVD, rescaled to the random init's standard deviation so the first
logits are small), so the drafter starts with the target's token geometry; the layers start random.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sysconfig
import time

from experiments import report
from experiments.common import CHECKPOINTS, CURVES, DATA, SHIPPED


CHAT_FILE = os.path.join(DATA, "smollm2_chat.jsonl")
OUT = os.path.join(SHIPPED, "smollm2-135m", "drafters", "ar-distilled")

TOPICS = ["the water cycle", "photosynthesis", "black holes", "the French Revolution", "compound interest",
          "machine learning", "the immune system", "climate change", "volcanoes", "the Roman Empire",
          "electric cars", "sleep", "coffee", "honey bees", "the internet", "recycling", "the moon landing",
          "vaccines", "earthquakes", "public speaking", "time management", "gardening", "chess", "jazz music",
          "the stock market", "renewable energy", "ancient Egypt", "the human brain", "rainbows", "tea"]
TASKS = ["Explain {t} to a ten-year-old.", "Give me three interesting facts about {t}.",
         "Write a short paragraph about {t}.", "What are the pros and cons of {t}?",
         "Write a haiku about {t}.", "Summarise what {t} is in two sentences.",
         "Write a short story that involves {t}.", "List five questions a student might ask about {t}."]
CODE_TASKS = ["Write a Python function that reverses a string.", "Write a Python function to check if a number is prime.",
              "How do I read a CSV file in Python?", "Write a Python class for a simple bank account.",
              "Explain list comprehensions in Python with an example.", "Write a function that merges two sorted lists.",
              "How do I sort a dictionary by value in Python?", "Write a Python script that counts words in a file.",
              "What is the difference between a list and a tuple in Python?", "Write a recursive factorial function.",
              "Write a Python function that returns the n-th Fibonacci number.", "How do I handle exceptions in Python?",
              "Write a function that removes duplicates from a list while keeping order.",
              "Explain what a decorator is in Python with an example.", "Write a binary search function in Python.",
              "How do I make an HTTP request in Python?"]


def chat_prompts() -> list[str]:
    prompts = [task.format(t=t) for t, task in itertools.product(TOPICS, TASKS)]
    return prompts + CODE_TASKS


def gen_chat(args) -> None:
    import smcsd
    target, _ = smcsd.load("smollm2-135m")
    prompts = chat_prompts()[: args.limit]
    t0 = time.time()
    done = set()
    if os.path.exists(CHAT_FILE):
        with open(CHAT_FILE) as f:
            done = {json.loads(line)["prompt"] for line in f}
    todo = [p for p in prompts if p not in done]
    with open(CHAT_FILE, "a") as f:
        for i in range(0, len(todo), args.batch):
            batch = todo[i:i + args.batch]
            res = smcsd.decode(messages=[[{"role": "user", "content": p}] for p in batch], target=target,
                               method="ar", temperature=0.7, max_new_tokens=args.max_new_tokens, seed=i)
            for p, text in zip(batch, res.texts):
                f.write(json.dumps({"prompt": p, "answer": text.strip()}) + "\n")
            f.flush()
            print(f"{i + len(batch)}/{len(todo)} answers ({time.time() - t0:.0f}s)", flush=True)


def code_texts(max_bytes: int) -> list[str]:
    """A fixed selection of stdlib .py files (sorted by path), up to `max_bytes` of source."""
    root = sysconfig.get_paths()["stdlib"]
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__",
                                                               "test", "tests", "idlelib", "lib2to3"))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name.endswith(".py") and 2_000 < os.path.getsize(path) < 60_000:
                with open(path, encoding="utf-8", errors="replace") as f:
                    out.append(f.read())
                total += len(out[-1])
                if total >= max_bytes:
                    return out
    return out


def train(args) -> None:
    import jax.numpy as jnp
    import numpy as np

    import smcsd
    from smcsd.models import LanguageModel, init_model
    from smcsd.train import TextCorpus
    from smcsd.train.loop import distill_ar_drafter, draft_config_for

    target, _ = smcsd.load("smollm2-135m", dtype="float32")
    tok = target.tokenizer
    with open(CHAT_FILE) as f:
        chats = [json.loads(line) for line in f]
    chat_texts = [tok.apply_chat_template([{"role": "user", "content": c["prompt"]},
                                           {"role": "assistant", "content": c["answer"]}], tokenize=False,
                                          add_generation_prompt=False) for c in chats]
    texts = code_texts(args.code_bytes) + chat_texts
    corpus = TextCorpus(texts, tokenizer=tok, seq_len=args.seq_len, batch_size=args.batch_size,
                        heldout_frac=args.heldout_frac, seed=0)
    print(f"corpus: {corpus.num_tokens} tokens ({len(texts) - len(chat_texts)} code files, {len(chat_texts)} chats)",
          flush=True)
    config = draft_config_for(target.config, hidden=args.hidden, layers=args.layers, heads=args.heads,
                              kv_heads=args.kv_heads, intermediate=args.intermediate)
    params = init_model(config, seed=0).params
    emb = np.asarray(target.params["embed_tokens"]["embedding"], np.float32)  # [V, 576]
    u, s, _ = np.linalg.svd(emb, full_matrices=False)
    proj = u[:, :args.hidden] * s[:args.hidden]  # the target's token geometry on its top directions ...
    init_std = float(np.std(np.asarray(params["embed_tokens"]["embedding"])))
    params["embed_tokens"]["embedding"] = jnp.asarray(proj * (init_std / proj.std()), jnp.float32)  # ... at init scale
    draft = LanguageModel(config=config, params=params, tokenizer=tok, name="smollm2-135m/ar-distilled")
    command = report.command(__file__)  # with the subcommand
    res = distill_ar_drafter(target, draft, corpus, steps=args.steps, lr=args.lr, topk=args.topk,
                             cache_dir=args.cache_dir, ckpt_dir=args.ckpt_dir, resume=args.resume,
                             overwrite=args.overwrite, out=args.out, export_dtype="bfloat16",
                             eval_every=args.eval_every, ckpt_every=args.ckpt_every, eval_rows=args.eval_rows,
                             curves_path=os.path.join(CURVES, "smollm2-ar-distilled"),
                             stop_after=args.stop_after, command=command)
    h = res.history
    print(json.dumps(h["eval"][-1] if h["eval"] else {}, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-chat")
    g.add_argument("--limit", type=int, default=None)
    g.add_argument("--batch", type=int, default=16)
    g.add_argument("--max-new-tokens", type=int, default=160)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=900)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--layers", type=int, default=3)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--kv-heads", type=int, default=2)
    t.add_argument("--intermediate", type=int, default=768)
    t.add_argument("--topk", type=int, default=64)
    t.add_argument("--code-bytes", type=int, default=900_000)
    t.add_argument("--heldout-frac", type=float, default=0.04)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--eval-rows", type=int, default=32)
    t.add_argument("--ckpt-every", type=int, default=50)
    t.add_argument("--stop-after", type=int, default=None)
    t.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/smcsd/teacher"))
    t.add_argument("--ckpt-dir", default=os.path.join(CHECKPOINTS, "smollm2-ar-distilled"))
    t.add_argument("--out", default=OUT)
    t.add_argument("--resume", action="store_true")
    t.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    (gen_chat if args.cmd == "gen-chat" else train)(args)


if __name__ == "__main__":
    main()
