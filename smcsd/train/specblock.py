"""SpecBlock training (`train_specblock`): teacher-forced anchors, a chained second block, valid-prefix mask, 0.8^k KL.

Per sequence, `num_anchors` anchors a (as `train_block_drafter`'s, from (seed, step)) each open a block of S slots:
anchor feature = the target's hidden state at a - 1, anchor token x_a, slot k at position a + k predicting x_{a+k+1},
context = target features of positions < a, attention causal within the block — what `SpecBlockDrafter.propose`
computes. Each anchor also trains a block chained from slot M - 1 of the first (M ~ Uniform{1..S} per anchor, from
(seed, step)): anchor feature = the drafter's own hidden state at that slot, token = the gold x_{a+M} (teacher
forcing), slots at a + M + k predicting x_{a+M+k+1}, the same context < a.

Rank head (`train_rank_head`, a second stage on the trained drafter, which stays frozen — the paper co-trains it, but
its input is detached anyway): an MLP on [normed slot hidden state; 15 confidence features of q] predicting the rank
class of the target's argmax under q (1 / 2-4 / 5-10 / > 10), cross-entropy, first-block slots of random anchors.

Loss (SpecBlock): sum over both blocks and slots of 0.8^k * m_k * (kl_weight * KL(p_T || q_k) + ce_weight * CE), divided
by the number of blocks, with the valid-prefix mask m_k = prod_{j<k} [argmax q_j = argmax p_T at j] (the chained block's
mask also needs the first block's slots 0..M-1 right), `losses.valid_prefix_mask`; `valid_prefix=False` keeps every
in-range position (the ablation). Held-out: per-slot acceptance alpha_k = sum_x min(p_T, q_k) (top-k lower bound) of
the first block and of a block chained from the last slot (M = S), and the expected accepted length at K = S and 2S.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models.transformer import Part

from ..drafters.dflash import shared_head_logits
from ..drafters.specblock import (SpecBlockConfig, SpecBlockDrafter, SpecBlockNet, causal_blocks, init_rank_params,
                                  rank_class, rank_logits)
from .dflash import sample_anchors
from .data import TeacherStream, TextCorpus
from .loop import TrainResult, placement, train, training_info
from .losses import token_cross_entropy, token_forward_kl_topk, valid_prefix_mask

__all__ = ["sample_chain_points", "specblock_loss", "specblock_train_logits", "train_rank_head", "train_specblock"]


def sample_chain_points(seed: int, step: int, shape, slots: int) -> np.ndarray:
    """int32 M in {1..S} per anchor: the chained block starts from slot M - 1 (a pure function of (seed, step))."""
    return np.random.default_rng([seed, step, 0x5BC]).integers(1, slots + 1, size=shape).astype(np.int32)


def specblock_train_logits(config: SpecBlockConfig, net_params, shared, tokens, hidden, anchors, chain,
                           return_hidden: bool = False):
    """Logits, gold labels and in-range flags `[Bt, A, 2, S, ...]` of the first block (index 0) and the chained block
    (index 1) of every anchor; also the teacher positions `[Bt, A, 2, S]` each slot is scored against (and, with
    `return_hidden`, the normed hidden states `[Bt, A, 2, S, H]`)."""
    Bt, T = tokens.shape
    A, S = anchors.shape[1], config.block_size
    net = SpecBlockNet(config)
    apply = lambda *a, method: net.apply({"params": net_params}, *a, method=method)  # noqa: E731
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (Bt, T))
    kv = apply(hidden, pos, method=SpecBlockNet.context_kv)
    a_of = jnp.repeat(anchors, S, axis=1)  # [Bt, A*S]
    ctx = [[Part(k, v, jnp.arange(T)[None, None, :] < a_of[:, :, None])] for k, v in kv]
    blk = jnp.broadcast_to(causal_blocks(A, S), (Bt, A * S, A * S))
    k = jnp.arange(S, dtype=jnp.int32)
    hidden_out = []

    def block(feat, tok, start):  # start [Bt, A]: slot 0's position
        emb = jnp.take(shared["embed"], tok, axis=0)
        x = apply(feat, emb, S, method=SpecBlockNet.inputs)
        bpos = (start[:, :, None] + k).reshape(Bt, A * S)
        h, raw = apply(x, S, bpos, ctx, blk, method=SpecBlockNet.block_hidden)
        hidden_out.append(h.reshape(Bt, A, S, -1))
        return shared_head_logits(h, shared).reshape(Bt, A, S, -1), raw.reshape(Bt, A, S, -1)

    prev = jnp.take_along_axis(hidden, (anchors - 1)[:, :, None], axis=1)  # [Bt, A, n*H]
    feat1 = apply(prev, method=SpecBlockNet.feature)
    logits1, raw1 = block(feat1, jnp.take_along_axis(tokens, anchors, axis=1), anchors)
    from_slot = jnp.take_along_axis(raw1, (chain - 1)[:, :, None, None], axis=2)[:, :, 0]  # [Bt, A, H]
    start2 = anchors + chain
    feat2 = apply(from_slot, method=SpecBlockNet.chain_feature)
    logits2, _ = block(feat2, jnp.take_along_axis(tokens, jnp.minimum(start2, T - 1), axis=1), start2)
    teach = jnp.stack([anchors[:, :, None] + k, start2[:, :, None] + k], axis=2)  # [Bt, A, 2, S]: predicting +1
    labels = jnp.take_along_axis(tokens, jnp.minimum(teach + 1, T - 1).reshape(Bt, -1), axis=1).reshape(teach.shape)
    if return_hidden:
        return jnp.stack([logits1, logits2], axis=2), labels, teach + 1 < T, teach, jnp.stack(hidden_out, axis=2)
    return jnp.stack([logits1, logits2], axis=2), labels, teach + 1 < T, teach


def _teacher_at(arr, teach):
    """The teacher's arrays `[Bt, T, k]` at positions `teach [Bt, A, 2, S]` (clipped): `[Bt, A, 2, S, k]`."""
    Bt, T = arr.shape[:2]
    idx = jnp.minimum(teach, T - 1).reshape(Bt, -1)
    return jnp.take_along_axis(arr, idx[:, :, None], axis=1).reshape(teach.shape + (arr.shape[-1],))


