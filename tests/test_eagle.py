"""The EAGLE-3 drafter (smcsd/drafters/eagle.py): its cached decoding path (prompt pairs from the prefill's hidden
states, `observe` from the verification call, rollback, shared-prefix rows) equals the training-time-test unroll
(`eagle_unroll_logits`), its draws follow the q it reports (a reduced draft vocabulary: q = 0 outside, or the floor
mixture under smc), `sd` / `sd-multi` / `sd-tree` reproduce the enumerated p_T with a random drafter over a reduced
vocabulary where the target puts mass outside it (chi-square), `smc` follows its exact finite-N law with the floor
mixture as its proposal, greedy `sd` equals `ar`, EAGLE / SpecForge checkpoints load (a checkpoint written by tensor
name with NumPy gives the logits of an independent NumPy forward) and round-trip, and bad input gets clear errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_full, init_model
from smcsd.drafters import DraftVocab, EagleDrafter, KINDS
from smcsd.drafters.eagle import default_target_layers, eagle_unroll_logits
from smcsd.drafters.vocab import floor_mixture
from smcsd.runtime.engine import hidden_concat
from smcsd.sampling import SamplingParams
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_config, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
P_BROKEN = 1e-6


def deep_target():
    """A 3-layer toy target (so the three feature layers differ) with peaked distributions."""
    return init_model(tiny_config(6, layers=3), 0, init_std=0.8, name="toy-deep")


def eagle(target, vocab=None, **kw):
    return EagleDrafter.create(target, draft_vocab=vocab, **{"seed": 1, "init_std": 0.5, **kw})


_unroll = jax.jit(eagle_unroll_logits, static_argnums=(0, 5))


def hidden_of(target, drafter, seq):
    _, h = forward_full(target.config, target.params, jnp.asarray(seq, jnp.int32), hidden_layers=drafter.hidden_layers)
    return hidden_concat(h)


def test_default_target_layers_and_registration():
    assert default_target_layers(30) == (1, 14, 26)  # SpecForge / SGLang: outputs of layers 1, L//2-1, L-4
    assert default_target_layers(32) == (1, 15, 28)
    assert default_target_layers(3) == (0, 1, 2) and default_target_layers(1) == (0, 0, 0)
    assert KINDS["eagle"] is EagleDrafter


# ----------------------------------------------------------------------------- the cached path vs the unroll

def _one_cycle(d, p, prompt, prompt_len, hid, block, block_hid, n_acc, pending, K, rows, shared, key):
    """init -> propose -> verification (observe the given block, accept n_acc) -> rollback -> propose, the
    bookkeeping of smcsd/methods/sd.py; returns (first proposal, second proposal)."""
    B = prompt.shape[0]
    st = d.init(p, prompt, prompt_len, 32, rows, hid, **({"suffix_len": 24} if shared else {}))
    R = B * rows
    rep = lambda a: jnp.repeat(a, rows, axis=0)  # noqa: E731
    feed = jnp.stack([rep(block[:, 0]), jnp.zeros((R,), jnp.int32)], 1)
    one = jnp.ones((R,), jnp.int32)
    sampling = SamplingParams.make(1.0)
    prop = d.propose(p, st, feed, one, key, sampling, K)
    start = rep(prompt_len)
    st = d.observe(p, prop.state, rep(block), rep(block_hid), start, rep(n_acc) + 1)
    full = rep(n_acc) == K
    tlen = start + 1 + rep(n_acc)
    fc = jnp.where(full, 2, 1)
    st = d.set_lengths(st, tlen + 1 - fc)
    nxt = rep(pending)  # the correction / bonus token: the sequence's next token
    feed = jnp.where(full[:, None], jnp.stack([rep(block)[:, K], nxt], 1), jnp.stack([nxt, 0 * nxt], 1))
    return prop, d.propose(p, st, feed, fc, jax.random.fold_in(key, 1), sampling, K)


@pytest.mark.parametrize("vocab,shared", [pytest.param(None, False, marks=pytest.mark.slow), ((0, 2, 3, 5), True)])
def test_cached_path_matches_unroll(vocab, shared):
    """Ragged prompts, one verified block with partial acceptance (row 0 accepts all K = 3, row 1 one token), a
    rollback, then a second proposal: every step's log q equals the training unroll on the committed sequence plus
    the drafted tokens (iteration i at the committed length) -- with the full vocabulary on plain rows, and with a
    reduced one (−inf outside) on shared-prefix rows (two rows per request)."""
    target = deep_target()
    v = None if vocab is None else DraftVocab.from_ids(vocab, 6)
    d = eagle(target, v)
    p = d.drafter_params()
    rng = np.random.default_rng(0)
    seq = jnp.asarray(rng.integers(0, 6, (2, 14)), jnp.int32)
    hid = hidden_of(target, d, seq)
    plen = jnp.asarray([5, 4], jnp.int32)
    K, rows = 3, (2 if shared else 1)
    n_acc = jnp.asarray([3, 1], jnp.int32)
    block = jnp.stack([seq[0, 5:9], seq[1, 4:8]])
    block_hid = jnp.stack([hid[0, 5:9], hid[1, 4:8]])
    commit = [9, 6]  # committed target lengths after the cycle; the pending token sits there
    pending = jnp.asarray([seq[0, 9], seq[1, 6]], jnp.int32)
    first, second = jax.jit(_one_cycle, static_argnums=(0, 9, 10, 11))(
        d, p, seq[:, :5], plen, hid[:, :5], block, block_hid, n_acc, pending, K, rows, shared, jax.random.PRNGKey(3))
    # the references: every (row, proposal) sequence = committed tokens + pending + drafted x_1..x_{K-1}, padded
    # at the end (row L of the unroll reads nothing after position L + K - 1), in one batched unroll
    cases, seqs = [], []
    for b in range(2):
        for r in range(rows):
            for prop, L in ((first, int(plen[b])), (second, commit[b])):
                drafted = np.asarray(prop.tokens[b * rows + r])
                ref = np.concatenate([np.asarray(seq[b, :L + 1]), drafted[:K - 1]])
                seqs.append(np.pad(ref, (0, 14 - len(ref))))
                cases.append((prop, b * rows + r, L, drafted))
    seqs = jnp.asarray(np.stack(seqs), jnp.int32)
    ref = np.asarray(jax.nn.log_softmax(_unroll(d.eagle_config, d.params, p["embed"], seqs, hidden_of(target, d, seqs),
                                                K), -1))  # [K, cases, T-1, V']
    for c, (prop, row, L, drafted) in enumerate(cases):
        want, got = ref[:, c, L - 1], np.asarray(prop.logq[row])
        if v is None:
            np.testing.assert_allclose(got, want, atol=2e-4)
        else:
            np.testing.assert_allclose(got[:, v.draft_to_target], want, atol=2e-4)
            assert np.all(np.isneginf(np.delete(got, v.draft_to_target, axis=1)))
            assert np.isin(drafted, v.draft_to_target).all()
    # the test has power: the unroll one position off gives other log q
    on = np.asarray(second.logq[0, 0])
    keep = slice(None) if v is None else v.draft_to_target
    assert np.abs(ref[0, 1, 9] - on[keep]).max() > 1e-2


@pytest.mark.slow  # default-run budget: the enumeration tests below check the same (a misreported q fails them)
def test_propose_samples_from_its_q_with_the_floor():
    """20k rows from one context, reduced vocabulary: the plain proposal draws only kept tokens, as its q says; the
    smc proposal (`importance_proposal`, floor ε = 0.3 here) draws the mixture (1−ε)q′ + ε/V it reports, outside
    tokens included (chi-square against the reported q at positions 1 and 2 given position 1's token)."""
    target = deep_target()
    v = DraftVocab.from_ids([0, 2, 3], 6)
    d = eagle(target, v, smc_floor=0.3)
    R, K = 20_000, 2
    prompt = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    for drafter in (d, d.importance_proposal()):
        p = drafter.drafter_params()
        st = drafter.init(p, prompt, jnp.asarray([5]), 16, R, hidden_of(target, drafter, prompt))
        feed = jnp.asarray([[0, 0]] * R, jnp.int32)
        prop = jax.jit(lambda s, k: drafter.propose(p, s, feed, jnp.ones((R,), jnp.int32), k,
                                                    SamplingParams.make(1.0), K))(st, jax.random.PRNGKey(5))
        np.testing.assert_array_equal(np.asarray(prop.state.lengths), 5 + K)
        q = np.exp(np.asarray(prop.logq[0, 0], np.float64))
        np.testing.assert_allclose(q.sum(), 1.0, atol=1e-5)
        toks = np.asarray(prop.tokens)
        assert chi_square_pvalue(np.bincount(toks[:, 0], minlength=6), q) > P_MIN
        outside = ~np.isin(toks, v.draft_to_target)
        if drafter.floor == 0:
            assert not outside.any() and np.all(q[[1, 4, 5]] == 0)
        else:
            assert drafter.floor == 0.3 and outside.mean() > 0.1
            np.testing.assert_allclose(q[[1, 4, 5]], 0.3 / 6, rtol=1e-5)
        # position 2 given position 1 = 0: its reported q is what those rows drew from
        sel = toks[:, 0] == 0
        lq2 = np.asarray(prop.logq)[sel, 1]
        np.testing.assert_allclose(lq2, np.broadcast_to(lq2[:1], lq2.shape), atol=1e-5)  # one context, one q
        q2 = np.exp(lq2[0].astype(np.float64))
        assert chi_square_pvalue(np.bincount(toks[sel, 1], minlength=6), q2) > P_MIN


# ----------------------------------------------------------------------------- exactness by enumeration

V, SEED = 6, 2
PROMPT, LENGTH, K = (0, 1, 2, 0, 1), 3, 2
VOCAB = (0, 2, 3, 5)  # the target puts mass on 1 and 4 too: drafts never propose them, verification must


def _reduced(target):
    return DraftVocab.from_ids(VOCAB, V)


def _outside_mass(target, **setting):
    """p_T's probability that a continuation holds a token outside the draft vocabulary."""
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    conts = np.array(list(itertools.product(range(V), repeat=LENGTH)))
    return float(probs[~np.isin(conts, VOCAB).all(1)].sum())


@pytest.mark.parametrize("method,setting,vocab", [
    ("sd", dict(temperature=1.0), True),
    pytest.param("sd-multi", dict(temperature=0.7, top_k=3), True, marks=pytest.mark.slow),  # default-run budget
    pytest.param("sd", dict(temperature=0.7, top_p=0.9), False, marks=pytest.mark.slow),
    pytest.param("sd-multi", dict(temperature=1.0), False, marks=pytest.mark.slow),
])
def test_eagle_is_exact(method, setting, vocab):
    """sd / sd-multi with a random EAGLE drafter (over 4 of the 6 tokens where `vocab`) reproduce the enumerated p_T
    (20k samples, chi-square)."""
    target, _ = tiny_pair(V, SEED)
    d = eagle(target, _reduced(target) if vocab else None)
    if vocab:
        assert _outside_mass(target, **setting) > 0.05  # the target really puts mass outside the draft vocabulary
    counts = sample_counts(method, target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=78, num_speculative_tokens=K,
                           num_particles=3, **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, p, total_variation(counts, probs))


@pytest.mark.parametrize("tree,vocab", [pytest.param("2,2:sample", True, marks=pytest.mark.slow),  # budget pytest.param("3,1:distinct", False, marks=pytest.mark.slow),
                                        pytest.param("3,1:top", True, marks=pytest.mark.slow)])
def test_eagle_tree_is_exact(tree, vocab):
    """sd-tree with an EAGLE drafter's product tree (each level one drafter call over its nodes, ancestor-masked),
    over a reduced vocabulary: the enumerated p_T (chi-square)."""
    target, _ = tiny_pair(V, SEED)
    d = eagle(target, _reduced(target) if vocab else None)
    counts = sample_counts("sd-tree", target, d, (0, 1), LENGTH, 20_000, batch=5000, seed=3000, tree=tree)
    probs = exact_distribution(target, (0, 1), LENGTH)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (tree, p, total_variation(counts, probs))


@pytest.mark.slow
def test_broken_acceptance_is_detected_with_eagle(accept_always):
    target, _ = tiny_pair(V, SEED)
    counts = sample_counts("sd", target, eagle(target, _reduced(target)), PROMPT, LENGTH, 20_000, batch=5000, seed=78,
                           num_speculative_tokens=K)
    assert chi_square_pvalue(counts, exact_distribution(target, PROMPT, LENGTH)) < P_BROKEN


@pytest.mark.slow
def test_eagle_smc_matches_finite_n_law():
    """One SMC cycle (K = 1) with a reduced-vocabulary EAGLE drafter: smc proposes from the floor mixture
    q = (1 − ε)q′ + ε/V (ε = 0.2 here), and the output follows the SIR law L_4 computed from the enumerated p_T and
    that q from the unroll reference (chi-square at N = 4, where L_4 is far from p_T); TV to p_T shrinks at N = 32."""
    import test_smc as ts
    target, _ = ts._pair()
    v = DraftVocab.from_ids(VOCAB, ts.V)
    d = eagle(target, v, smc_floor=0.2)
    conts = np.array(list(itertools.product(range(ts.V), repeat=ts.LENGTH)), np.int32)
    n = len(ts.PROMPT)
    firsts = np.arange(ts.V)
    seqs = np.concatenate([np.broadcast_to(np.asarray(ts.PROMPT), (ts.V, n)), firsts[:, None]], 1)
    logits = _unroll(d.eagle_config, d.params, d.shared["embed"], jnp.asarray(seqs), hidden_of(target, d, seqs),
                     1)[0, :, n - 1]  # x_1's q given the prompt and x_0
    q1 = np.asarray(floor_mixture(jax.nn.log_softmax(logits, -1), v.draft_to_target, ts.V, 0.2), np.float64)
    lq = np.zeros((len(conts), ts.LENGTH, ts.V))
    lq[:, 1] = q1[conts[:, 0]]
    target_law, laws = ts.single_cycle_laws(ts.PROMPT, ts.LENGTH, (4, 32), lq=lq)
    tv = {}
    for N in (4, 32):
        out, _, flags = ts.smc_outputs(N, ts.LENGTH, 10_000, seed=91 * N, draft=d)
        counts = ts.counts_of(out, ts.LENGTH)
        assert chi_square_pvalue(counts, laws[N]) > P_MIN, N
        assert not np.any(flags)  # the floor keeps every weight finite
        tv[N] = total_variation(counts, target_law)
    assert 0.5 * np.abs(laws[4] - target_law).sum() > 0.05  # L_4 is visibly biased: the test has power
    assert tv[32] < tv[4], tv


def test_smc_runs_the_floored_proposal(monkeypatch):
    """smc builds its program from `importance_proposal()` (the floor ε = smc_floor); the exact methods keep q′;
    smc_floor = 0 with a reduced vocabulary is refused (q would be 0 where p_T is not)."""
    from smcsd.methods import smc as smc_mod
    from smcsd.decode import prepare
    target, _ = tiny_pair(V, SEED)
    d = eagle(target, _reduced(target), smc_floor=0.05)
    assert d.floor == 0 and d.full_support and d.importance_proposal().floor == 0.05
    full = eagle(target)
    assert full.importance_proposal() is full
    seen = []
    real = EagleDrafter.propose

    def spy(self, *a, **k):
        seen.append(self.floor)
        return real(self, *a, **k)

    monkeypatch.setattr(EagleDrafter, "propose", spy)
    prep = prepare([[0, 1]], target=target, draft=d, method="smc", max_new_tokens=4, num_speculative_tokens=1,
                   num_particles=2)
    init, cycle, _ = smc_mod.program_parts(target.config, prep.draft, prep.spec)
    tp, dp, inp = prep.args
    jax.eval_shape(lambda: cycle(tp, dp, inp, init(tp, dp, inp)))  # traces propose, computes nothing
    assert seen == [0.05], seen
    with pytest.raises(ValueError, match="positive probability"):
        smcsd.decode([[0, 1]], target=target, draft=eagle(target, _reduced(target), smc_floor=0.0), method="smc",
                     max_new_tokens=4)


@pytest.mark.slow
def test_greedy_sd_equals_ar():
    """At T = 0, sd, sd-multi and sd-tree with an EAGLE drafter (reduced vocabulary) emit ar's tokens over many
    cycles, with K drafter calls per sd cycle."""
    target = deep_target()
    d = eagle(target, DraftVocab.from_ids(VOCAB, 6))
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3]]
    kw = dict(target=target, max_new_tokens=14, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    for method, extra in (("sd", dict(num_speculative_tokens=3)), ("sd-multi", dict(num_speculative_tokens=2,
                                                                                    num_particles=2)),
                          ("sd-tree", dict(tree="2,1,1:top"))):
        res = smcsd.decode(prompts, draft=d, method=method, **extra, **kw)
        assert res.tokens == ref, method
    res = smcsd.decode(prompts, draft=d, method="sd", num_speculative_tokens=3, **kw)
    assert res.stats.num_draft_calls == 3 * res.stats.num_target_calls


# ----------------------------------------------------------------------------- EAGLE / SpecForge checkpoints

def _np_rms(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps))


