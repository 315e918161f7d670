"""The DFlash block drafter (smcsd/drafters/dflash.py): its cached decoding path equals a cache-free reference of
the same network (context written by `observe` from verification hidden states, stale slots masked, ragged
rows), its draws follow the q it reports and are independent across positions given the context, `sd` /
`sd-multi` with a randomly initialised block drafter reproduce the enumerated p_T (chi-square), `smc` follows its
exact finite-N law (computed from the reference q), greedy `sd` equals `ar`, one drafter call per cycle whatever
K, save/load round trip, and clear errors."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_full, init_model
from smcsd.drafters import DFlashDrafter
from smcsd.drafters.dflash import default_target_layers, reference_logits
from smcsd.runtime.engine import hidden_concat
from smcsd.sampling import SamplingParams
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)


def deep_target():
    """A 3-layer toy target (so the drafter reads several hidden layers) with peaked distributions."""
    return init_model(tiny_config(6, layers=3), 0, init_std=0.8, name="toy-deep")


def block(target, **kw):
    kw = {"num_layers": 2, "block_size": 4, "seed": 1, "init_std": 0.5, **kw}
    return DFlashDrafter.create(target, **kw)


def hidden_of(target, drafter, seq):
    _, h = forward_full(target.config, target.params, jnp.asarray(seq, jnp.int32), hidden_layers=drafter.hidden_layers)
    return hidden_concat(h)


def test_default_target_layers():
    assert default_target_layers(30) == (1, 8, 14, 20, 27)  # DFlash: spread from layer 1 to L-3
    assert default_target_layers(3) == (0, 1, 2) and default_target_layers(1) == (0,)
    assert default_target_layers(30, count=1) == (1,)


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_cached_path_matches_reference():
    """init on ragged prompts, observe a verified block (its hidden states), then propose with a context shorter
    than what was written (rejected slots must be masked): logits equal the cache-free reference."""
    target = deep_target()
    d = block(target)
    p = d.drafter_params()
    seq = jnp.asarray([[1, 2, 3, 4, 5, 0, 1, 2, 3, 4], [5, 4, 3, 2, 1, 0, 5, 4, 3, 2]], jnp.int32)
    hid = hidden_of(target, d, seq)
    prompt_len = jnp.asarray([5, 4], jnp.int32)
    state = d.init(p, seq[:, :5], prompt_len, 16, 1, hid[:, :5])
    observed = jnp.stack([hid[0, 5:8], hid[1, 4:7]])  # each row's next three positions
    state = d.observe(p, state, seq[:, 5:8], observed, prompt_len, jnp.asarray([3, 3]))
    ctx = jnp.asarray([8, 6], jnp.int32)  # row 1 keeps only 2 of the 3 observed slots
    anchors = jnp.asarray([int(seq[0, 8]), 5], jnp.int32)
    got = np.asarray(jax.jit(d.block_logits_at, static_argnums=4)(p, state, anchors, ctx, 3))
    ref0 = np.asarray(reference_logits(d, hid[:1], 8, anchors[:1], 3))[0]
    ref1 = np.asarray(reference_logits(d, hid[1:, :6], 6, anchors[1:], 3))[0]
    np.testing.assert_allclose(got[0], ref0, atol=1e-4)
    np.testing.assert_allclose(got[1], ref1, atol=1e-4)
    # the test has power: a context one slot longer gives other logits
    longer = np.asarray(reference_logits(d, hid[1:, :7], 7, anchors[1:], 3))[0]
    assert np.abs(longer - ref1).max() > 1e-2


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_propose_samples_independent_positions_from_q():
    """20k rows from one context: each position's draws follow its reported q, and the pair (x_1, x_2) follows
    q_1 x q_2 (chi-square; the joint proposal factorises, which keeps per-position rejection exact). The state
    advances like ARDrafter's (prompt + fed token + K-1)."""
    target = deep_target()
    d = block(target)
    p = d.drafter_params()
    R, K, V = 20_000, 2, 6
    prompt = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    hid = hidden_of(target, d, prompt)
    state = d.init(p, prompt, jnp.asarray([5]), 16, R, hid)
    feed = jnp.asarray([[0, 0]] * R, jnp.int32)
    prop = jax.jit(lambda s, k: d.propose(p, s, feed, jnp.ones((R,), jnp.int32), k, SamplingParams.make(1.0), K))(
        state, jax.random.PRNGKey(5))
    np.testing.assert_array_equal(np.asarray(prop.state.lengths), 5 + 1 + K - 1)
    q = np.exp(np.asarray(prop.logq[0], np.float64))
    assert np.allclose(np.asarray(prop.logq), np.asarray(prop.logq[:1]), atol=1e-6)  # one context, one q
    toks = np.asarray(prop.tokens)
    joint = np.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V)
    assert chi_square_pvalue(joint, np.outer(q[0], q[1]).ravel()) > P_MIN


