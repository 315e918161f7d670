"""EAGLE-3 drafter training with training-time test (EAGLE-3, arXiv 2503.01840; HASS, arXiv 2408.15766).

The target runs teacher-forced over a corpus (`TeacherStream` with `layers` = the drafter's three feature layers):
tokens, the hidden states of those layers at every position and its top-k next-token log-probs. The drafter is
unrolled on its own predicted features for k = 1..K (`eagle_unroll_outputs`): step 1 at row s reads the target's
feature of position s − 1 and predicts x_{s+1}; step k reads its own output of step k − 1 and predicts x_{s+k} —
exactly what decoding computes after a committed length s with x_{s+1..s+k−1} drafted (the gold tokens stand in for
the drafts, the features are the drafter's own). Every step is supervised by the target's distribution at the
position it predicts:

    l_k = w_kl · KL(p̃_T ‖ q_k) + w_ce · CE(x_{s+k}),   loss = Σ_k γ^(k−1) · mean_s(l_k) / Σ_k γ^(k−1)

with p̃_T the target's top-k log-probs restricted to the draft vocabulary and renormalised (q is 0 outside it, so
that is the part of p_T the drafter can match), CE on the gold token where the vocabulary keeps it, and γ = 0.8 by
default (SpecForge's per-step decay). Positions whose predicted token runs past the row are masked. Step 1 covers
every position; steps 2..K cover `ttt_rows` random positions per sequence (a row's later steps depend on the other
rows only through step 1's keys, so this is exact for the rows kept, and it cuts the unroll's cost — mostly the head
over the supervised positions — from K full passes to about one).

Held-out metrics (the teacher's top-k: lower bounds where they sum over it): `greedy1` the first draft's greedy
agreement with the target's argmax (its first-draft acceptance at T = 0), `accept_k` Σ_x min(p_T, q_k) per step
(acceptance at T = 1, q_k on the gold prefix), `accept_len` E[Σ_k Π_{j≤k} α_j] and `greedy_len` the same with the
greedy agreements (expected accepted length of a K-chain at T = 1 / T = 0, on the gold prefix), `kl`, `ce`.

`TokenCorpus` packs token documents (a `SelfDistilledCorpus`'s conversations, `token_corpus`) into training rows with
an explicit held-out split, for `TeacherStream`.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..drafters.eagle import EagleConfig, EagleDrafter, eagle_hf_config, eagle_unroll_at, head_logits
from .data import TeacherStream, TextCorpus
from .loop import TrainResult, placement, train, training_info

__all__ = ["TokenCorpus", "eagle_loss", "sample_rows", "token_corpus", "train_eagle"]


# ----------------------------------------------------------------------------------------------- data

class TokenCorpus(TextCorpus):
    """Token documents packed into `seq_len` rows (`TextCorpus`'s batches, epochs and fingerprint, without a
    tokenizer): `documents` (sequences of ids) are concatenated into the training rows; `heldout_documents` (if given)
    into the held-out rows, else the last `heldout_frac` of the rows are held out. `eos_id` is appended to a document
    that does not end with it (None: documents are taken as they are).

    masks / heldout_masks: per document, one bool per token: whether predicting that token is supervised (and, held
    out, measured), e.g. a conversation's answer tokens only (`token_corpus(..., loss_on="answers")`), as EAGLE-3
    and SpecForge train on assistant turns. Packed alongside the tokens into `train_masks` / `heldout_masks`
    (`[rows, seq_len]`; None without masks); a `TeacherStream` batch then carries them as `loss_mask`."""

    def __init__(self, documents: Sequence[Sequence[int]], *, seq_len: int, batch_size: int,
                 heldout_documents: Sequence[Sequence[int]] | None = None, seed: int = 0, heldout_frac: float = 0.05,
                 eos_id: int | None = None, max_tokens: int | None = None,
                 masks: Sequence[Sequence[bool]] | None = None, heldout_masks: Sequence[Sequence[bool]] | None = None):
        for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if seq_len < 3:
            raise ValueError(f"seq_len must be >= 3 (an EAGLE pair and the token it predicts), got {seq_len}")
        if not 0 <= heldout_frac < 1:
            raise ValueError(f"heldout_frac must be in [0, 1), got {heldout_frac!r}")
        documents = list(documents)
        if not documents:
            raise ValueError("documents is empty: pass at least one token document")
        self.seq_len, self.batch_size, self.seed, self.heldout_frac = seq_len, batch_size, seed, heldout_frac

        if heldout_masks is not None and heldout_documents is None:
            raise ValueError("heldout_masks needs heldout_documents (without them the held-out rows are cut from the "
                             "training documents, whose masks are `masks`)")
        if (masks is None) != (heldout_masks is None) and heldout_documents is not None:
            raise ValueError("pass both masks and heldout_masks, or neither (held-out metrics must be measured on "
                             "the positions training supervises)")

        def pack(docs, mks, arg):
            if mks is not None:
                mks = list(mks)
                if len(mks) != len(docs):
                    raise ValueError(f"{arg} has {len(mks)} entries for {len(docs)} documents: one mask per document")
            parts, mparts = [], []
            for i, d in enumerate(docs):
                ids = np.asarray(d, np.int32).reshape(-1)
                m = None if mks is None else np.asarray(mks[i], bool).reshape(-1)
                if m is not None and len(m) != len(ids):
                    raise ValueError(f"{arg}[{i}] has {len(m)} entries for a document of {len(ids)} tokens: one "
                                     "bool per token")
                if eos_id is not None and (len(ids) == 0 or ids[-1] != eos_id):
                    ids = np.append(ids, np.int32(eos_id))
                    m = None if m is None else np.append(m, True)
                parts.append(ids)
                mparts.append(m)
            stream = np.concatenate(parts) if parts else np.zeros((0,), np.int32)
            mstream = None if mks is None else (np.concatenate(mparts) if mparts else np.zeros((0,), bool))
            return stream, mstream

        def rows_of(x, n):
            return None if x is None else x[:n * seq_len].reshape(n, seq_len)

        stream, mstream = pack(documents, masks, "masks")
        if max_tokens is not None:
            stream = stream[:max_tokens]
            mstream = None if mstream is None else mstream[:max_tokens]
        self.num_documents = len(documents) + (len(heldout_documents) if heldout_documents is not None else 0)
        n_rows = len(stream) // seq_len
        rows, mrows = rows_of(stream, n_rows), rows_of(mstream, n_rows)
        if heldout_documents is not None:
            held, mheld = pack(heldout_documents, heldout_masks, "heldout_masks")
            n_held = len(held) // seq_len
            self.train_rows, self.heldout_rows = rows, rows_of(held, n_held)
            self.train_masks, self.heldout_masks = mrows, rows_of(mheld, n_held)
            self.num_tokens = int(len(stream) + len(held))
        else:
            n_held = min(n_rows - 1, max(1, round(heldout_frac * n_rows))) if heldout_frac > 0 and n_rows > 1 else 0
            self.train_rows, self.heldout_rows = rows[:n_rows - n_held], rows[n_rows - n_held:]
            if mrows is not None:
                self.train_masks, self.heldout_masks = mrows[:n_rows - n_held], mrows[n_rows - n_held:]
            self.num_tokens = int(len(stream))
        if len(self.train_rows) < batch_size:
            raise ValueError(f"the documents give {len(self.train_rows)} training rows of seq_len {seq_len}, fewer than "
                             f"one batch of batch_size = {batch_size}; add documents or lower batch_size / seq_len")
        self.batches_per_epoch = len(self.train_rows) // batch_size


def token_corpus(corpus, *, seq_len: int, batch_size: int, seed: int = 0, include_text: bool = True,
                 max_tokens: int | None = None, loss_on: str = "all") -> TokenCorpus:
    """A `TokenCorpus` of a `smcsd.train.corpus.SelfDistilledCorpus`: its training conversations (prompt + the
    target's answer; with `include_text` also its local text documents) as training rows and its held-out
    conversations (prompts no training row holds) as held-out rows.

    loss_on: "all" (every token is supervised) or "answers": only predicting the target's own answer tokens (and
    the local text, teacher-forced everywhere) is supervised, and held-out metrics are measured on the held-out
    answers alone, which is what a drafter drafts when decoding (a chat prompt's user turn is never drafted)."""
    if loss_on not in ("all", "answers"):
        raise ValueError(f"loss_on must be 'all' or 'answers', got {loss_on!r}")
    if loss_on == "all":
        return TokenCorpus(corpus.documents("train", include_text=include_text), seq_len=seq_len,
                           batch_size=batch_size, heldout_documents=corpus.documents("heldout", include_text=False),
                           seed=seed, max_tokens=max_tokens)
    docs, masks = corpus.documents("train", include_text=include_text, with_masks=True)
    held, held_masks = corpus.documents("heldout", include_text=False, with_masks=True)
    return TokenCorpus(docs, seq_len=seq_len, batch_size=batch_size, heldout_documents=held, seed=seed,
                       max_tokens=max_tokens, masks=masks, heldout_masks=held_masks)


# ----------------------------------------------------------------------------------------------- loss

def sample_rows(seed: int, step: int, batch: int, seq_len: int, num_rows: int, steps: int) -> np.ndarray:
    """int32 `[batch, A]` distinct rows s per sequence (sorted) in [1, seq_len − 1 − steps], where every one of the
    `steps` unrolled steps predicts a token inside the row, for steps 2..K of the unroll; A = min(num_rows, that
    many). A pure function of (seed, step), so a resumed run sees the same rows."""
    hi = seq_len - 1 - steps
    if hi < 1:
        raise ValueError(f"seq_len {seq_len} is too short for {steps} unrolled steps (needs >= {steps + 2})")
    n = min(int(num_rows), hi)
    rng = np.random.default_rng([seed, step, 0xEA63])
    return np.sort(np.stack([rng.choice(hi, n, replace=False) + 1 for _ in range(batch)]), 1).astype(np.int32)


def _targets_at(batch, rows, k: int):
    """The teacher's top-k at the position row s predicts at step k (0-based; teacher at s + k), the gold token
    (s + k + 1) and whether it is inside the sequence and supervised (`loss_mask`, when the batch has one), for
    `rows [B, N]`: `[B, N, ...]`."""
    T = batch["tokens"].shape[1]
    t = jnp.minimum(rows + k, T - 1)
    g = jnp.minimum(rows + k + 1, T - 1)
    gold = jnp.take_along_axis(batch["tokens"], g, axis=1)
    ids = jnp.take_along_axis(batch["topk_ids"], t[:, :, None], axis=1)
    lp = jnp.take_along_axis(batch["topk_logp"], t[:, :, None], axis=1)
    valid = rows + k + 1 <= T - 1
    if "loss_mask" in batch:  # only positions predicting a supervised token (e.g. the target's answers)
        valid = valid & jnp.take_along_axis(batch["loss_mask"], g, axis=1)
    return ids, lp, gold, valid


def _kept_teacher(logits, ids, lp, t2d):
    """What the per-position divergences share: the drafter's log-softmax over V′, each top-k id's draft index
    (−1 outside V′), whether it is kept, the drafter's log-prob of it, the teacher's log-probs renormalised on the
    kept ids (garbage where not kept: mask with `kept`), and whether any id is kept."""
    logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [..., V']
    d = jnp.take(t2d, ids)  # [..., k] draft index or -1
    kept = d >= 0
    lq_ids = jnp.take_along_axis(logq, jnp.maximum(d, 0), axis=-1)
    z = jax.nn.logsumexp(jnp.where(kept, lp, -jnp.inf), axis=-1, keepdims=True)
    lp_kept = lp - jnp.where(jnp.isfinite(z), z, 0.0)
    return logq, d, kept, lq_ids, lp_kept, jnp.isfinite(z[..., 0])


def _step_terms(logits, ids, lp, gold, t2d, kept_teacher=None):
    """Per position: KL(p̃ ‖ q) over the kept part of the teacher's top-k, CE of the gold token (0 where it is not
    kept), whether each is defined, and the greedy agreement / acceptance (top-k lower bound) with the full p_T.
    `kept_teacher`: `_kept_teacher(logits, ids, lp, t2d)` when the caller has it already."""
    logq, d, kept, lq_ids, lp_kept, has = kept_teacher or _kept_teacher(logits, ids, lp, t2d)
    lpt = jnp.where(kept, lp_kept, 0.0)  # p̃ (log), 0 where not kept (masked)
    pt = jnp.where(kept, jnp.exp(lpt), 0.0)
    kl = jnp.sum(jnp.where(kept, pt * (lpt - lq_ids), 0.0), axis=-1)
    dg = jnp.take(t2d, gold)
    ce = -jnp.take_along_axis(logq, jnp.maximum(dg, 0)[..., None], axis=-1)[..., 0]
    q_ids = jnp.where(kept, jnp.exp(lq_ids), 0.0)
    accept = jnp.sum(jnp.minimum(jnp.exp(lp), q_ids), axis=-1)
    agree = (jnp.argmax(logits, axis=-1) == jnp.maximum(d[..., 0], 0)) & kept[..., 0]
    return kl, has, ce, dg >= 0, accept, agree


def _renyi_terms(logits, ids, lp, t2d, alpha: float, kept_teacher=None):
    """Per position: D_α(p̃ ‖ q) over the kept part of the teacher's top-k (`smcsd.train.losses.token_renyi_topk`'s
    form over the draft vocabulary: p̃ renormalised on the kept ids, q the drafter's full softmax over V′, so the
    value also pushes q's mass outside them back on), and whether it is defined. α = 2 is log(1 + χ²(p̃ ‖ q)), the
    log second moment of `smc`'s per-token importance weight. `kept_teacher` as for `_step_terms`."""
    _, _, kept, lq_ids, lp_kept, has = kept_teacher or _kept_teacher(logits, ids, lp, t2d)
    terms = jnp.where(kept, alpha * lp_kept + (1.0 - alpha) * lq_ids, -jnp.inf)
    d_alpha = jax.nn.logsumexp(terms, axis=-1) / (alpha - 1.0)
    return jnp.where(has, d_alpha, 0.0), has


def _all_rows(batch):
    B, T = batch["tokens"].shape
    return jnp.broadcast_to(jnp.arange(1, T, dtype=jnp.int32), (B, T - 1))


@functools.lru_cache(maxsize=16)
def eagle_loss(config: EagleConfig, steps: int, step_decay: float = 0.8, ce_weight: float = 0.1,
               kl_weight: float = 1.0, remat: bool = False, renyi_weight: float = 0.0,
               alpha: float = 2.0, temperature: float = 1.0) -> Callable:
    """loss_fn(net_params, batch) -> (loss, aux) for `train`: the training-time-test loss of the module docstring.

    batch: `tokens [B, T]`, `hidden [B, T, 3H]`, `topk_ids` / `topk_logp [B, T, k]` (a `TeacherStream` batch), the
    target's `embed [V, H]` and `t2d int32[V]` (draft index of each target id, −1 outside; frozen: passed as data),
    and optionally `rows [B, A]` (`sample_rows`): the rows steps 2..K are unrolled and supervised on (default every
    row; step 1 always covers every row). remat: run each step's head and loss under `jax.checkpoint` (no
    `[B, rows, V′]` logits kept per step for the backward pass, at the cost of recomputing them).
    renyi_weight > 0 adds renyi_weight · D_α(p̃ ‖ q) per step (`_renyi_terms`; α > 1, default 2: the χ² objective of a
    proposal trained for `smc`, issue "Proposals trained for SMC"); with kl_weight it is the Rényi + KL mix.
    temperature τ: every divergence compares the tempered pair, softmax(log p_T / τ) (renormalised on the kept top-k)
    against softmax(head logits / τ), which is what `smc` at temperature τ proposes from and weighs against (a
    proposal for T = 0.7 trains at τ = 0.7); greedy agreement does not depend on it."""
    if steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {steps}")
    from .losses import check_alpha, check_temperature, check_weights
    check_weights(ce_weight=ce_weight, kl_weight=kl_weight, renyi_weight=renyi_weight)
    if renyi_weight:
        alpha = check_alpha("eagle_loss", alpha)
    tau = check_temperature("eagle_loss", temperature)
    w = np.asarray([step_decay ** k for k in range(steps)], np.float32)
    w = w / w.sum()

    def per_step(net_params, a, ids, lp, gold, valid, t2d):
        logits = head_logits(config, net_params, a)
        if tau != 1.0:  # the tempered pair (lp is renormalised on the kept ids in _kept_teacher)
            logits, lp = logits / tau, lp / tau
        kt = _kept_teacher(logits, ids, lp, t2d)  # shared by the KL and the Rényi term (one log-softmax over V′)
        kl, has, ce, ce_ok, _, agree = _step_terms(logits, ids, lp, gold, t2d, kt)
        m_kl = (valid & has).astype(jnp.float32)
        m_ce = (valid & ce_ok).astype(jnp.float32)
        m = valid.astype(jnp.float32)
        n_kl, n_ce = jnp.maximum(m_kl.sum(), 1.0), jnp.maximum(m_ce.sum(), 1.0)
        kl_mean = (kl * m_kl).sum() / n_kl
        if renyi_weight:  # the Rényi term rides on the KL slot's positions (the same kept top-k)
            d_alpha, _ = _renyi_terms(logits, ids, lp, t2d, alpha, kt)
            kl_mean = kl_weight * kl_mean + renyi_weight * (d_alpha * m_kl).sum() / n_kl
        return (kl_mean, (ce * m_ce).sum() / n_ce,
                jax.lax.stop_gradient((agree * m).sum() / jnp.maximum(m.sum(), 1.0)))

    step_fn = jax.checkpoint(per_step) if remat else per_step

    def loss_fn(net_params, batch):
        rows = batch.get("rows")
        outs = eagle_unroll_at(config, net_params, batch["embed"], batch["tokens"], batch["hidden"], steps, rows)
        every = _all_rows(batch)
        kls, ces, agrees = [], [], []
        for k in range(steps):
            at = every if (k == 0 or rows is None) else rows
            kl, ce, agree = step_fn(net_params, outs[k], *_targets_at(batch, at, k), batch["t2d"])
            kls.append(kl)
            ces.append(ce)
            agrees.append(agree)
        kl, ce = jnp.stack(kls), jnp.stack(ces)
        divergence = kl if renyi_weight else kl_weight * kl  # with the Rényi term, per_step weighed both already
        loss = jnp.sum(w * (divergence + ce_weight * ce))
        return loss, {"kl1": kl[0], f"kl{steps}": kl[-1], "ce1": ce[0], "greedy1": agrees[0]}
    return loss_fn


@functools.lru_cache(maxsize=16)
def _eval_program(config: EagleConfig, steps: int):
    """jit(net_params, batch) -> sums over valid positions (every row at every step): kl [K], ce [K], accept [K],
    greedy [K], counts [K], and over rows valid for every step: accept_len, greedy_len, their count."""
    def ev(net_params, batch):
        outs = eagle_unroll_at(config, net_params, batch["embed"], batch["tokens"], batch["hidden"], steps)
        every = _all_rows(batch)
        out = [[], [], [], [], []]
        alphas, agrees, valids = [], [], []
        for k in range(steps):
            ids, lp, gold, valid = _targets_at(batch, every, k)
            kl, has, ce, ce_ok, acc, agree = _step_terms(head_logits(config, net_params, outs[k]), ids, lp, gold,
                                                         batch["t2d"])
            m = valid.astype(jnp.float32)
            out[0].append((kl * m * has).sum())
            out[1].append((ce * m * ce_ok).sum())
            out[2].append((acc * m).sum())
            out[3].append((agree * m).sum())
            out[4].append(m.sum())
            alphas.append(acc)
            agrees.append(agree.astype(jnp.float32))
            valids.append(m)
        # rows with every step inside the sequence whose first drafted token is supervised (an answer token)
        full = (every + steps <= batch["tokens"].shape[1] - 1).astype(jnp.float32) * valids[0]
        acc_len = (jnp.cumprod(jnp.stack(alphas), axis=0).sum(0) * full).sum()
        greedy_len = (jnp.cumprod(jnp.stack(agrees), axis=0).sum(0) * full).sum()
        return tuple(jnp.stack(x) for x in out) + (acc_len, greedy_len, full.sum())
    return jax.jit(ev)


# ----------------------------------------------------------------------------------------------- recipe

def train_eagle(target, drafter: EagleDrafter, corpus: TextCorpus | TeacherStream, *, steps: int, ttt_steps: int = 5,
                step_decay: float = 0.8, ttt_rows: int | None = 64, remat: bool = False, seed: int = 0,
                lr: float = 1e-3, warmup: int | None = None, clip: float = 1.0,
                weight_decay: float = 0.1, ce_weight: float = 0.1, kl_weight: float = 1.0, topk: int = 32,
                renyi_weight: float = 0.0, alpha: float = 2.0, temperature: float = 1.0,
                cache_dir: str | None = None, ckpt_dir: str | None = None, resume: bool = False,
                overwrite: bool = False, out: str | None = None, export_dtype: str = "float32",
                eval_every: int = 100, ckpt_every: int = 100, eval_rows: int | None = 64, progress: bool = True,
                stop_after: int | None = None, curves_path: str | None = None, command: str | None = None,
                mesh=None) -> TrainResult:
    """Train `drafter` (an `EagleDrafter`, e.g. `EagleDrafter.create(target, draft_vocab=...)`) for `target` on
    `corpus` (a `TextCorpus` / `TokenCorpus`, or a ready `TeacherStream` carrying the drafter's layers and top-k) with
    training-time test over `ttt_steps` = K unrolled steps (module docstring). Step 1 is supervised at every position;
    steps 2..K at `ttt_rows` random positions per sequence (`sample_rows`, drawn from (seed, step); None: every
    position), which is what keeps the unroll cheap: its cost is mostly the head over the supervised positions.

    The target's embedding, the draft vocabulary and the target itself stay frozen; the drafter's own weights (`fc`,
    the decoder layer, `norm`, `lm_head`) are trained from `drafter.params`. Held-out metrics every `eval_every` steps
    (module docstring). out: `drafter.save` directory (EAGLE / SpecForge layout) with `training.json` (settings, final
    metrics, wall time, token budget, command) once the run finishes. Resumable (`ckpt_dir`, `resume`): a resumed run
    reproduces the uninterrupted one's losses. mesh: a ("data", "model") device mesh (`smcsd.train.loop.placement`)."""
    if not isinstance(drafter, EagleDrafter):
        raise TypeError(f"drafter must be an EagleDrafter, got {type(drafter).__name__}")
    if isinstance(ttt_steps, bool) or not isinstance(ttt_steps, int) or ttt_steps < 1:
        raise ValueError(f"ttt_steps must be an int >= 1 (the unrolled draft steps), got {ttt_steps!r}")
    if not 0 < step_decay <= 1:
        raise ValueError(f"step_decay must be in (0, 1], got {step_decay!r}")
    pl = placement(mesh)
    drafter = drafter.bind(target)
    config = drafter.eagle_config
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(
        target, corpus, topk=topk, layers=drafter.hidden_layers, cache_dir=cache_dir, mesh=pl.mesh)
    if tuple(stream.layers) != drafter.hidden_layers:
        raise ValueError(f"the teacher stream carries target layers {stream.layers}, the drafter reads "
                         f"{drafter.hidden_layers}")
    if not stream.topk:
        raise ValueError("train_eagle needs a top-k teacher stream (topk >= 1)")
    corpus = stream.corpus
    sample_rows(0, 0, 1, corpus.seq_len, 1, ttt_steps)  # validates seq_len against ttt_steps
    pl.check_rows(corpus.batch_size)
    rows = pl.local_rows(corpus.batch_size)
    V = target.config.vocab_size
    t2d = np.arange(V, dtype=np.int32) if drafter.vocab is None else drafter.vocab.target_to_draft
    frozen = {"embed": pl.shard_frozen({"embed": drafter.shared["embed"]}, target.config)["embed"],
              "t2d": pl.replicate(jnp.asarray(t2d))}
    loss_fn = eagle_loss(config, ttt_steps, float(step_decay), float(ce_weight), float(kl_weight), bool(remat),
                         float(renyi_weight), float(alpha), float(temperature))
    T, n = corpus.seq_len, corpus.batch_size
    if ttt_rows is not None and (isinstance(ttt_rows, bool) or not isinstance(ttt_rows, int) or ttt_rows < 1):
        raise ValueError(f"ttt_rows must be an int >= 1 (positions per sequence for steps 2..K) or None, got "
                         f"{ttt_rows!r}")

    def batches(step):  # this process's rows; the unroll rows drawn for the whole batch, so any mesh sees the same
        b = {**stream.batch(step, rows), **frozen}
        if ttt_rows is not None and ttt_steps > 1:
            b["rows"] = sample_rows(seed, step, n, T, ttt_rows, ttt_steps)[rows]
        return b

    ev_prog = _eval_program(config, ttt_steps)

    def eval_fn(p):
        tot = None
        for b in stream.eval_batches(eval_rows):
            r = [np.asarray(x, np.float64) for x in pl.to_host(ev_prog(p, pl.shard_global({**b, **frozen})))]
            tot = r if tot is None else [x + y for x, y in zip(tot, r)]
        kl, ce, acc, agree, n, acc_len, greedy_len, full = tot
        n = np.maximum(n, 1)
        res = {"kl": float(kl.sum() / n.sum()), "ce": float(ce.sum() / n.sum()), "greedy1": float(agree[0] / n[0]),
               "accept1": float(acc[0] / n[0]), "accept": float(acc.sum() / n.sum()),
               "accept_len": float(acc_len / max(full, 1)), "greedy_len": float(greedy_len / max(full, 1))}
        if ttt_steps > 1:
            res[f"accept{ttt_steps}"] = float(acc[-1] / n[-1])
        return res

    vocab_id = None if drafter.vocab is None else drafter.vocab.fingerprint
    meta = {"recipe": "train_eagle", "eagle_config": eagle_hf_config(config), "draft_vocab": vocab_id,
            "target_config": stream.config.to_dict(), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "batch_size": corpus.batch_size, "seq_len": corpus.seq_len,
            "data_seed": corpus.seed, "ttt_steps": ttt_steps, "ttt_rows": ttt_rows, "seed": seed,
            "step_decay": step_decay, "ce_weight": ce_weight, "kl_weight": kl_weight, "topk": stream.topk}
    if renyi_weight:  # only then (a run without the term keeps the settings, so its checkpoints still resume)
        meta.update(renyi_weight=float(renyi_weight), alpha=float(alpha))
    if temperature != 1.0:  # likewise
        meta.update(temperature=float(temperature))
    name = getattr(target, "name", "target")
    t0 = time.time()
    res = train(loss_fn, drafter.params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every,
                ckpt_every=ckpt_every, progress=progress, stop_after=stop_after, curves_path=curves_path,
                meta=meta, desc=f"eagle drafter for {name}", command=command, mesh=pl)
    h = res.history
    if out and h["finished"]:
        info = training_info("train_eagle", name, stream, res, steps, export_dtype, ttt_steps=ttt_steps,
                             draft_vocab_size=config.draft_vocab_size, target_layers=list(drafter.hidden_layers),
                             this_process_s=round(time.time() - t0, 1))
        pl.on_lead(lambda: drafter.with_params(res.params).save(out, export_dtype, info))
    return res