def _masks(logits, top1, in_range, chain, valid_prefix: bool):
    """Loss masks `[Bt, A, 2, S]` (module docstring) and the per-slot correctness."""
    correct = (jnp.argmax(logits, -1) == top1) & in_range
    if not valid_prefix:
        return in_range.astype(jnp.float32), correct
    m1 = valid_prefix_mask(correct[:, :, 0])
    reach = jnp.take_along_axis(jnp.cumprod(correct[:, :, 0].astype(jnp.float32), -1), (chain - 1)[..., None],
                                axis=-1)  # prod_{j<M} correct_j of the first block
    m2 = valid_prefix_mask(correct[:, :, 1]) * reach
    return jnp.stack([m1, m2], axis=2) * in_range, correct


@functools.lru_cache(maxsize=16)
def specblock_loss(config: SpecBlockConfig, valid_prefix: bool = True, decay: float = 0.8, kl_weight: float = 1.0,
                   ce_weight: float = 0.0, pad_id: int | None = None):
    """loss_fn(net_params, batch) -> (loss, aux) for `train`: batch holds tokens, hidden, anchors, chain, topk_ids,
    topk_logp and the target's frozen `embed` / `head`."""
    S = config.block_size
    w = decay ** jnp.arange(S, dtype=jnp.float32)

    def loss_fn(net_params, batch):
        shared = {"embed": batch["embed"], "head": batch["head"]}
        logits, labels, in_range, teach = specblock_train_logits(config, net_params, shared, batch["tokens"],
                                                                 batch["hidden"], batch["anchors"], batch["chain"])
        if pad_id is not None:
            in_range = in_range & (labels != pad_id)
        ids, lp = _teacher_at(batch["topk_ids"], teach), _teacher_at(batch["topk_logp"], teach)
        m, correct = _masks(logits, ids[..., 0], in_range, batch["chain"], valid_prefix)
        kl = token_forward_kl_topk(ids, lp, logits)
        ce = token_cross_entropy(logits, labels)
        per = kl_weight * kl + ce_weight * ce
        blocks = 2 * batch["anchors"].shape[0] * batch["anchors"].shape[1]
        loss = (w * m * per).sum() / blocks
        n = jnp.maximum(in_range.sum(), 1)
        return loss, {"kl": (kl * in_range).sum() / n, "ce": (ce * in_range).sum() / n,
                      "top1": (correct * in_range).sum() / n, "masked_frac": 1.0 - m.sum() / n}
    return loss_fn


