"""The self-distillation corpus builder (smcsd.train.corpus): continuous-batching generation is the target's own
sampler, a build resumes exactly after a kill, the split is by request, and bad input gets clear errors."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

import smcsd
from smcsd.train.corpus import BuildSettings, SelfDistilledCorpus, build_corpus, generate
from toys import chi_square_pvalue, exact_distribution, tiny_pair

TINY = BuildSettings(batch_size=4, shard_jobs=6, max_new_tokens=10, max_prompt_tokens=160, self_instruct=5,
                     self_instruct_max_new=8, follow_up_every=2, heldout_per_mille=250, prefill_rows=2, chunk=4)
REQUESTS = [f"def f{i}(x):" for i in range(20)] + [f"class C{i}:" for i in range(10)]


@pytest.fixture(scope="module")
def code_target():
    target, _ = smcsd.load("tiny-code")
    return target


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_greedy_generation_equals_ar(code_target):
    """Slots refilled mid-batch (7 requests, 3 slots, prefilled 2 at a time) give decode(method='ar')'s tokens."""
    tok = code_target.tokenizer
    reqs = [tok.encode(s) for s in ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [i for i in",
                                    "# compute the", "for k, v in d.items():", "while True:"]]
    answers, finished = generate(code_target, reqs, keys=list(range(7)), temperatures=[0.0] * 7, max_new_tokens=20,
                                 stop_ids=[tok.eos_id], batch_size=3, prefill_rows=2, chunk=4)
    ref = smcsd.decode(reqs, target=code_target, method="ar", temperature=0.0, max_new_tokens=20)
    assert [a.tolist() for a in answers] == [list(r) for r in ref.tokens]
    assert finished == [bool(len(r) and r[-1] == tok.eos_id) for r in ref.tokens]


def test_sampled_generation_is_the_target_distribution():
    """Two-token continuations of a toy target at T=0.8: 3000 draws (3 slots, refilled) against the exact p_T.
    A chi-square goodness-of-fit p-value below 1e-3 would reject; a correct sampler fails this one time in 1000."""
    target, _ = tiny_pair()
    V, n = target.config.vocab_size, 3000
    answers, _ = generate(target, [[1, 2]] * n, keys=list(range(n)), temperatures=[0.8] * n, max_new_tokens=2,
                          stop_ids=[], batch_size=64, prefill_rows=16, chunk=2)
    idx = np.array([a[0] * V + a[1] for a in answers])
    counts = np.bincount(idx, minlength=V * V)
    assert chi_square_pvalue(counts, exact_distribution(target, [1, 2], 2, temperature=0.8)) > 1e-3


def _arrays(path):
    out = {}
    for p in sorted(glob.glob(os.path.join(path, "shards", "*.npz"))):
        with np.load(p) as z:
            out[os.path.basename(p)] = {k: z[k] for k in z.files}
    return out


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_build_resumes_exactly_after_a_kill(code_target, tmp_path):
    full = build_corpus(code_target, str(tmp_path / "full"), TINY, requests=REQUESTS, progress=False, log=lambda m: None)
    part = str(tmp_path / "part")
    build_corpus(code_target, part, TINY, requests=REQUESTS, max_shards=2, progress=False, log=lambda m: None)
    # a kill between writing a shard and the manifest: the shard is on disk, the manifest does not list it yet
    build_corpus(code_target, part, TINY, requests=REQUESTS, max_shards=1, progress=False, log=lambda m: None)
    with open(os.path.join(part, "manifest.json")) as f:
        m = json.load(f)
    m["shards"] = m["shards"][:-1]
    with open(os.path.join(part, "manifest.json"), "w") as f:
        json.dump(m, f)
    for tmp in ("chat-00002.npz.0.tmp.npz", "chat-00002.npz.tmp.npz"):  # killed writes (this and older versions)
        open(os.path.join(part, "shards", tmp), "wb").write(b"half-written")
    resumed = build_corpus(code_target, part, TINY, requests=REQUESTS, progress=False, log=lambda m: None)
    a, b = _arrays(str(tmp_path / "full")), _arrays(part)
    assert a.keys() == b.keys() and len(a) >= 5
    for name in a:
        for k in a[name]:
            np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name}:{k}")
    assert resumed["totals"]["answer_tokens"] == full["totals"]["answer_tokens"] > 0
    assert [e["name"] for e in resumed["shards"]] == [e["name"] for e in full["shards"]]


def test_split_is_by_request_and_loader_checks_tokenizer(code_target, tmp_path):
    build_corpus(code_target, str(tmp_path), TINY, requests=REQUESTS, progress=False, log=lambda m: None)
    c = SelfDistilledCorpus(str(tmp_path), code_target.tokenizer)
    train = {json.dumps(x["messages"][0]) for x in c.conversations("train")}
    held = {json.dumps(x["messages"][0]) for x in c.conversations("heldout")}
    assert train and held and not train & held
    freq = c.answer_frequencies(code_target.config.vocab_size)
    assert freq.sum() == c.describe()["train_answer_tokens"]
    # answer-only loss masks: True exactly on the answer tokens, aligned with the documents; the held-out rows of
    # token_corpus(loss_on="answers") measure the held-out answers alone
    docs, masks = c.documents("train", include_text=False, with_masks=True)
    convs = c.conversations("train")
    assert len(docs) == len(masks) == len(convs)
    for doc, m, conv in zip(docs, masks, convs):
        assert len(m) == len(doc) and m.sum() == len(conv["answer"]) and m[-len(conv["answer"]):].all()
        np.testing.assert_array_equal(doc[m], conv["answer"])
    from smcsd.train.eagle import token_corpus
    tc = token_corpus(c, seq_len=16, batch_size=2, include_text=False, loss_on="answers")
    held_answer = sum(len(x["answer"]) for x in c.conversations("heldout"))
    assert 0 < tc.heldout_masks.sum() <= held_answer < tc.heldout_masks.size
    with pytest.raises(ValueError, match="loss_on must be"):
        token_corpus(c, seq_len=16, batch_size=2, loss_on="prompts")
    other = smcsd.load("tiny-arith")[0].tokenizer
    if other.encode("x = 1") == code_target.tokenizer.encode("x = 1"):  # both byte-level: fake another tokenizer
        class Other:
            vocab_size, bos_id, eos_id = 999, 1, 2

            def encode(self, text):
                return [3]
        other = Other()
    with pytest.raises(ValueError, match="another tokenizer"):
        SelfDistilledCorpus(str(tmp_path), other)


def test_bad_input_is_a_clear_error(code_target, tmp_path):
    with pytest.raises(ValueError, match="requests is empty"):
        build_corpus(code_target, str(tmp_path / "a"), TINY, requests=[], progress=False)
    with pytest.raises(ValueError, match="duplicates requests"):
        build_corpus(code_target, str(tmp_path / "b"), TINY, requests=["def f():", "def  F():"], progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        BuildSettings(batch_size=0)
    build_corpus(code_target, str(tmp_path / "c"), TINY, requests=REQUESTS, max_shards=1, progress=False,
                 log=lambda m: None)
    with pytest.raises(ValueError, match="another settings"):
        build_corpus(code_target, str(tmp_path / "c"), BuildSettings(batch_size=8), requests=REQUESTS, progress=False)
    with pytest.raises(ValueError, match="requests is empty"):
        generate(code_target, [], keys=[], temperatures=[], max_new_tokens=4, stop_ids=[])
