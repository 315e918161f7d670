"""FlexDraft (smcsd/drafters/flex.py, smcsd/methods/flex.py): the verified positions' logits and cache writes are the plain model's
whatever the masks hold, `flex` reproduces the enumerated p_T and `ar`'s greedy tokens, calibration uses the bonus,
the adapters save and load, and misuse is refused clearly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_cached, init_cache, init_model
from smcsd.drafters.flex import FlexConfig, draft_logits, forward_flex, init_flex_params
from smcsd.models.transformer import unstack_layers
from smcsd.drafters import FlexDrafter
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2


@pytest.mark.slow  # default-run budget
def test_verified_positions_are_the_plain_models_whatever_the_masks():
    target = init_model(tiny_config(V, layers=3), 0, init_std=0.8)
    c, params = target.config, unstack_layers(target.params)  # the layout decode uses on CPU
    tok = jnp.asarray([[0, 1, 2, 3, 4], [2, 3, 1, 0, 5]], jnp.int32)
    cache = init_cache(c.num_hidden_layers, 2, 16, c.num_key_value_heads, c.head_dim, c.jnp_dtype, per_layer=True)
    cache = forward_cached(c, params, jnp.asarray([[1, 2], [3, 3]], jnp.int32), cache)[1]  # some context first
    ref_logits, ref_cache = forward_cached(c, params, tok, cache)
    anchors = jnp.asarray([[0, 2, 4], [1, 1, 3]], jnp.int32)
    outs = []
    for seed, scale in ((1, 0.5), (7, 40.0)):  # two very different mask contents and adapters
        fp = init_flex_params(c, params, FlexConfig(adapter_layers=2, group_size=3), seed=seed, std=0.5)
        fp = fp._replace(mask_vector=fp.mask_vector * scale)
        logits, new_cache, mh, _ = forward_flex(c, params, fp, tok, cache, anchors, 3)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-6, rtol=0)
        for a, b in zip(new_cache.k + new_cache.v, ref_cache.k + ref_cache.v):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
        outs.append(np.asarray(mh))
    assert outs[0].shape == (2, 3, 3, c.hidden_size)
    assert np.abs(outs[0] - outs[1]).max() > 1e-2  # the masks' states do depend on their content


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_masks_see_their_anchor_and_group_only():
    """A group's states depend on the clean tokens up to its anchor, not on later ones, nor on other groups."""
    target = init_model(tiny_config(V, layers=2), 0, init_std=0.8)
    c, params = target.config, unstack_layers(target.params)
    fp = init_flex_params(c, params, FlexConfig(adapter_layers=1, group_size=2), seed=3, std=0.5)
    cache = init_cache(c.num_hidden_layers, 1, 16, c.num_key_value_heads, c.head_dim, c.jnp_dtype, per_layer=True)
    a = forward_flex(c, params, fp, jnp.asarray([[0, 1, 2, 3]]), cache, jnp.asarray([[1, 3]]), 2)[2]
    b = forward_flex(c, params, fp, jnp.asarray([[0, 1, 5, 4]]), cache, jnp.asarray([[1, 3]]), 2)[2]
    np.testing.assert_allclose(np.asarray(a[:, 0]), np.asarray(b[:, 0]), atol=1e-6)  # anchor 1: tokens 2, 3 unseen
    assert np.abs(np.asarray(a[:, 1] - b[:, 1])).max() > 1e-3  # anchor 3 sees them
    single = forward_flex(c, params, fp, jnp.asarray([[0, 1, 2, 3]]), cache, jnp.asarray([[1]]), 2)[2]
    np.testing.assert_allclose(np.asarray(single[:, 0]), np.asarray(a[:, 0]), atol=1e-6)  # other groups unseen