@functools.lru_cache(maxsize=16)
def _eval_program(config: SpecBlockConfig, pad_id: int | None):
    def ev(net_params, batch):
        shared = {"embed": batch["embed"], "head": batch["head"]}
        logits, labels, in_range, teach = specblock_train_logits(config, net_params, shared, batch["tokens"],
                                                                 batch["hidden"], batch["anchors"], batch["chain"])
        if pad_id is not None:
            in_range = in_range & (labels != pad_id)
        ids, p = _teacher_at(batch["topk_ids"], teach), jnp.exp(_teacher_at(batch["topk_logp"], teach))
        q = jax.nn.softmax(logits, -1)
        alpha = jnp.minimum(p, jnp.take_along_axis(q, ids, -1)).sum(-1) * in_range  # [Bt, A, 2, S]
        chain_len = jnp.cumprod(alpha.reshape(alpha.shape[:2] + (-1,)), -1).sum(-1)  # K = 2S (chain from M = S)
        return (alpha.sum((0, 1)), in_range.sum((0, 1)).astype(jnp.float32), chain_len.sum(),
                jnp.cumprod(alpha[:, :, 0], -1).sum(-1).sum(), jnp.float32(alpha.shape[0] * alpha.shape[1]))
    return jax.jit(ev)


def train_specblock(target, drafter: SpecBlockDrafter, corpus: TextCorpus | TeacherStream, *, steps: int,
                    valid_prefix: bool = True, decay: float = 0.8, lr: float = 1e-3, warmup: int | None = None,
                    clip: float = 1.0, weight_decay: float = 0.1, num_anchors: int = 8, kl_weight: float = 1.0,
                    ce_weight: float = 0.0, topk: int = 32, seed: int = 0, cache_dir: str | None = None,
                    ckpt_dir: str | None = None, resume: bool = False, overwrite: bool = False,
                    out: str | None = None, export_dtype: str = "float32", eval_every: int = 100,
                    ckpt_every: int = 100, eval_rows: int | None = 64, progress: bool = True,
                    stop_after: int | None = None, curves_path: str | None = None,
                    command: str | None = None, mesh=None) -> TrainResult:
    """Train `drafter` (a `SpecBlockDrafter`, e.g. `SpecBlockDrafter.create(target)`) on `corpus` (module docstring);
    the target's embedding and LM head stay frozen. out: `drafter.save` directory with `training.json` once the run
    finishes. mesh: a ("data", "model") device mesh (`smcsd.train.loop.placement`): rows over "data", the teacher's
    target and the shared embedding / LM head over "model", the drafter replicated."""
    if not isinstance(drafter, SpecBlockDrafter):
        raise TypeError(f"drafter must be a SpecBlockDrafter, got {type(drafter).__name__}")
    pl = placement(mesh)
    drafter = drafter.bind(target)
    config = drafter.block_config
    S = config.block_size
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(
        target, corpus, topk=topk, layers=config.target_layers, cache_dir=cache_dir, mesh=pl.mesh)
    if tuple(stream.layers) != config.target_layers:
        raise ValueError(f"the teacher stream carries target layers {stream.layers}, the drafter reads "
                         f"{config.target_layers}")
    if not stream.topk:
        raise ValueError("train_specblock needs a top-k teacher stream (topk >= 1): its loss is a KL to the target")
    corpus = stream.corpus
    T = corpus.seq_len
    sample_anchors(seed, 0, 1, T, num_anchors)  # validates num_anchors against seq_len
    pl.check_rows(corpus.batch_size)
    rows, n = pl.local_rows(corpus.batch_size), corpus.batch_size
    pad = getattr(target.config, "pad_token_id", None)
    loss_fn = specblock_loss(config, bool(valid_prefix), float(decay), float(kl_weight), float(ce_weight), pad)
    shared = pl.shard_frozen(drafter.shared, target.config)

    def batches(step):  # this process's rows; anchors and chain points drawn for the whole batch
        b = dict(stream.batch(step, rows))
        b["anchors"] = sample_anchors(seed, step, n, T, num_anchors)[rows]
        b["chain"] = sample_chain_points(seed, step, (n, num_anchors), S)[rows]
        return {**b, **shared}

    ev_prog = _eval_program(config, pad)

    def eval_fn(p):
        tot = None
        for i, b in enumerate(stream.eval_batches(eval_rows)):
            anchors = sample_anchors(10_000 + seed, i, len(b["tokens"]), T, num_anchors)
            b = {**b, "anchors": anchors, "chain": np.full(anchors.shape, S, np.int32), **shared}
            r = [np.asarray(x, np.float64) for x in pl.to_host(ev_prog(p, pl.shard_global(b)))]
            tot = r if tot is None else [x + y for x, y in zip(tot, r)]
        a_sum, a_n, chain_len, block_len, blocks = tot
        per = a_sum / np.maximum(a_n, 1)  # [2, S]
        return {"accept_pos1": float(per[0, 0]), "accept": float(a_sum[0].sum() / max(a_n[0].sum(), 1)),
                f"accept_len_k{S}": float(block_len / max(blocks, 1)),
                f"accept_len_k{2 * S}": float(chain_len / max(blocks, 1)),
                "accept_chained_pos1": float(per[1, 0])}

    meta = {"recipe": "train_specblock", "valid_prefix": bool(valid_prefix), "decay": decay,
            "block_config": config.to_dict(), "target_config": stream.config.to_dict(),
            "target_params": stream.params_fingerprint, "corpus": corpus.fingerprint, "batch_size": corpus.batch_size,
            "seq_len": T, "data_seed": corpus.seed, "num_anchors": num_anchors, "kl_weight": kl_weight,
            "ce_weight": ce_weight, "topk": stream.topk, "seed": seed}
    name = getattr(target, "name", "target")
    t0 = time.time()
    res = train(loss_fn, drafter.params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every,
                ckpt_every=ckpt_every, progress=progress, stop_after=stop_after, curves_path=curves_path,
                meta=meta, desc=f"specblock for {name}", command=command, mesh=pl)
    if out and res.history["finished"]:
        info = training_info("train_specblock", name, stream, res, steps, export_dtype, valid_prefix=bool(valid_prefix),
                             this_process_s=round(time.time() - t0, 1),
                             budget={"blocks_seen": 2 * steps * corpus.batch_size * num_anchors})
        pl.on_lead(lambda: SpecBlockDrafter(config, res.params, name=drafter.name).save(out, export_dtype, info))
    return res