# ----------------------------------------------------------------------------- exactness by enumeration

V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2


@pytest.mark.parametrize("method,setting", [
    ("sd", dict(temperature=1.0)),
    pytest.param("sd-multi", dict(temperature=0.7, top_k=3), marks=pytest.mark.slow),  # default-run budget
])
def test_block_drafter_is_exact(method, setting):
    """sd / sd-multi with a random block drafter on the toy target: outputs match the enumerated p_T."""
    target, _ = tiny_pair(V, SEED)
    d = block(target, block_size=4)
    counts = sample_counts(method, target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=78, num_speculative_tokens=K,
                           num_particles=3, **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, p, total_variation(counts, probs))


@pytest.mark.slow  # default-run budget (the block drafter's sd exactness stays in the default run)
def test_block_drafter_smc_matches_finite_n_law():
    """One SMC cycle (K = 1) with the block drafter as the proposal: the output follows the SIR law L_4 computed
    from the enumerated p_T and the reference q of the drafter (chi-square at N = 4, where L_4 is far from p_T)."""
    import test_smc as ts
    target, _ = ts._pair()
    d = block(target, block_size=3, init_std=0.6)
    conts = np.array(list(itertools.product(range(ts.V), repeat=ts.LENGTH)), np.int32)
    lq = np.zeros((len(conts), ts.LENGTH, ts.V))
    n = len(ts.PROMPT)
    firsts = np.arange(ts.V)
    seqs = np.concatenate([np.broadcast_to(np.asarray(ts.PROMPT), (ts.V, n)), firsts[:, None]], 1)
    q1 = jax.nn.log_softmax(reference_logits(d, hidden_of(target, d, seqs), n, jnp.asarray(firsts), 1)[:, 0], -1)
    lq[:, 1] = np.asarray(q1, np.float64)[conts[:, 0]]  # x_1's q depends on the prompt and x_0 only
    target_law, laws = ts.single_cycle_laws(ts.PROMPT, ts.LENGTH, (4,), lq=lq)
    out, _, _ = ts.smc_outputs(4, ts.LENGTH, 10_000, seed=91, draft=d)
    counts = ts.counts_of(out, ts.LENGTH)
    assert chi_square_pvalue(counts, laws[4]) > P_MIN
    assert 0.5 * np.abs(laws[4] - target_law).sum() > 0.05  # L_4 is visibly biased: the test has power


@pytest.mark.slow  # default-run budget
def test_greedy_sd_equals_ar_with_one_drafter_call_per_cycle():
    """At T = 0, sd and sd-multi with a block drafter emit ar's tokens over many cycles (so `observe` runs between
    cycles), with one drafter call per target call whatever K."""
    target = deep_target()
    d = block(target, block_size=6)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    for method, k in (("sd", 5), ("sd-multi", 2)):
        res = smcsd.decode(prompts, draft=d, method=method, num_speculative_tokens=k, num_particles=2, **kw)
        assert res.tokens == ref, method
        assert res.stats.num_draft_calls == res.stats.num_target_calls