def test_calibration_uses_the_bonus_token():
    target, _ = tiny_pair(V, SEED)
    c = target.config
    fp = init_flex_params(c, target.params, FlexConfig(adapter_layers=1, group_size=2), seed=1)
    h = jax.random.normal(jax.random.PRNGKey(0), (1, 2, c.hidden_size))
    base = draft_logits(c, target.params, fp, h, jnp.asarray([1]))
    w = target.params["embed_tokens"]["embedding"] if c.tie_word_embeddings else target.params["lm_head"]
    np.testing.assert_allclose(np.asarray(base), np.asarray(jnp.einsum("bsd,vd->bsv", h, w)), atol=1e-5)  # zero init
    fp = fp._replace(calib={**fp.calib, "w2": jax.random.normal(jax.random.PRNGKey(1), fp.calib["w2"].shape)})
    assert np.abs(np.asarray(draft_logits(c, target.params, fp, h, jnp.asarray([1]))
                             - draft_logits(c, target.params, fp, h, jnp.asarray([4])))).max() > 1e-3


def flex_drafter(target, seed=1):
    d = FlexDrafter.create(target, adapter_layers=1, group_size=3, seed=seed, std=0.5)
    calib = {**d.params.calib, "w2": jax.random.normal(jax.random.PRNGKey(seed), d.params.calib["w2"].shape)}
    return d.with_params(d.params._replace(calib=calib))  # a calibration that really moves q


@pytest.mark.parametrize("setting,options", [
    (dict(temperature=1.0), {}),
    pytest.param(dict(temperature=1.0), dict(mode="sequential"), marks=pytest.mark.slow),  # draft pass + verify pass
    pytest.param(dict(temperature=0.7, top_k=3), dict(tau=0.3), marks=pytest.mark.slow),  # confidence cut
    pytest.param(dict(temperature=1.0), dict(tau=0.3, mode="sequential"), marks=pytest.mark.slow),  # cut verify pass
    # ragged rows packed into 3000 tokens for 5000 rows of K = 2: rows verify 0, 1 or 2 drafts by confidence
    pytest.param(dict(temperature=1.0), dict(mode="sequential", token_budget=3000), marks=pytest.mark.slow),
    pytest.param(dict(temperature=0.7, top_k=3), dict(tau=0.3, mode="sequential", token_budget=6000),
                 marks=pytest.mark.slow),
])
def test_flex_is_exact(setting, options):
    target, _ = tiny_pair(V, SEED)
    d = flex_drafter(target).with_options(**options)
    counts = sample_counts("flex", target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=87,
                           num_speculative_tokens=K, **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (p, total_variation(counts, probs))


@pytest.mark.slow  # default-run budget
def test_sequential_mode_and_confidence_cut():
    """Greedy: both modes and the cut give ar's tokens; the sequential mode makes two target calls per cycle; a
    high tau verifies fewer drafts (stats.num_draft_tokens) than no cut."""
    target, _ = tiny_pair(V, SEED)
    d = flex_drafter(target)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, eos_id=[], num_speculative_tokens=3)
    ref = smcsd.decode(prompts, method="ar", temperature=0.0, **{k: v for k, v in kw.items()
                                                                   if k != "num_speculative_tokens"}).tokens
    seq = smcsd.decode(prompts, draft=d.with_options(mode="sequential"), method="flex", temperature=0.0, **kw)
    assert seq.tokens == ref
    cycles = seq.stats.num_drafts / 2  # two requests
    assert seq.stats.num_target_calls >= 2 * (cycles - 1)
    full = smcsd.decode(prompts, draft=d, method="flex", temperature=1.0, seed=1, **kw)
    cut = smcsd.decode(prompts, draft=d.with_options(tau=0.5), method="flex", temperature=1.0, seed=1, **kw)
    assert full.stats.num_draft_tokens == 3 * full.stats.num_drafts
    assert cut.stats.num_draft_tokens < 3 * cut.stats.num_drafts
    assert smcsd.decode(prompts, draft=d.with_options(tau=0.5), method="flex", temperature=0.0, **kw).tokens == ref
    assert smcsd.decode(prompts, draft=d.with_options(tau=0.5, mode="sequential"), method="flex", temperature=0.0,
                        **kw).tokens == ref
    with pytest.raises(ValueError, match="mode"):
        d.with_options(mode="fast")
    with pytest.raises(ValueError, match="tau"):
        d.with_options(tau=1.5)
    assert d.mode_for(4) == "parallel" and d.mode_for(5) == "sequential"


