"""`PromptLookup`: n-gram drafting from the prompt and the output so far (no params, no model).

Like vLLM's `ngram` speculator and transformers' `prompt_lookup_num_tokens`: find the latest earlier
occurrence of the sequence's last n tokens (n from `max_ngram` down to `min_ngram`, longest first) and
propose the token that followed it. Drafting K tokens repeats this K times, each time on the sequence
extended by the tokens drafted so far, so a long copied span is proposed token by token.

The proposal distribution (what makes the methods exact/consistent): at each position, with c the
looked-up token,

    q(v) = (1 − floor) · [v = c] + floor / V        (a match was found)
    q(v) = 1 / V                                    (no match)

and x_k is sampled from exactly this q (with probability 1 − floor the match, else a uniform token). Since
`logq` is the distribution really sampled from, `sd` / `sd-multi` stay exact for any floor in [0, 1]; with
floor > 0 every token has positive probability, so `smc`'s importance weights stay consistent (floor = 0 is
refused for `smc`). The drafter ignores the draft temperature / top-k / top-p: q is fixed by the match.

Cost: K × (max_ngram − min_ngram + 1) comparisons over the [R, S] token history per cycle, and the K
[R, V] log-q rows the verifier reads — no model call.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from .base import Drafter, Proposal, TokenHistory


@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
    """N-gram lookup drafter. `floor` is the probability mass spread uniformly over the vocabulary
    (see the module docstring); `vocab_size` is filled in from the target by `decode`."""

    max_ngram: int = 3
    min_ngram: int = 1
    floor: float = 0.01
    vocab: int | None = None

    kind = "prompt-lookup"
    param_free = True

    def __post_init__(self):
        for name in ("max_ngram", "min_ngram"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PromptLookup {name} must be an int >= 1, got {v!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"PromptLookup min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")
        if isinstance(self.floor, bool) or not isinstance(self.floor, (int, float)) or not 0 <= self.floor <= 1:
            raise ValueError(f"PromptLookup floor must be a number in [0, 1] (the probability of a uniform draw "
                             f"instead of the match; > 0 for smc), got {self.floor!r}")
        object.__setattr__(self, "floor", float(self.floor))

    @property
    def full_support(self) -> bool:
        return self.floor > 0

    @property
    def vocab_size(self) -> int | None:
        return self.vocab

    def bind(self, target) -> "PromptLookup":
        return dataclasses.replace(self, vocab=target.config.vocab_size)

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 0  # no model

    def describe(self) -> str:
        return f"prompt-lookup(n={self.min_ngram}..{self.max_ngram}, floor={self.floor:g})"

    # ------------------------------------------------------------------ traced
    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None):
        B, Tp = prompt.shape
        tokens = jnp.zeros((B, cache_len), jnp.int32).at[:, :Tp].set(prompt[:, :cache_len])
        tokens = jnp.where(jnp.arange(cache_len)[None, :] < prompt_len[:, None], tokens, -1)
        hist = TokenHistory(tokens=tokens, lengths=jnp.asarray(prompt_len, jnp.int32))
        return hist.repeat(rows_per_prompt) if rows_per_prompt > 1 else hist

    def lookup(self, hist: TokenHistory):
        """(found bool[R], token int32[R]): the token after the latest earlier occurrence of the longest
        matching suffix n-gram (n = max_ngram .. min_ngram)."""
        tok, L = hist.tokens, hist.lengths
        R, S = tok.shape
        pos = jnp.arange(S, dtype=jnp.int32)[None, :]
        rows = jnp.arange(R)[:, None]
        found = jnp.zeros((R,), bool)
        cand = jnp.zeros((R,), jnp.int32)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            # position j ends a match if tok[j - i] == tok[L - 1 - i] for i < n, with j + 1 < L (the token after
            # it is known and it is not the suffix itself) and j - n + 1 >= 0.
            ok = (pos < (L - 1)[:, None]) & (pos >= n - 1) & (L >= n + 1)[:, None]
            for i in range(n):
                want = tok[rows[:, 0], jnp.maximum(L - 1 - i, 0)]  # [R]
                shifted = jnp.roll(tok, i, axis=1)  # shifted[j] = tok[j - i] (wraps only where j < i: masked)
                ok = ok & (shifted == want[:, None])
            j = jnp.max(jnp.where(ok, pos, -1), axis=1)  # latest occurrence
            hit = (j >= 0) & ~found
            nxt = tok[rows[:, 0], jnp.clip(j + 1, 0, S - 1)]
            cand = jnp.where(hit, nxt, cand)
            found = found | hit
        return found, cand

    def propose(self, params, state: TokenHistory, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        del params, sampling
        V = self.vocab
        if V is None:
            raise ValueError("PromptLookup needs the vocabulary size: bind it to the target (decode does)")
        R = feed.shape[0]
        hist = state.write(feed, feed_count)
        log_floor = jnp.float32(math.log(self.floor / V) if self.floor > 0 else -jnp.inf)
        log_hit = jnp.float32(math.log1p(-self.floor + self.floor / V) if self.floor < 1 else math.log(1.0 / V))
        log_uniform = jnp.float32(-math.log(V))
        keys = jax.random.split(key, num_tokens)
        toks, logqs = [], []
        for k in range(num_tokens):
            found, cand = self.lookup(hist)
            k_mix, k_uni = jax.random.split(keys[k])
            uniform_tok = jax.random.randint(k_uni, (R,), 0, V, dtype=jnp.int32)
            take_match = found & (jax.random.uniform(k_mix, (R,)) >= self.floor)
            x = jnp.where(take_match, cand, uniform_tok)
            onehot = jnp.arange(V, dtype=jnp.int32)[None, :] == cand[:, None]
            logq = jnp.where(found[:, None], jnp.where(onehot, log_hit, log_floor), log_uniform)
            toks.append(x)
            logqs.append(logq)
            if k < num_tokens - 1:  # x_1..x_{K-1} join the history (x_K is fed next cycle, like a KV cache)
                hist = hist.write(x[:, None], jnp.ones((R,), jnp.int32))
        return Proposal(jnp.stack(toks, axis=1), jnp.stack(logqs, axis=1), hist)
