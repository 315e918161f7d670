"""`smcsd.decode(method="ar")` and the processed sampling distribution."""

import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import ByteTokenizer, ModelConfig, init_model
from smcsd.sampling import SamplingParams, process_logits

from toys import chi_square_pvalue, tiny_config, tiny_pair

BYTE_CFG = ModelConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def byte_model():
    return init_model(BYTE_CFG, 0, tokenizer=ByteTokenizer(), init_std=0.3, name="byte-toy")


def _greedy_reference(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(jnp.argmax(model(jnp.asarray([ids]))[0, -1])))
    return ids[-n:]


@pytest.mark.slow  # default-run budget
def test_greedy_matches_naive_loop_ragged(byte_model):
    prompts = ["def", "import numpy as np", "x = 1\n"]
    res = smcsd.decode(prompts, target=byte_model, max_new_tokens=12, temperature=0.0, eos_id=[])
    assert [len(t) for t in res.tokens] == [12] * 3
    for p, toks in zip(prompts, res.tokens):
        assert toks == _greedy_reference(byte_model, byte_model.tokenizer.encode(p), 12)
    assert res.texts == [byte_model.tokenizer.decode(t) for t in res.tokens]
    assert res.stats.tokens_per_target_call == 1.0
    assert res.stats.num_target_calls == 11  # the first token comes from the prefill


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_input_forms_are_equivalent(byte_model):
    ids = byte_model.tokenizer.encode("abc")
    kw = dict(target=byte_model, max_new_tokens=4, temperature=0.0, eos_id=[])
    a = smcsd.decode("abc", **kw).tokens
    assert smcsd.decode(["abc"], **kw).tokens == a
    assert smcsd.decode(ids, **kw).tokens == a
    assert smcsd.decode([ids], **kw).tokens == a
    assert smcsd.decode(np.asarray(ids), **kw).tokens == a
    # Request order is kept in a batch of different lengths.
    both = smcsd.decode(["a much longer prompt here", "abc"], **kw).tokens
    assert both[1] == a[0]


def _next_token_probe(model, prompt, n, seed=0, **sampling):
    res = smcsd.decode([prompt] * n, target=model, max_new_tokens=1, eos_id=[], seed=seed, **sampling)
    counts = np.bincount(np.array(res.tokens)[:, 0], minlength=model.config.vocab_size)
    logits = model(jnp.asarray([prompt]))[0, -1]
    probs = np.exp(np.asarray(process_logits(logits, SamplingParams.make(**sampling)), np.float64))
    return counts, probs


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=3),
                                      dict(temperature=1.3, top_p=0.8), dict(temperature=1.0, top_k=4, top_p=0.9)])
def test_sampled_next_token_matches_processed_distribution(sampling):
    target, _ = tiny_pair(vocab=8, seed=3, init_std=0.5)
    counts, probs = _next_token_probe(target, [1, 2, 3], 20000, seed=7, **sampling)
    # Pearson chi-square with cells of expected count >= 5 (the approximation's validity rule).
    # Under a correct sampler p is uniform on [0, 1]; rejecting at 1e-3 has a 0.1% false-alarm rate,
    # and the seed is fixed, so the outcome is deterministic. A wrong truncation puts samples in
    # zero-probability cells (p = 0) or shifts mass by >> the 1/sqrt(20000) ~ 0.7% sampling error.
    assert chi_square_pvalue(counts, probs) > 1e-3
    # The truncation itself is respected exactly.
    assert counts[probs == 0].sum() == 0


def test_sampled_whole_sequences_match_processed_distribution():
    from toys import exact_distribution, sample_counts
    target, _ = tiny_pair(vocab=5, seed=1, init_std=0.5)
    probs = exact_distribution(target, [1, 2], 3, temperature=0.8, top_k=4)
    counts = sample_counts("ar", target, None, [1, 2], 3, 20000, batch=5000, temperature=0.8, top_k=4)
    assert chi_square_pvalue(counts, probs) > 1e-3  # threshold as in the next-token test


def test_chi_square_test_detects_a_wrong_distribution():
    """Test of the test: samples at temperature 1 must fail against the temperature-0.7 distribution."""
    target, _ = tiny_pair(vocab=8, seed=3, init_std=0.5)
    counts, _ = _next_token_probe(target, [1, 2, 3], 20000, seed=7, temperature=1.0)
    _, wrong = _next_token_probe(target, [1, 2, 3], 10, seed=7, temperature=0.7)
    assert chi_square_pvalue(counts, wrong) < 1e-6


