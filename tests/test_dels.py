"""DeLS-Spec's fused drafter (smcsd/drafters/dels.py): its proposals follow the fused q it reports (block logits +
alpha * local-head logits of the tokens drafted so far - beta * log-prior), `sd` / `sd-multi` / `sd-tree` with a
random block drafter and a random local head reproduce the enumerated p_T, greedy `sd` equals `ar`, the head
saves, loads and fuses with any block drafter of the target, training lowers its loss, and bad input is refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.drafters import DFlashDrafter, DeLSDrafter, LocalHead, initial_feed
from smcsd.drafters.dels import fused_reference_logq, unigram_log_prior
from smcsd.sampling import SamplingParams
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2


def fused(target, seed: int = 1, alpha=1.0, beta=0.3, block_size: int = 4):
    """A random block drafter fused with a random local head whose logits are large (so the fusion visibly moves q)
    and a non-uniform prior."""
    block = DFlashDrafter.create(target, num_layers=2, block_size=block_size, seed=seed, init_std=0.5)
    head = LocalHead.create(target, hidden=8, rank=8, seed=seed + 10)
    head = head.with_params({**head.params, "out": head.params["out"] * 3.0})
    prior = np.log(np.arange(1, V + 1, dtype=np.float64) / np.arange(1, V + 1).sum())
    return DeLSDrafter(block, LocalHead(head.config, head.params, prior), alpha=alpha, beta=beta)


@pytest.mark.slow  # default-run budget
def test_propose_follows_the_fused_q_it_reports():
    """K = 3 from one prompt, 20k rows: every row's reported log q equals the cache-free reference computed from the
    block's logits and that row's own drafted tokens; x_1 follows the block alone, x_2 (given x_1) the fused q, and
    the fusion really changes q (so the test has power)."""
    target, _ = tiny_pair(V, SEED)
    d = fused(target)
    p = d.drafter_params()
    R, Kp = 20_000, 3
    prompt = jnp.asarray([PROMPT], jnp.int32)
    from smcsd.models import forward_full
    from smcsd.runtime.engine import hidden_concat
    _, hid = forward_full(target.config, target.params, prompt, hidden_layers=d.hidden_layers)
    hid = hidden_concat(hid)
    state = d.init(p, prompt, jnp.asarray([len(PROMPT) - 1]), 16, 1, target_hidden=hid[:, :len(PROMPT) - 1])
    state = jax.tree_util.tree_map(lambda x: jnp.repeat(x, R, axis=0), state)
    feed, count = initial_feed(jnp.full((R,), PROMPT[-1], jnp.int32))
    sp = SamplingParams.make(1.0)
    prop = jax.jit(d.propose, static_argnums=6)(p, state, feed, count, jax.random.PRNGKey(3), sp, Kp)
    lb = d.block.block_logits_at(p["block"], state, feed[:, 0], state.lengths, Kp)
    ref = fused_reference_logq(d, lb, prop.tokens, sp)
    np.testing.assert_allclose(np.asarray(prop.logq), np.asarray(ref), atol=1e-5)
    q = np.exp(np.asarray(prop.logq, np.float64))
    np.testing.assert_allclose(q[:, 0], np.asarray(jax.nn.softmax(lb[:, 0]), np.float64), atol=1e-5)
    assert chi_square_pvalue(np.bincount(np.asarray(prop.tokens[:, 0]), minlength=V), q[0, 0]) > P_MIN
    x1 = np.asarray(prop.tokens[:, 0])
    top = np.bincount(x1).argmax()
    rows = np.flatnonzero(x1 == top)
    assert chi_square_pvalue(np.bincount(np.asarray(prop.tokens[rows, 1]), minlength=V), q[rows[0], 1]) > P_MIN
    plain = np.asarray(jax.nn.softmax(lb[rows[0], 1]), np.float64)
    assert 0.5 * np.abs(q[rows[0], 1] - plain).sum() > 0.05  # the local head moved position 2's distribution
    other = np.flatnonzero(x1 != top)[0]
    assert np.abs(q[rows[0], 1] - q[other, 1]).max() > 1e-3  # and x_2's q depends on x_1 (left-to-right)
    assert int(prop.state.lengths[0]) == len(PROMPT) + Kp - 1


@pytest.mark.parametrize("method,setting", [
    ("sd", dict(temperature=1.0)),
    pytest.param("sd-multi", dict(temperature=0.7, top_k=3), marks=pytest.mark.slow),  # default-run budget
    pytest.param("sd-tree", dict(temperature=1.0, tree="2,2"), marks=pytest.mark.slow),
])
def test_fused_drafter_is_exact(method, setting):
    target, _ = tiny_pair(V, SEED)
    d = fused(target)
    counts = sample_counts(method, target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=83, num_speculative_tokens=K,
                           num_particles=3, **setting)
    setting = {k: v for k, v in setting.items() if k != "tree"}
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, p, total_variation(counts, probs))


@pytest.mark.slow  # default-run budget
def test_greedy_sd_equals_ar():
    target, _ = tiny_pair(V, SEED)
    d = fused(target, block_size=5)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=12, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    res = smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=4, **kw)
    assert res.tokens == ref
    assert res.stats.num_draft_calls == res.stats.num_target_calls


@pytest.mark.slow  # default-run budget
def test_save_load_and_fuse_with_another_block(tmp_path):
    target, _ = tiny_pair(V, SEED)
    d = fused(target)
    d.head.save(str(tmp_path / "head"))
    head = LocalHead.load(str(tmp_path / "head"))
    np.testing.assert_array_equal(head.log_prior, d.head.log_prior)
    e = DeLSDrafter(d.block, head, alpha=d.alpha, beta=d.beta)
    assert e == d
    kw = dict(target=target, method="sd", max_new_tokens=8, num_speculative_tokens=3, seed=3, eos_id=[])
    assert smcsd.decode([[1, 2, 3]], draft=d, **kw).tokens == smcsd.decode([[1, 2, 3]], draft=e, **kw).tokens
    other = DFlashDrafter.create(target, num_layers=1, block_size=6, seed=5, init_std=0.5)
    f = DeLSDrafter(other, head)  # the head is not tied to one block drafter
    assert smcsd.decode([[1, 2, 3]], draft=f, **kw).tokens[0]


def test_errors(tmp_path):
    target, _ = tiny_pair(V, SEED)
    d = fused(target)
    with pytest.raises(TypeError, match="DFlashDrafter"):
        DeLSDrafter(target, d.head)
    with pytest.raises(TypeError, match="LocalHead"):
        DeLSDrafter(d.block, d.block)
    with pytest.raises(ValueError, match="alpha"):
        DeLSDrafter(d.block, d.head, alpha=float("nan"))
    with pytest.raises(ValueError, match="beta"):
        DeLSDrafter(d.block, d.head, beta=())
    big, _ = tiny_pair(8, SEED)
    with pytest.raises(ValueError, match="vocab"):
        DeLSDrafter(d.block, LocalHead.create(big))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        smcsd.decode([[1, 2]], target=target, draft=d, method="sd", num_speculative_tokens=4, max_new_tokens=4)
    with pytest.raises(ValueError, match="local head"):
        LocalHead.load(str(tmp_path))
    with pytest.raises(ValueError, match="shape"):
        LocalHead(d.head.config, d.head.params, np.zeros(3))


def test_unigram_log_prior():
    lp = unigram_log_prior(np.array([[0, 0, 1], [2, 0, 5]]), 6)
    np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(lp), np.array([4, 2, 2, 1, 1, 2]) / 12, rtol=1e-6)


def test_training_learns_a_local_pattern(tmp_path):
    """A byte corpus where each letter is followed by the next one (cyclically): the head, which sees only the
    block's own tokens, must learn it; held-out accuracy goes from chance to near 1 (document boundaries are the
    only exceptions), and the saved head loads."""
    from smcsd.models import ByteTokenizer, ModelConfig, init_model
    from smcsd.train import TextCorpus, train_local_head
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    target = init_model(cfg, seed=3, tokenizer=tok, init_std=0.5, name="byte-target")
    letters = "abcdefghij"
    rng = np.random.default_rng(0)
    texts = ["".join(letters[(s + i) % 10] for i in range(300)) for s in rng.integers(0, 10, 30)]
    corpus = TextCorpus(texts, tokenizer=tok, seq_len=40, batch_size=8, heldout_frac=0.1)
    head = LocalHead.create(target, hidden=32, rank=16, seed=0)
    res, trained = train_local_head(target, head, corpus, steps=200, depth=4, lr=1e-2, progress=False,
                                    out=str(tmp_path / "head"), eval_every=200)
    ev = res.history["eval"]
    assert ev[0]["heldout_acc"] < 0.3 and ev[-1]["heldout_acc"] > 0.95, ev
    assert np.argmax(trained.log_prior) in tok.encode(letters, add_bos=False)
    assert LocalHead.load(str(tmp_path / "head")).num_params == trained.num_params
