"""PARD-2's mask drafter (smcsd/drafters/pard2.py): its proposal is one forward over [pending, MASK × (K−1)] whose
positions follow the q it reports, `sd` / `sd-multi` with a random mask drafter reproduce the enumerated p_T (with
and without target features), `smc`'s one-cycle law matches the finite-N SIR law with the dual-mode q, greedy `sd`
equals `ar`, and bad input is refused clearly."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_full, init_model
from smcsd.models.transformer import InputEdits
from smcsd.drafters.pard2 import FEATURE_SCALE, PARD2Drafter
from smcsd.runtime.engine import hidden_concat
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2


def mask_drafter(target, features: bool, seed: int = 7):
    """A random mask drafter on the toy vocabulary; with `features` a random (non-zero) feature projection, so the
    target's hidden states really change its proposals."""
    model = init_model(tiny_config(V, hidden=8, heads=1), seed, init_std=0.8, name="toy-mask")
    d = PARD2Drafter.create(model, target=target, feature_layers=(0,) if features else (), seed=seed)
    if features:
        rng = np.random.default_rng(seed)
        extra = {**d.extra, "feature_proj": jnp.asarray(rng.normal(0, 40.0, d.extra["feature_proj"].shape),
                                                        jnp.float32)}
        d = PARD2Drafter(model, extra, (0,), True)
    return d


@pytest.mark.parametrize("method,features,setting", [
    ("sd", False, dict(temperature=1.0)),
    pytest.param("sd-multi", False, dict(temperature=0.7, top_k=3), marks=pytest.mark.slow),  # default-run budget
    ("sd", True, dict(temperature=0.7, top_k=3)),
    pytest.param("sd-multi", True, dict(temperature=1.0), marks=pytest.mark.slow),
])
def test_mask_drafter_is_exact(method, features, setting):
    target, _ = tiny_pair(V, SEED)
    d = mask_drafter(target, features)
    counts = sample_counts(method, target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=81,
                           num_speculative_tokens=K, num_particles=3, **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, features, p, total_variation(counts, probs))


def test_propose_follows_reported_q_and_masks_matter():
    """One proposal of K = 3 from a prompt: q_1 is the model's next-token distribution at the last fed token, the
    mask positions' q differ from it (the masks are inputs, not copies), and 20k draws follow each q_k."""
    from smcsd.drafters import initial_feed
    from smcsd.sampling import SamplingParams
    target, _ = tiny_pair(V, SEED)
    d = mask_drafter(target, False)
    p = d.drafter_params()
    R = 20_000
    prompt = jnp.asarray([PROMPT], jnp.int32)
    state = d.init(p, prompt, jnp.asarray([len(PROMPT) - 1]), 16, 1)
    state = jax.tree_util.tree_map(lambda x: jnp.repeat(x, R, axis=0), state)
    feed, count = initial_feed(jnp.full((R,), PROMPT[-1], jnp.int32))
    prop = jax.jit(d.propose, static_argnums=6)(p, state, feed, count, jax.random.PRNGKey(3),
                                               SamplingParams.make(1.0), 3)
    q = np.exp(np.asarray(prop.logq[0], np.float64))  # [3, V], the same for every row
    ref = jax.nn.softmax(forward_full(d.model_config, d.model.params, prompt)[0, -1])
    np.testing.assert_allclose(q[0], np.asarray(ref), atol=1e-5)
    assert np.abs(q[1] - q[0]).max() > 1e-3
    for k in range(3):
        counts = np.bincount(np.asarray(prop.tokens[:, k]), minlength=V)
        assert chi_square_pvalue(counts, q[k]) > P_MIN, k
    assert int(prop.state[0].lengths[0]) == len(PROMPT) + 2  # prompt + fed token + K - 1


@pytest.mark.slow  # default-run budget
def test_mask_drafter_smc_matches_finite_n_law():
    """One SMC cycle (K = 1) with the dual-mode drafter as the proposal: the output follows the SIR law L_4 computed
    from the enumerated p_T and the drafter's q with the target's shifted features (chi-square at N = 4)."""
    import test_smc as ts
    target, _ = ts._pair()
    d = mask_drafter(target, True, seed=11)
    conts = np.array(list(itertools.product(range(ts.V), repeat=ts.LENGTH)), np.int32)
    n = len(ts.PROMPT)
    firsts = np.arange(ts.V)
    seqs = jnp.asarray(np.concatenate([np.broadcast_to(np.asarray(ts.PROMPT), (ts.V, n)), firsts[:, None]], 1))
    _, h = forward_full(target.config, target.params, seqs, hidden_layers=(0,))
    h = hidden_concat(h)
    shifted = jnp.concatenate([jnp.zeros_like(h[:, :1]), h[:, :-1]], axis=1)
    add = FEATURE_SCALE * jnp.einsum("rtf,fh->rth", shifted, d.extra["feature_proj"])
    logits = forward_full(d.model_config, d.model.params, seqs, inputs=InputEdits(add=add))
    q1 = np.asarray(jax.nn.log_softmax(logits[:, -1], -1), np.float64)
    lq = np.zeros((len(conts), ts.LENGTH, ts.V))
    lq[:, 1] = q1[conts[:, 0]]  # x_1's q depends on the prompt and x_0
    target_law, laws = ts.single_cycle_laws(ts.PROMPT, ts.LENGTH, (4,), lq=lq)
    out, _, _ = ts.smc_outputs(4, ts.LENGTH, 10_000, seed=93, draft=d, num_speculative_tokens=1)
    counts = ts.counts_of(out, ts.LENGTH)
    assert chi_square_pvalue(counts, laws[4]) > P_MIN
    assert 0.5 * np.abs(laws[4] - target_law).sum() > 0.05  # L_4 is visibly biased: the test has power


