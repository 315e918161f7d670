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

Losses for SMC proposals (SMC-SD: the variance of its importance weights, hence N/ESS, grows with χ²(p‖q), not
with KL), from the processed target p and the drafter q at each position:

- `token_reverse_kl` / `token_reverse_kl_topk`: KL(q ‖ p) (mode-seeking);
- `token_renyi` / `token_renyi_topk`: Rényi-α D_α(p ‖ q), α > 1 (α = 2: log(1 + χ²(p ‖ q))), in log space;
- `mix(*(weight, loss))`, `token_renyi_kl_mix` / `token_renyi_kl_mix_topk` (D_α + γ·KL(p ‖ q)), `check_weights`;
- block level (the SMC weight of a K-token block is Π_k p/q): `block_log_weight`, `block_renyi_mc` (D_α of the
  block's joint distributions estimated from sampled blocks) and `block_sum` (the per-position decomposition);
- draft vocabulary (a head over V′ < V tokens): `floor_mixture_logq`, q = (1 − ε)·q′ + ε/V over the full vocabulary,
  so every divergence against it is finite and the target's mass outside the draft vocabulary is counted.

`reverse_kl`, `renyi`, `reverse_kl_topk`, `renyi_topk` are their masked means. These SMC losses compute in at
least float32: bfloat16 / float16 inputs are promoted, float64 inputs (under `jax.enable_x64`) stay float64, which
is what finite-difference checks need.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "block_log_weight", "block_renyi_mc", "block_sum", "cat_weights", "check_alpha", "check_weights", "cross_entropy",
    "dflash_gamma", "dflash_weights", "dpace_weights", "floor_mixture_logq", "forward_kl", "forward_kl_topk",
    "masked_mean", "mix", "renyi", "renyi_topk", "reverse_kl", "reverse_kl_topk", "token_cross_entropy",
    "token_forward_kl", "token_forward_kl_topk", "token_renyi", "token_renyi_kl_mix", "token_renyi_kl_mix_topk",
    "token_renyi_topk", "token_reverse_kl", "token_reverse_kl_topk", "uniform_weights", "valid_prefix_mask",
    "weighted_mean",
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
    (`weighted_mean(..., normalize=False)` divides by Σ m instead; `block_loss` in smcsd/train/dflash.py does it
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


# ----------------------------------------------------------------------------------------- SMC proposals
# The importance weight SMC-SD gives a drafted token is w = p(x)/q(x), x ~ q (DESIGN.md, "SMC-SD, the algorithm",
# step 3), so what a proposal for SMC must keep small is the spread of p/q under q: E_q[w²] = 1 + χ²(p ‖ q), and
# N/ESS ≈ 1 + χ² (Kong 1992; Agapiou et al. 2017, "Importance sampling: intrinsic dimension and computational cost").
# Rényi divergences (van Erven & Harremoës 2014) interpolate: D_α(p ‖ q) = 1/(α−1)·log E_q[w^α], → KL(p ‖ q) as
# α → 1, = log(1 + χ²) at α = 2.

def _float_dtype(*arrays):
    """The common dtype of `arrays`, at least float32 (bfloat16 / float16 promoted, float64 kept)."""
    dtype = jnp.float32
    for a in arrays:
        dtype = jnp.promote_types(dtype, a.dtype)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _floats(*xs):
    xs = [jnp.asarray(x) for x in xs]
    dtype = _float_dtype(*xs)
    return [x.astype(dtype) for x in xs]


def _concrete(x):
    """`x` as a numpy array, or None when it is traced (inside jit/grad its values are not known yet)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _static_float(fn: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: {name} must be a Python number (a static setting, not an array), got "
                        f"{type(value).__name__} {value!r}")
    return float(value)


def check_alpha(fn: str, alpha) -> float:
    alpha = _static_float(fn, "alpha", alpha)
    if not alpha > 1:
        raise ValueError(f"{fn}: the Rényi order alpha must be > 1, got {alpha!r}; alpha = 1 is the KL divergence "
                         "KL(p ‖ q): use token_forward_kl / token_forward_kl_topk for it")
    if math.isinf(alpha):
        raise ValueError(f"{fn}: alpha = inf (the max-divergence log max p/q) is not supported; use a finite alpha > 1")
    return alpha


def check_temperature(fn: str, temperature) -> float:
    """The temperature τ both distributions of a divergence are processed at: a finite Python number > 0."""
    t = _static_float(fn, "temperature", temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"{fn}: temperature must be a finite number > 0 (the temperature smc will propose at, e.g. "
                         f"0.7), got {temperature!r}")
    return t


def _check_same_vocab(fn: str, target_logp, draft_logits) -> None:
    if target_logp.ndim == 0 or draft_logits.ndim == 0:
        raise ValueError(f"{fn}: target_logp and draft_logits must have a vocabulary axis (the last), got shapes "
                         f"{target_logp.shape} and {draft_logits.shape}")
    vt, vd = target_logp.shape[-1], draft_logits.shape[-1]
    if vt != vd:
        raise ValueError(f"{fn}: target_logp covers {vt} tokens but draft_logits covers {vd}: the proposal must be a "
                         f"distribution over the target's vocabulary; map a draft-vocabulary head onto it first with "
                         f"floor_mixture_logq(logq, draft_to_target, vocab_size={vt}, eps=...)")


def _check_topk(fn: str, topk_ids, topk_logp, draft_logits) -> None:
    if not jnp.issubdtype(topk_ids.dtype, jnp.integer):
        raise TypeError(f"{fn}: topk_ids must be integer token ids, got dtype {topk_ids.dtype}")
    if topk_ids.shape != topk_logp.shape:
        raise ValueError(f"{fn}: topk_ids {topk_ids.shape} and topk_logp {topk_logp.shape} must have the same shape")
    if topk_ids.shape[:-1] != draft_logits.shape[:-1] or topk_ids.shape[-1] > draft_logits.shape[-1]:
        raise ValueError(f"{fn}: the top-k target {topk_ids.shape} does not fit draft_logits {draft_logits.shape}: "
                         "they need the same leading positions and k <= the vocabulary size")


def check_weights(**weights) -> None:
    """Raise unless every named loss weight (a number, or a concrete array such as per-position weights) is finite
    and ≥ 0: a NaN weight would silently turn the whole loss into NaN, a negative one would maximise its term.

    `check_weights(renyi_weight=1.0, kl_weight=0.5)`; traced arrays (inside jit) cannot be checked and are skipped.
    """
    for name, w in weights.items():
        if w is None or isinstance(w, (str, bytes, bool)):
            raise TypeError(f"loss weight {name} must be a number or an array of numbers, got {w!r}")
        a = _concrete(w)
        if a is None:
            continue
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise TypeError(f"loss weight {name} must be numeric, got dtype {a.dtype}")
        a = a.astype(np.float64)
        if np.isnan(a).any():
            raise ValueError(f"loss weight {name} is NaN ({w!r}); give a finite weight >= 0")
        if (a < 0).any():
            raise ValueError(f"loss weight {name} is negative ({w!r}): a negative weight maximises its term; "
                             "give a weight >= 0 (0 drops the term)")
        if np.isinf(a).any():
            raise ValueError(f"loss weight {name} is infinite ({w!r}); give a finite weight >= 0")


def mix(*terms):
    """Σ_i w_i · loss_i over `(weight, loss)` pairs (losses broadcast: per position or already reduced).

    The weights are checked (`check_weights`: finite, ≥ 0). A term whose weight is 0 is dropped rather than
    multiplied, so an infinite loss with weight 0 (e.g. a divergence against a q with zeros) does not become NaN.
    """
    if not terms:
        raise ValueError("mix needs at least one (weight, loss) pair")
    for i, t in enumerate(terms):
        if not (isinstance(t, (tuple, list)) and len(t) == 2):
            raise TypeError(f"mix: term {i} must be a (weight, loss) pair, got {type(t).__name__}")
    check_weights(**{f"of term {i}": w for i, (w, _) in enumerate(terms)})
    kept = [(w, l) for w, l in terms if not (_concrete(w) is not None and np.all(np.asarray(w) == 0))]
    if not kept:
        raise ValueError("mix: every weight is 0, so the loss would be 0; give at least one term a weight > 0")
    total = None
    for w, l in kept:
        (l,) = _floats(l)
        total = w * l if total is None else total + w * l
    return total


def token_reverse_kl(target_logp, draft_logits):
    """KL(q ‖ p) = Σ_x q(x) (log q(x) − log p(x)) per position, from full target log-probs and draft logits `[..., V]`.

    Reverse KL is mode-seeking: it punishes q for mass where p is small and hardly for missing mass where p is
    large, so particles agree (high ESS) but the drafter may under-cover the target (the SMC-SD authors' fine-tunes:
    best resample rate, worse accuracy than Rényi-2). Terms with q(x) = 0 contribute 0; where q(x) > 0 = p(x) it is
    +inf, so p must have full support wherever q has (the temperature-only target a `TeacherStream` stores has).
    """
    logp, logits = _floats(target_logp, draft_logits)
    _check_same_vocab("token_reverse_kl", logp, logits)
    logq = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    q = jnp.exp(logq)
    return (q * jnp.where(q > 0, logq - logp, 0.0)).sum(-1)


def reverse_kl(target_logp, draft_logits, mask=None):
    """Masked mean of `token_reverse_kl` (nats/token)."""
    return masked_mean(token_reverse_kl(target_logp, draft_logits), mask)


def token_reverse_kl_topk(topk_ids, topk_logp, draft_logits, tail_floor: float = 1e-6):
    """KL(q ‖ p) per position against a top-k target, over the k + 1 cells {id_1, ..., id_k, rest}.

    With only the top-k of p known, KL(q ‖ p̃) against the renormalised top-k p̃ (what `token_forward_kl_topk`
    uses) is +inf: q is > 0 outside the top-k where p̃ = 0. So here the target keeps its raw top-k log-probs and its
    remaining mass lumps into one cell, p_rest = 1 − Σ_i p(id_i) (at least `tail_floor`, which absorbs float16
    rounding of a cached teacher that makes the sum exceed 1), and q_rest = 1 − Σ_i q(id_i):

        Σ_i q(id_i) (log q(id_i) − log p(id_i)) + q_rest (log q_rest − log p_rest).

    This is the reverse KL between the two coarse-grained distributions, a lower bound of the full KL(q ‖ p) (data
    processing), equal to it when q ∝ p on the rest, and to `token_reverse_kl` when k = V.
    """
    tail_floor = _static_float("token_reverse_kl_topk", "tail_floor", tail_floor)
    if not 0 < tail_floor < 1:
        raise ValueError(f"token_reverse_kl_topk: tail_floor must be in (0, 1), got {tail_floor!r}")
    ids = jnp.asarray(topk_ids)
    lp, logits = _floats(topk_logp, draft_logits)
    _check_topk("token_reverse_kl_topk", ids, lp, logits)
    ids = ids.astype(jnp.int32)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    logq_k = jnp.take_along_axis(logits, ids, axis=-1) - lse
    # the rest's mass from the logits outside the top-k (a finite sentinel instead of -inf keeps the gradient finite
    # when the top-k is the whole vocabulary)
    rest = jnp.put_along_axis(logits, ids, jnp.finfo(logits.dtype).min, axis=-1, inplace=False)
    logq_r = jax.nn.logsumexp(rest, axis=-1) - lse[..., 0]
    p_rest = -jnp.expm1(jax.nn.logsumexp(lp, axis=-1))  # 1 − Σ_i p(id_i)
    logp_r = jnp.log(jnp.maximum(p_rest, tail_floor))
    q_k, q_r = jnp.exp(logq_k), jnp.exp(logq_r)
    inside = (q_k * jnp.where(q_k > 0, logq_k - lp, 0.0)).sum(-1)
    return inside + q_r * jnp.where(q_r > 0, logq_r - logp_r, 0.0)


def reverse_kl_topk(topk_ids, topk_logp, draft_logits, mask=None, tail_floor: float = 1e-6):
    """Masked mean of `token_reverse_kl_topk` (nats/token)."""
    return masked_mean(token_reverse_kl_topk(topk_ids, topk_logp, draft_logits, tail_floor), mask)


def _renyi_from_logs(logp, logq, alpha):
    """1/(α−1) · logsumexp_x [α log p(x) + (1−α) log q(x)] over the last axis, terms with p(x) = 0 left out.

    In log space: at p = 0.5, q = 1e-30 the term is 2·log 0.5 + 69 = 67.7 (no overflow), where p²/q = 2.5e29 and
    p²/q at q = e^-200 would overflow float32.
    """
    support = logp > -jnp.inf
    terms = jnp.where(support, alpha * logp + (1.0 - alpha) * jnp.where(support, logq, 0.0), -jnp.inf)
    return jax.nn.logsumexp(terms, axis=-1) / (alpha - 1.0)


def token_renyi(target_logp, draft_logits, alpha: float):
    """Rényi-α divergence D_α(p ‖ q) = 1/(α−1) · log Σ_x p(x)^α q(x)^(1−α) per position, for α > 1.

    From full target log-probs `target_logp [..., V]` (the processed target) and draft logits `[..., V]` (or
    normalised log-probs, e.g. `floor_mixture_logq`). D_α = 1/(α−1)·log E_q[(p/q)^α]: for α = 2 it is
    log(1 + χ²(p ‖ q)), the log of the second moment of SMC's per-token importance weight, which N/ESS grows with;
    as α → 1 it tends to KL(p ‖ q), the forward KL (D_α is non-decreasing in α and D_1 = KL). Mass-covering like
    forward KL but punishing p/q ≫ 1 polynomially rather than logarithmically. Computed with logsumexp, finite at any
    finite log-ratio; +inf where q(x) = 0 < p(x) (use the ε floor of `floor_mixture_logq`). van Erven & Harremoës
    (2014), "Rényi divergence and Kullback-Leibler divergence", eq. (1); Li & Turner (2016) train variational
    proposals with it.
    """
    alpha = check_alpha("token_renyi", alpha)
    logp, logits = _floats(target_logp, draft_logits)
    _check_same_vocab("token_renyi", logp, logits)
    logq = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return _renyi_from_logs(logp, logq, alpha)


def renyi(target_logp, draft_logits, alpha: float, mask=None):
    """Masked mean of `token_renyi` (nats/token)."""
    return masked_mean(token_renyi(target_logp, draft_logits, alpha), mask)


def token_renyi_topk(topk_ids, topk_logp, draft_logits, alpha: float):
    """D_α(p̃ ‖ q) per position against the target's top-k, renormalised: p̃ = softmax(topk_logp) on `topk_ids`.

    As in `token_forward_kl_topk`: q is the draft's *full* softmax over V (not renormalised), so the value is ≥ 0 and
    also pushes q's mass outside the top-k back onto it; equals `token_renyi` when k = V; only k logits are gathered.
    p̃ has no mass outside the top-k, so this divergence is finite (its reverse-KL counterpart is not, see
    `token_reverse_kl_topk`). When decoding samples with top-k at the same k, p̃ is exactly the processed target.
    """
    alpha = check_alpha("token_renyi_topk", alpha)
    ids = jnp.asarray(topk_ids)
    lp, logits = _floats(topk_logp, draft_logits)
    _check_topk("token_renyi_topk", ids, lp, logits)
    logp = jax.nn.log_softmax(lp, axis=-1)
    logq = jnp.take_along_axis(logits, ids.astype(jnp.int32), axis=-1) - \
        jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return _renyi_from_logs(logp, logq, alpha)


def renyi_topk(topk_ids, topk_logp, draft_logits, alpha: float, mask=None):
    """Masked mean of `token_renyi_topk` (nats/token)."""
    return masked_mean(token_renyi_topk(topk_ids, topk_logp, draft_logits, alpha), mask)


def _mix_weights(fn: str, alpha, renyi_weight, kl_weight) -> tuple[float, float]:
    """The checked static weights of a Rényi + KL mix (and its alpha, checked even when its term is dropped)."""
    check_alpha(fn, alpha)
    renyi_weight = _static_float(fn, "renyi_weight", renyi_weight)
    kl_weight = _static_float(fn, "kl_weight", kl_weight)
    check_weights(renyi_weight=renyi_weight, kl_weight=kl_weight)
    if renyi_weight == 0 and kl_weight == 0:
        raise ValueError(f"{fn}: renyi_weight and kl_weight are both 0, so the loss would be 0; give one a weight > 0")
    return renyi_weight, kl_weight


def token_renyi_kl_mix(target_logp, draft_logits, *, alpha: float = 1.5, renyi_weight: float = 1.0,
                       kl_weight: float = 0.5):
    """renyi_weight · D_α(p ‖ q) + kl_weight · KL(p ‖ q) per position (full target log-probs).

    The defaults are the SMC-SD authors' robust setting (Rényi order 1.5 plus 0.5·forward KL; abdelfattah-lab/smcsd,
    `docs/smc/proposal_results.md`): the KL term keeps the gradient well-behaved where p/q is large, the Rényi term
    weighs those tokens more than KL does. A weight of 0 drops its term (`mix`). The KL term is `token_forward_kl`'s,
    computed in float32 as the module's first losses are.
    """
    renyi_weight, kl_weight = _mix_weights("token_renyi_kl_mix", alpha, renyi_weight, kl_weight)
    _check_same_vocab("token_renyi_kl_mix", jnp.asarray(target_logp), jnp.asarray(draft_logits))
    terms = []
    if renyi_weight:
        terms.append((renyi_weight, token_renyi(target_logp, draft_logits, alpha)))
    if kl_weight:
        terms.append((kl_weight, token_forward_kl(target_logp, draft_logits)))
    return mix(*terms)


def token_renyi_kl_mix_topk(topk_ids, topk_logp, draft_logits, *, alpha: float = 1.5, renyi_weight: float = 1.0,
                            kl_weight: float = 0.5):
    """`token_renyi_kl_mix` against a renormalised top-k target (`token_renyi_topk` + `token_forward_kl_topk`)."""
    renyi_weight, kl_weight = _mix_weights("token_renyi_kl_mix_topk", alpha, renyi_weight, kl_weight)
    ids, lp, logits = jnp.asarray(topk_ids), jnp.asarray(topk_logp), jnp.asarray(draft_logits)
    _check_topk("token_renyi_kl_mix_topk", ids, lp, logits)
    terms = []
    if renyi_weight:
        terms.append((renyi_weight, token_renyi_topk(ids, lp, logits, alpha)))
    if kl_weight:
        terms.append((kl_weight, token_forward_kl_topk(ids, lp, logits)))
    return mix(*terms)


# ----------------------------------------------------------------------------------------- SMC blocks
# A block: K drafted tokens x_1..x_K after a context c, P(x_1:K) = Π_k p(x_k | c, x_<k) under the target and
# Q(x_1:K) = Π_k q(x_k | c, x_<k) under the drafter. SMC-SD weights the whole block at once,
# W = P/Q = exp(Δℓ), Δℓ = Σ_k log p − log q, so the quantity that governs its N/ESS per cycle is the *block's*
# E_Q[W²] = 1 + χ²(P ‖ Q), which is not the product of per-token moments when the conditionals depend on the
# drafted tokens.

def block_log_weight(target_logp_tokens, draft_logq_tokens, mask=None):
    """Δℓ = Σ_k m_k (log p(x_k | ·) − log q(x_k | ·)) over the last axis: the SMC log-weight of a drafted block.

    `target_logp_tokens`, `draft_logq_tokens [..., K]`: the log-probabilities of the block's drafted tokens under
    the target (teacher-forced on the block) and the drafter; `mask [..., K]` zeroes positions after EOS (EOS is
    absorbing: they add nothing, DESIGN.md step 3).
    """
    lp, lq = _floats(target_logp_tokens, draft_logq_tokens)
    if lp.shape != lq.shape:
        raise ValueError(f"block_log_weight: target_logp_tokens {lp.shape} and draft_logq_tokens {lq.shape} must "
                         "have the same shape [..., K]")
    return block_sum(lp - lq, mask)


def block_renyi_mc(target_logp_tokens, draft_logq_tokens, alpha: float = 2.0, mask=None,
                   behavior_logq_tokens=None):
    """D_α(P ‖ Q) of a block's joint distributions, estimated from S sampled blocks per context, `[..., S, K] -> [...]`.

    D_α(P ‖ Q) = 1/(α−1) · log E_Q[W^α], W = P/Q the block's SMC weight; α = 2 gives log(1 + χ²(P ‖ Q)) =
    log E_Q[W²] ≈ log E[N/ESS] of one cycle. With blocks x^(s), s = 1..S, drawn from a behaviour distribution B
    (the drafter itself, B = Q, by default):

        D̂ = 1/(α−1) · [ logsumexp_s( α log P(x^s) + (1−α) log Q(x^s) − log B(x^s) ) − log S ],

    the log of an unbiased estimate of E_Q[W^α] = E_B[P^α Q^(1−α) / B]: consistent as S → ∞, biased low for finite
    S (Jensen), all in log space. Its gradient in the drafter's parameters with the samples held fixed is
    −Σ_s w̄_s ∇log Q(x^s), w̄ = softmax_s(the terms above): the self-normalised estimate of the exact
    ∇D_α = −E_Q[W^α ∇log Q] / E_Q[W^α] (the χ² upper bound of Dieng et al. 2017, CUBO, has this form). On policy
    (`behavior_logq_tokens=None`) log B = stop_gradient(log Q), which makes the pathwise derivative exactly that
    score-function gradient; pass `behavior_logq_tokens` for blocks collected under an older drafter (off policy),
    or for an exact check: all V^K blocks with log B = −K log V enumerate the expectation exactly.

    `target_logp_tokens [..., S, K]`: log p of each sampled block's tokens (stop-gradient: the target is frozen);
    `draft_logq_tokens [..., S, K]`: log q of the same tokens under the drafter being trained (its training-time-
    test unroll, where it has one); `mask [..., S, K]`: positions after EOS. Needs S ≥ 2: with one sample the
    gradient is the drafter's log-likelihood of its own sample, which sharpens q instead of covering p.
    """
    alpha = check_alpha("block_renyi_mc", alpha)
    lp, lq = _floats(target_logp_tokens, draft_logq_tokens)
    if lp.shape != lq.shape or lp.ndim < 2:
        raise ValueError(f"block_renyi_mc: target_logp_tokens {lp.shape} and draft_logq_tokens {lq.shape} must have "
                         "the same shape [..., S, K] (S sampled blocks of K tokens per context)")
    S = lp.shape[-2]
    if S < 2:
        raise ValueError(f"block_renyi_mc: needs S >= 2 sampled blocks per context on axis -2, got S = {S}; with one "
                         "sample the estimate's gradient only sharpens q on its own sample")
    logP = jax.lax.stop_gradient(block_sum(lp, mask))
    logQ = block_sum(lq, mask)
    if behavior_logq_tokens is None:
        logB = jax.lax.stop_gradient(logQ)
    else:
        (lb,) = _floats(behavior_logq_tokens)
        if lb.shape != lq.shape:
            raise ValueError(f"block_renyi_mc: behavior_logq_tokens {lb.shape} must have draft_logq_tokens' shape "
                             f"{lq.shape}")
        logB = jax.lax.stop_gradient(block_sum(lb, mask))
    terms = alpha * logP + (1.0 - alpha) * logQ - logB
    return (jax.nn.logsumexp(terms, axis=-1) - math.log(S)) / (alpha - 1.0)


def block_sum(per_pos_loss, mask=None):
    """Σ_k m_k · l_k over the last axis (block positions k = 1..K): a per-position loss turned into a block's.

    What the sum estimates depends on the loss and on whose prefixes the positions were evaluated along
    (chain rules of the divergences, Cover & Thomas Thm 2.5.3 for KL):
    - `token_forward_kl` along prefixes sampled from the target (teacher forcing on the self-distillation corpus,
      the target's own outputs): KL(P ‖ Q) = Σ_k E_{x<k ~ P}[KL(p_k ‖ q_k)], an unbiased estimate of the block's
      forward KL;
    - `token_reverse_kl` along the drafter's own unroll: KL(Q ‖ P) = Σ_k E_{x<k ~ Q}[KL(q_k ‖ p_k)] (value unbiased;
      its pathwise gradient leaves out the score term of the sampled prefix, as on-policy distillation does);
    - `token_renyi`: Rényi has no chain rule; Σ_k D_α(p_k ‖ q_k) = D_α(⊗_k p_k ‖ ⊗_k q_k) exactly when the
      positions' distributions do not depend on the block's own earlier tokens (e.g. all conditioned on the gold
      prefix, as teacher forcing evaluates them), because E_Q[W^α] then factorises into Π_k E_{q_k}[w_k^α];
      otherwise it is that teacher-forced surrogate, and `block_renyi_mc` estimates the joint D_α itself.
    """
    (loss,) = _floats(per_pos_loss)
    if mask is None:
        return loss.sum(-1)
    (m,) = _floats(mask)
    return jnp.where(jnp.broadcast_to(m, loss.shape) != 0, jnp.broadcast_to(m, loss.shape) * loss, 0.0).sum(-1)


# ----------------------------------------------------------------------------------------- draft vocabulary

def floor_mixture_logq(logq_draft_vocab, draft_to_target, vocab_size: int, eps: float):
    """Full-vocabulary log q of a draft-vocabulary head mixed with an ε floor: q = (1 − ε)·q′ + ε/V, `[..., V]`.

    `logq_draft_vocab [..., V′]`: the drafter's log-probs (or logits; normalised here) over its V′ kept tokens
    (FR-Spec's draft vocabulary); `draft_to_target int[V′]`: the target id of each kept token (distinct);
    `vocab_size` V: the target's. q(x) = (1 − ε)·q′(x) + ε/V on kept tokens and ε/V elsewhere: it sums to 1 and is
    ≥ ε/V > 0 everywhere, so SMC's weights p/q and every divergence against it are finite (with q′ alone they are
    +inf wherever the target has mass outside the draft vocabulary). That outside mass is counted, not dropped:
    each outside token adds p(x)·log(p(x)·V/ε) to KL(p ‖ q) and p(x)^α (ε/V)^(1−α) inside D_α's sum — constant in
    the drafter's parameters, but inside D_α's log it down-weights the gradient on the kept tokens when the outside
    mass is large, which is the SMC cost it stands for (a particle that drafts an outside token gets weight
    p(x)·V/ε). The drafter must sample from this same mixture for the loss to describe its weights.
    """
    eps = _static_float("floor_mixture_logq", "eps", eps)
    if not 0 < eps < 1:
        raise ValueError(f"floor_mixture_logq: eps must be in (0, 1) (the floor's share of q), got {eps!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise TypeError(f"floor_mixture_logq: vocab_size must be a positive int (the target's V), got {vocab_size!r}")
    vocab_size = int(vocab_size)
    d2t = jnp.asarray(draft_to_target)
    if not jnp.issubdtype(d2t.dtype, jnp.integer):
        raise TypeError(f"floor_mixture_logq: draft_to_target must be integer target ids, got dtype {d2t.dtype}")
    (logq,) = _floats(logq_draft_vocab)
    if d2t.ndim != 1 or logq.ndim == 0 or d2t.shape[0] != logq.shape[-1]:
        raise ValueError(f"floor_mixture_logq: draft_to_target {d2t.shape} must be int[V′] with V′ = the last axis of "
                         f"logq_draft_vocab {logq.shape}")
    if d2t.shape[0] > vocab_size:
        raise ValueError(f"floor_mixture_logq: the draft vocabulary has {d2t.shape[0]} tokens, more than the target's "
                         f"vocab_size {vocab_size}")
    ids = _concrete(d2t)
    if ids is not None:
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"floor_mixture_logq: draft_to_target holds ids outside [0, {vocab_size}) "
                             f"(min {ids.min()}, max {ids.max()})")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("floor_mixture_logq: draft_to_target has repeated target ids; each kept token maps to a "
                             "distinct target id")
    log_floor = math.log(eps) - math.log(vocab_size)
    kept = jnp.logaddexp(math.log1p(-eps) + jax.nn.log_softmax(logq, axis=-1), log_floor)
    full = jnp.full(logq.shape[:-1] + (vocab_size,), log_floor, logq.dtype)
    return full.at[..., d2t.astype(jnp.int32)].set(kept)
