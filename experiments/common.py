"""What the experiment scripts share besides reporting: where the repository's folders are, and the prompts the
benchmarks and studies decode (one copy, so every script measures on the same requests and the corpus builder can
keep them out of training).

Only the standard library is imported at module level (numpy and the tiny pairs' data inside `prompts_for`), so the
peer interpreters of bench/real.py and bench/lookup.py, which may lack jax, can import it too.
"""

from __future__ import annotations

import os

PACKAGE = os.path.dirname(os.path.abspath(__file__))  # experiments/
REPO = os.path.dirname(PACKAGE)
RESULTS = os.path.join(PACKAGE, "results")
DATA = os.path.join(PACKAGE, "data")
CORPUS = os.path.join(DATA, "corpus", "smollm2-135m")  # the SmolLM2 self-distillation corpus (train/build_corpus.py)
CURVES = os.path.join(RESULTS, "train")  # training histories, one <tag>.json (+ .png) per run
SHIPPED = os.path.join(REPO, "models", "shipped")  # the pairs and drafters the package ships
CHECKPOINTS = os.path.join(REPO, "checkpoints")  # training checkpoints (not shipped)
DOCS = os.path.join(REPO, "docs")

# Chat requests for SmolLM2, outside the topics and task templates of experiments/data/smollm2_chat.jsonl (the AR
# drafter's corpus) and kept out of the self-distillation corpus. The SmolLM2 pair benchmark and the fidelity study
# use the first six (their recorded results did), the drafter studies all eight.
CHAT_PROMPTS = [
    "Describe how a bicycle works.", "What should I pack for a weekend camping trip?",
    "Write a short poem about autumn leaves.", "Explain why the sky is blue.",
    "Give me tips for learning a new language.", "Write a Python function that returns the largest element of a list.",
    "How does a refrigerator keep food cold?", "Write a limerick about a cat who loves boxes.",
]
BENCH_PROMPTS = CHAT_PROMPTS[:6]

# A ~300-token passage for long prompts (summarise it, repeat it, edit it): bench/real.py, peers.py, lookup.py.
PASSAGE = (
    "The lighthouse at the end of the harbour was built in 1871, when the town still lived from fishing and "
    "the small trade in salt and timber that came down the river. Its keeper, a widower named Thomas Hale, "
    "kept a logbook for thirty-two years in which he wrote down the weather, the ships that passed, and the "
    "names of the men who did not come back. The logbook survives in the town museum. It shows how the "
    "harbour changed: steam replaced sail in the 1880s, the fishing fleet shrank after the great storm of "
    "1894, and by the turn of the century most of the traffic was coal for the new railway. Hale himself "
    "rarely comments on these changes. He records the price of lamp oil, the repairs to the lens, and the "
    "visits of the inspector, who came every spring and always found something to criticise. Only once, in "
    "the winter of 1899, does he write at length: a schooner ran aground on the northern reef, and Hale rowed "
    "out with two fishermen to take off the crew. All seven were saved. The town gave him a silver watch, "
    "which he mentions in a single line, and the next day's entry is about the wind again.")


def chat_prompts(target, messages) -> list[list[int]]:
    """Token ids of each user message as one chat turn, under the target's chat template, ready to answer."""
    tok = target.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True)
            for m in messages]


def prompts_for(pair: str, target, n: int, prompt_tokens: int, seed: int = 99) -> list[list[int]]:
    """`n` prompts outside the pair's training data: SmolLM2 the chat prompts above (cycled), tiny-code windows of
    `prompt_tokens` bytes from the held-out standard-library files (drawn with `seed`)."""
    if pair == "smollm2-135m":
        return chat_prompts(target, (CHAT_PROMPTS * (n // len(CHAT_PROMPTS) + 1))[:n])
    import numpy as np

    from experiments import code_data
    data = code_data.CodeData(prompt_tokens)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data.heldout) - prompt_tokens, n)
    return [[code_data.BOS] + data.heldout[s:s + prompt_tokens].tolist() for s in starts]


def heldout_chat_prompts(corpus_dir: str, target) -> list[list[int]]:
    """The held-out chat requests of a self-distillation corpus (prompts no training split contains), rendered with
    the target's chat template."""
    from smcsd.train.corpus import SelfDistilledCorpus
    reqs = SelfDistilledCorpus(corpus_dir, target.tokenizer).heldout_requests(("chat",))
    return [target.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in reqs]


def pair_prompts(pair: str, target, count: int, quality: bool = False):
    """(prompt token lists, stop ids, arith problems or None) of a pair's evaluation requests: tiny-arith's test
    problems, else `prompts_for`'s (32-byte code windows; a different draw for quality than for speed)."""
    if pair == "tiny-arith":
        from experiments import arith_data
        probs = arith_data.test_set()[:count]
        return [target.tokenizer.encode(p.question) for p in probs], None, probs
    prompts = prompts_for(pair, target, count, 32, seed=123 if quality else 99)
    return prompts, (list(target.tokenizer.end_of_turn_ids) if pair == "smollm2-135m" else None), None
