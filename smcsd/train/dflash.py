"""Block-drafter (DFlash) training: many anchored blocks of a teacher-forced sequence in one pass.

The target runs teacher-forced over a corpus (`TeacherStream` with `layers` = the drafter's target layers):
tokens, the hidden states of those layers at every position, and optionally its top-k next-token log-probs.
Per sequence, `num_anchors` random anchor positions a (drawn from (seed, step), so a resumed run sees the same
anchors) each open a block [x_a, MASK × (B−1)] at positions a..a+B−1; the block attends to the context
features of positions < a and, bidirectionally, to itself — exactly what `DFlashDrafter.propose` computes at
decode time, with all blocks of a sequence sharing one context K/V. Position k predicts x_{a+k}.

Per-position loss l_k = w_ce · CE(x_{a+k}) + w_kl · KL(p_T(·|x_≤a+k−1) ‖ q_k) (KL against the target's top-k),
masked where a+k runs past the sequence or hits padding, then weighted:
- `dflash`: w_k = exp(−(k−1)/γ) (`losses.dflash_weights`, γ from `losses.dflash_gamma(B)` unless given);
  loss = Σ m·w·l / Σ m·w;
- `dpace`: D-PACE's w_k = Σ_{j≥k} m_j Π_{i≤j} ((1−a)·q_i + a) with q_i the drafter's probability of the gold
  token (`losses.dpace_weights`, stop-gradient); loss = Σ m·w·l / number of blocks (the paper's normalisation);
- `uniform`: w_k = 1.
Held-out metrics: CE, and from the top-k teacher the per-position acceptance α_k = Σ_x min(p_T, q_k) (a lower
bound: only the teacher's top-k terms) and the expected accepted length of a K = B−1 block,
E[Σ_k Π_{j≤k} α_j] (positions treated as independent, as the factorised proposal makes them at decode).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..drafters.dflash import DFlashConfig, DFlashDrafter, BlockNet, embed_block, shared_head_logits
from .data import TeacherStream, TextCorpus
from .loop import TrainResult, placement, train, training_info
from .losses import dflash_gamma, dpace_weights, token_cross_entropy, token_forward_kl_topk

__all__ = ["WEIGHTINGS", "block_loss", "block_train_logits", "sample_anchors", "sample_prefix_lengths",
           "train_block_drafter"]

WEIGHTINGS = ("dflash", "dpace", "uniform")


def sample_anchors(seed: int, step: int, batch: int, seq_len: int, num_anchors: int) -> np.ndarray:
    """int32 `[batch, num_anchors]` distinct anchor positions per row in [1, seq_len − 2] (each has context before
    it and a gold token after it), sorted; a pure function of (seed, step)."""
    hi = seq_len - 2
    if num_anchors > hi:
        raise ValueError(f"num_anchors={num_anchors} is more than the {hi} anchor positions of seq_len {seq_len}")
    rng = np.random.default_rng([seed, step, 0xB10C])
    return np.sort(np.stack([rng.choice(hi, num_anchors, replace=False) + 1 for _ in range(batch)]), 1).astype(np.int32)


def sample_prefix_lengths(seed: int, step: int, shape, block_size: int, decay: float) -> np.ndarray:
    """int32 visible-prefix lengths p in {0..B−2} with Pr(p) ∝ decay^p (D²SD's variable-prefix drafter training),
    one per anchor of `shape`; a pure function of (seed, step)."""
    if not 0 < decay <= 1:
        raise ValueError(f"prefix_decay must be in (0, 1], got {decay!r}")
    w = decay ** np.arange(block_size - 1)
    rng = np.random.default_rng([seed, step, 0x9FE])
    return rng.choice(block_size - 1, size=shape, p=w / w.sum()).astype(np.int32)


def block_train_logits(config: DFlashConfig, net_params, shared, tokens, hidden, anchors, prefix_len=None):
    """Logits `[Bt, A, B−1, V]` of every block position k = 1..B−1 of `anchors [Bt, A]` in `tokens [Bt, T]`, given
    the target's hidden states `hidden [Bt, T, n*H]`; also the gold labels `[Bt, A, B−1]` (clipped at T−1) and
    whether they exist (`in_range`). With `prefix_len [Bt, A]` block positions 1..p show their gold tokens instead
    of the mask (the variable-prefix drafter's input)."""
    Bt, T = tokens.shape
    A, B, dt = anchors.shape[1], config.block_size, config.model.jnp_dtype
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (Bt, T))
    offs = jnp.arange(B, dtype=jnp.int32)
    bpos = (anchors[:, :, None] + offs).reshape(Bt, A * B)
    anchor_tok = jnp.take_along_axis(tokens, anchors, axis=1)
    where = anchors[:, :, None] + offs[1:]  # [Bt, A, B-1]: the predicted positions
    labels = jnp.take_along_axis(tokens, jnp.minimum(where, T - 1).reshape(Bt, -1), axis=1).reshape(where.shape)
    given = {} if prefix_len is None else {"prefix": labels.reshape(Bt * A, B - 1),
                                           "prefix_len": prefix_len.reshape(-1)}
    x = embed_block(net_params, shared, anchor_tok.reshape(-1), B, dt, **given).reshape(Bt, A * B, -1)
    a_of = jnp.repeat(anchors, B, axis=1)  # [Bt, A*B]: each query's anchor
    ctx_mask = jnp.arange(T)[None, None, :] < a_of[:, :, None]
    blk = jnp.repeat(jnp.arange(A), B)
    blk_mask = jnp.broadcast_to(blk[:, None] == blk[None, :], (Bt, A * B, A * B))
    h = BlockNet(config).apply({"params": net_params}, hidden, pos, x, bpos, ctx_mask, blk_mask)
    h = h.reshape(Bt, A, B, -1)[:, :, 1:]
    in_range = where < T
    return shared_head_logits(h.reshape(Bt, A * (B - 1), -1), shared).reshape(Bt, A, B - 1, -1), labels, in_range


def _gather_teacher(arr, anchors, B):
    """The teacher's arrays `[Bt, T, k]` at the positions predicting each block token (a+k−1): `[Bt, A, B−1, k]`."""
    Bt, T = arr.shape[:2]
    idx = jnp.minimum(anchors[:, :, None] + jnp.arange(B - 1), T - 1).reshape(Bt, -1)
    return jnp.take_along_axis(arr, idx[:, :, None], axis=1).reshape(anchors.shape + (B - 1, arr.shape[-1]))


@functools.lru_cache(maxsize=16)
def block_loss(config: DFlashConfig, weighting: str, gamma: float | None = None, dpace_a: float = 0.5,
               ce_weight: float = 1.0, kl_weight: float = 0.0, pad_id: int | None = None) -> Callable:
    """loss_fn(net_params, batch) -> (loss, aux) for `train`; batch holds tokens, hidden, anchors, the target's
    `embed` / `head` (frozen: passed as data, never updated) and, with kl_weight > 0, topk_ids / topk_logp.
    With `prefix_len [Bt, A]` in the batch (variable-prefix drafter) positions k <= p are given, not predicted: no
    loss there, and the DFlash weights restart after the prefix (w = exp(−(k−p−1)/γ), D²SD's recipe)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    B = config.block_size
    gamma = dflash_gamma(B) if gamma is None else float(gamma)

    def loss_fn(net_params, batch):
        tokens, anchors = batch["tokens"], batch["anchors"]
        shared = {"embed": batch["embed"], "head": batch["head"]}
        plen = batch.get("prefix_len")
        logits, labels, valid = block_train_logits(config, net_params, shared, tokens, batch["hidden"], anchors, plen)
        if pad_id is not None:
            valid = valid & (labels != pad_id)
        shift = 0 if plen is None else plen[..., None]  # positions 1..p are given
        valid = valid & (jnp.arange(1, B) > shift)
        m = valid.astype(jnp.float32)
        ce = token_cross_entropy(logits, labels)  # [Bt, A, B-1]
        per_pos = ce_weight * ce
        kl = jnp.zeros_like(ce)
        if kl_weight:
            kl = token_forward_kl_topk(_gather_teacher(batch["topk_ids"], anchors, B),
                                       _gather_teacher(batch["topk_logp"], anchors, B), logits)
            per_pos = per_pos + kl_weight * kl
        if weighting == "dpace":
            w = dpace_weights(jnp.exp(-ce), m, dpace_a)
            loss = (w * m * per_pos).sum() / (anchors.shape[0] * anchors.shape[1])
        else:
            k = jnp.arange(1, B) - shift  # position within the predicted part
            w = jnp.exp(-(jnp.maximum(k, 1) - 1) / gamma) if weighting == "dflash" else jnp.ones((B - 1,), jnp.float32)
            wm = w * m
            loss = (wm * per_pos).sum() / jnp.maximum(wm.sum(), 1e-9)
        n = jnp.maximum(m.sum(), 1.0)
        return loss, {"ce": (ce * m).sum() / n, "kl": (kl * m).sum() / n}
    return loss_fn


@functools.lru_cache(maxsize=16)
def _eval_program(config: DFlashConfig, pad_id: int | None):
    """jit -> (ce sum, valid count, per-position α sums [B−1], per-position counts, accepted-length sum, blocks)."""
    B = config.block_size

    def ev(net_params, batch):
        shared = {"embed": batch["embed"], "head": batch["head"]}
        anchors, plen = batch["anchors"], batch.get("prefix_len")
        logits, labels, valid = block_train_logits(config, net_params, shared, batch["tokens"], batch["hidden"],
                                                   anchors, plen)
        if pad_id is not None:
            valid = valid & (labels != pad_id)
        given = jnp.arange(1, B) <= (0 if plen is None else plen[..., None])
        valid = valid & ~given
        m = valid.astype(jnp.float32)
        ce = token_cross_entropy(logits, labels)
        q = jax.nn.softmax(logits, -1)
        ids = _gather_teacher(batch["topk_ids"], anchors, B)
        p = jnp.exp(_gather_teacher(batch["topk_logp"], anchors, B))
        alpha = jnp.minimum(p, jnp.take_along_axis(q, ids, -1)).sum(-1) * m  # [Bt, A, B-1]
        # E[accepted] of each block after its given prefix (0 past a missing position)
        acc_len = (jnp.cumprod(jnp.where(given, 1.0, alpha), axis=-1) * ~given).sum(-1)
        return ((ce * m).sum(), m.sum(), alpha.sum((0, 1)), m.sum((0, 1)), acc_len.sum(),
                jnp.float32(anchors.shape[0] * anchors.shape[1]))
    return jax.jit(ev)


def train_block_drafter(target, drafter: DFlashDrafter, corpus: TextCorpus | TeacherStream, *, steps: int,
                        weighting: str = "dflash", lr: float = 6e-4, warmup: int | None = None, clip: float = 1.0,
                        weight_decay: float = 0.1, num_anchors: int = 8, gamma: float | None = None,
                        dpace_a: float = 0.5, ce_weight: float = 1.0, kl_weight: float = 0.0, topk: int = 32,
                        seed: int = 0, cache_dir: str | None = None, ckpt_dir: str | None = None,
                        resume: bool = False, overwrite: bool = False, out: str | None = None,
                        export_dtype: str = "float32", eval_every: int = 100, ckpt_every: int = 100,
                        eval_rows: int | None = 64, progress: bool = True, stop_after: int | None = None,
                        curves_path: str | None = None, command: str | None = None,
                        prefix_decay: float | None = None, mesh=None) -> TrainResult:
    """Train `drafter` (a `DFlashDrafter`, e.g. `DFlashDrafter.create(target)`) for `target` on `corpus` with the
    DFlash (`weighting="dflash"`), D-PACE (`"dpace"`) or uniform per-position weights (module docstring).

    The target's embedding and LM head stay frozen (they are the target's own); only the drafter's weights are
    trained, from `drafter.params`. With `prefix_decay` (D²SD's variable-prefix drafter, e.g. 0.9) each block shows
    its first p gold tokens, p ~ prefix_decay^p over {0..B−2}, and is trained on the positions after them.
    Held-out metrics every `eval_every` steps: ce, accept (mean α over positions,
    top-k lower bound) and accept_len (expected accepted length at K = B−1). out: `drafter.save` directory with
    `training.json` (settings, final metrics, wall time, command) once the run finishes.
    mesh: a ("data", "model") device mesh (`smcsd.train.loop.placement`): rows over "data", the teacher's target and
    the shared embedding / LM head over "model", the drafter replicated; under `jax.distributed` every process
    calls this with the same arguments.
    """
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter must be a DFlashDrafter, got {type(drafter).__name__}")
    pl = placement(mesh)
    drafter = drafter.bind(target)
    config = drafter.block_config
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(
        target, corpus, topk=topk, layers=config.target_layers, cache_dir=cache_dir, mesh=pl.mesh)
    if tuple(stream.layers) != config.target_layers:
        raise ValueError(f"the teacher stream carries target layers {stream.layers}, the drafter reads "
                         f"{config.target_layers}")
    if not stream.topk:
        raise ValueError("train_block_drafter needs a top-k teacher stream (topk >= 1) for its held-out acceptance")
    corpus = stream.corpus
    T, B = corpus.seq_len, config.block_size
    sample_anchors(seed, 0, 1, T, num_anchors)  # validates num_anchors against seq_len
    pl.check_rows(corpus.batch_size)
    rows, n = pl.local_rows(corpus.batch_size), corpus.batch_size
    pad = getattr(target.config, "pad_token_id", None)
    loss_fn = block_loss(config, weighting, None if gamma is None else float(gamma), float(dpace_a),
                         float(ce_weight), float(kl_weight), pad)
    shared = pl.shard_frozen(drafter.shared, target.config)

    def batches(step):  # this process's rows; anchors drawn for the whole batch, so any mesh sees the same ones
        b = dict(stream.batch(step, rows))
        b["anchors"] = sample_anchors(seed, step, n, T, num_anchors)[rows]
        if prefix_decay is not None:
            b["prefix_len"] = sample_prefix_lengths(seed, step, (n, num_anchors), B, prefix_decay)[rows]
        if not kl_weight:
            b.pop("topk_ids", None), b.pop("topk_logp", None)
        return {**b, **shared}

    ev_prog = _eval_program(config, pad)

    def eval_fn(p):
        tot = None
        for i, b in enumerate(stream.eval_batches(eval_rows)):
            b = {**b, "anchors": sample_anchors(10_000 + seed, i, len(b["tokens"]), T, num_anchors), **shared}
            if prefix_decay is not None:
                b["prefix_len"] = sample_prefix_lengths(10_000 + seed, i, b["anchors"].shape, B, prefix_decay)
            r = [np.asarray(x, np.float64) for x in pl.to_host(ev_prog(p, pl.shard_global(b)))]
            tot = r if tot is None else [x + y for x, y in zip(tot, r)]
        ce_sum, n, a_sum, a_n, len_sum, blocks = tot
        per_pos = a_sum / np.maximum(a_n, 1)
        return {"ce": float(ce_sum / max(n, 1)), "accept": float(a_sum.sum() / max(a_n.sum(), 1)),
                "accept_len": float(len_sum / max(blocks, 1)), "accept_pos1": float(per_pos[0]),
                "accept_pos_last": float(per_pos[-1])}

    meta = {"recipe": "train_block_drafter", "weighting": weighting, "block_config": config.to_dict(),
            "target_config": stream.config.to_dict(), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "batch_size": corpus.batch_size, "seq_len": T, "data_seed": corpus.seed,
            "num_anchors": num_anchors, "gamma": dflash_gamma(B) if gamma is None else gamma, "dpace_a": dpace_a,
            "ce_weight": ce_weight, "kl_weight": kl_weight, "topk": stream.topk, "seed": seed,
            "prefix_decay": prefix_decay}
    name = getattr(target, "name", "target")
    t0 = time.time()
    res = train(loss_fn, drafter.params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every,
                ckpt_every=ckpt_every, progress=progress, stop_after=stop_after, curves_path=curves_path,
                meta=meta, desc=f"{weighting} block drafter for {name}", command=command, mesh=pl)
    h = res.history
    if out and h["finished"]:
        info = training_info("train_block_drafter", name, stream, res, steps, export_dtype, weighting=weighting, prefix_decay=prefix_decay,
                             this_process_s=round(time.time() - t0, 1),
                             budget={"blocks_seen": steps * corpus.batch_size * num_anchors})
        pl.on_lead(lambda: DFlashDrafter(config, res.params, name=drafter.name).save(out, export_dtype, info))
    return res
