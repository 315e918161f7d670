"""PARD-2 training of a `PARD2Drafter`: conditional-drop (COD) sequences, CAT weights, dual mode.

One training row is a sequence x_0..x_{T−1} followed by its mask groups (PARD's layout, built by `cod_layout`):
- group 0 is the sequence itself: the output at real token t predicts x_{t+1} (causal attention);
- mask group i (1 ≤ i < depth) holds one MASK per kept anchor a, at RoPE position a + i; it attends to x_0..x_a
  and to the masks of the same anchor at depths < i (and itself), and predicts x_{a+i+1} — what mask i − 1 of a
  proposal anchored at a predicts at decode time (`PARD2Drafter.propose`).
Group i keeps ceil(T · max(r^i, r_min)) anchors (r = `retain`, 0.7; r_min 0.2), nested (a kept anchor of group i
is kept in group i − 1), drawn from (seed, step) and shared by the rows of a batch. The whole layout runs as one
forward under that attention pattern (`models.forward_tree` over an empty cache).

Loss at a predicted token (PARD-2): 0.1 · Σ w·m·CE(gold) / Σ w·m + 1.0 · Σ w·m·KL(p_T ‖ q) / Σ w·m, with
- CAT weights (`weighting="cat"`): w = Π_{s=1..i} p_T(x_{a+s} | x_{<a+s}), the target's teacher-forced probability
  of the i gold tokens the mask did not see — how likely verification is to reach it (1 for group 0;
  stop-gradient; from the teacher's top-k, 0 where a gold token is outside it), or `"uniform"`: w = 1;
- dual mode (`feature_layers` on the drafter): the target's hidden states at those layers, shifted right by one
  token, projected and added to the real tokens' inputs; a whole row's features are zeroed with probability
  `feature_drop` (0.2), so one drafter runs with or without them.
Held-out: per depth k = 1..depth the acceptance α_k = Σ_x min(p_T, q_k) (top-k lower bound) averaged over anchors,
and the expected accepted length at K = 4 and 8, Σ_k Π_{j≤k} α_j, with features and (dual mode) without.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import forward_tree, init_cache
from smcsd.models.transformer import InputEdits

from ..drafters.pard2 import FEATURE_SCALE, PARD2Drafter
from .data import TeacherStream, TextCorpus
from .loop import TrainResult, placement, train, training_info
from .losses import token_cross_entropy, token_forward_kl_topk

WEIGHTINGS = ("cat", "uniform")

__all__ = ["WEIGHTINGS", "cod_layout", "mask_loss", "train_mask_drafter"]


def cod_layout(seed: int, step: int, T: int, depth: int, retain: float = 0.7, r_min: float = 0.2) -> dict:
    """The COD layout of one step (module docstring), as numpy arrays over its L slots: `anchor`, `depth` (0: a real
    token), `pos` (RoPE position), `label` (index of the predicted token, may be ≥ T: no label), `visible [L, L]`."""
    if not 0 < retain <= 1 or not 0 <= r_min <= 1:
        raise ValueError(f"retain must be in (0, 1] and r_min in [0, 1], got {retain}, {r_min}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    rng = np.random.default_rng([seed, step, 0xC0D])
    order = rng.permutation(T - 1)  # anchors 0..T-2 by priority: group i keeps a prefix of it (nested)
    anchor, dep = [np.arange(T)], [np.zeros(T, np.int64)]
    for i in range(1, depth):
        n = min(T - 1, int(math.ceil(T * max(retain ** i, r_min))))
        anchor.append(np.sort(order[:n]))
        dep.append(np.full(n, i))
    anchor, dep = np.concatenate(anchor), np.concatenate(dep)
    real = dep == 0
    vis = np.where(real[:, None] & real[None, :], anchor[None, :] <= anchor[:, None], False)  # causal among reals
    vis |= (~real)[:, None] & real[None, :] & (anchor[None, :] <= anchor[:, None])  # a mask sees x_0..x_a
    vis |= (~real)[:, None] & (~real)[None, :] & (anchor[None, :] == anchor[:, None]) & (dep[None, :] <= dep[:, None])
    return {"anchor": anchor.astype(np.int32), "depth": dep.astype(np.int32), "pos": (anchor + dep).astype(np.int32),
            "label": (anchor + dep + 1).astype(np.int32), "visible": vis}


def _forward(drafter: PARD2Drafter, params, tokens, layout, feats, keep):
    """Logits `[B, L, V]` of the COD layout; `feats [B, T, F]` (or None) the target's hidden states, `keep [B]`."""
    c = drafter.model_config
    B, T = tokens.shape
    L = layout["anchor"].shape[0]
    real = layout["depth"] == 0
    x = jnp.where(real[None, :], jnp.take(tokens, jnp.minimum(layout["anchor"], T - 1), axis=1), 0)
    add = None
    if feats is not None:
        shifted = jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)  # t sees t - 1
        f = jnp.where(real[None, :, None], jnp.take(shifted, jnp.minimum(layout["anchor"], T - 1), axis=1), 0.0)
        add = FEATURE_SCALE * jnp.einsum("blf,fh->blh", f * keep[:, None, None], params["feature_proj"])
    inputs = InputEdits(is_mask=jnp.broadcast_to(~real, (B, L)), mask_embedding=params["mask_embedding"], add=add)
    cache = init_cache(c.num_hidden_layers, B, L, c.num_key_value_heads, c.head_dim, c.jnp_dtype)
    idx = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    logits, _ = forward_tree(c, params["lm"], x, cache, jnp.zeros((B,), jnp.int32), idx,
                             jnp.broadcast_to(layout["pos"], (B, L)), jnp.broadcast_to(layout["visible"], (B, L, L)),
                             inputs=inputs)
    return logits


