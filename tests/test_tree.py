"""Token trees: the tree-masked cached forward against the plain causal forward of every root-to-node path,
ancestor masks, and compaction of an accepted path's keys/values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smcsd.models import ancestor_mask, forward_cached, forward_full, forward_tree, init_model
from smcsd.models.transformer import unstack_layers
from toys import tiny_config

# A tree of 6 nodes under the root (index 0): root -> 1, 2; 1 -> 3, 4; 2 -> 5; 3 -> 6.
PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3])
DEPTHS = np.array([0, 1, 1, 2, 2, 2, 3])


def _path(m):
    out = []
    while m >= 0:
        out.append(m)
        m = PARENTS[m]
    return out[::-1]


def test_ancestor_mask_matches_paths():
    mask = np.asarray(ancestor_mask(jnp.asarray(PARENTS)))
    for m in range(len(PARENTS)):
        assert set(np.flatnonzero(mask[m])) == set(_path(m)), m


@pytest.mark.slow  # default-run budget (42 s in the default lane; sd-tree's exactness tests there run the same forward)
@pytest.mark.parametrize("unstacked,shared", [(False, False), (True, False), (True, True)])
def test_tree_forward_equals_each_path(unstacked, shared):
    """Logits at every tree node == the cache-free causal forward over context + that node's root path; a wrong
    mask (every node sees every node) must differ, so the check can fail."""
    model = init_model(tiny_config(vocab=11, hidden=32, layers=2, heads=4, kv_heads=2), 3, init_std=0.5)
    params = unstack_layers(model.params) if unstacked else model.params
    cfg = model.config
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, 11, size=(2, 5)).astype(np.int32)
    nodes = rng.integers(0, 11, size=(2, len(PARENTS))).astype(np.int32)
    from smcsd.models import init_cache
    cache = init_cache(cfg.num_hidden_layers, 2, 24, cfg.num_key_value_heads, cfg.head_dim, per_layer=unstacked)
    _, cache = forward_cached(cfg, params, jnp.asarray(ctx), cache)
    if shared:  # the context as a shared prefix: 1 row per prompt, as smc's particles hold it
        cache = cache.share_prefix(1, 16)
    vis = ancestor_mask(jnp.asarray(np.broadcast_to(PARENTS, (2, len(PARENTS)))))
    base = jnp.full((2,), 5, jnp.int32)
    idx = jnp.broadcast_to(jnp.arange(len(PARENTS)), (2, len(PARENTS)))
    dep = jnp.asarray(np.broadcast_to(DEPTHS, (2, len(PARENTS))))
    logits, _ = forward_tree(cfg, params, jnp.asarray(nodes), cache, base, idx, dep, vis)
    wrong, _ = forward_tree(cfg, params, jnp.asarray(nodes), cache, base, idx, dep, jnp.ones_like(vis))
    err_wrong = 0.0
    for m in range(len(PARENTS)):
        seq = np.concatenate([ctx, nodes[:, _path(m)]], axis=1)
        ref = forward_full(cfg, model.params, jnp.asarray(seq))[:, -1]
        np.testing.assert_allclose(np.asarray(logits[:, m]), np.asarray(ref), rtol=2e-4, atol=2e-4)
        err_wrong = max(err_wrong, float(jnp.max(jnp.abs(wrong[:, m] - ref))))
    assert err_wrong > 1e-2


@pytest.mark.slow  # default-run budget; the AR drafter's trees (exactness, greedy tests) fill regions this way
def test_tree_levels_in_several_calls():
    """A tree written level by level (what a drafter does) gives the same logits as one call over all of it."""
    model = init_model(tiny_config(vocab=11, hidden=32, layers=2, heads=4, kv_heads=2), 4, init_std=0.5)
    cfg, params = model.config, model.params
    ctx = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    nodes = jnp.asarray([[5, 6, 7, 8, 9, 10, 1]], jnp.int32)
    cache = model.init_cache(1, 20)
    _, cache = forward_cached(cfg, params, ctx, cache)
    vis = ancestor_mask(jnp.asarray(PARENTS)[None])
    base = jnp.asarray([4])
    idx, dep = jnp.arange(7)[None], jnp.asarray(DEPTHS)[None]
    whole, _ = forward_tree(cfg, params, nodes, cache, base, idx, dep, vis)
    c, outs = cache, []
    for level in range(4):
        sel = np.flatnonzero(DEPTHS == level)
        lg, c = forward_tree(cfg, params, nodes[:, sel], c, base, idx[:, sel], dep[:, sel], vis[:, sel])
        outs.append((sel, lg))
    for sel, lg in outs:
        np.testing.assert_allclose(np.asarray(lg[0]), np.asarray(whole[0, sel]), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("unstacked", [pytest.param(False, marks=pytest.mark.slow),
                                       pytest.param(True, marks=pytest.mark.slow)])  # default-run budget
def test_compact_moves_the_path(unstacked):
    """After compaction the cache continues exactly like one that decoded the accepted path token by token."""
    model = init_model(tiny_config(vocab=11, hidden=32, layers=2, heads=4, kv_heads=2), 5, init_std=0.5)
    cfg = model.config
    params = unstack_layers(model.params) if unstacked else model.params
    from smcsd.models import init_cache
    mk = lambda: init_cache(cfg.num_hidden_layers, 1, 24, cfg.num_key_value_heads, cfg.head_dim, per_layer=unstacked)
    ctx = jnp.asarray([[1, 2, 3]], jnp.int32)
    nodes = jnp.asarray([[4, 5, 6, 7, 8, 9, 10]], jnp.int32)
    _, cache = forward_cached(cfg, params, ctx, mk())
    vis = ancestor_mask(jnp.asarray(PARENTS)[None])
    _, cache = forward_tree(cfg, params, nodes, cache, jnp.asarray([3]), jnp.arange(7)[None],
                            jnp.asarray(DEPTHS)[None], vis)
    path = _path(6)  # 0, 1, 3, 6
    # the root stays at slot 3; node m sits at slot 3 + m = 4 + (m - 1)
    cache = cache.compact(jnp.asarray([4]), jnp.asarray([[m - 1 for m in path[1:]]]), jnp.asarray([3])).set_lengths(
        jnp.asarray([3 + len(path)]))
    nxt, _ = forward_cached(cfg, params, jnp.asarray([[2]]), cache)
    ref = forward_full(cfg, model.params, jnp.concatenate([ctx, nodes[:, path], jnp.asarray([[2]])], 1))[:, -1]
    np.testing.assert_allclose(np.asarray(nxt[:, 0]), np.asarray(ref), rtol=2e-4, atol=2e-4)
    # without compaction the continuation is wrong (slots 5..6 hold nodes 2 and 3, not 3 and 6)
    _, raw = forward_cached(cfg, params, ctx, mk())
    _, raw = forward_tree(cfg, params, nodes, raw, jnp.asarray([3]), jnp.arange(7)[None], jnp.asarray(DEPTHS)[None], vis)
    bad, _ = forward_cached(cfg, params, jnp.asarray([[2]]), raw.set_lengths(jnp.asarray([3 + len(path)])))
    assert float(jnp.max(jnp.abs(bad[:, 0] - ref))) > 1e-2


# ----------------------------------------------------------------------------- sd-tree: exactness by enumeration

import smcsd  # noqa: E402
from smcsd.runtime import engine  # noqa: E402
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_pair, total_variation  # noqa: E402

# The enumeration setting of tests/test_sd.py: vocab 6, prompt [0, 1], 3 new tokens (216 outcomes), a draft far
# from the target; trees of depth 2 so a 3-token continuation crosses a cycle boundary (bonus + compaction).
V, SEED, PROMPT, LENGTH = 6, 2, (0, 1), 3
NUM_SAMPLES, BATCH = 20_000, 5_000
P_MIN = 1e-3  # a correct sampler fails with probability 1e-3 per test (the seeds are fixed anyway)
P_BROKEN = 1e-6  # a broken rule must fail by far, not by bad luck
SETTINGS = {"t1": dict(temperature=1.0), "t07_topk3": dict(temperature=0.7, top_k=3)}
TREES = {"sample": "2,2:sample", "distinct": "3,2:distinct", "top": "3,1:top"}


def _tree_exactness(tree, setting, seed=0, draft=None, **kw):
    target, toy_draft = tiny_pair(V, SEED)
    params = SETTINGS[setting]
    counts = sample_counts("sd-tree", target, toy_draft if draft is None else draft, PROMPT, LENGTH, NUM_SAMPLES,
                           batch=BATCH, seed=seed, tree=tree, **params, **kw)
    probs = exact_distribution(target, PROMPT, LENGTH, **params)
    return chi_square_pvalue(counts, probs), total_variation(counts, probs)


# Half of the (builder, setting) grid runs by default, the other half with -m slow (default-run budget).
DEFAULT_GRID = {("distinct", "t07_topk3")}  # default-run budget: the rest of the grid runs in the slow lane


@pytest.mark.parametrize("children,setting", [
    pytest.param(c, st, marks=() if (c, st) in DEFAULT_GRID else pytest.mark.slow) for c in TREES for st in SETTINGS])
def test_sd_tree_exact(children, setting):
    pvalue, tv = _tree_exactness(TREES[children], setting, seed=3000)
    assert pvalue > P_MIN, f"sd-tree {TREES[children]} {setting}: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_sd_tree_broken_rule_is_detected(accept_always):
    pvalue, tv = _tree_exactness(TREES["sample"], "t1", seed=3000)
    assert pvalue < P_BROKEN, f"the broken rule passed: p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # a second broken rule; the default run keeps test_sd_tree_broken_rule_is_detected
def test_top_children_tested_against_soft_q_is_detected(monkeypatch):
    """Deterministic top-k children are only exact with point-mass trial distributions: recording the soft q
    for them (the tempting mistake) must fail the same test."""
    from smcsd.drafters import tree as tree_mod
    real = tree_mod.draw_children

    def soft(key, logq, num, children):
        tokens, trial, valid = real(key, logq, num, children)
        return tokens, jnp.broadcast_to(logq[:, :, None, :], trial.shape), valid

    engine.clear_compile_cache()
    monkeypatch.setattr(tree_mod, "draw_children", soft)
    try:
        pvalue, tv = _tree_exactness(TREES["top"], "t1", seed=3000)
    finally:
        monkeypatch.undo()
        engine.clear_compile_cache()
    assert pvalue < P_BROKEN, f"top-k children with soft q passed: p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.parametrize("tree", [pytest.param("2,2,1:sample", marks=pytest.mark.slow),  # default-run budget
                                  pytest.param("3,1,1:distinct", marks=pytest.mark.slow),
                                  pytest.param("2,2,1:top", marks=pytest.mark.slow)])
def test_sd_tree_greedy_matches_ar(tree):
    target, draft = tiny_pair(V, SEED)
    prompts = [[0, 1], [3], [2, 5, 4]]
    ar = smcsd.decode(prompts, target=target, method="ar", max_new_tokens=10, temperature=0, eos_id=[])
    st = smcsd.decode(prompts, target=target, draft=draft, method="sd-tree", tree=tree, max_new_tokens=10,
                      temperature=0, eos_id=[])
    np.testing.assert_array_equal(np.asarray(st.tokens), np.asarray(ar.tokens))
    assert st.stats.num_target_calls <= ar.stats.num_target_calls


@pytest.mark.slow  # default-run budget (a fresh-clone default lane took 11 min 0 s); CI's slow lane runs it
def test_greedy_top_children_are_the_drafts_next_best_tokens():
    """At temperature 0 a ':top' tree's children are the drafter's top tokens (ranked by its own distribution, not
    by the one-hot a temperature-0 draft would be), so the second root child is a real token that verification can
    accept: the tree accepts more per call than the chain of the same depth, with ar's greedy tokens. Deterministic
    (T=0, fixed weights)."""
    target, draft = tiny_pair(V, SEED)
    prompts = [[0, 1], [3], [2, 5, 4], [1, 1, 2]]
    ar = smcsd.decode(prompts, target=target, method="ar", max_new_tokens=12, temperature=0, eos_id=[])
    chain = smcsd.decode(prompts, target=target, draft=draft, method="sd-tree", tree="1,1:top", max_new_tokens=12,
                         temperature=0, eos_id=[])
    wide = smcsd.decode(prompts, target=target, draft=draft, method="sd-tree", tree="3,1:top", max_new_tokens=12,
                        temperature=0, eos_id=[])
    np.testing.assert_array_equal(np.asarray(wide.tokens), np.asarray(ar.tokens))
    np.testing.assert_array_equal(np.asarray(chain.tokens), np.asarray(ar.tokens))
    first = lambda r: r.stats.accepted_per_position[0] / r.stats.num_drafts  # noqa: E731
    assert first(wide) > first(chain), (wide.stats.accepted_per_position, chain.stats.accepted_per_position)


@pytest.fixture(scope="module")
def random_d2sd():
    """A randomly initialised D²SD pair (main + variable-prefix block drafters) for the toy target."""
    from smcsd.drafters.d2sd import create_random
    target, _ = tiny_pair(V, SEED)
    return create_random(target, block_size=4, seed=0)


@pytest.mark.parametrize("setting", ["t1", pytest.param("t07_topk3", marks=pytest.mark.slow)])
def test_d2sd_tree_exact(random_d2sd, setting):
    """The D²SD tree builder (a chain of 2 and both re-anchoring points as branches) with random drafters."""
    pvalue, tv = _tree_exactness("1,1+2", setting, seed=4000, draft=random_d2sd)
    assert pvalue > P_MIN, f"sd-tree d2sd {setting}: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # default-run budget
def test_block_drafter_product_tree_exact():
    """A (random) block drafter's product tree: target hidden states gathered along the accepted path."""
    from smcsd.drafters import DFlashDrafter
    target, _ = tiny_pair(V, SEED)
    pvalue, tv = _tree_exactness("2,2:distinct", "t1", seed=5000, draft=DFlashDrafter.create(target, block_size=4))
    assert pvalue > P_MIN, f"sd-tree block drafter: chi-square p={pvalue:.2e}, TV={tv:.4f}"