@pytest.mark.slow  # default-run budget
def test_greedy_flex_equals_ar_with_one_call_per_cycle():
    target, _ = tiny_pair(V, SEED)
    d = flex_drafter(target)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    res = smcsd.decode(prompts, draft=d, method="flex", num_speculative_tokens=3, **kw)
    assert res.tokens == ref
    assert res.stats.num_draft_calls == 0 and res.stats.num_target_calls < 14


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_save_load_and_errors(tmp_path):
    target, _ = tiny_pair(V, SEED)
    d = flex_drafter(target)
    d.save(str(tmp_path / "flex"))
    e = FlexDrafter.load(str(tmp_path / "flex"))
    assert e == d and e.num_params == d.num_params
    kw = dict(target=target, method="flex", max_new_tokens=8, num_speculative_tokens=2, seed=3, eos_id=[])
    assert smcsd.decode([[1, 2, 3]], draft=d, **kw).tokens == smcsd.decode([[1, 2, 3]], draft=e, **kw).tokens
    with pytest.raises(ValueError, match="method='flex' only"):
        smcsd.decode([[1, 2, 3]], target=target, draft=d, method="sd", max_new_tokens=4)
    with pytest.raises(ValueError, match="FlexDraft adapters"):
        smcsd.decode([[1, 2, 3]], target=target, draft=target, method="flex", max_new_tokens=4)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        smcsd.decode([[1, 2, 3]], target=target, draft=d, method="flex", num_speculative_tokens=4, max_new_tokens=4)
    with pytest.raises(ValueError, match="adapter_layers"):
        FlexDrafter.create(target, adapter_layers=2)
    other = init_model(tiny_config(V, layers=2), 0)
    with pytest.raises(ValueError, match="another target"):
        smcsd.decode([[1, 2, 3]], target=other, draft=d, method="flex", max_new_tokens=4)


