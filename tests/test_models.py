"""models/: the transformer's cached path against its cache-free path, the cache contract (ragged
writes, roll back, gather), configs and tokenizers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smcsd.models import ByteTokenizer, HFTokenizer, LanguageModel, ModelConfig, init_model

BASE = dict(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)

ARCHS = {
    "llama-mha": dict(),
    "gqa": dict(num_key_value_heads=2),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "qwen2-bias": dict(num_key_value_heads=2, attention_bias=True),
    "qwen3-qknorm": dict(num_key_value_heads=2, qk_norm=True, head_dim=16),
    "llama3-rope": dict(num_key_value_heads=2, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "linear-rope": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def _model(arch, dtype="float32", seed=0):
    model = init_model(ModelConfig(**BASE, **ARCHS[arch], dtype=dtype), seed, init_std=0.3)
    # Biases and norm weights start at 0/1; perturb every leaf so each option really matters.
    leaves, tree = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    leaves = [x + (0.1 * jax.random.normal(k, x.shape)).astype(x.dtype) for x, k in zip(leaves, keys)]
    model.params = jax.tree_util.tree_unflatten(tree, leaves)
    return model


def _tokens(B, T, V, seed=0):
    return jax.random.randint(jax.random.PRNGKey(seed), (B, T), 0, V)


# One architecture in the default run, the rest with -m slow (default-run budget).
@pytest.mark.parametrize("arch", [a if a == "llama-mha" else pytest.param(a, marks=pytest.mark.slow)
                                  for a in sorted(ARCHS)])
def test_incremental_matches_full_forward_ragged(arch):
    """Ragged prefill then token-by-token decoding reproduces the full-sequence logits (1e-5)."""
    model = _model(arch)
    B, T, V = 3, 12, BASE["vocab_size"]
    toks = _tokens(B, T, V)
    full = np.asarray(model(toks))
    prompt_len = jnp.array([3, 7, 5])
    padded = jnp.where(jnp.arange(8)[None] < prompt_len[:, None], toks[:, :8], 0)
    cache = model.init_cache(B, 24)
    apply = jax.jit(model.apply)
    logits, cache = apply(model.params, padded, cache, prompt_len)
    for b in range(B):
        np.testing.assert_allclose(logits[b, :prompt_len[b]], full[b, :prompt_len[b]], atol=1e-5, rtol=1e-5)
    # Each row continues from its own length; feed 2 tokens per call to also cover T > 1 writes.
    pos = np.asarray(prompt_len)
    for _ in range(2):
        chunk = jnp.stack([toks[b, pos[b]:pos[b] + 2] for b in range(B)])
        logits, cache = apply(model.params, chunk, cache, None)
        for b in range(B):
            np.testing.assert_allclose(logits[b], full[b, pos[b]:pos[b] + 2], atol=1e-5, rtol=1e-5)
        pos = pos + 2
    np.testing.assert_array_equal(cache.lengths, pos)


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_logits_are_float32_for_bfloat16_params():
    ref = _model("gqa", dtype="float32")
    model = LanguageModel(ref.config.replace(dtype="bfloat16"),
                          jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), ref.params))
    toks = _tokens(2, 6, BASE["vocab_size"])
    logits, expected = np.asarray(model(toks)), np.asarray(ref(toks))
    assert logits.dtype == np.float32
    # Same weights rounded to bf16 (8 bits of mantissa, ~0.4% relative per op): logits agree to a few
    # percent of their scale; a wrong dtype path (e.g. garbage from a bad cast) would be O(scale).
    assert np.abs(logits - expected).max() < 0.05 * np.abs(expected).max()
    cache = model.init_cache(2, 8)
    assert cache.k.dtype == jnp.bfloat16
    lg, _ = model.apply(model.params, toks, cache)
    assert lg.dtype == jnp.float32


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_rollback_then_rewrite_equals_never_written():
    model = _model("gqa")
    V = BASE["vocab_size"]
    prompt, wrong, right = _tokens(2, 5, V, 1), _tokens(2, 4, V, 2), _tokens(2, 3, V, 3)
    cache = model.init_cache(2, 16)
    _, cache = model.apply(model.params, prompt, cache)
    _, dirty = model.apply(model.params, wrong, cache)
    rolled = dirty.set_lengths(cache.lengths)
    lg_rolled, c1 = model.apply(model.params, right, rolled)
    lg_clean, c2 = model.apply(model.params, right, cache)
    np.testing.assert_allclose(lg_rolled, lg_clean, atol=1e-6)
    # Per-row roll back to different lengths: row 0 keeps one of the wrong tokens.
    rolled = dirty.set_lengths(cache.lengths + jnp.array([1, 0]))
    lg, _ = model.apply(model.params, right[:, :1], rolled)
    seq0 = jnp.concatenate([prompt[0], wrong[0, :1], right[0, :1]])[None]
    np.testing.assert_allclose(lg[0, 0], model(seq0)[0, -1], atol=1e-5)


@pytest.mark.slow  # default-run budget (<= 10 min on 2 cores); CI runs it with -m slow
def test_gather_rows_equals_separate_decoding():
    model = _model("qwen3-qknorm")
    V = BASE["vocab_size"]
    toks = _tokens(3, 6, V, 4)
    cache = model.init_cache(3, 16)
    _, cache = model.apply(model.params, toks, cache)
    idx = jnp.array([2, 0, 2, 1])
    gathered = cache.gather(idx)
    nxt = _tokens(4, 2, V, 5)
    lg, _ = model.apply(model.params, nxt, gathered)
    for r, src in enumerate(np.asarray(idx)):
        seq = jnp.concatenate([toks[src], nxt[r]])[None]
        np.testing.assert_allclose(lg[r], model(seq)[0, -2:], atol=1e-5)
    rep = cache.repeat(2)
    np.testing.assert_array_equal(rep.lengths, [6] * 6)
    np.testing.assert_array_equal(rep.k[:, 2], cache.k[:, 1])


def test_hidden_states_on_request():
    model = _model("gqa")
    toks = _tokens(2, 5, BASE["vocab_size"])
    logits, cache, hidden = model.apply(model.params, toks, model.init_cache(2, 8), hidden_layers=(0, 1))
    assert hidden.shape == (2, 2, 5, BASE["hidden_size"])
    full_logits, full_hidden = model.logits(model.params, toks, hidden_layers=(1,))
    np.testing.assert_allclose(hidden[1], full_hidden[0], rtol=1e-5, atol=1e-5)  # f32: the cached and cache-free paths sum in different orders
    assert not np.allclose(hidden[0], hidden[1])


@pytest.mark.parametrize("arch,unstacked", [("qwen2-bias", True), pytest.param("qwen3-qknorm", False,
                                                                               marks=pytest.mark.slow)])
def test_packed_forward_equals_unpacked_at_the_packed_tokens(arch, unstacked):
    """forward_cached(..., pack=): ragged row prefixes run as one packed row of tokens; their logits, hidden states
    and cache writes equal the plain forward's, the rest are zeros, and later calls see the same cache."""
    import functools
    from smcsd.models import forward_cached as plain
    from smcsd.models.transformer import unstack_layers
    model = _model(arch)
    forward_cached = jax.jit(functools.partial(plain, model.config), static_argnames=("hidden_layers",))
    c, params = model.config, (unstack_layers(model.params) if unstacked else model.params)
    B, T, V = 3, 4, BASE["vocab_size"]
    cache = model.init_cache(B, 16)
    if unstacked:
        from smcsd.models import init_cache
        cache = init_cache(c.num_hidden_layers, B, 16, c.num_key_value_heads, c.head_dim, c.jnp_dtype, per_layer=True)
    cache = forward_cached(params, _tokens(B, 3, V, 1), cache, num_valid=jnp.array([3, 1, 2]))[1]
    toks = _tokens(B, T, V, 2)
    L = jnp.array([2, 0, 4])
    pack = jnp.array([0, 1, 8, 9, 10, 11, 12], jnp.int32)  # rows' prefixes (flat b * T + t), one padding entry
    ref_logits, ref_cache, ref_hidden = forward_cached(params, toks, cache, num_valid=L, hidden_layers=(0,))
    logits, new_cache, hidden = forward_cached(params, toks, cache, num_valid=L, hidden_layers=(0,), pack=pack)
    keep = np.asarray(jnp.arange(T)[None, :] < L[:, None])
    np.testing.assert_allclose(np.asarray(logits)[keep], np.asarray(ref_logits)[keep], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(hidden)[:, keep], np.asarray(ref_hidden)[:, keep], atol=1e-5, rtol=1e-5)
    assert not np.asarray(logits)[~keep].any()
    np.testing.assert_array_equal(new_cache.lengths, ref_cache.lengths)
    nxt = _tokens(B, 1, V, 3)
    a = forward_cached(params, nxt, new_cache)[0]
    b = forward_cached(params, nxt, ref_cache)[0]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="logit_index"):
        plain(c, params, toks, cache, pack=pack, logit_index=jnp.zeros((B, 1), jnp.int32))