@pytest.mark.slow  # default-run budget
def test_d2sd_greedy_matches_ar(random_d2sd):
    target, _ = tiny_pair(V, SEED)
    prompts = [[0, 1], [3], [2, 5, 4]]
    ar = smcsd.decode(prompts, target=target, method="ar", max_new_tokens=10, temperature=0, eos_id=[])
    st = smcsd.decode(prompts, target=target, draft=random_d2sd, method="sd-tree", tree="1,1,1+2",
                      max_new_tokens=10, temperature=0, eos_id=[])
    np.testing.assert_array_equal(np.asarray(st.tokens), np.asarray(ar.tokens))


# ----------------------------------------------------------------------------- bad input, shapes

def test_tree_spec_shapes_and_parse():
    from smcsd import TreeSpec
    t = TreeSpec.parse("2,2,1,1:distinct")
    assert (t.branching, t.children, t.depth, t.num_nodes, t.max_candidates) == ((2, 2, 1, 1), "distinct", 4, 14, 4)
    d = TreeSpec.parse("1,1,1,1+2")
    assert (d.num_nodes, d.max_candidates, d.branches) == (12, 3, 2)
    parents, depths = TreeSpec((2, 1)).product_layout()
    assert parents.tolist() == [-1, -1, 0, 1] and depths.tolist() == [1, 1, 2, 2]
    for bad in ["", "2,0,1", "2,x", "2,1:greedy", "1,1+5"]:
        with pytest.raises(ValueError):
            TreeSpec.parse(bad)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="sd-tree", tree="2,a"), "children per depth"),
    (dict(method="sd-tree", tree=(2, 1)), "TreeSpec"),
    (dict(method="sd", tree="2,1"), "shapes method='sd-tree' only"),
    (dict(method="sd-tree", tree="2,1,1", num_speculative_tokens=4), "disagrees"),
    (dict(method="sd-tree", tree="1,1+1"), "D2SDDrafter"),
])
def test_sd_tree_bad_input(kwargs, match):
    target, draft = tiny_pair(V, SEED)
    with pytest.raises((ValueError, TypeError), match=match):
        smcsd.decode([0, 1], target=target, draft=draft, max_new_tokens=4, **kwargs)


