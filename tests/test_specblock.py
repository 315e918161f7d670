"""SpecBlock (smcsd/drafters/specblock.py): one block's proposal equals the cache-free reference, chained blocks start
from the previous block's last slot, `observe` keeps the anchor feature of the last committed position, `sd` /
`sd-multi` with a random SpecBlock drafter reproduce the enumerated p_T and `smc` its finite-N law, greedy `sd`
equals `ar`, save/load round-trips, training (valid-prefix mask, 0.8^k KL, chained blocks) learns, errors are clear."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_full
from smcsd.drafters import SpecBlockDrafter, initial_feed
from smcsd.drafters.specblock import reference_block_logits
from smcsd.runtime.engine import hidden_concat
from smcsd.sampling import SamplingParams
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2


def specblock(target, slots: int = 3, seed: int = 1):
    return SpecBlockDrafter.create(target, num_layers=2, block_size=slots, seed=seed, init_std=0.5)


def _hidden(target, d, seq):
    _, h = forward_full(target.config, target.params, jnp.asarray(seq, jnp.int32), hidden_layers=d.hidden_layers)
    return hidden_concat(h)


@pytest.mark.slow  # default-run budget
def test_cached_proposals_match_the_reference_across_chaining_and_observe():
    target, _ = tiny_pair(V, SEED)
    S = 3
    d = specblock(target, S)
    p = d.drafter_params()
    seq = jnp.asarray([[0, 1, 2, 0, 1, 3, 4, 2, 5, 1]], jnp.int32)
    hid = _hidden(target, d, seq)
    n = 4  # prompt x_0..x_3 committed; the pending token seq[4] sits at position 4
    sp = SamplingParams.make(1.0)
    state = d.init(p, seq[:, :n], jnp.asarray([n]), 32, 1, target_hidden=hid[:, :n])
    feed, cnt = initial_feed(seq[:, n])
    prop = d.propose(p, state, feed, cnt, jax.random.PRNGKey(0), sp, 2 * S)  # two chained blocks
    l1, raw1 = reference_block_logits(d, hid, n, seq[:, n], S)
    np.testing.assert_allclose(np.asarray(prop.logq[:, :S]), np.asarray(jax.nn.log_softmax(l1, -1)), atol=1e-5)
    l2, _ = reference_block_logits(d, hid, n, prop.tokens[:, S - 1], S, chain=(raw1[:, S - 1], S))
    np.testing.assert_allclose(np.asarray(prop.logq[:, S:]), np.asarray(jax.nn.log_softmax(l2, -1)), atol=1e-5)
    l2_other, _ = reference_block_logits(d, hid, n, (prop.tokens[:, S - 1] + 1) % V, S, chain=(raw1[:, S - 1], S))
    assert np.abs(np.asarray(l2_other - l2)).max() > 1e-3  # the chained block depends on the token drafted before it
    assert int(d.lengths(prop.state)[0]) == n + 2 * S
    # verification committed x_0 and one more token (num_valid = 2): the next block is anchored two positions on
    state = d.observe(p, prop.state, seq[:, n:n + 3], hid[:, n:n + 3], jnp.asarray([n]), jnp.asarray([2]))
    state = d.set_lengths(state, jnp.asarray([n + 2]))
    feed, cnt = initial_feed(seq[:, n + 2])
    prop = d.propose(p, state, feed, cnt, jax.random.PRNGKey(1), sp, S)
    ref, _ = reference_block_logits(d, hid, n + 2, seq[:, n + 2], S)
    np.testing.assert_allclose(np.asarray(prop.logq), np.asarray(jax.nn.log_softmax(ref, -1)), atol=1e-5)
    assert d.calls_per_proposal(S) == 1 and d.calls_per_proposal(S + 1) == 2


@pytest.mark.parametrize("method,setting,k", [
    ("sd", dict(temperature=1.0), 4),  # K = 4 > S = 3: two chained blocks per proposal
    pytest.param("sd-multi", dict(temperature=0.7, top_k=3), 2, marks=pytest.mark.slow),  # default-run budget
])
def test_specblock_is_exact(method, setting, k):
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3)
    counts = sample_counts(method, target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=84, num_speculative_tokens=k,
                           num_particles=3, **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, p, total_variation(counts, probs))


@pytest.mark.slow
def test_specblock_smc_matches_finite_n_law():
    """One SMC cycle (K = 1) with SpecBlock as the proposal follows the SIR law L_4 built from the enumerated p_T and
    the reference q (chi-square at N = 4, where L_4 is far from p_T)."""
    import test_smc as ts
    target, _ = ts._pair()
    d = specblock(target, 2, seed=3)
    conts = np.array(list(itertools.product(range(ts.V), repeat=ts.LENGTH)), np.int32)
    lq = np.zeros((len(conts), ts.LENGTH, ts.V))
    n = len(ts.PROMPT)
    firsts = np.arange(ts.V)
    seqs = np.concatenate([np.broadcast_to(np.asarray(ts.PROMPT), (ts.V, n)), firsts[:, None]], 1)
    logits, _ = reference_block_logits(d, _hidden(target, d, seqs), n, jnp.asarray(firsts), 1)
    lq[:, 1] = np.asarray(jax.nn.log_softmax(logits[:, 0], -1), np.float64)[conts[:, 0]]
    target_law, laws = ts.single_cycle_laws(ts.PROMPT, ts.LENGTH, (4,), lq=lq)
    out, _, _ = ts.smc_outputs(4, ts.LENGTH, 10_000, seed=92, draft=d)
    counts = ts.counts_of(out, ts.LENGTH)
    assert chi_square_pvalue(counts, laws[4]) > P_MIN
    assert 0.5 * np.abs(laws[4] - target_law).sum() > 0.05


@pytest.mark.slow  # default-run budget
def test_greedy_sd_equals_ar():
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    for method, k in (("sd", 5), ("sd-multi", 2)):
        res = smcsd.decode(prompts, draft=d, method=method, num_speculative_tokens=k, num_particles=2, **kw)
        assert res.tokens == ref, method
    res = smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=5, **kw)
    assert res.stats.num_draft_calls == 2 * res.stats.num_target_calls  # K = 5 > S = 3: two chained forwards


def test_save_load_round_trip(tmp_path):
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3)
    d.save(str(tmp_path / "sb"))
    e = SpecBlockDrafter.load(str(tmp_path / "sb"))
    assert e == d and e.num_params == d.num_params
    kw = dict(target=target, method="sd", max_new_tokens=8, num_speculative_tokens=3, seed=3, eos_id=[])
    assert smcsd.decode([[1, 2, 3]], draft=d, **kw).tokens == smcsd.decode([[1, 2, 3]], draft=e.bind(target),
                                                                           **kw).tokens
    from smcsd.drafters import DFlashDrafter
    with pytest.raises(ValueError, match="specblock"):
        DFlashDrafter.load(str(tmp_path / "sb"))
    with pytest.raises(ValueError, match="sd-tree|tree"):
        smcsd.decode([[1, 2, 3]], target=target, draft=d, method="sd-tree", max_new_tokens=4)


# ----------------------------------------------------------------------------- training

def _byte_setup():
    from smcsd.models import ByteTokenizer, ModelConfig, init_model
    from smcsd.train import TextCorpus
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    target = init_model(cfg, seed=3, tokenizer=tok, init_std=0.5, name="tiny-target")
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "def", "f(x):", "return", "x"]
    texts = [" ".join(rng.choice(words, size=30)) + "." for _ in range(40)]
    return target, TextCorpus(texts, tokenizer=tok, seq_len=32, batch_size=8)


@pytest.mark.slow  # default-run budget
def test_training_forward_matches_decode_reference():
    """Both blocks of every anchor in the training pass (shared context K/V, block-causal mask, chained block from
    slot M - 1 with the gold token) have the logits of the cache-free decode reference."""
    from smcsd.train.specblock import specblock_train_logits
    target, corpus = _byte_setup()
    d = SpecBlockDrafter.create(target, num_layers=2, block_size=3, seed=2, init_std=0.3)
    tokens = jnp.asarray(corpus.batch(0)[:2])
    hid = _hidden(target, d, tokens)
    anchors = jnp.asarray([[3, 10], [5, 20]], jnp.int32)
    chain = jnp.asarray([[1, 3], [2, 2]], jnp.int32)
    p = d.drafter_params()
    logits, labels, in_range, _ = specblock_train_logits(d.block_config, p["net"], p, tokens, hid, anchors, chain)
    for r in range(2):
        for a in range(2):
            at, m = int(anchors[r, a]), int(chain[r, a])
            ref1, raw1 = reference_block_logits(d, hid[r:r + 1], at, tokens[r:r + 1, at], 3)
            np.testing.assert_allclose(np.asarray(logits[r, a, 0]), np.asarray(ref1[0]), atol=2e-4)
            ref2, _ = reference_block_logits(d, hid[r:r + 1], at, tokens[r:r + 1, at + m], 3,
                                             chain=(raw1[:, m - 1], m))
            np.testing.assert_allclose(np.asarray(logits[r, a, 1]), np.asarray(ref2[0]), atol=2e-4)
            np.testing.assert_array_equal(np.asarray(labels[r, a, 0]), np.asarray(tokens[r, at + 1:at + 4]))
    assert bool(in_range.all())


def test_valid_prefix_masks():
    from smcsd.train.specblock import _masks
    # one anchor, S = 3: first block right, wrong, right; chained block (from M = 2) right, right, wrong
    top1 = jnp.asarray([[[[1, 2, 3], [4, 5, 6]]]])
    pred = jnp.asarray([[[[1, 0, 3], [4, 5, 0]]]])
    logits = jax.nn.one_hot(pred, 8) * 10
    ok = jnp.ones(top1.shape, bool)
    m, correct = _masks(logits, top1, ok, jnp.asarray([[2]]), True)
    np.testing.assert_array_equal(np.asarray(m[0, 0]), [[1, 1, 0], [0, 0, 0]])  # chain needs slots 0..1 right
    m, _ = _masks(logits, top1, ok, jnp.asarray([[1]]), True)
    np.testing.assert_array_equal(np.asarray(m[0, 0]), [[1, 1, 0], [1, 1, 1]])
    m, _ = _masks(logits, top1, ok, jnp.asarray([[1]]), False)
    assert float(m.sum()) == 6


@pytest.mark.slow  # default-run budget
@pytest.mark.parametrize("valid_prefix", [True, False])
def test_training_learns_the_target(tmp_path, valid_prefix):
    from smcsd.train import train_specblock
    target, corpus = _byte_setup()
    d = SpecBlockDrafter.create(target, num_layers=1, block_size=3, seed=0)
    res = train_specblock(target, d, corpus, steps=60, lr=3e-3, num_anchors=4, progress=False, eval_every=60,
                          valid_prefix=valid_prefix, out=str(tmp_path / "sb"))
    ev = res.history["eval"]
    assert ev[-1]["accept_len_k3"] > ev[0]["accept_len_k3"] + 0.1, ev
    assert ev[-1]["accept_len_k6"] >= ev[-1]["accept_len_k3"]
    e = SpecBlockDrafter.load(str(tmp_path / "sb")).bind(target)
    assert e.num_params == d.num_params


# ----------------------------------------------------------------------------- trees

def test_rank_tree_keeps_the_best_ancestor_closed_nodes():
    """Widths [2, 1, 3] at three depths, budget 5: the kept nodes are the 5 best by cumulative log q among the tree
    the widths allow, breadth-first, each with its parent kept; an impossible width (0) prunes the depth."""
    from smcsd.drafters.specblock import rank_tree
    V = 6
    rng = np.random.default_rng(0)
    lq = jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (1, 3, V)), jnp.float32), -1)
    width = jnp.asarray([[2, 1, 3]], jnp.int32)
    tokens, parents, depths, valid = (np.asarray(x[0]) for x in rank_tree(lq, width, 5, 6))
    lqn = np.asarray(lq[0])
    order = [np.argsort(-lqn[d]) for d in range(3)]
    paths = [(a,) for a in order[0][:2]]
    paths += [p + (b,) for p in paths[:2] for b in order[1][:1]]
    paths += [p + (c,) for p in paths[2:4] for c in order[2][:3]]
    score = {p: sum(lqn[d, t] for d, t in enumerate(p)) for p in paths}
    best = sorted(paths, key=lambda p: (-score[p], len(p)))[:5]
    got = []
    for m in range(5):
        assert valid[m]
        path, j = [], m
        while j >= 0:
            path.append(int(tokens[j]))
            assert parents[j] < j
            j = parents[j]
        got.append(tuple(reversed(path)))
        assert depths[m] == len(got[-1])
    assert sorted(got) == sorted(best)
    assert list(depths) == sorted(depths)  # breadth-first
    _, _, _, valid = rank_tree(lq, jnp.asarray([[1, 0, 3]], jnp.int32), 5, 6)
    assert int(np.asarray(valid).sum()) == 1  # width 0 at depth 2: only the depth-1 node is left


def _with_rank_head(d, seed=0, scale=3.0):
    from smcsd.drafters.specblock import init_rank_params
    rp = init_rank_params(d.block_config.model.hidden_size, seed, width=16)
    return d.with_rank_head({**rp, "w2": rp["w2"] * scale, "b2": jnp.asarray([0.5, 0.0, 0.2, -0.3])})


@pytest.mark.parametrize("tree", [
    pytest.param("rank:5x2", marks=pytest.mark.slow),  # default-run budget
    pytest.param("3,2:top", marks=pytest.mark.slow),  # a fixed top-k tree from the same block (default-run budget)
])
def test_specblock_trees_are_exact(tree):
    target, _ = tiny_pair(V, SEED)
    d = _with_rank_head(specblock(target, 3))
    counts = sample_counts("sd-tree", target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=85, tree=tree,
                           temperature=1.0)
    probs = exact_distribution(target, PROMPT, LENGTH, temperature=1.0)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (tree, p, total_variation(counts, probs))


@pytest.mark.slow  # default-run budget
def test_rank_trees_greedy_and_errors(tmp_path):
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=10, temperature=0.0, eos_id=[])
    with pytest.raises(ValueError, match="rank head"):
        smcsd.decode(prompts, draft=d, method="sd-tree", tree="rank:6x3", **kw)
    with pytest.raises(ValueError, match="rank-head tree|rank head"):
        smcsd.decode(prompts, draft=smcsd.drafters.DFlashDrafter.create(target, block_size=4), method="sd-tree",
                     tree="rank:6x3", **kw)
    with pytest.raises(ValueError, match="depth"):
        smcsd.decode(prompts, draft=_with_rank_head(d), method="sd-tree", tree="rank:6x4", **kw)
    with pytest.raises(ValueError, match="rank:<budget>x<depth>"):
        smcsd.TreeSpec.parse("rank:6")
    e = _with_rank_head(d)
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    assert smcsd.decode(prompts, draft=e, method="sd-tree", tree="rank:6x3", **kw).tokens == ref
    e.save(str(tmp_path / "sb"))
    f = SpecBlockDrafter.load(str(tmp_path / "sb")).bind(target)
    assert f.builds_rank_trees and not d.builds_rank_trees
    kw["temperature"] = 1.0
    assert (smcsd.decode(prompts, draft=e, method="sd-tree", tree="rank:6x3", seed=4, **kw).tokens
            == smcsd.decode(prompts, draft=f, method="sd-tree", tree="rank:6x3", seed=4, **kw).tokens)


@pytest.mark.slow  # default-run budget
def test_rank_head_training_learns_the_classes():
    """On the byte toy, a trained SpecBlock's rank classes are predictable from its confidence: the head beats
    always guessing the most frequent class on held-out anchors."""
    from smcsd.train import train_rank_head, train_specblock
    target, corpus = _byte_setup()
    d = SpecBlockDrafter.create(target, num_layers=1, block_size=3, seed=0)
    trained = SpecBlockDrafter(d.block_config, train_specblock(target, d, corpus, steps=40, lr=3e-3, num_anchors=4,
                                                               progress=False).params).bind(target)
    res, e = train_rank_head(target, trained, corpus, steps=80, lr=3e-3, num_anchors=4, width=32, progress=False,
                             eval_every=80)
    ev = res.history["eval"][-1]
    majority = max(ev["class0"], ev["class3"], 1 - ev["class0"] - ev["class3"])  # a bound on any single class share
    assert ev["acc"] > ev["class0"] and ev["acc"] > 0.5, ev
    assert ev["acc"] >= majority - 0.05 and ev["ce"] < res.history["eval"][0]["ce"], ev
    assert e.builds_rank_trees


# ----------------------------------------------------------------------------- online adaptation (opt-in)

def test_online_adaptation_bandit_and_update_rule():
    """feedback(): a row starts as if its last cycle skipped, so the first feedback picks the untried 'update' arm
    and moves the logit bias by lr * sum_{k <= n} (p_k - q_k) (live rows only); the next feedback books that arm's
    reward (tokens committed / (1 + cost)) in its discounted sums."""
    from smcsd.drafters import OnlineAdapt
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3).adaptive(OnlineAdapt(lr=0.5, cost=0.1))
    p_ = d.drafter_params()
    seq = jnp.asarray([[0, 1, 2, 0, 1], [3, 4, 3, 2, 1]], jnp.int32)
    state = d.init(p_, seq, jnp.asarray([5, 5]), 16, 1, target_hidden=_hidden(target, d, seq))
    rng = np.random.default_rng(0)
    p = jax.nn.softmax(jnp.asarray(rng.normal(size=(2, 3, V)), jnp.float32), -1)
    q = jax.nn.softmax(jnp.asarray(rng.normal(size=(2, 2, V)), jnp.float32), -1)
    n_acc, live = jnp.asarray([1, 2]), jnp.asarray([True, False])
    s1 = d.feedback(state, p, q, n_acc, live)
    np.testing.assert_array_equal(np.asarray(s1[1]["arm"]), [1, 0])  # row 1 is not live: unchanged
    np.testing.assert_allclose(np.asarray(s1[1]["bias"][0]), 0.5 * np.asarray((p[0, :2] - q[0]).sum(0)), atol=1e-6)
    assert float(jnp.abs(s1[1]["bias"][1]).max()) == 0.0
    s2 = d.feedback(s1, p, q, n_acc, live)
    np.testing.assert_allclose(np.asarray(s2[1]["n"][0]), [0.95, 1.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(s2[1]["s"][0]), [0.95 * 2, 2 / 1.1], atol=1e-5)
    with pytest.raises(ValueError, match="discount"):
        OnlineAdapt(discount=0.0)
    with pytest.raises(TypeError, match="OnlineAdapt"):
        specblock(target, 3).adaptive(0.5)


@pytest.mark.slow  # default-run budget
def test_online_adaptation_keeps_sd_exact():
    """The bias depends only on past cycles and every proposal reports the q it used, so `sd` stays exact with
    adaptation on (a large lr, so the bias really moves q within the 3 tokens)."""
    from smcsd.drafters import OnlineAdapt
    target, _ = tiny_pair(V, SEED)
    d = specblock(target, 3).adaptive(OnlineAdapt(lr=5.0, cost=0.0, explore=0.0))
    counts = sample_counts("sd", target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=86, num_speculative_tokens=1,
                           temperature=1.0)
    probs = exact_distribution(target, PROMPT, LENGTH, temperature=1.0)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (p, total_variation(counts, probs))
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=12, temperature=0.0, eos_id=[])
    assert (smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=3, **kw).tokens
            == smcsd.decode(prompts, method="ar", **kw).tokens)