@functools.lru_cache(maxsize=16)
def _rank_programs(config: SpecBlockConfig):
    def forward(rank_params, batch):
        shared = {"embed": batch["embed"], "head": batch["head"]}
        logits, _, in_range, teach, hidden = specblock_train_logits(
            config, batch["net"], shared, batch["tokens"], batch["hidden"], batch["anchors"], batch["chain"],
            return_hidden=True)
        logits, hidden = jax.lax.stop_gradient(logits[:, :, 0]), jax.lax.stop_gradient(hidden[:, :, 0])
        top1 = _teacher_at(batch["topk_ids"], teach)[:, :, 0, :, 0]
        labels = rank_class(logits, top1)
        out = rank_logits(rank_params, hidden, logits)
        m = in_range[:, :, 0].astype(jnp.float32)
        ce = -jnp.take_along_axis(jax.nn.log_softmax(out, -1), labels[..., None], -1)[..., 0]
        acc = (jnp.argmax(out, -1) == labels).astype(jnp.float32)
        n = jnp.maximum(m.sum(), 1.0)
        freq = (jax.nn.one_hot(labels, 4) * m[..., None]).sum((0, 1, 2)) / n
        return (ce * m).sum() / n, {"ce": (ce * m).sum() / n, "acc": (acc * m).sum() / n, "class0": freq[0],
                                    "class3": freq[3]}
    return forward, jax.jit(lambda p, b: forward(p, b)[1])