def _targets(batch, layout, pad_id):
    """Labels `[B, L]`, validity, the teacher's top-k at each predicted token, and the CAT weights."""
    tokens = batch["tokens"]
    B, T = tokens.shape
    lab = layout["label"]
    valid = jnp.broadcast_to(lab < T, (B, lab.shape[0]))
    li = jnp.minimum(lab, T - 1)
    labels = jnp.take(tokens, li, axis=1)
    if pad_id is not None:
        valid = valid & (labels != pad_id)
    ids = jnp.take(batch["topk_ids"], li - 1, axis=1)  # p_T of x_label given the gold prefix: at position label-1
    logp = jnp.take(batch["topk_logp"], li - 1, axis=1)
    # gold log p_T(x_{t+1} | x_{<=t}) at every t (from the top-k; -inf outside it), then CAT's product over the
    # i gold tokens x_{a+1}..x_{a+i} a depth-i mask did not see
    nxt = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
    hit = batch["topk_ids"] == nxt[:, :, None]
    gold = jnp.where(hit.any(-1), jnp.sum(jnp.where(hit, batch["topk_logp"], 0.0), -1), -jnp.inf)  # [B, T]
    csum = jnp.concatenate([jnp.zeros((B, 1)), jnp.cumsum(jnp.maximum(gold, -1e4), axis=1)], axis=1)  # [B, T+1]
    a, d = layout["anchor"], layout["depth"]
    cat = jnp.exp(jnp.take(csum, jnp.minimum(a + d, T), axis=1) - jnp.take(csum, a, axis=1))
    return labels, valid, ids, logp, jax.lax.stop_gradient(cat)


