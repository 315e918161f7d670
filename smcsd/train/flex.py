"""FlexDraft training (`train_flex`): only the mask adapters, the mask vector and the calibration MLP learn; the
target is frozen (its params travel as data).

Per sequence, `num_anchors` anchors a (from (seed, step), as the block drafters'): one mask group after clean
token a, exactly the group `flex` would read if the drafts up to a were accepted. The clean sequence runs through
`smcsd.drafters.flex.forward_flex` teacher-forced (the plain target forward; it writes the K/V the masks read), and mask j
(1..S) predicts x_{a+1+j}, the j-th token after the bonus x_{a+1}; its logits are the shared LM head's plus the
calibration MLP on [embed(x_{a+1}); h] (the gold bonus: teacher forcing). Loss per mask: kl_weight * KL(p_T || q_j)
(the target's top-k at that position) + ce_weight * CE(gold), weighted 0.8^(j-1) (later masks are reached less
often), averaged. Held-out: per-position acceptance alpha_j = sum_x min(p_T, q_j) (top-k lower bound) and the
expected accepted length sum_j prod_{i<=j} alpha_i, with and without calibration (its MLP's output zeroed).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import init_cache
from smcsd.drafters.flex import FlexConfig, draft_logits, forward_flex

from ..drafters.flex import FlexDrafter
from .dflash import sample_anchors
from .data import TeacherStream, TextCorpus
from .loop import placement, train, training_info
from .losses import token_cross_entropy, token_forward_kl_topk

__all__ = ["flex_loss", "flex_train_logits", "train_flex", "without_calibration"]


def without_calibration(flex_params):
    """The same adapters with the calibration MLP's output zeroed (the ablation of bonus-guided calibration)."""
    return flex_params._replace(calib={**flex_params.calib, "w2": jnp.zeros_like(flex_params.calib["w2"])})


def flex_train_logits(config, fc: FlexConfig, target_params, flex_params, tokens, anchors):
    """Draft logits `[Bt, A, S, V]` of the mask group after each anchor, the teacher positions they are scored at
    `[Bt, A, S]` (a + j: where the target predicts x_{a+1+j}), gold labels and in-range flags."""
    Bt, T = tokens.shape
    A, S = anchors.shape[1], fc.group_size
    cache = init_cache(config.num_hidden_layers, Bt, T, config.num_key_value_heads, config.head_dim, config.jnp_dtype)
    _, _, mh, _ = forward_flex(config, target_params, flex_params, tokens, cache, anchors, S,
                               logit_index=jnp.zeros((Bt, 1), jnp.int32))
    bonus = jnp.take_along_axis(tokens, jnp.minimum(anchors + 1, T - 1), axis=1)  # [Bt, A]
    logits = draft_logits(config, target_params, flex_params, mh.reshape(Bt * A, S, -1), bonus.reshape(-1))
    teach = anchors[:, :, None] + jnp.arange(1, S + 1)  # [Bt, A, S]
    labels = jnp.take_along_axis(tokens, jnp.minimum(teach + 1, T - 1).reshape(Bt, -1), axis=1).reshape(teach.shape)
    return logits.reshape(Bt, A, S, -1), teach, labels, teach + 1 < T


def _teacher(arr, teach):
    Bt, T = arr.shape[:2]
    idx = jnp.minimum(teach, T - 1).reshape(Bt, -1)
    return jnp.take_along_axis(arr, idx[:, :, None], axis=1).reshape(teach.shape + (arr.shape[-1],))


@functools.lru_cache(maxsize=8)
def flex_loss(config, fc: FlexConfig, kl_weight: float = 1.0, ce_weight: float = 0.1, decay: float = 0.8):
    w = decay ** jnp.arange(fc.group_size, dtype=jnp.float32)

    def loss_fn(flex_params, batch):
        logits, teach, labels, ok = flex_train_logits(config, fc, batch["target"], flex_params, batch["tokens"],
                                                      batch["anchors"])
        kl = token_forward_kl_topk(_teacher(batch["topk_ids"], teach), _teacher(batch["topk_logp"], teach), logits)
        ce = token_cross_entropy(logits, labels)
        m = ok.astype(jnp.float32) * w
        loss = (m * (kl_weight * kl + ce_weight * ce)).sum() / jnp.maximum(m.sum(), 1e-6)
        n = jnp.maximum(ok.sum(), 1)
        return loss, {"kl": (kl * ok).sum() / n, "ce": (ce * ok).sum() / n}
    return loss_fn