def train_rank_head(target, drafter: SpecBlockDrafter, corpus: TextCorpus | TeacherStream, *, steps: int,
                    lr: float = 1e-3, width: int = 256, num_anchors: int = 8, topk: int = 32, seed: int = 0,
                    cache_dir: str | None = None, ckpt_dir: str | None = None, resume: bool = False,
                    overwrite: bool = False, out: str | None = None, export_dtype: str = "float32",
                    eval_every: int = 100, ckpt_every: int = 100, eval_rows: int | None = 64, progress: bool = True,
                    stop_after: int | None = None, command: str | None = None, mesh=None):
    """Train a rank head for a trained `drafter` (frozen). Returns `(TrainResult, drafter.with_rank_head(...))`; with
    `out` the drafter is saved there with the head (its training.json gains a "rank_head" entry). mesh: as
    `train_specblock`'s (the frozen drafter replicated)."""
    import json
    import os
    if not isinstance(drafter, SpecBlockDrafter):
        raise TypeError(f"drafter must be a SpecBlockDrafter, got {type(drafter).__name__}")
    pl = placement(mesh)
    drafter = drafter.bind(target)
    config, S = drafter.block_config, drafter.block_config.block_size
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(
        target, corpus, topk=topk, layers=config.target_layers, cache_dir=cache_dir, mesh=pl.mesh)
    corpus, T = stream.corpus, stream.corpus.seq_len
    pl.check_rows(corpus.batch_size)
    rows, nrows = pl.local_rows(corpus.batch_size), corpus.batch_size
    dp = drafter.drafter_params()
    frozen = {"net": pl.replicate(dp["net"]), **pl.shard_frozen({"embed": dp["embed"], "head": dp["head"]},
                                                                 target.config)}
    forward, ev = _rank_programs(config)

    def batch_of(b, step, salt, rows=None):
        n = len(b["tokens"]) if rows is None else nrows
        anchors = sample_anchors(salt + seed, step, n, T, num_anchors)
        anchors = anchors if rows is None else anchors[rows]
        return {**b, "anchors": anchors, "chain": np.full(anchors.shape, S, np.int32), **frozen}

    def eval_fn(p):
        tot, n = {}, 0
        for i, b in enumerate(stream.eval_batches(eval_rows)):
            r = pl.to_host(ev(p, pl.shard_global(batch_of(b, i, 10_000))))
            tot = {k: tot.get(k, 0.0) + float(v) for k, v in r.items()}
            n += 1
        return {k: v / max(n, 1) for k, v in tot.items()}

    meta = {"recipe": "train_rank_head", "block_config": config.to_dict(), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "num_anchors": num_anchors, "topk": stream.topk, "seed": seed,
            "width": width, "batch_size": corpus.batch_size, "seq_len": T}
    t0 = time.time()
    res = train(forward, init_rank_params(config.model.hidden_size, seed, width),
                lambda step: batch_of(dict(stream.batch(step, rows)), step, 0, rows), steps=steps, lr=lr,
                weight_decay=0.0, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every, ckpt_every=ckpt_every,
                progress=progress, stop_after=stop_after, meta=meta, desc="specblock rank head", command=command,
                mesh=pl)
    with_head = drafter.with_rank_head(res.params)
    if out and res.history["finished"] and pl.is_lead:
        info = {}
        if os.path.isfile(os.path.join(out, "training.json")):
            with open(os.path.join(out, "training.json")) as f:
                info = json.load(f)
        h = res.history
        info["rank_head"] = {"recipe": "train_rank_head", "run": h["run"], "final_eval": h["eval"][-1] if h["eval"]
                             else None, "train_wall_s": round(h["wall_s"], 1),
                             "this_process_s": round(time.time() - t0, 1), "commands": h.get("commands", []),
                             "num_params": int(sum(np.size(x) for x in jax.tree_util.tree_leaves(res.params)))}
        with_head.save(out, export_dtype, info)
    pl.barrier("smcsd-train-export")
    return res, with_head