@functools.lru_cache(maxsize=16)
def mask_loss(drafter: PARD2Drafter, weighting: str, ce_weight: float = 0.1, kl_weight: float = 1.0,
              pad_id: int | None = None):
    """loss_fn(params, batch) -> (loss, aux) for `train`: batch holds tokens, topk_ids / topk_logp, the layout
    (`cod_layout` arrays), `keep [B]` and, in dual mode, `hidden`."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")

    def loss_fn(params, batch):
        layout = batch["layout"]
        logits = _forward(drafter, params, batch["tokens"], layout, batch.get("hidden"), batch["keep"])
        labels, valid, ids, logp, cat = _targets(batch, layout, pad_id)
        m = valid.astype(jnp.float32)
        w = cat if weighting == "cat" else jnp.ones_like(cat)
        wm = w * m
        denom = jnp.maximum(wm.sum(), 1e-9)
        ce = token_cross_entropy(logits, labels)
        kl = token_forward_kl_topk(ids, logp, logits)
        loss = ce_weight * (wm * ce).sum() / denom + kl_weight * (wm * kl).sum() / denom
        n = jnp.maximum(m.sum(), 1.0)
        return loss, {"ce": (ce * m).sum() / n, "kl": (kl * m).sum() / n}
    return loss_fn


@functools.lru_cache(maxsize=16)
def _eval_program(drafter: PARD2Drafter, depth: int, pad_id: int | None):
    def ev(params, batch):
        layout = batch["layout"]
        logits = _forward(drafter, params, batch["tokens"], layout, batch.get("hidden"), batch["keep"])
        labels, valid, ids, logp, _ = _targets(batch, layout, pad_id)
        q = jax.nn.softmax(logits, -1)
        alpha = jnp.minimum(jnp.exp(logp), jnp.take_along_axis(q, ids, -1)).sum(-1) * valid  # [B, L]
        onehot = jax.nn.one_hot(layout["depth"], depth)  # [L, depth]
        return jnp.einsum("bl,ld->d", alpha, onehot), jnp.einsum("bl,ld->d", valid.astype(jnp.float32), onehot)
    return jax.jit(ev)


def train_mask_drafter(target, drafter: PARD2Drafter, corpus: TextCorpus | TeacherStream, *, steps: int,
                       weighting: str = "cat", depth: int = 8, retain: float = 0.7, r_min: float = 0.2,
                       feature_drop: float = 0.2, lr: float = 1e-3, warmup: int | None = None, clip: float = 1.0,
                       weight_decay: float = 0.1, ce_weight: float = 0.1, kl_weight: float = 1.0, topk: int = 32,
                       seed: int = 0, cache_dir: str | None = None, ckpt_dir: str | None = None,
                       resume: bool = False, overwrite: bool = False, out: str | None = None,
                       export_dtype: str = "float32", eval_every: int = 100, ckpt_every: int = 100,
                       eval_rows: int | None = 32, progress: bool = True, stop_after: int | None = None,
                       curves_path: str | None = None, command: str | None = None, mesh=None) -> TrainResult:
    """Train `drafter` (a `PARD2Drafter`, e.g. `PARD2Drafter.create(pair's AR draft, target=..., feature_layers=...)`)
    with PARD-2's COD sequences and CAT (or uniform) weights (module docstring); all of its params are trained (the
    small LM, the mask embedding and, in dual mode, the feature projection). out: `PARD2Drafter.save` directory with
    `training.json` (settings, final metrics, wall time, command) once the run finishes. mesh: a ("data", "model")
    device mesh (`smcsd.train.loop.placement`): rows over "data", the teacher's target over "model", the drafter
    replicated; under `jax.distributed` every process calls this with the same arguments."""
    if not isinstance(drafter, PARD2Drafter):
        raise TypeError(f"drafter must be a PARD2Drafter, got {type(drafter).__name__}")
    if not 0 <= feature_drop <= 1:
        raise ValueError(f"feature_drop must be in [0, 1], got {feature_drop!r}")
    pl = placement(mesh)
    drafter = drafter.bind(target).with_features(True)
    layers = drafter.feature_layers
    stream = corpus if isinstance(corpus, TeacherStream) else TeacherStream(
        target, corpus, topk=topk, layers=layers, cache_dir=cache_dir, mesh=pl.mesh)
    if not stream.topk:
        raise ValueError("train_mask_drafter needs a top-k teacher stream (topk >= 1)")
    if tuple(stream.layers) != layers:
        raise ValueError(f"the teacher stream carries target layers {stream.layers}, the drafter reads {layers}")
    corpus = stream.corpus
    T = corpus.seq_len
    pl.check_rows(corpus.batch_size)
    rows, n = pl.local_rows(corpus.batch_size), corpus.batch_size
    pad = getattr(target.config, "pad_token_id", None)
    loss_fn = mask_loss(drafter, weighting, float(ce_weight), float(kl_weight), pad)
    params = {"lm": drafter.model.params, **drafter.extra}

    def batches(step):  # this process's rows; `keep` drawn for the whole batch, the layout shared (replicated)
        b = dict(stream.batch(step, rows))
        rng = np.random.default_rng([seed, step, 0xF0])
        b["keep"] = (rng.random(n) >= feature_drop).astype(np.float32)[rows]
        b["layout"] = pl.replicate(cod_layout(seed, step, T, depth, retain, r_min))
        return b

    ev_prog = _eval_program(drafter, depth, pad)

    def eval_fn(p):
        out = {}
        for mode, keep in (("", 1.0),) + ((("_nofeat", 0.0),) if layers else ()):
            a_sum, n = np.zeros(depth), np.zeros(depth)
            for i, b in enumerate(stream.eval_batches(eval_rows)):
                b = {**b, "keep": np.full(len(b["tokens"]), keep, np.float32),
                     "layout": pl.replicate(cod_layout(10_000 + seed, i, T, depth, retain, r_min))}
                s, c = pl.to_host(ev_prog(p, pl.shard_global(b)))
                a_sum, n = a_sum + np.asarray(s), n + np.asarray(c)
            alpha = a_sum / np.maximum(n, 1)
            out[f"accept_pos1{mode}"] = float(alpha[0])
            for K in (4, 8):
                if K <= depth:
                    out[f"accept_len_k{K}{mode}"] = float(np.cumprod(alpha[:K]).sum())
        return out

    meta = {"recipe": "train_mask_drafter", "weighting": weighting, "depth": depth, "retain": retain, "r_min": r_min,
            "feature_layers": list(layers), "feature_drop": feature_drop, "draft_config": drafter.model_config.to_dict(),
            "target_config": stream.config.to_dict(), "target_params": stream.params_fingerprint,
            "corpus": corpus.fingerprint, "batch_size": corpus.batch_size, "seq_len": T, "data_seed": corpus.seed,
            "ce_weight": ce_weight, "kl_weight": kl_weight, "topk": stream.topk, "seed": seed}
    name = getattr(target, "name", "target")
    t0 = time.time()
    res = train(loss_fn, params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip, weight_decay=weight_decay,
                ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every, ckpt_every=ckpt_every,
                progress=progress, stop_after=stop_after, curves_path=curves_path, meta=meta,
                desc=f"pard2 ({weighting}) for {name}", command=command, mesh=pl)
    if out and res.history["finished"]:
        info = training_info("train_mask_drafter", name, stream, res, steps, export_dtype, weighting=weighting,
                             this_process_s=round(time.time() - t0, 1))
        pl.on_lead(lambda: drafter.with_params(res.params).save(out, export_dtype, info))
    return res
