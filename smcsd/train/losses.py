"""Drafter losses: small pure functions over arrays, meant to be composed inside a `loss_fn`.

Three kinds of pieces, all shape-polymorphic over leading axes (`[B, T]`, `[B, T, K]`, ...):

- per-position losses, `[...]` from logits `[..., V]`: `token_cross_entropy` (gold tokens),
  `token_forward_kl` (full target log-probs) and `token_forward_kl_topk` (renormalised top-k teacher);
- per-position *weights* for block drafters that predict K positions at once (k = 1..K, last axis):
  `uniform_weights`, `dflash_weights` (`dflash_gamma`), `dpace_weights`, `cat_weights`, and SpecBlock's
  `valid_prefix_mask`;
- reductions: `masked_mean` and `weighted_mean(per_pos_loss, weights, mask)`.

`cross_entropy`, `forward_kl` and `forward_kl_topk` are the masked means of the per-position
losses, the usual AR-drafter objective. A block drafter's loss is e.g.

    weighted_mean(token_forward_kl(target_logp, logits), dflash_weights(K, gamma), mask)

Data-dependent weights (`dpace_weights`, `cat_weights`, `valid_prefix_mask`) are wrapped in
`jax.lax.stop_gradient`: they decide *where* the drafter should be good, they are not themselves trained.
All arithmetic is float32 whatever the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "cat_weights", "cross_entropy", "dflash_gamma", "dflash_weights", "dpace_weights", "forward_kl", "forward_kl_topk",
    "masked_mean", "token_cross_entropy", "token_forward_kl", "token_forward_kl_topk", "uniform_weights",
    "valid_prefix_mask", "weighted_mean",
]


# ----------------------------------------------------------------------------------------- reductions

def masked_mean(values, mask=None):
    """Σ m·v / max(Σ m, 1): the mean over the positions where `mask` (broadcast to `values`) is non-zero."""
    values = jnp.asarray(values, jnp.float32)
    if mask is None:
        return values.mean()
    mask = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), values.shape)
    return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def weighted_mean(per_pos_loss, weights, mask=None, *, normalize: bool = True):
    """Combine a per-position loss `[..., K]` with per-position weights (broadcast, e.g. `[K]`) and a mask.

    normalize=True: Σ w·m·l / Σ w·m, a weighted average (uniform weights give the plain masked mean).
    normalize=False: Σ w·m·l / Σ m, which keeps the weights' absolute scale (e.g. with `dpace_weights`
    the loss is then an expected per-*reached*-position loss rather than a re-weighted average).
    """
    loss = jnp.asarray(per_pos_loss, jnp.float32)
    w = jnp.broadcast_to(jnp.asarray(weights, jnp.float32), loss.shape)
    m = jnp.ones_like(loss) if mask is None else jnp.broadcast_to(jnp.asarray(mask, jnp.float32), loss.shape)
    denom = (w * m).sum() if normalize else m.sum()
    return (w * m * loss).sum() / jnp.maximum(denom, 1e-9)


# ----------------------------------------------------------------------------------------- losses

def token_cross_entropy(logits, labels):
    """−log q(label) per position, `[...]`, from draft logits `[..., V]` and int labels `[...]`."""
    logits = jnp.asarray(logits, jnp.float32)
    gold = jnp.take_along_axis(logits, jnp.asarray(labels, jnp.int32)[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - gold  # = −log_softmax(logits)[label], without a [..., V] logq


def cross_entropy(logits, labels, mask=None):
    """Masked mean of `token_cross_entropy`: next-token CE on the gold tokens (nats/token)."""
    return masked_mean(token_cross_entropy(logits, labels), mask)


def token_forward_kl(target_logp, draft_logits):
    """KL(p_T ‖ q) = Σ_x p_T(x) (log p_T(x) − log q(x)) per position, from full target log-probs `[..., V]`.

    Forward KL (mass-covering) is the distillation objective of DistillSpec (Zhou et al., 2024) for the
    sampling regime: speculative acceptance is Σ_x min(p_T, q) = 1 − TV(p_T, q), and TV ≤ sqrt(KL/2)
    (Pinsker). Zero-probability target entries (log p = −inf) contribute 0.
    """
    logp = jnp.asarray(target_logp, jnp.float32)
    logits = jnp.asarray(draft_logits, jnp.float32)
    p = jnp.exp(logp)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return jnp.where(p > 0, p * (logp - logits + lse), 0.0).sum(-1)


def forward_kl(target_logp, draft_logits, mask=None):
    """Masked mean of `token_forward_kl` (nats/token)."""
    return masked_mean(token_forward_kl(target_logp, draft_logits), mask)


def token_forward_kl_topk(topk_ids, topk_logp, draft_logits):
    """KL(p̃_T ‖ q) per position against the target's top-k, renormalised: p̃ = softmax(topk_logp) on `topk_ids`.

    Σ_{i≤k} p̃_i (log p̃_i − log q(id_i)), with q the draft's *full* softmax over V (not renormalised),
    so it is ≥ 0 and also pushes the draft's mass outside the top-k back onto it. Equals
    `token_forward_kl` when k = V. Storing k ≪ V log-probs per position is what makes caching the teacher
    of a real-vocabulary target (V ~ 50k–150k) affordable.
    """
    logp = jax.nn.log_softmax(jnp.asarray(topk_logp, jnp.float32), axis=-1)  # renormalise over the top-k
    logits = jnp.asarray(draft_logits, jnp.float32)
    # log q(id) = logit(id) − logsumexp(logits): gathering k logits instead of building a [..., V] log_softmax
    # keeps the backward pass to one softmax over V (2.6x faster steps at V = 49152 on this CPU).
    logq = jnp.take_along_axis(logits, jnp.asarray(topk_ids, jnp.int32), axis=-1) - \
        jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    p = jnp.exp(logp)
    return jnp.where(p > 0, p * (logp - logq), 0.0).sum(-1)


def forward_kl_topk(topk_ids, topk_logp, draft_logits, mask=None):
    """Masked mean of `token_forward_kl_topk` (nats/token)."""
    return masked_mean(token_forward_kl_topk(topk_ids, topk_logp, draft_logits), mask)


# ----------------------------------------------------------------------------------------- block weights
# Position k = 1..K along the last axis: the k-th token a block drafter proposes after its context.

def uniform_weights(K: int):
    """w_k = 1 for k = 1..K: every drafted position counts the same."""
    return jnp.ones((K,), jnp.float32)


def dflash_gamma(block_size: int) -> float:
    """DFlash's decay γ for a block of `block_size` (anchor + B−1 predictions): 7 / 5 / 4 for B = 16 / 10 / 8 as
    released; other sizes use γ = (B + 5) / 3 (exact at 16 and 10, 4.3 at 8), at least 1."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(int(block_size), max(1.0, (block_size + 5) / 3))


