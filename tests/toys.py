"""Tiny models with enumerable output spaces, the exact distribution over whole continuations, and
the goodness-of-fit tests the exactness/consistency suites share."""

from __future__ import annotations

import functools
import itertools

import jax.numpy as jnp
import numpy as np
from scipy import stats as sps

import smcsd
from smcsd.models import ModelConfig, init_model
from smcsd.sampling import SamplingParams, process_logits


def tiny_config(vocab=6, hidden=16, layers=1, heads=2, kv_heads=1, max_pos=64, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos, **kw)


@functools.lru_cache(maxsize=None)
def tiny_pair(vocab=6, seed=0, init_std=0.8):
    """A target and a *different* draft on the same vocabulary; large init_std gives peaked, varied
    distributions so acceptance is neither 0 nor 1."""
    target = init_model(tiny_config(vocab), seed, init_std=init_std, name="toy-target")
    draft = init_model(tiny_config(vocab, hidden=8, heads=1), seed + 100, init_std=init_std, name="toy-draft")
    return target, draft


def exact_distribution(model, prompt, length, temperature=1.0, top_k=0, top_p=1.0) -> np.ndarray:
    """p_T over all V**length continuations of `prompt` (index = base-V number, first token most
    significant), from the model's full-sequence logits (no cache) and the processed distribution."""
    V = model.config.vocab_size
    conts = np.array(list(itertools.product(range(V), repeat=length)), np.int32)  # [V**L, L]
    seqs = np.concatenate([np.broadcast_to(np.asarray(prompt, np.int32), (len(conts), len(prompt))), conts], 1)
    logits = model(jnp.asarray(seqs))[:, len(prompt) - 1:-1]  # predictions for each continuation token
    logp = process_logits(logits, SamplingParams.make(temperature, top_k, top_p))
    per_tok = jnp.take_along_axis(logp, jnp.asarray(conts)[..., None], axis=-1)[..., 0]
    probs = np.exp(np.asarray(per_tok, np.float64).sum(-1))
    return probs / probs.sum()


def continuation_index(tokens, V) -> np.ndarray:
    tokens = np.asarray(tokens)
    return (tokens * (V ** np.arange(tokens.shape[-1])[::-1])).sum(-1)


def sample_counts(method, target, draft, prompt, length, num_samples, batch=2000, seed=0, **kw) -> np.ndarray:
    """Histogram over continuations of `num_samples` decodes (batched requests of the same prompt)."""
    V = target.config.vocab_size
    counts = np.zeros(V ** length, np.int64)
    done = 0
    while done < num_samples:
        res = smcsd.decode([list(prompt)] * batch, target=target, draft=draft, method=method,
                           max_new_tokens=length, seed=seed + done, eos_id=[], **kw)
        toks = np.array(res.tokens)
        assert toks.shape == (batch, length), toks.shape
        counts += np.bincount(continuation_index(toks, V), minlength=V ** length)
        done += batch
    return counts


def chi_square_statistic(counts, probs, min_expected=5.0) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; cells with expected count < min_expected are pooled
    (the usual validity condition of the chi-square approximation). Samples in zero-probability cells
    give an infinite statistic (an impossible outcome is a definite failure)."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    n = counts.sum()
    if np.any(counts[probs <= 0] > 0):
        return float("inf"), max(int((probs > 0).sum()) - 1, 1)
    expected = probs * n
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if len(obs) <= 1:  # a single possible outcome, and every sample landed on it
        return 0.0, 0
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def chi_square_pvalue(counts, probs, min_expected=5.0) -> float:
    """Goodness-of-fit p-value of `chi_square_statistic` (0 for an impossible outcome, 1 when only one
    outcome is possible)."""
    stat, df = chi_square_statistic(counts, probs, min_expected)
    if stat == float("inf"):
        return 0.0
    if df == 0:
        return 1.0
    return float(sps.chi2.sf(stat, df=df))


def total_variation(counts, probs) -> float:
    emp = np.asarray(counts, np.float64) / np.sum(counts)
    return 0.5 * float(np.abs(emp - np.asarray(probs)).sum())