def test_save_load_round_trip(tmp_path):
    target = deep_target()
    d = block(target)
    d.save(str(tmp_path / "dflash"))
    e = DFlashDrafter.load(str(tmp_path / "dflash"))
    assert e == d and e.name == "dflash" and e.num_params == d.num_params
    kw = dict(target=target, method="sd", max_new_tokens=8, num_speculative_tokens=3, seed=3, eos_id=[])
    assert smcsd.decode([[1, 2, 3]], draft=d, **kw).tokens == smcsd.decode([[1, 2, 3]], draft=e, **kw).tokens


def test_errors(tmp_path):
    target = deep_target()
    d = block(target, block_size=4)
    with pytest.raises(ValueError, match="num_speculative_tokens=4 .*at most 3"):
        smcsd.decode([[1, 2]], target=target, draft=d, method="sd", num_speculative_tokens=4)
    other = init_model(tiny_config(7, layers=3), 0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        smcsd.decode([[1, 2]], target=other, draft=d, method="sd")
    wide = init_model(tiny_config(6, hidden=32, layers=3), 0)
    with pytest.raises(ValueError, match="hidden_size"):
        smcsd.decode([[1, 2]], target=wide, draft=d, method="sd")
    shallow = init_model(tiny_config(6, layers=1), 0)
    with pytest.raises(ValueError, match="layers"):
        smcsd.decode([[1, 2]], target=shallow, draft=d, method="sd")
    with pytest.raises(ValueError, match="num_layers"):
        DFlashDrafter.create(target, num_layers=0)
    with pytest.raises(ValueError, match="block_size"):
        DFlashDrafter.create(target, block_size=1)
    with pytest.raises(ValueError, match="no block drafter"):
        DFlashDrafter.load(str(tmp_path))


# ----------------------------------------------------------------------------- training (smcsd/train/dflash.py)

def _byte_setup():
    from smcsd.models import ByteTokenizer, ModelConfig
    from smcsd.train import TextCorpus
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    target = init_model(cfg, seed=3, tokenizer=tok, init_std=0.5, name="tiny-target")
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "def", "f(x):", "return", "x"]
    texts = [" ".join(rng.choice(words, size=30)) + "." for _ in range(40)]
    corpus = TextCorpus(texts, tokenizer=tok, seq_len=32, batch_size=8)
    return target, corpus


def test_training_forward_matches_decode_reference():
    """Every anchored block of the training pass (shared context K/V, block-diagonal mask) has the logits of a
    single decode-time proposal at that anchor (the cache-free reference): training learns what decoding runs."""
    from smcsd.train.dflash import block_train_logits, sample_anchors
    target = deep_target()
    d = block(target, block_size=4)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, 6, (2, 12)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    anchors = jnp.asarray(sample_anchors(0, 0, 2, 12, 4))
    logits, labels, in_range = block_train_logits(d.block_config, d.params, d.shared, tokens, hid, anchors)
    assert logits.shape == (2, 4, 3, 6)
    for r in range(2):
        for i in range(4):
            a = int(anchors[r, i])
            ref = reference_logits(d, hid[r:r + 1], a, tokens[r:r + 1, a], 3)[0]
            ok = np.asarray(in_range[r, i])
            np.testing.assert_allclose(np.asarray(logits[r, i])[ok], np.asarray(ref)[ok], atol=1e-4)
            want = [int(tokens[r, a + k]) for k in range(1, 4) if a + k < 12]
            assert np.asarray(labels[r, i])[ok].tolist() == want


def test_sample_anchors():
    from smcsd.train.dflash import sample_anchors
    a = sample_anchors(0, 3, 4, 32, 8)
    assert a.shape == (4, 8) and a.min() >= 1 and a.max() <= 30
    assert all(len(set(r)) == 8 for r in a.tolist())
    np.testing.assert_array_equal(a, sample_anchors(0, 3, 4, 32, 8))  # a function of (seed, step)
    assert not np.array_equal(a, sample_anchors(0, 4, 4, 32, 8))
    with pytest.raises(ValueError, match="num_anchors"):
        sample_anchors(0, 0, 1, 8, 7)