@pytest.mark.parametrize("arch", ["mqa-tied", "llama-mha"])  # tied embedding / its own lm_head
def test_the_transposed_head_layout_gives_the_same_logits(arch):
    """`decode_params` on CPU: per-layer buffers plus the head's [D, V] copy; logits (also at `logit_index`) match the
    stacked layout's, a changed copy changes them (it is what runs), and `stack_layers` drops it again."""
    from smcsd.models import forward_cached, init_cache
    from smcsd.models.transformer import HEAD_T, stack_layers, unstack_layers, with_transposed_head
    model = _model(arch)
    c, V = model.config, BASE["vocab_size"]
    assert c.tie_word_embeddings == (arch == "mqa-tied")
    fast = model.decode_params()
    assert HEAD_T in fast and fast[HEAD_T].shape == (c.hidden_size, V)
    toks = _tokens(2, 3, V, 4)
    cache = model.init_cache(2, 8)
    per_layer = init_cache(c.num_hidden_layers, 2, 8, c.num_key_value_heads, c.head_dim, c.jnp_dtype, per_layer=True)
    idx = jnp.array([[2], [0]], jnp.int32)
    for kw in ({}, {"logit_index": idx}):
        want = forward_cached(c, model.params, toks, cache, **kw)[0]
        got = forward_cached(c, fast, toks, per_layer, **kw)[0]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    zeroed = {**fast, HEAD_T: jnp.zeros_like(fast[HEAD_T])}
    assert not np.asarray(forward_cached(c, zeroed, toks, per_layer)[0]).any()
    assert HEAD_T not in stack_layers(with_transposed_head(c, unstack_layers(model.params)))