def test_process_logits_truncation():
    logits = jnp.array([[3.0, 1.0, 2.0, 0.0, -1.0]])
    lp = lambda **kw: np.exp(np.asarray(process_logits(logits, SamplingParams.make(**kw))))[0]
    assert np.array_equal(lp(temperature=0.0) > 0, [True, False, False, False, False])
    assert np.array_equal(lp(top_k=2) > 0, [True, False, True, False, False])
    p = lp()
    # top_p = 0.9: smallest prefix of the sorted probabilities whose mass reaches 0.9.
    order = np.argsort(-p)
    need = np.searchsorted(np.cumsum(p[order]), 0.9) + 1
    assert (lp(top_p=0.9) > 0).sum() == need
    assert (lp(top_p=1e-6) > 0).sum() == 1
    np.testing.assert_allclose(lp(temperature=2.0), np.exp(logits[0] / 2) / np.exp(logits[0] / 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(lp(top_k=2).sum(), 1.0, rtol=1e-6)


def test_top_p_one_keeps_the_whole_tail():
    """A peaked distribution whose float32 running mass reaches 1.0 before its tail: top_p = 1 is "off"."""
    logits = jnp.concatenate([jnp.array([30.0]), jnp.linspace(0.0, -5.0, 255)])[None]
    logp = np.asarray(process_logits(logits, SamplingParams.make(top_p=1.0)))
    assert np.all(np.isfinite(logp))


def test_sampling_params_do_not_recompile(byte_model):
    kw = dict(target=byte_model, max_new_tokens=5, eos_id=[])
    smcsd.decode("abc", temperature=1.0, **kw)
    again = smcsd.decode("abd", temperature=0.3, top_k=5, top_p=0.5, seed=3, **kw)
    assert again.stats.compile_time_s == 0.0
    # Nearby sizes share a bucket: a slightly longer prompt and a few more tokens reuse the program.
    assert smcsd.decode("abde", temperature=0.5, max_new_tokens=6, target=byte_model, eos_id=[]).stats.compile_time_s == 0.0


def test_seeds(byte_model):
    kw = dict(target=byte_model, max_new_tokens=16, temperature=1.0, eos_id=[])
    a = smcsd.decode(["hello", "world"], seed=1, **kw).tokens
    assert smcsd.decode(["hello", "world"], seed=1, **kw).tokens == a
    assert smcsd.decode(["hello", "world"], seed=2, **kw).tokens != a


def test_eos_stops_rows_independently(byte_model):
    prompts = ["abc", "xyz"]
    free = smcsd.decode(prompts, target=byte_model, max_new_tokens=10, temperature=0.0, eos_id=[]).tokens
    stop = free[0][3]  # make row 0 stop at its 4th token
    res = smcsd.decode(prompts, target=byte_model, max_new_tokens=10, temperature=0.0, eos_id=stop)
    assert res.tokens[0] == free[0][:free[0].index(stop) + 1]
    expected1 = free[1][:free[1].index(stop) + 1] if stop in free[1] else free[1]
    assert res.tokens[1] == expected1
    # The tokenizer's EOS is the default stop token.
    res = smcsd.decode(prompts, target=byte_model, max_new_tokens=10, temperature=0.0, eos_id=[stop, 257])
    assert res.tokens[0][-1] == stop


def test_max_new_tokens_respected(byte_model):
    res = smcsd.decode(["a", "bb"], target=byte_model, max_new_tokens=3, temperature=1.0, eos_id=[])
    assert [len(t) for t in res.tokens] == [3, 3]
    res = smcsd.decode("a", target=byte_model, max_new_tokens=1, temperature=1.0, eos_id=[])
    assert len(res.tokens[0]) == 1 and res.stats.num_target_calls == 0


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(prompt=""), ValueError, "empty"),
    (dict(prompt=[]), ValueError, "empty"),
    (dict(prompt=[[1, 2], []]), ValueError, "prompt 1 is empty"),
    (dict(prompt="x" * 200), ValueError, "max length"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=125), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens"),
    (dict(temperature=-0.1), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(method="beam"), ValueError, "unknown method"),
    (dict(prompt=[1, 2, 300]), ValueError, "outside the vocabulary"),
    (dict(prompt=[1, -2]), ValueError, "outside the vocabulary"),
    (dict(prompt=[1.0, 2.0]), TypeError, "token ids|list of token ids"),
    (dict(prompt=np.array([1.0, 2.0])), TypeError, "dtype"),
    (dict(prompt=5), TypeError, "prompt must be"),
    (dict(eos_id=999), ValueError, "eos_id"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(target="tiny"), TypeError, "LanguageModel"),
])
def test_bad_inputs_raise_clear_errors(byte_model, kwargs, exc, match):
    args = dict(prompt="abc", target=byte_model, max_new_tokens=4)
    args.update(kwargs)
    prompt = args.pop("prompt")
    with pytest.raises(exc, match=match):
        smcsd.decode(prompt, **args)


def test_text_prompt_without_tokenizer_is_a_clear_error():
    target, _ = tiny_pair()
    with pytest.raises(ValueError, match="tokenizer"):
        smcsd.decode("hello", target=target, max_new_tokens=2)


def test_vocabulary_mismatch_is_a_clear_error(byte_model):
    other = init_model(tiny_config(vocab=7), 0)
    for method in smcsd.available_methods():
        if method == "ar":
            continue
        # flex drafts with FlexDraft adapters, not a second model: the draft is refused before any vocabulary check
        with pytest.raises(ValueError, match="vocab" if method != "flex" else "FlexDraft adapters"):
            smcsd.decode("abc", target=byte_model, draft=other, method=method, max_new_tokens=4)