@pytest.mark.slow  # default-run budget
def test_training_raises_acceptance(tmp_path):
    """train_flex on the byte toy: the held-out expected accepted length of the masks' drafts rises, calibration is
    reported separately, only the adapters change (the target's params are untouched) and the result loads."""
    from smcsd.models import ByteTokenizer, ModelConfig
    from smcsd.train import TextCorpus, train_flex
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    target = init_model(cfg, seed=3, tokenizer=tok, init_std=0.5, name="tiny-target")
    before = jax.tree_util.tree_map(np.asarray, target.params)
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "def", "f(x):", "return", "x"]
    corpus = TextCorpus([" ".join(rng.choice(words, size=30)) + "." for _ in range(40)], tokenizer=tok, seq_len=32,
                        batch_size=8)
    d = FlexDrafter.create(target, adapter_layers=1, group_size=3, calib_hidden=32)
    res, trained = train_flex(target, d, corpus, steps=60, lr=3e-3, num_anchors=4, progress=False, eval_every=60,
                              out=str(tmp_path / "flex"))
    ev = res.history["eval"]
    assert ev[-1]["accept_len"] > ev[0]["accept_len"] + 0.1, ev
    assert "accept_len_nocal" in ev[-1]
    for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(target.params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert FlexDrafter.load(str(tmp_path / "flex")).num_params == trained.num_params


def test_budget_lengths_and_pack_index():
    """The packed verify's ragged lengths: every live row's first draft before any second, then by cumulative
    confidence within each row's cut; dead rows get none; the pack index lists each row's prefix."""
    from smcsd.methods.flex import budget_lengths, pack_index
    top1 = np.log(np.array([[0.9, 0.9, 0.9], [0.5, 0.99, 0.99], [0.99, 0.99, 0.99], [0.6, 0.6, 0.6]]))
    dlq = jnp.asarray(np.concatenate([top1[..., None], np.full((4, 3, 1), -30.0)], -1), jnp.float32)  # [B, K, 2]
    live = jnp.array([True, True, False, True])
    L = jnp.array([3, 3, 3, 2])
    # cumulative: row 0 .9 .81 .73, row 1 .5 .495 .49, row 3 .6 .36 (cut at 2); row 2 is dead
    assert budget_lengths(dlq, L, live, 3).tolist() == [1, 1, 0, 1]
    assert budget_lengths(dlq, L, live, 5).tolist() == [3, 1, 0, 1]
    assert budget_lengths(dlq, L, live, 7).tolist() == [3, 3, 0, 1]
    assert budget_lengths(dlq, L, live, 12).tolist() == [3, 3, 0, 2]
    assert budget_lengths(dlq, L, live, 2).tolist() in ([1, 1, 0, 0], [1, 0, 0, 1], [0, 1, 0, 1])
    assert pack_index(jnp.array([2, 0, 1]), 3, 5).tolist() == [0, 1, 6, 9, 9]


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_packed_verify_matches_unpacked_and_ar():
    """Greedy flex with packed verify calls (budgets below, at and above one token per row) gives ar's tokens and
    verifies no more drafts than the budget allows."""
    target, _ = tiny_pair(V, SEED)
    d = flex_drafter(target).with_options(mode="sequential")
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3], [5, 1], [2, 2, 2, 2]]
    kw = dict(target=target, max_new_tokens=12, eos_id=[], num_speculative_tokens=3)
    ref = smcsd.decode(prompts, method="ar", temperature=0.0, max_new_tokens=12, target=target, eos_id=[]).tokens
    for budget in (2, 7):  # below one token per row (some rows take plain steps), and most of the batch
        res = smcsd.decode(prompts, draft=d.with_options(token_budget=budget), method="flex", temperature=0.0, **kw)
        assert res.tokens == ref, budget
        cycles = res.stats.num_target_calls / 2
        assert res.stats.num_draft_tokens <= budget * cycles
    with pytest.raises(ValueError, match="token_budget"):
        d.with_options(token_budget=0)
    with pytest.raises(ValueError, match="parallel mode does not pack"):
        d.with_options(mode="parallel", token_budget=8)


def test_verify_widths():
    """The cut's static widths, and the narrowest one holding every live row's L (dead rows do not count)."""
    from smcsd.methods.sd import width_index, verify_widths
    assert verify_widths(1) == (1,) and verify_widths(4) == (1, 2, 4) and verify_widths(6) == (1, 2, 4, 6)
    widths = verify_widths(6)
    live = jnp.array([True, True, False])
    assert int(width_index(jnp.array([1, 3, 6]), live, widths)) == 2  # max live L = 3 -> width 4
    assert int(width_index(jnp.array([1, 1, 6]), live, widths)) == 0
    assert int(width_index(jnp.array([5, 1, 1]), live, widths)) == 3


@pytest.mark.slow  # default-run budget (real SmolLM2 target)
def test_flex_without_draft_uses_the_shipped_pairs_adapters():
    """A user's first try: the tiny-code target and method='flex' with no draft= (it used to fail in the pair
    loader with "dtype= applies to fetched models only"); greedy flex is exact, so it must equal ar."""
    target, _ = smcsd.load("tiny-code")
    res = smcsd.decode("def f(x):", target=target, method="flex", max_new_tokens=12, temperature=0.0)
    ref = smcsd.decode("def f(x):", target=target, method="ar", max_new_tokens=12, temperature=0.0)
    assert res.tokens == ref.tokens