@pytest.mark.slow  # default-run budget (test_training_resume_is_exact runs the training loop in the default run)
@pytest.mark.parametrize("weighting", ["dflash", "dpace"])
def test_training_learns_the_target(tmp_path, weighting):
    """60 steps of KL-to-target training: held-out expected accepted length at least doubles from the random init's
    (0.05 -> 0.16 measured for both weightings; a random target over 259 bytes is hard to imitate),
    the export loads back and drafts under `sd` with one drafter call per cycle."""
    from smcsd.train import train_block_drafter
    target, corpus = _byte_setup()
    d = DFlashDrafter.create(target, num_layers=1, block_size=4, seed=0)
    res = train_block_drafter(target, d, corpus, steps=60, weighting=weighting, lr=1e-2, num_anchors=6,
                              ce_weight=0.1, kl_weight=1.0, topk=16, eval_every=60, progress=False,
                              out=str(tmp_path / "dflash"))
    first, last = res.history["eval"][0], res.history["eval"][-1]
    assert last["accept_len"] > max(2 * first["accept_len"], first["accept_len"] + 0.08), (first, last)
    assert last["ce"] < first["ce"]
    e = DFlashDrafter.load(str(tmp_path / "dflash"))
    assert e.block_config == d.block_config
    out = smcsd.decode([[1, 2, 3]], target=target, draft=e, method="sd", num_speculative_tokens=3,
                       max_new_tokens=12, temperature=1.0, eos_id=[])
    assert out.stats.num_draft_calls == out.stats.num_target_calls and len(out.tokens[0]) == 12


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_training_resume_is_exact(tmp_path):
    """Stopped after 6 steps and resumed to 12: the same losses (anchors included) as 12 steps straight."""
    from smcsd.train import train_block_drafter
    target, corpus = _byte_setup()
    d = DFlashDrafter.create(target, num_layers=1, block_size=4, seed=0)
    kw = dict(steps=12, weighting="dpace", lr=1e-2, num_anchors=4, kl_weight=0.5, topk=8, progress=False,
              eval_every=100)
    full = train_block_drafter(target, d, corpus, **kw)
    train_block_drafter(target, d, corpus, ckpt_dir=str(tmp_path / "ck"), stop_after=6, **kw)
    resumed = train_block_drafter(target, d, corpus, ckpt_dir=str(tmp_path / "ck"), resume=True, **kw)
    assert [r["loss"] for r in resumed.history["train"]] == [r["loss"] for r in full.history["train"]]


def test_training_errors():
    from smcsd.train import train_block_drafter
    from smcsd.train.dflash import block_loss
    target, corpus = _byte_setup()
    d = DFlashDrafter.create(target, num_layers=1, block_size=4)
    with pytest.raises(ValueError, match="weighting"):
        block_loss(d.block_config, "bogus")
    with pytest.raises(TypeError, match="DFlashDrafter"):
        train_block_drafter(target, target, corpus, steps=1)
    with pytest.raises(ValueError, match="num_anchors"):
        train_block_drafter(target, d, corpus, steps=1, num_anchors=40, progress=False)


@pytest.mark.slow  # the real tiny-code pair, two decodes (~40 s of compiles)
def test_shipped_distilled_block_drafter_is_exact_at_t0():
    """tiny-code's shipped `dflash-distilled` (trained on the target's own continuations) is a DFlash drafter bound
    to the target, and greedy `sd` with it at K = 8 emits `ar`'s tokens on held-out prompts."""
    from experiments.common import prompts_for
    assert "dflash-distilled" in smcsd.available_drafters("tiny-code")
    target, d = smcsd.load("tiny-code", drafter="dflash-distilled")
    assert isinstance(d, DFlashDrafter) and d.name == "tiny-code/dflash-distilled"
    prompts = prompts_for("tiny-code", target, 4, 32, seed=3)
    kw = dict(target=target, max_new_tokens=48, temperature=0.0)
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    res = smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=8, **kw)
    assert res.tokens == ref
    # it pays: >= 2 tokens per target call over the batch (greedy, so deterministic; it makes 14 calls for 48
    # tokens, the corpus-trained `dflash-dpace` 38, `ar` 47)
    assert res.stats.num_target_calls <= 48 // 2, res.stats.num_target_calls