def _np_rope(x, pos, hd, theta):
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = hd // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rot * sin[:, None]


def _np_eagle_first_step(W, cfg, feats3, tokens, embed):
    """An independent NumPy EAGLE-3 forward (SpecForge's LlamaForCausalLMEagle3 with its HF weight layout [out, in]):
    pairs (fc(feats3[t]), embed[tokens[t]]) at positions 1..T, causal; returns the draft-vocabulary logits [T, V']."""
    hq, hk, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    g = feats3 @ W["fc.weight"].T
    e = embed[tokens]
    x = np.concatenate([_np_rms(e, W["midlayer.input_layernorm.weight"], eps),
                        _np_rms(g, W["midlayer.hidden_norm.weight"], eps)], -1)
    T = len(tokens)
    pos = np.arange(1, T + 1, dtype=np.float64)
    q = _np_rope((x @ W["midlayer.self_attn.q_proj.weight"].T).reshape(T, hq, hd), pos, hd, cfg["rope_theta"])
    k = _np_rope((x @ W["midlayer.self_attn.k_proj.weight"].T).reshape(T, hk, hd), pos, hd, cfg["rope_theta"])
    v = (x @ W["midlayer.self_attn.v_proj.weight"].T).reshape(T, hk, hd)
    rep = hq // hk
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    att = np.einsum("hqk,khd->qhd", a, v).reshape(T, hq * hd)
    h = g + att @ W["midlayer.self_attn.o_proj.weight"].T
    m = _np_rms(h, W["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = m @ W["midlayer.mlp.gate_proj.weight"].T, m @ W["midlayer.mlp.up_proj.weight"].T
    h = h + (gate / (1 + np.exp(-gate)) * up) @ W["midlayer.mlp.down_proj.weight"].T
    return _np_rms(h, W["norm.weight"], eps) @ W["lm_head.weight"].T


def test_loads_a_specforge_checkpoint_written_by_name(tmp_path):
    """A LlamaForCausalLMEagle3 checkpoint written tensor by tensor with NumPy (SpecForge's names, [out, in] matrices,
    d2t offsets, t2d mask, an embed_tokens.weight that is ignored) loads; its first-step logits equal an independent
    NumPy forward of the same weights; `save` writes the same names and loads back to the same drafter."""
    from safetensors.numpy import save_file
    target = deep_target()
    H, I, V, Vd = 16, 32, 6, 4
    hq, hk, hd = 2, 1, 8
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": hq, "num_key_value_heads": hk, "head_dim": hd,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
           "vocab_size": V, "draft_vocab_size": Vd, "tie_word_embeddings": False, "torch_dtype": "float32",
           "hidden_act": "silu", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    rng = np.random.default_rng(0)
    r = lambda *s: rng.normal(0, 0.5, s).astype(np.float32)  # noqa: E731
    W = {"fc.weight": r(H, 3 * H), "midlayer.input_layernorm.weight": 1 + r(H), "midlayer.hidden_norm.weight": 1 + r(H),
         "midlayer.post_attention_layernorm.weight": 1 + r(H), "midlayer.self_attn.q_proj.weight": r(hq * hd, 2 * H),
         "midlayer.self_attn.k_proj.weight": r(hk * hd, 2 * H), "midlayer.self_attn.v_proj.weight": r(hk * hd, 2 * H),
         "midlayer.self_attn.o_proj.weight": r(H, hq * hd), "midlayer.mlp.gate_proj.weight": r(I, H),
         "midlayer.mlp.up_proj.weight": r(I, H), "midlayer.mlp.down_proj.weight": r(H, I), "norm.weight": 1 + r(H),
         "lm_head.weight": r(Vd, H)}
    kept = np.array([0, 2, 3, 5])
    tensors = {**W, "d2t": (kept - np.arange(Vd)).astype(np.int64), "t2d": np.isin(np.arange(V), kept),
               "embed_tokens.weight": r(V, H)}
    ck = tmp_path / "eagle3-ckpt"
    ck.mkdir()
    save_file(tensors, str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps(cfg))
    d = EagleDrafter.load(str(ck)).bind(target)
    assert d.hidden_layers == (0, 1, 2) and d.vocab.draft_to_target.tolist() == kept.tolist()
    seq = np.asarray([[1, 2, 3, 4, 5, 0, 1]])
    feats = np.asarray(hidden_of(target, d, seq), np.float64)[0]
    embed = np.asarray(target.params["embed_tokens"]["embedding"], np.float64)
    want = _np_eagle_first_step({k: v.astype(np.float64) for k, v in W.items()}, cfg, feats[:-1], seq[0, 1:], embed)
    got = _unroll(d.eagle_config, d.params, d.shared["embed"], jnp.asarray(seq), hidden_of(target, d, seq), 1)[0, 0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    # (decoding = the unroll: test_cached_path_matches_unroll)
    # save: the same tensor names and values, and the maps in SpecForge's convention
    d.save(str(tmp_path / "saved"))
    from safetensors.numpy import load_file
    back = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert set(back) == set(W) | {"d2t", "t2d"}
    for k in W:
        np.testing.assert_allclose(back[k], W[k], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(back["d2t"] + np.arange(Vd), kept)
    np.testing.assert_array_equal(back["t2d"], np.isin(np.arange(V), kept))
    saved_cfg = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved_cfg["architectures"] == ["LlamaForCausalLMEagle3"] and saved_cfg["draft_vocab_size"] == Vd
    assert saved_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    e = EagleDrafter.load(str(tmp_path / "saved")).bind(target)
    assert e == d and e.vocab == d.vocab


def test_save_load_round_trip(tmp_path):
    """float32 save / load gives the same drafter (same static identity, hence the same compiled programs, and the
    same weights); bfloat16 keeps every weight to bfloat16's precision."""
    target = deep_target()
    d = eagle(target, DraftVocab.from_ids(VOCAB, 6))
    d.save(str(tmp_path / "f"))
    f = EagleDrafter.load(str(tmp_path / "f")).bind(target)
    assert f == d and hash(f) == hash(d) and f.vocab == d.vocab and f.name == "f"
    for a, b in zip(jax.tree_util.tree_leaves(d.params), jax.tree_util.tree_leaves(f.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    d.save(str(tmp_path / "e"), dtype="bfloat16")
    e = EagleDrafter.load(str(tmp_path / "e"), dtype="float32").bind(target)
    tol = 2 ** -7  # bfloat16 keeps 8 significant bits
    for a, b in zip(jax.tree_util.tree_leaves(d.params), jax.tree_util.tree_leaves(e.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=1e-6)


def test_cutting_the_draft_vocabulary_keeps_the_head_rows(tmp_path):
    """`with_draft_vocab` on a smaller vocabulary inside the drafter's own: the cut drafter's logits are the original's
    at the kept tokens (full -> 4 tokens -> 2 by `DraftVocab.top`, the stop id kept), it saves and loads as such, and
    a vocabulary with tokens the head has no row for, a non-vocabulary, or a bad cut size are refused by name."""
    target = deep_target()
    d = eagle(target)
    rng = np.random.default_rng(5)
    seq = jnp.asarray(rng.integers(0, 6, (2, 9)), jnp.int32)
    hid = hidden_of(target, d, seq)

    def logits(dr):
        return np.asarray(_unroll(dr.eagle_config, dr.params, dr.drafter_params()["embed"], seq, hid, 2))

    full = logits(d)
    v4 = DraftVocab.from_ids(VOCAB, 6)
    d4 = d.with_draft_vocab(v4).bind(target)
    assert d4.vocab == v4 and d4.eagle_config.draft_vocab_size == 4 and d4.num_params < d.num_params
    np.testing.assert_allclose(logits(d4), full[..., v4.draft_to_target], atol=1e-5)
    counts = np.array([1, 0, 9, 7, 0, 2])
    v2 = v4.top(counts, 2, required_ids=[5])  # the most frequent kept id (2) and the required 5
    assert v2.draft_to_target.tolist() == [2, 5]
    d2 = d4.with_draft_vocab(v2)
    np.testing.assert_allclose(logits(d2), full[..., [2, 5]], atol=1e-5)
    d2.save(str(tmp_path / "cut"))
    back = EagleDrafter.load(str(tmp_path / "cut")).bind(target)
    assert back.vocab == v2 and back.eagle_config.draft_vocab_size == 2
    np.testing.assert_allclose(logits(back), full[..., [2, 5]], atol=1e-5)
    assert np.abs(full[..., [2, 5]] - full[..., [0, 2]]).max() > 1e-3  # the test has power: other rows differ
    with pytest.raises(ValueError, match="no row for"):
        d2.with_draft_vocab(DraftVocab.from_ids([0, 3], 6))  # 0 and 3 were cut away
    with pytest.raises(TypeError, match="DraftVocab"):
        d.with_draft_vocab([0, 2])
    with pytest.raises(ValueError, match="size"):
        v4.top(counts, 4)
    with pytest.raises(ValueError, match="required_ids"):
        v4.top(counts, 2, required_ids=[1])
    with pytest.raises(ValueError, match="one count per target id"):
        v4.top(counts[:5], 2)


@pytest.mark.slow  # default-run budget (the cut drafter is an EagleDrafter over a vocabulary: test_eagle_is_exact)
def test_a_cut_drafter_is_exact():
    """sd with a drafter cut from the full vocabulary to 4 tokens reproduces the enumerated p_T (20k samples,
    chi-square), the target putting mass outside the cut vocabulary."""
    target, _ = tiny_pair(V, SEED)
    d = eagle(target).with_draft_vocab(_reduced(target))
    setting = dict(temperature=1.0)
    assert _outside_mass(target, **setting) > 0.05
    counts = sample_counts("sd", target, d, PROMPT, LENGTH, 20_000, batch=5000, seed=79, num_speculative_tokens=K,
                           **setting)
    probs = exact_distribution(target, PROMPT, LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (p, total_variation(counts, probs))


def test_errors(tmp_path):
    target = deep_target()
    with pytest.raises(ValueError, match="target hidden layers \\[5\\]"):
        EagleDrafter.create(target, target_layers=(0, 1, 5))
    with pytest.raises(ValueError, match="three target layers"):
        EagleDrafter.create(target, target_layers=(0, 1))
    d = eagle(target)
    other = lambda **kw: dataclasses.replace(target, config=target.config.replace(**kw))  # noqa: E731
    with pytest.raises(ValueError, match="target hidden layers"):
        d.bind(other(num_hidden_layers=1))
    with pytest.raises(ValueError, match="vocabularies differ"):
        d.bind(other(vocab_size=7))
    with pytest.raises(ValueError, match="hidden_size"):
        d.bind(other(hidden_size=32, num_attention_heads=4))
    with_eos = other(eos_token_id=4)
    with pytest.raises(ValueError, match="misses the target's stop"):
        EagleDrafter.create(with_eos, draft_vocab=DraftVocab.from_ids([0, 1, 2], 6))
    assert EagleDrafter.create(with_eos, draft_vocab=DraftVocab.from_counts(np.arange(6)[::-1], 3, required_ids=[4]))
    with pytest.raises(ValueError, match="does not match the config's draft_vocab_size"):
        EagleDrafter(d.eagle_config, d.params, DraftVocab.from_ids([0, 1], 6))
    with pytest.raises(ValueError, match="smc_floor"):
        eagle(target, smc_floor=1.5)
    with pytest.raises(ValueError, match="config.json missing"):
        EagleDrafter.load(str(tmp_path))
    d.save(str(tmp_path / "bad"))
    cfg = json.loads((tmp_path / "bad" / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="shapes differ"):
        EagleDrafter.load(str(tmp_path / "bad"))


# ----------------------------------------------------------------------------- training (smcsd/train/eagle.py)

def _byte_setup(batch_size=8, seq_len=32, heldout_frac=0.05):
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
    corpus = TextCorpus(texts, tokenizer=tok, seq_len=seq_len, batch_size=batch_size, heldout_frac=heldout_frac)
    return target, corpus


def _byte_vocab(target, corpus, size=64):
    from smcsd.drafters import stop_ids_of
    counts = np.bincount(corpus.train_rows.ravel(), minlength=target.config.vocab_size)
    return DraftVocab.from_counts(counts, size, required_ids=stop_ids_of(target))


def test_training_resume_is_exact(tmp_path):
    """4 steps straight = 2 steps, a stop, then a resume for 2 more: identical per-step losses and final weights
    (the teacher, the batches and the optimiser state are all restored)."""
    from smcsd.train import TeacherStream
    from smcsd.train.eagle import train_eagle
    target, corpus = _byte_setup(batch_size=4, seq_len=16, heldout_frac=0.0)
    d = EagleDrafter.create(target, draft_vocab=_byte_vocab(target, corpus), seed=0)
    stream = TeacherStream(target, corpus, topk=8, layers=d.hidden_layers)
    kw = dict(steps=4, ttt_steps=3, ttt_rows=4, lr=3e-3, progress=False)
    straight = train_eagle(target, d, stream, ckpt_dir=str(tmp_path / "a"), **kw)
    part = train_eagle(target, d, stream, ckpt_dir=str(tmp_path / "b"), stop_after=2, **kw)
    assert len(part.history["train"]) == 2 and not part.history["finished"]
    resumed = train_eagle(target, d, stream, ckpt_dir=str(tmp_path / "b"), resume=True, **kw)
    la = [r["loss"] for r in straight.history["train"]]
    lb = [r["loss"] for r in resumed.history["train"]]
    assert la == lb and len(la) == 4, (la, lb)
    moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
             zip(jax.tree_util.tree_leaves(d.params), jax.tree_util.tree_leaves(resumed.params))]
    assert max(moved) > 1e-3  # the run trained
    for a, b in zip(jax.tree_util.tree_leaves(straight.params), jax.tree_util.tree_leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_training_unroll_matches_decoding_and_loss_masks():
    """The loss sees the unroll's step k at the positions it predicts: with a teacher equal to the drafter's own
    step-k distribution (top-k = all V′ kept tokens), every step's KL is 0; a shifted teacher gives KL > 0."""
    target = deep_target()
    v = DraftVocab.from_ids(VOCAB, 6)
    d = eagle(target, v)
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 6, (2, 10)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    K = 3
    logq = jax.nn.log_softmax(_unroll(d.eagle_config, d.params, d.shared["embed"], tokens, hid, K), -1)  # [K,B,9,4]
    kept = jnp.asarray(v.draft_to_target)
    from smcsd.train.eagle import eagle_loss as make_loss
    loss_fn = jax.jit(make_loss(d.eagle_config, K, 1.0, 0.0, 1.0))
    # a teacher per position t: the drafter's step-k row (t - k) distribution, built for one k at a time
    for k in range(K):
        ids = jnp.broadcast_to(kept, (2, 10, 4))
        lp = jnp.full((2, 10, 4), -1.0).at[:, 1 + k:].set(logq[k, :, :9 - k])  # teacher at t = s + k, s = 1..
        batch = {"tokens": tokens, "hidden": hid, "topk_ids": ids, "topk_logp": lp, "embed": d.shared["embed"],
                 "t2d": jnp.asarray(v.target_to_draft)}
        _, aux = loss_fn(d.params, batch)
        got = {1: aux["kl1"], K: aux[f"kl{K}"]}
        if k + 1 in got:
            assert float(got[k + 1]) < 1e-5, (k, aux)
            other = K if k == 0 else 1
            assert float(got[other]) > 1e-3, (k, aux)


@pytest.mark.slow  # default-run budget (the fresh-clone default lane took 12 min 27 s)
def test_loss_masks_supervise_only_the_masked_tokens():
    """`TokenCorpus(masks=)` packs a per-token mask beside the tokens (an appended EOS is supervised), the teacher
    stream's batches carry it as `loss_mask`, and the loss and held-out metrics count only positions predicting a
    masked token: with a teacher equal to the drafter's own step-1 distribution except at two corrupted positions,
    KL is 0 when those positions' tokens are masked out and > 0 when they are not."""
    from smcsd.train import TeacherStream
    from smcsd.train.eagle import TokenCorpus, eagle_loss as make_loss
    docs = [[1, 2, 3, 4], [5, 1, 2], [3, 3, 3, 3, 3]]
    masks = [[False, False, True, True], [False, True, True], [True] * 5]
    c = TokenCorpus(docs, seq_len=4, batch_size=2, eos_id=0, masks=masks, heldout_documents=[[1, 2, 3]],
                    heldout_masks=[[False, True, True]])
    np.testing.assert_array_equal(c.train_rows.ravel(), [1, 2, 3, 4, 0, 5, 1, 2, 0, 3, 3, 3])
    np.testing.assert_array_equal(c.train_masks.ravel(), [0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(c.heldout_masks.ravel(), [0, 1, 1, 1])
    plain = TokenCorpus(docs, seq_len=4, batch_size=2, eos_id=0, heldout_documents=[[1, 2, 3]])
    assert plain.train_masks is None and plain.fingerprint != c.fingerprint  # masks change what training sees
    target = deep_target()
    stream = TeacherStream(target, c, topk=4, layers=(0, 1, 2))
    b = stream.batch(0)
    np.testing.assert_array_equal(b["loss_mask"], c.train_masks[c.train_indices(0)])
    assert "loss_mask" not in TeacherStream(target, plain, topk=4, layers=(0, 1, 2)).batch(0)
    with pytest.raises(ValueError, match=r"masks\[1\] has 2 entries for a document of 3 tokens"):
        TokenCorpus(docs, seq_len=4, batch_size=2, masks=[masks[0], [True, True], masks[2]])
    with pytest.raises(ValueError, match="masks has 2 entries for 3 documents"):
        TokenCorpus(docs, seq_len=4, batch_size=2, masks=masks[:2])
    with pytest.raises(ValueError, match="both masks and heldout_masks"):
        TokenCorpus(docs, seq_len=4, batch_size=2, masks=masks, heldout_documents=[[1, 2, 3]])

    v = DraftVocab.from_ids(VOCAB, 6)
    d = eagle(target, v)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 6, (2, 10)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    logq = jax.nn.log_softmax(_unroll(d.eagle_config, d.params, d.shared["embed"], tokens, hid, 1), -1)
    lp = jnp.full((2, 10, 4), -1.0).at[:, 1:].set(logq[0, :, :9])  # teacher at t = s: the drafter's step-1 row s
    lp = lp.at[0, 4].set(lp[0, 4, ::-1]).at[1, 7].set(lp[1, 7, ::-1])  # corrupted at (0, 4) and (1, 7)
    batch = {"tokens": tokens, "hidden": hid, "topk_ids": jnp.broadcast_to(jnp.asarray(v.draft_to_target), (2, 10, 4)),
             "topk_logp": lp, "embed": d.shared["embed"], "t2d": jnp.asarray(v.target_to_draft)}
    loss_fn = jax.jit(make_loss(d.eagle_config, 1, 1.0, 0.0, 1.0))
    mask = np.ones((2, 10), bool)
    assert float(loss_fn(d.params, {**batch, "loss_mask": jnp.asarray(mask)})[1]["kl1"]) > 1e-3
    mask[0, 5] = mask[1, 8] = False  # the tokens the corrupted positions predict
    assert float(loss_fn(d.params, {**batch, "loss_mask": jnp.asarray(mask)})[1]["kl1"]) < 1e-5


@pytest.mark.slow  # default-run budget
def test_unroll_on_a_subset_of_rows():
    """Steps 2..K unrolled on chosen rows only give those rows' outputs of the full unroll (a row's later steps see
    the other rows only through step 1's keys), so training can supervise them on a sample of positions."""
    from smcsd.drafters.eagle import eagle_unroll_at
    from smcsd.train.eagle import sample_rows
    target = deep_target()
    d = eagle(target)
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, 6, (2, 12)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    rows = jnp.asarray(sample_rows(0, 5, 2, 12, 4, 3))
    assert rows.shape == (2, 4) and int(rows.min()) >= 1 and int(rows.max()) <= 12 - 1 - 3
    full, sub = jax.jit(lambda: (eagle_unroll_at(d.eagle_config, d.params, d.shared["embed"], tokens, hid, 3),
                                 eagle_unroll_at(d.eagle_config, d.params, d.shared["embed"], tokens, hid, 3, rows)))()
    np.testing.assert_allclose(np.asarray(sub[0]), np.asarray(full[0]), atol=1e-5)
    for k in (1, 2):
        want = np.take_along_axis(np.asarray(full[k]), np.asarray(rows - 1)[:, :, None], axis=1)
        np.testing.assert_allclose(np.asarray(sub[k]), want, atol=1e-4)
    np.testing.assert_array_equal(sample_rows(0, 5, 2, 12, 4, 3), np.asarray(rows))  # a function of (seed, step)
    with pytest.raises(ValueError, match="too short"):
        sample_rows(0, 0, 1, 5, 2, 4)


@pytest.mark.slow
def test_training_learns_the_target(tmp_path):
    """60 steps of training-time-test KL training on the byte toy: held-out first-draft greedy agreement and the
    expected accepted length rise well above the initial drafter's, and the export loads back and drafts under sd."""
    from smcsd.train.eagle import train_eagle
    target, corpus = _byte_setup()
    d = EagleDrafter.create(target, draft_vocab=_byte_vocab(target, corpus), seed=0)
    res = train_eagle(target, d, corpus, steps=60, ttt_steps=3, lr=1e-2, topk=16, eval_every=60, progress=False,
                      out=str(tmp_path / "eagle"))
    first, last = res.history["eval"][0], res.history["eval"][-1]
    print(first, last)
    # a random byte-level target is hard to imitate; measured: greedy1 0.017 -> 0.054, accept_len 0.03 -> 0.09
    # (held-out metrics are deterministic: no sampling error, only the learning signal)
    assert last["greedy1"] > 2 * first["greedy1"] and last["accept_len"] > 2 * first["accept_len"], (first, last)
    assert last["kl"] < 0.6 * first["kl"]
    e = EagleDrafter.load(str(tmp_path / "eagle")).bind(target)
    assert e.eagle_config == d.eagle_config and e.vocab == d.vocab
    r = smcsd.decode(["the cat "], target=target, draft=e, method="sd", max_new_tokens=16, num_speculative_tokens=3,
                     temperature=0.0)
    assert r.stats.num_target_calls >= 1


def test_renyi_term_matches_the_closed_form_and_bounds_kl():
    """`_renyi_terms` over a draft vocabulary equals `losses.token_renyi_topk` when every kept id is in it (q over
    V′ = V), and a direct numpy D_α on the renormalised kept part when some top-k ids fall outside V′; D_2 ≥ KL
    (Rényi divergence is non-decreasing in α, KL = D_1), and D_α of q against itself is 0. Closed forms, no sampling."""
    from smcsd.train.eagle import _renyi_terms, _step_terms
    from smcsd.train.losses import token_renyi_topk
    rng = np.random.default_rng(0)
    V, k = 7, 4
    logits = jnp.asarray(rng.normal(size=(3, V)), jnp.float32)
    ids = jnp.asarray(np.stack([rng.choice(V, k, replace=False) for _ in range(3)]), jnp.int32)
    lp = jnp.asarray(np.log(rng.dirichlet(np.ones(k), size=3)), jnp.float32)
    full = jnp.arange(V, dtype=jnp.int32)
    for alpha in (1.5, 2.0, 3.0):
        got, has = _renyi_terms(logits, ids, lp, full, alpha)
        np.testing.assert_allclose(got, token_renyi_topk(ids, lp, logits, alpha), rtol=1e-5, atol=1e-6)
        assert bool(jnp.all(has))
    kl = _step_terms(logits, ids, lp, ids[:, 0], full)[0]
    assert bool(jnp.all(_renyi_terms(logits, ids, lp, full, 2.0)[0] >= kl - 1e-6))
    # a draft vocabulary of 5 of the 7 ids: kept ids renormalised, q over the 5
    t2d = np.full(V, -1, np.int32)
    t2d[[0, 2, 3, 5, 6]] = np.arange(5)
    dl = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    got, _ = _renyi_terms(dl, ids, lp, jnp.asarray(t2d), 2.0)
    for r in range(3):
        d = t2d[np.asarray(ids[r])]
        keep = d >= 0
        p = np.exp(np.asarray(lp[r]))[keep]
        p = p / p.sum()
        q = np.exp(np.asarray(jax.nn.log_softmax(dl[r])))[d[keep]]
        np.testing.assert_allclose(got[r], np.log(np.sum(p ** 2 / q)), rtol=1e-5)
    # against itself (every kept id, teacher = the drafter's own softmax): 0
    own = jax.nn.log_softmax(dl, -1)
    all_ids = jnp.broadcast_to(jnp.asarray([0, 2, 3, 5, 6], jnp.int32), (3, 5))
    np.testing.assert_allclose(_renyi_terms(dl, all_ids, own, jnp.asarray(t2d), 2.0)[0], 0.0, atol=1e-5)


def test_eagle_loss_renyi_option_checks_its_arguments():
    from smcsd.train.eagle import eagle_loss
    cfg = eagle(deep_target(), DraftVocab.from_ids(VOCAB, 6)).eagle_config
    with pytest.raises(ValueError, match="alpha must be > 1"):
        eagle_loss(cfg, 2, 0.8, 0.1, 1.0, False, 1.0, 1.0)
    with pytest.raises(ValueError, match="renyi_weight is negative"):
        eagle_loss(cfg, 2, 0.8, 0.1, 1.0, False, -1.0, 2.0)
    with pytest.raises(ValueError, match="kl_weight is NaN"):
        eagle_loss(cfg, 2, 0.8, 0.1, float("nan"), False, 0.0, 2.0)


@pytest.mark.slow  # default-run budget: two loss programs compiled
def test_eagle_loss_carries_the_renyi_term():
    from smcsd.train.eagle import eagle_loss
    # in the training loss: 0 against the drafter's own step-1 distribution, and 0.5·KL + D_2 ≥ 1.5·KL (> KL alone)
    # against a corrupted teacher, so the term is in the loss
    target = deep_target()
    v = DraftVocab.from_ids(VOCAB, 6)
    d = eagle(target, v)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 6, (2, 10)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    logq = jax.nn.log_softmax(_unroll(d.eagle_config, d.params, d.shared["embed"], tokens, hid, 1), -1)
    lp = jnp.full((2, 10, 4), -1.0).at[:, 1:].set(logq[0, :, :9])
    batch = {"tokens": tokens, "hidden": hid, "topk_ids": jnp.broadcast_to(jnp.asarray(v.draft_to_target), (2, 10, 4)),
             "topk_logp": lp, "embed": d.shared["embed"], "t2d": jnp.asarray(v.target_to_draft)}
    mixed = jax.jit(eagle_loss(d.eagle_config, 1, 1.0, 0.0, 0.5, False, 1.0, 2.0))
    kl_only = jax.jit(eagle_loss(d.eagle_config, 1, 1.0, 0.0, 1.0))
    assert float(mixed(d.params, batch)[0]) < 1e-5
    bad = {**batch, "topk_logp": lp[..., ::-1]}
    lm, lk = float(mixed(d.params, bad)[0]), float(kl_only(d.params, bad)[0])
    assert lk > 1e-3 and lm >= 1.5 * lk - 1e-5, (lm, lk)


def test_eagle_loss_temperature_checks_its_argument():
    from smcsd.train.eagle import eagle_loss
    cfg = eagle(deep_target(), DraftVocab.from_ids(VOCAB, 6)).eagle_config
    for bad in (0.0, -0.7, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            eagle_loss(cfg, 2, 0.8, 0.1, 1.0, False, 1.0, 2.0, bad)
    with pytest.raises(TypeError, match="temperature must be a Python number"):
        eagle_loss(cfg, 2, 0.8, 0.1, 1.0, False, 1.0, 2.0, "0.7")


@pytest.mark.slow  # default-run budget: two loss programs compiled
def test_eagle_loss_at_a_temperature_compares_the_tempered_pair():
    """At τ the loss is the τ = 1 loss of the tempered pair: the teacher's log-probs / τ (renormalised on the kept
    top-k) against the drafter's logits / τ, which a head scaled by 1/τ produces. A wrong tempering (one side only,
    or none) changes the value, so the comparison can fail."""
    import jax.tree_util as jtu
    from smcsd.train.eagle import eagle_loss
    target = deep_target()
    v = DraftVocab.from_ids(VOCAB, 6)
    d = eagle(target, v)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 6, (2, 10)), jnp.int32)
    hid = hidden_of(target, d, tokens)
    lp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(4).normal(0, 2, (2, 10, 4)), jnp.float32), -1)
    batch = {"tokens": tokens, "hidden": hid, "topk_ids": jnp.broadcast_to(jnp.asarray(v.draft_to_target), (2, 10, 4)),
             "topk_logp": lp, "embed": d.shared["embed"], "t2d": jnp.asarray(v.target_to_draft)}
    tau = 0.7
    hot = jax.jit(eagle_loss(d.eagle_config, 2, 0.8, 0.0, 0.5, False, 1.0, 1.5, tau))
    cold = jax.jit(eagle_loss(d.eagle_config, 2, 0.8, 0.0, 0.5, False, 1.0, 1.5))
    scaled = jtu.tree_map_with_path(
        lambda path, x: x / tau if any(getattr(k, "key", None) == "lm_head" for k in path) else x, d.params)
    got = float(hot(d.params, batch)[0])
    want = float(cold(scaled, {**batch, "topk_logp": lp / tau})[0])
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (got, want)
    assert abs(got - float(cold(d.params, batch)[0])) > 1e-3  # the temperature matters on this batch


def test_a_pairs_smc_proposal_may_be_an_eagle_head(tmp_path, monkeypatch):
    """`smcsd.pairs`' "smc-proposal" entry loads an EAGLE-3 checkpoint as an `EagleDrafter` bound to the target (and
    an AR checkpoint as a `LanguageModel`, as before): a Rényi-trained EAGLE head can ship as a pair's proposal."""
    import smcsd.pairs as pairs
    target = deep_target()
    d = eagle(target, DraftVocab.from_ids(VOCAB, 6))
    d.save(str(tmp_path / "smc-proposal"))
    monkeypatch.setattr(pairs, "drafter_dir", lambda pair, name: str(tmp_path / name))
    got = pairs.ENTRIES["smc-proposal"].load("toy", "smc-proposal", target)
    assert isinstance(got, EagleDrafter) and got.name == "toy/smc-proposal"
    np.testing.assert_allclose(np.asarray(jax.tree_util.tree_leaves(got.params)[0]),
                               np.asarray(jax.tree_util.tree_leaves(d.params)[0]))