def dflash_weights(K: int, gamma: float):
    """w_k = exp(−(k − 1)/γ), k = 1..K (DFlash, block-diffusion drafter training).

    Later positions are only verified when all earlier ones are accepted, so their errors matter
    less; γ sets how fast the emphasis decays (γ → ∞ gives uniform weights).
    """
    if not gamma > 0:
        raise ValueError(f"dflash_weights: gamma must be > 0, got {gamma!r}")
    k = jnp.arange(1, K + 1, dtype=jnp.float32)
    return jnp.exp(-(k - 1.0) / gamma)


def _exclusive_cumprod(x):
    """[..., K] -> [..., K] with out_k = Π_{j<k} x_j (out_1 = 1)."""
    ones = jnp.ones_like(x[..., :1])
    return jnp.cumprod(jnp.concatenate([ones, x[..., :-1]], axis=-1), axis=-1)


def dpace_weights(gold_prob, mask=None, a: float = 0.5):
    """D-PACE per-position weights (arXiv 2605.18810): how much the accepted length depends on position k.

    `gold_prob [..., K]`: the drafter's probability of the gold token at block positions k = 1..K; `mask`
    (same shape, default all valid) marks positions with a gold token. With s_k = (1 − a)·q_k + a (s = 1 where
    masked out), P_k = Π_{j≤k} s_j (a smoothed probability that the block is still accepted at k) and
    w_k = Σ_{j≥k} m_j·P_j: an error at k forfeits the expected acceptance of every later position too, so early
    positions weigh most. Stop-gradient. D-PACE's loss is Σ m·w·CE divided by the number of blocks, not by Σ w
    (`weighted_mean(..., normalize=False)` divides by Σ m instead; `block_loss` in smcsd/train/block.py does it
    the paper's way).
    """
    if not 0 <= a <= 1:
        raise ValueError(f"dpace_weights: a must be in [0, 1], got {a!r}")
    q = jax.lax.stop_gradient(jnp.asarray(gold_prob, jnp.float32))
    m = jnp.ones_like(q) if mask is None else jnp.broadcast_to(jnp.asarray(mask, jnp.float32), q.shape)
    s = jnp.where(m > 0, (1.0 - a) * q + a, 1.0)
    P = jnp.cumprod(s, axis=-1)
    mp = m * P
    return jax.lax.stop_gradient(jnp.flip(jnp.cumsum(jnp.flip(mp, -1), axis=-1), -1))  # Σ_{j≥k} m_j P_j


def cat_weights(target_gold_logp):
    """w_k = Π_{j<k} p_T(x_j | x_{<j}) (PARD-2, CAT): the target's probability of the gold tokens before depth k.

    `target_gold_logp [..., K]`: log p_T of the gold token at each position 1..K of the block, under the
    gold prefix. The weight at depth k is the product over the k − 1 preceding gold tokens (w_1 = 1):
    positions behind an unlikely gold prefix are rarely reached at decode time and count less.
    Computed as exp(exclusive cumsum) for stability; stop-gradient.
    """
    lp = jax.lax.stop_gradient(jnp.asarray(target_gold_logp, jnp.float32))
    csum = jnp.cumsum(lp, axis=-1) - lp  # Σ_{j<k} log p_j
    return jnp.exp(csum)


def valid_prefix_mask(correct):
    """m_k = Π_{j<k} correct_j (SpecBlock): 1 up to and including the first wrong position, 0 after.

    `correct [..., K]` (bool or {0, 1}): whether the drafter's prediction at position k is right (e.g.
    its argmax equals the target's token). Positions after the first mistake would be rejected at
    verification anyway, so they are masked out of the loss. Stop-gradient.
    """
    c = jax.lax.stop_gradient(jnp.asarray(correct, jnp.float32))
    return _exclusive_cumprod(c)
