"""DeLS-Spec local-head training (`train_local_head`): next-token prediction over short windows, nothing else.

The head (`smcsd.drafters.LocalHead`) sees, at decode time, only the tokens drafted so far in one block (the
anchor is not fed; its GRU starts from zero). Training mirrors that: each corpus row is cut into windows of
`depth + 1` tokens w_0..w_depth at a random offset per step; the GRU runs over the target's (frozen) embeddings of
w_1..w_{depth-1} from a zero state and the head predicts w_2..w_depth (plain cross-entropy, every position weighted
alike). Neither the target nor any block drafter runs: the only target weights read are its token embedding,
gathered on the host, so a step costs a few small matmuls plus the rank x vocab head. The unigram log-prior used
by the fusion is counted over the training rows. Held-out: the head's cross-entropy and top-1 accuracy.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..drafters.dels import LocalHead, local_logits, run_gru, unigram_log_prior
from .data import TextCorpus, params_fingerprint
from .loop import placement, train

__all__ = ["local_head_loss", "local_windows", "train_local_head"]


def local_windows(rows, depth: int, offset: int) -> np.ndarray:
    """Windows `[B * n, depth + 1]` of rows `[B, T]` starting at `offset`, n = (T - offset) // (depth + 1)."""
    rows = np.asarray(rows)
    B, T = rows.shape
    W = depth + 1
    n = (T - offset) // W
    if n < 1:
        raise ValueError(f"rows of {T} tokens hold no window of depth + 1 = {W} tokens at offset {offset}; use a "
                         "smaller depth or longer rows")
    return rows[:, offset:offset + n * W].reshape(B * n, W)


def _batch(embed: np.ndarray, windows: np.ndarray) -> dict:
    return {"emb": embed[windows[:, 1:-1]], "labels": windows[:, 2:].astype(np.int32)}


def local_head_loss(params, batch):
    """Mean cross-entropy of the head's predictions of w_2..w_depth; aux: top-1 accuracy."""
    hs = run_gru(params, batch["emb"])  # [N, depth-1, G]
    logp = jax.nn.log_softmax(local_logits(params, hs), -1)
    nll = -jnp.take_along_axis(logp, batch["labels"][..., None], -1)[..., 0]
    acc = (jnp.argmax(logp, -1) == batch["labels"]).astype(jnp.float32)
    return nll.mean(), {"ce": nll.mean(), "acc": acc.mean()}


def train_local_head(target, head: LocalHead, corpus: TextCorpus, *, steps: int, depth: int = 8, lr: float = 3e-3,
                     warmup: int | None = None, clip: float = 1.0, weight_decay: float = 0.01, seed: int = 0,
                     ckpt_dir: str | None = None, resume: bool = False, overwrite: bool = False, out: str | None = None,
                     export_dtype: str = "float32", eval_every: int = 100, ckpt_every: int = 100,
                     eval_rows: int | None = 64, progress: bool = True, stop_after: int | None = None,
                     curves_path: str | None = None, command: str | None = None, info: dict | None = None,
                     mesh=None):
    """Train `head` (e.g. `LocalHead.create(target)`) on `corpus` (a `TextCorpus` in the target's tokenizer) for
    `steps` steps of `corpus.batch_size` rows. Returns `(TrainResult, LocalHead)` — the head carries the corpus's
    unigram log-prior. out: `LocalHead.save` directory with `training.json` once the run finishes (`info` is merged
    into it, e.g. the block drafter it is meant for). mesh: a ("data", "model") device mesh
    (`smcsd.train.loop.placement`): corpus rows (and their windows) over "data", the head replicated; no target
    runs here, so nothing is split over "model"."""
    if not isinstance(head, LocalHead):
        raise TypeError(f"head must be a LocalHead, got {type(head).__name__}")
    if not isinstance(corpus, TextCorpus):
        raise TypeError(f"corpus must be a smcsd.train.TextCorpus, got {type(corpus).__name__}")
    if not isinstance(depth, int) or depth < 2:
        raise ValueError(f"depth must be an int >= 2 (the block positions the head serves), got {depth!r}")
    head.check_target(target.config)
    if corpus.seq_len < depth + 1:
        raise ValueError(f"corpus.seq_len = {corpus.seq_len} is shorter than one window (depth + 1 = {depth + 1})")
    pl = placement(mesh)
    pl.check_rows(corpus.batch_size)
    rows = pl.local_rows(corpus.batch_size)
    embed = np.asarray(pl.to_host(target.params["embed_tokens"]["embedding"]), np.float32)
    prior = unigram_log_prior(corpus.train_rows, head.config.vocab_size)
    head = LocalHead(head.config, head.params, prior, head.name)

    def batches(step):  # this process's rows' windows (row-major: a row's windows stay in its data block)
        offset = int(np.random.default_rng([seed, step, 0x10CA1]).integers(0, depth + 1))
        return _batch(embed, local_windows(corpus.batch(step)[rows], depth, min(offset, corpus.seq_len - depth - 1)))

    ev = jax.jit(lambda p, b: local_head_loss(p, b)[1])

    def eval_fn(p):
        idx = corpus.heldout_indices(eval_rows)
        ce = acc = 0.0
        for i in idx:
            m = pl.to_host(ev(p, pl.shard_global(_batch(embed, local_windows(corpus.heldout_rows[i], depth, 0)))))
            ce, acc = ce + float(m["ce"]), acc + float(m["acc"])
        return {"heldout_ce": ce / len(idx), "heldout_acc": acc / len(idx)}

    meta = {"recipe": "train_local_head", "config": dataclasses.asdict(head.config), "depth": depth, "seed": seed,
            "corpus": corpus.fingerprint, "batch_size": corpus.batch_size, "seq_len": corpus.seq_len,
            "target_params": params_fingerprint(target.params)}
    t0 = time.time()
    res = train(local_head_loss, head.params, batches, steps=steps, lr=lr, warmup=warmup, clip=clip,
                weight_decay=weight_decay, ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                eval_fn=eval_fn if len(corpus.heldout_rows) else None, eval_every=eval_every, ckpt_every=ckpt_every,
                progress=progress, stop_after=stop_after, curves_path=curves_path, meta=meta,
                desc=f"local head for {getattr(target, 'name', 'target')}", command=command, mesh=pl)
    head = head.with_params(res.params)
    if out and res.history["finished"]:
        h = res.history
        record = {"recipe": "train_local_head",
                  "target": {"name": getattr(target, "name", "target"), "params_fingerprint": meta["target_params"]},
                  "run": h["run"], "final_eval": h["eval"][-1] if h["eval"] else None,
                  "train_wall_s": round(h["wall_s"], 1), "this_process_s": round(time.time() - t0, 1),
                  "budget": {"steps": steps, "tokens_seen": steps * corpus.batch_size * corpus.seq_len,
                             "backend": jax.default_backend()},
                  "num_params": head.num_params, "stored_dtype": export_dtype, "corpus": corpus.describe(),
                  "commands": h.get("commands", []), **(info or {})}
        if h.get("placements"):
            record["budget"]["placements"] = h["placements"]
        pl.on_lead(lambda: head.save(out, export_dtype, record))
    return res, head