def test_sd_tree_needs_a_tree_drafter():
    target, _ = tiny_pair(V, SEED)
    with pytest.raises(ValueError, match="chains only"):
        smcsd.decode([0, 1], target=target, draft=smcsd.PromptLookup(), method="sd-tree", max_new_tokens=4)


def test_d2sd_refuses_product_trees(random_d2sd):
    target, _ = tiny_pair(V, SEED)
    with pytest.raises(ValueError, match="chain plus branches"):
        smcsd.decode([0, 1], target=target, draft=random_d2sd, method="sd-tree", tree="2,1", max_new_tokens=4)


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_default_tree_follows_the_drafter(random_d2sd):
    from smcsd.defaults import default_tree
    target, draft = tiny_pair(V, SEED)
    assert default_tree(random_d2sd, 3).branches > 0 and set(default_tree(random_d2sd, 3).branching) == {1}
    t = default_tree(smcsd.drafters.as_drafter(draft), 3)
    assert t.depth == 3 and t.branches == 0
    r = smcsd.decode([[0, 1]], target=target, draft=random_d2sd, max_new_tokens=6, eos_id=[])
    assert r.stats.method == "sd-tree"


# ----------------------------------------------------------------------------- D²SD's variable-prefix training

@pytest.mark.slow  # default-run budget
def test_variable_prefix_training_matches_decode_path():
    """A training block that shows its first p gold tokens has the logits of the decode-time re-anchored block
    (`block_logits_at(..., prefix, prefix_len)` over a cache filled from the same hidden states), and its loss
    ignores the given positions."""
    from smcsd.models import forward_full
    from smcsd.drafters import DFlashDrafter
    from smcsd.runtime.engine import hidden_concat
    from smcsd.train.dflash import block_loss, block_train_logits
    from toys import tiny_config
    target = init_model(tiny_config(6, layers=3), 0, init_std=0.8)
    d = DFlashDrafter.create(target, num_layers=2, block_size=5, seed=1, init_std=0.5)
    p = d.drafter_params()
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 6, (2, 12)), jnp.int32)
    _, h = forward_full(target.config, target.params, tokens, hidden_layers=d.hidden_layers)
    hid = hidden_concat(h)
    anchors = jnp.asarray([[3], [5]], jnp.int32)
    plen = jnp.asarray([[2], [0]], jnp.int32)
    logits, labels, _ = block_train_logits(d.block_config, d.params, d.shared, tokens, hid, anchors, plen)
    for r in range(2):
        a = int(anchors[r, 0])
        state = d.init(p, tokens[r:r + 1, :a], jnp.asarray([a]), 16, 1, hid[r:r + 1, :a])
        got = d.block_logits_at(p, state, tokens[r:r + 1, a], jnp.asarray([a]), 4, prefix=labels[r:r + 1, 0],
                                prefix_len=plen[r, :1])
        np.testing.assert_allclose(np.asarray(logits[r, 0]), np.asarray(got[0]), atol=1e-4)
    plain, _, _ = block_train_logits(d.block_config, d.params, d.shared, tokens, hid, anchors)
    assert float(jnp.abs(plain[0, 0, 2:] - logits[0, 0, 2:]).max()) > 1e-3  # the shown tokens matter
    # the loss counts the positions after the shown prefix only: with p = 3 of 4, the last position's CE
    fn = block_loss(d.block_config, "uniform")
    p3 = jnp.asarray([[3], [3]])
    loss, _ = fn(d.params, {"tokens": tokens, "anchors": anchors, "hidden": hid, **d.shared, "prefix_len": p3})
    lg3, lab3, _ = block_train_logits(d.block_config, d.params, d.shared, tokens, hid, anchors, p3)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(lg3[:, 0, 3], -1), lab3[:, 0, 3, None], -1)
    np.testing.assert_allclose(float(loss), float(ce.mean()), rtol=1e-5)


def test_prefix_lengths_follow_the_decay():
    """Pr(p) ∝ 0.9^p over {0..B−2}: 40k draws, chi-square against the normalised weights (p > 1e-3)."""
    from scipy import stats as sps
    from smcsd.train.dflash import sample_prefix_lengths
    x = sample_prefix_lengths(0, 7, (200, 200), 16, 0.9)
    w = 0.9 ** np.arange(15)
    w /= w.sum()
    counts = np.bincount(x.ravel(), minlength=15)
    assert sps.chisquare(counts, w * x.size).pvalue > 1e-3
    np.testing.assert_array_equal(x, sample_prefix_lengths(0, 7, (200, 200), 16, 0.9))
    with pytest.raises(ValueError, match="prefix_decay"):
        sample_prefix_lengths(0, 0, (1,), 16, 1.5)