@pytest.mark.slow  # default-run budget
@pytest.mark.parametrize("features", [False, True])
def test_greedy_sd_equals_ar(features):
    target, _ = tiny_pair(V, SEED)
    d = mask_drafter(target, features)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    for method, k in (("sd", 4), ("sd-multi", 2)):
        res = smcsd.decode(prompts, draft=d, method=method, num_speculative_tokens=k, num_particles=2, **kw)
        assert res.tokens == ref, method


def test_errors():
    target, draft = tiny_pair(V, SEED)
    with pytest.raises(TypeError, match="LanguageModel"):
        PARD2Drafter("model", {})
    with pytest.raises(ValueError, match="mask_embedding"):
        PARD2Drafter(draft, {})
    with pytest.raises(ValueError, match="needs the target"):
        PARD2Drafter.create(draft, feature_layers=(0,))
    other = init_model(tiny_config(7), 0)
    with pytest.raises(ValueError, match="vocab"):
        smcsd.decode([0, 1], target=target, draft=PARD2Drafter.create(other), method="sd", max_new_tokens=2)
    assert mask_drafter(target, True).with_features(False).hidden_layers == ()


# ----------------------------------------------------------------------------- PARD-2 training pieces

def test_cod_layout_groups_are_nested_and_attend_like_decoding():
    from smcsd.train.pard2 import cod_layout
    T, depth = 20, 4
    lay = cod_layout(0, 3, T, depth)
    a, d, vis = lay["anchor"], lay["depth"], lay["visible"]
    sizes = [int((d == i).sum()) for i in range(depth)]
    assert sizes[0] == T and sizes[1:] == [14, 10, 7]  # ceil(20 * max(0.7^i, 0.2))
    for i in range(2, depth):  # nested: every anchor of group i is in group i - 1
        assert set(a[d == i]) <= set(a[d == i - 1])
    s = int(np.flatnonzero((d == 2))[0])  # a depth-2 mask of anchor a0
    a0 = a[s]
    seen = {(int(a[j]), int(d[j])) for j in np.flatnonzero(vis[s])}
    assert seen == {(t, 0) for t in range(a0 + 1)} | {(int(a0), 1), (int(a0), 2)}
    assert lay["pos"][s] == a0 + 2 and lay["label"][s] == a0 + 3
    np.testing.assert_array_equal(lay["visible"], cod_layout(0, 3, T, depth)["visible"])  # a function of (seed, step)


@pytest.mark.slow  # default-run budget
def test_training_forward_matches_decode_proposal():
    """The COD forward's outputs at anchor a (real token, then its masks) equal the decode-time proposal anchored at
    a: training learns what `propose` runs (with target features too)."""
    from smcsd.drafters import initial_feed
    from smcsd.sampling import SamplingParams
    from smcsd.train.pard2 import _forward, cod_layout
    target, _ = tiny_pair(V, SEED)
    d = mask_drafter(target, True)
    T, depth = 10, 3
    rng = np.random.default_rng(4)
    tokens = jnp.asarray(rng.integers(0, V, (1, T)), jnp.int32)
    _, h = forward_full(target.config, target.params, tokens, hidden_layers=(0,))
    hid = hidden_concat(h)
    lay = {k: jnp.asarray(v) for k, v in cod_layout(0, 0, T, depth, retain=1.0, r_min=1.0).items()}
    params = {"lm": d.model.params, **d.extra}
    logits = _forward(d, params, tokens, lay, hid, jnp.ones((1,)))
    a = 5
    want = [int(np.flatnonzero((np.asarray(lay["anchor"]) == a) & (np.asarray(lay["depth"]) == i))[0])
            for i in range(depth)]
    p = d.drafter_params()
    state = d.init(p, tokens[:, :a], jnp.asarray([a]), 16, 1, hid[:, :a])
    feed, count = initial_feed(tokens[:, a])
    prop = d.propose(p, state, feed, count, jax.random.PRNGKey(0), SamplingParams.make(1.0), depth)
    np.testing.assert_allclose(np.asarray(jax.nn.log_softmax(logits[0, want], -1)), np.asarray(prop.logq[0]),
                               atol=1e-4)


def test_cat_weights_are_the_target_probability_of_the_unseen_gold_tokens():
    from smcsd.train.pard2 import _targets, cod_layout
    T, depth = 6, 3
    tokens = jnp.asarray([[1, 2, 3, 4, 5, 0]], jnp.int32)
    rng = np.random.default_rng(0)
    logp = np.log(rng.dirichlet(np.ones(V), size=(1, T)))  # full "top-k" = the whole vocabulary
    ids = np.broadcast_to(np.arange(V), (1, T, V))
    lay = cod_layout(0, 0, T, depth, retain=1.0, r_min=1.0)
    batch = {"tokens": tokens, "topk_ids": jnp.asarray(ids), "topk_logp": jnp.asarray(logp, jnp.float32)}
    _, _, _, _, cat = _targets(batch, {k: jnp.asarray(v) for k, v in lay.items()}, None)
    gold = [logp[0, t, int(tokens[0, t + 1])] for t in range(T - 1)]  # log p_T(x_{t+1} | x_<=t)
    for s in range(len(lay["anchor"])):
        a, i = int(lay["anchor"][s]), int(lay["depth"][s])
        if a + i < T:
            np.testing.assert_allclose(float(cat[0, s]), np.exp(sum(gold[a:a + i])), rtol=1e-5)