def test_cache_overflow_is_a_clear_error():
    model = _model("llama-mha")
    with pytest.raises(ValueError, match="max_len"):
        model.apply(model.params, _tokens(1, 9, BASE["vocab_size"]), model.init_cache(1, 8))


@pytest.mark.parametrize("bad, match", [
    (dict(num_key_value_heads=3), "multiple of"),
    (dict(hidden_size=30), "divisible"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(dtype="float8"), "dtype"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_type"),
    (dict(rope_scaling={"rope_type": "llama3"}), "factor"),
    (dict(eos_token_id=99), "outside the vocabulary"),
    (dict(head_dim=7), "even"),
])
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**BASE, **bad})


def test_config_roundtrip_and_hashable():
    c = ModelConfig(**BASE, **ARCHS["llama3-rope"])
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert hash(c) == hash(ModelConfig.from_dict(c.to_dict()))
    assert c.num_params == init_model(c, 0).num_params
    with pytest.raises(TypeError):
        init_model(dict(BASE))


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = "def f(x):\n    return x ** 2  # ünïcödé ✓"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id]) == text


def test_hf_tokenizer_wrapper(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers, decoders
    hf = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(["def add(a, b):\n    return a + b\n"] * 50, trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = HFTokenizer(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)
    ids = tok.encode("def add(a, b):")
    assert ids[0] == 1 and tok.decode(ids) == "def add(a, b):"
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        HFTokenizer(str(tmp_path / "missing"))