@functools.lru_cache(maxsize=8)
def _eval_program(config, fc: FlexConfig):
    def ev(flex_params, batch):
        logits, teach, _, ok = flex_train_logits(config, fc, batch["target"], flex_params, batch["tokens"],
                                                 batch["anchors"])
        q = jax.nn.softmax(logits, -1)
        ids, p = _teacher(batch["topk_ids"], teach), jnp.exp(_teacher(batch["topk_logp"], teach))
        alpha = jnp.minimum(p, jnp.take_along_axis(q, ids, -1)).sum(-1) * ok  # [Bt, A, S]
        return alpha.sum((0, 1)), ok.sum((0, 1)).astype(jnp.float32), jnp.cumprod(alpha, -1).sum(-1).sum(), \
            jnp.float32(alpha.shape[0] * alpha.shape[1])
    return jax.jit(ev)


def train_flex(target, drafter: FlexDrafter, corpus: TextCorpus | TeacherStream, *, steps: int, lr: float = 1e-3,
               warmup: int | None = None, clip: float = 1.0, weight_decay: float = 0.0, num_anchors: int = 8,
               kl_weight: float = 1.0, ce_weight: float = 0.1, topk: int = 32, seed: int = 0,
               cache_dir: str | None = None, ckpt_dir: str | None = None, resume: bool = False,
               overwrite: bool = False, out: str | None = None, export_dtype: str = "float32", eval_every: int = 100,
               ckpt_every: int = 100, eval_rows: int | None = 32, progress: bool = True,
               stop_after: int | None = None, curves_path: str | None = None, command: str | None = None,
               mesh=None):
    """Train `drafter`'s adapters, mask vector and calibration MLP for `target` (frozen) on `corpus` (module
    docstring). Returns `(TrainResult, trained FlexDrafter)`; `out`: its `save` directory with training.json.
    mesh: a ("data", "model") device mesh (`smcsd.train.loop.placement`): rows over "data", the frozen target (it
    runs inside every step here) over "model" in the decoding layout, the adapters replicated."""
    if not isinstance(drafter, FlexDrafter):
        raise TypeError(f"drafter must be a FlexDrafter, got {type(drafter).__name__}")
    pl = placement(mesh)
    drafter = drafter.bind(target)
    fc, config = drafter.flex_config, target.config
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(target, corpus, topk=topk,
                                                                           cache_dir=cache_dir, mesh=pl.mesh)
    if not stream.topk:
        raise ValueError("train_flex needs a top-k teacher stream (topk >= 1): its loss is a KL to the target")
    corpus = stream.corpus
    T = corpus.seq_len
    sample_anchors(seed, 0, 1, T, num_anchors)
    pl.check_rows(corpus.batch_size)
    rows, n = pl.local_rows(corpus.batch_size), corpus.batch_size
    loss_fn = flex_loss(config, fc, float(kl_weight), float(ce_weight))
    tp = pl.shard_frozen(target.params, config)

    def batches(step):  # this process's rows; anchors drawn for the whole batch
        b = dict(stream.batch(step, rows))
        b.pop("hidden", None)
        return {**b, "anchors": sample_anchors(seed, step, n, T, num_anchors)[rows], "target": tp}

    ev = _eval_program(config, fc)

    def eval_fn(p):
        out = {}
        for params, tag in ((p, ""), (pl.replicate(without_calibration(p)), "_nocal")):
            a_sum = n = lens = blocks = 0.0
            for i, b in enumerate(stream.eval_batches(eval_rows)):
                b = {**b, "anchors": sample_anchors(10_000 + seed, i, len(b["tokens"]), T, num_anchors), "target": tp}
                b.pop("hidden", None)
                r = [np.asarray(x, np.float64) for x in pl.to_host(ev(params, pl.shard_global(b)))]
                a_sum, n, lens, blocks = a_sum + r[0], n + r[1], lens + float(r[2]), blocks + float(r[3])
            alpha = a_sum / np.maximum(n, 1)
            out[f"accept_pos1{tag}"] = float(alpha[0])
            out[f"accept_len{tag}"] = lens / max(blocks, 1)
        return out

    meta = {"recipe": "train_flex", "flex_config": dataclasses.asdict(fc), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "num_anchors": num_anchors, "kl_weight": kl_weight, "ce_weight": ce_weight,
            "topk": stream.topk, "seed": seed, "batch_size": corpus.batch_size, "seq_len": T}
    t0 = time.time()
    res = train(loss_fn, drafter.params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every, ckpt_every=ckpt_every,
                progress=progress, stop_after=stop_after, curves_path=curves_path, meta=meta,
                desc=f"flex adapters for {getattr(target, 'name', 'target')}", command=command, mesh=pl)
    trained = drafter.with_params(res.params)
    if out and res.history["finished"]:
        info = training_info("train_flex", getattr(target, "name", "target"), stream, res, steps, export_dtype,
                             this_process_s=round(time.time() - t0, 1))
        pl.on_lead(lambda: trained.save(out, export_dtype, info))
    return res, trained
