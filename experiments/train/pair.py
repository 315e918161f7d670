"""Train a shipped target/draft pair (byte tokenizer, same data) and export it to `models/shipped/`.

    python -m experiments.train.pair --pair tiny-arith --role both
    python -m experiments.train.pair --pair tiny-code --role target --steps 1200 --resume

- Pairs: `tiny-code` (Python source of the running interpreter's standard library, held-out split by
  file) and `tiny-arith` (the generated arithmetic task of `experiments/arith_data.py`).
- Optimiser: optax AdamW (decoupled weight decay on matrices only), linear warmup + cosine decay to
  10 %, global-norm gradient clipping. Loss: next-token cross-entropy over non-pad targets; with
  `--distill` the draft's loss is (1 - w) * CE + w * KL(p_target || q_draft) against the trained target.
- Checkpoints: orbax `CheckpointManager` under `--ckpt-dir/<pair>/<role>` holding params, optimiser
  state, step and the loss history. The batch of step s is a pure function of (seed, s), so
  `--resume` continues from the latest checkpoint and reproduces the uninterrupted run's losses.
- Outputs: loss curves (train + held-out) as JSON and PNG under `--results-dir`, and the export
  `--out/<pair>/<role>/{config.json, model.safetensors, training.json}`.
- The generic pieces (optimiser, orbax checkpoints, export, curves) are `smcsd.train.loop`'s; this script
  keeps what is specific to the shipped pairs (their data, specs and the `--extend` schedule).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import code_data
from experiments.code_data import BOS, EOS, PAD, TOK
from experiments.common import CHECKPOINTS, CURVES, SHIPPED
from smcsd.models import ModelConfig, forward_full, init_model
from smcsd.train.loop import (checkpoint_manager, export_model, make_optimizer, restore_checkpoint,
                              save_checkpoint)
from smcsd.train.loop import save_curves as _save_curves


# ----------------------------------------------------------------------------------------------
# Pair specifications
# ----------------------------------------------------------------------------------------------

def _cfg(hidden, inter, layers, heads, kv, max_pos):
    return ModelConfig(vocab_size=TOK.vocab_size, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                       max_position_embeddings=max_pos, rope_theta=10000.0, rms_norm_eps=1e-5,
                       bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    config: ModelConfig
    steps: int
    batch_size: int
    lr: float
    warmup: int


@dataclasses.dataclass(frozen=True)
class PairSpec:
    name: str
    data: str  # "code" | "arith"
    seq_len: int  # tokens per training row (inputs), labels are shifted by one
    target: RoleSpec
    draft: RoleSpec
    drill_frac: float = 0.0  # arith: share of rows that are arithmetic drills (see arith_data.train_texts)


PAIRS = {
    "tiny-code": PairSpec(
        name="tiny-code", data="code", seq_len=256,
        target=RoleSpec(_cfg(256, 896, 6, 4, 2, 1024), steps=400, batch_size=8, lr=2e-3, warmup=30),
        draft=RoleSpec(_cfg(128, 384, 2, 2, 1, 1024), steps=400, batch_size=8, lr=3e-3, warmup=30)),
    "tiny-arith": PairSpec(
        name="tiny-arith", data="arith", seq_len=128,
        target=RoleSpec(_cfg(128, 512, 4, 4, 2, 256), steps=800, batch_size=32, lr=3e-3, warmup=60),
        draft=RoleSpec(_cfg(64, 192, 2, 2, 1, 256), steps=300, batch_size=32, lr=3e-3, warmup=30)),
}


# ----------------------------------------------------------------------------------------------
# Data: `batch(step, n)` is a pure function of (seed, step) -> int32[n, seq_len + 1]
# ----------------------------------------------------------------------------------------------

def _encode_rows(texts, seq_len):
    rows = np.full((len(texts), seq_len + 1), PAD, np.int32)
    for i, t in enumerate(texts):
        ids = [BOS] + list(t.encode()) + [EOS]
        if len(ids) > seq_len + 1:
            raise ValueError(f"example of {len(ids)} tokens does not fit seq_len {seq_len}: {t!r}")
        rows[i, :len(ids)] = ids
    return rows


class ArithData:
    """One generated problem per row: [BOS] + question + answer + [EOS], right-padded with PAD."""

    def __init__(self, seq_len: int, seed: int = 0, drill_frac: float = 0.0):
        from experiments import arith_data
        self.mod, self.seq_len, self.seed, self.drill_frac = arith_data, seq_len, seed, drill_frac

    def batch(self, step: int, n: int) -> np.ndarray:
        return _encode_rows(self.mod.train_texts(self.seed, step, n, self.drill_frac), self.seq_len)

    def eval_rows(self, n: int = 256) -> np.ndarray:
        return _encode_rows([p.text for p in self.mod.test_set()[:n]], self.seq_len)

    def describe(self) -> dict:
        return {"source": "experiments/arith_data.py", "drill_frac": self.drill_frac, "test_seed": self.mod.TEST_SEED,
                "test_size": self.mod.TEST_SIZE, "templates": len(self.mod.TEMPLATES)}


def make_data(pair: PairSpec, seq_len: int, seed: int, drill_frac: float | None = None):
    if pair.data == "code":
        return code_data.CodeData(seq_len, seed)
    return ArithData(seq_len, seed, pair.drill_frac if drill_frac is None else drill_frac)


# ----------------------------------------------------------------------------------------------
# Loss, optimiser, train step
# ----------------------------------------------------------------------------------------------

def token_losses(config: ModelConfig, params, rows):
    """Per-target cross-entropy (nats) `[B, T]`, the non-pad mask, and the logits."""
    inputs, labels = rows[:, :-1], rows[:, 1:]
    logits = forward_full(config, params, inputs)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    mask = (labels != PAD).astype(jnp.float32)
    return ce, mask, logits


def loss_fn(params, rows, config, teacher_config=None, teacher_params=None, distill_weight=0.0):
    ce, mask, logits = token_losses(config, params, rows)
    denom = jnp.maximum(mask.sum(), 1.0)
    ce_mean = (ce * mask).sum() / denom
    if teacher_config is None:
        return ce_mean, ce_mean
    t_logits = jax.lax.stop_gradient(forward_full(teacher_config, teacher_params, rows[:, :-1]))
    t_logp = jax.nn.log_softmax(t_logits, -1)
    s_logp = jax.nn.log_softmax(logits, -1)
    kl = (jnp.exp(t_logp) * (t_logp - s_logp)).sum(-1)  # KL(p_target || q_draft) per position
    kl_mean = (kl * mask).sum() / denom
    return (1.0 - distill_weight) * ce_mean + distill_weight * kl_mean, ce_mean


def make_train_step(config, tx, teacher_config=None, distill_weight=0.0):
    def step(params, opt_state, rows, teacher_params=None):
        (loss, ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, rows, config, teacher_config, teacher_params, distill_weight)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, ce
    return jax.jit(step, donate_argnums=(0, 1))


@functools.lru_cache(maxsize=8)
def compiled_step(config, lr, steps, warmup, teacher_config=None, distill_weight=0.0):
    """(optimizer, jitted train step), cached so runs with the same settings share one compilation."""
    tx = make_optimizer(lr, steps, warmup)
    return tx, make_train_step(config, tx, teacher_config, distill_weight)


@functools.lru_cache(maxsize=8)
def make_eval(config):
    @jax.jit
    def ev(params, rows):
        ce, mask, _ = token_losses(config, params, rows)
        n_bytes = ((rows[:, 1:] < 256) & (rows[:, 1:] != PAD)).sum()
        return (ce * mask).sum(), mask.sum(), n_bytes
    return ev


def evaluate(config, params, rows, batch: int = 32) -> dict:
    """Held-out loss per token (nats) and bits per byte (all target nats charged to the byte targets)."""
    ev = make_eval(config)
    tot = cnt = nb = 0.0
    for i in range(0, len(rows), batch):
        s, c, b = ev(params, jnp.asarray(rows[i:i + batch]))
        tot, cnt, nb = tot + float(s), cnt + float(c), nb + float(b)
    return {"loss": tot / cnt, "bits_per_byte": tot / max(nb, 1.0) / math.log(2), "tokens": int(cnt)}


# ----------------------------------------------------------------------------------------------
# Checkpoints (orbax), export (safetensors) and curves: the generic pieces live in smcsd.train.loop
# ----------------------------------------------------------------------------------------------

def _manager(directory: str):
    return checkpoint_manager(directory)


def load_exported(directory: str):
    """(config, params) of an exported model, via the package loader."""
    from smcsd.models.shipped import load_model_dir
    m = load_model_dir(directory)
    return m.config, m.params


def save_curves(history: dict, path_prefix: str, title: str):
    """JSON + PNG of a role's history (train rows are [step, CE] or [step, CE, distill loss])."""
    _save_curves(history, path_prefix, title, train_keys=("CE", "loss"), eval_keys=("loss",))


# ----------------------------------------------------------------------------------------------
# Training one role
# ----------------------------------------------------------------------------------------------

def train_role(pair: PairSpec, role: str, *, steps=None, batch_size=None, seq_len=None, lr=None, seed=0,
               ckpt_dir="checkpoints", resume=False, overwrite=False, out=None, export_dtype="float32",
               results_dir=None, eval_every=100, ckpt_every=100, stop_after=None, distill=False,
               distill_weight=0.5, teacher=None, progress=True, data=None, config=None, command=None,
               extend=False, export_as=None) -> dict:
    """Train `role` of `pair`; returns a summary with the loss history. `stop_after` simulates an
    interruption (stop and checkpoint after that many steps); `config` overrides the pair's config;
    `extend` lets `resume` continue a finished or running schedule to a larger `steps`; `export_as` is the export's
    path under `out/<pair>/` (default: the role), and also names the checkpoint and curves."""
    from tqdm import tqdm
    rs: RoleSpec = getattr(pair, role)
    config = config or rs.config
    steps = steps or rs.steps
    batch_size = batch_size or rs.batch_size
    seq_len = seq_len or pair.seq_len
    lr = lr or rs.lr
    warmup = min(rs.warmup, max(1, steps // 10))
    data = data or make_data(pair, seq_len, seed)
    drill_frac = getattr(data, "drill_frac", 0.0)
    name = export_as or (role + ("-distill" if distill else ""))  # checkpoint / curves / export name
    tag = f"{pair.name}/{name}"
    run = {"pair": pair.name, "role": role, "steps": steps, "batch_size": batch_size, "seq_len": seq_len,
           "lr": lr, "warmup": warmup, "seed": seed, "distill": bool(distill),
           "distill_weight": distill_weight if distill else 0.0, "config": config.to_dict()}
    if drill_frac:
        run["drill_frac"] = drill_frac

    ckpt_path = os.path.join(ckpt_dir, pair.name, name)
    if os.path.isdir(ckpt_path) and os.listdir(ckpt_path) and not resume:
        if not overwrite:
            raise SystemExit(f"checkpoints exist in {ckpt_path}: pass --resume to continue or --overwrite to restart")
        shutil.rmtree(ckpt_path)
    mngr = _manager(ckpt_path)

    teacher_cfg = teacher[0] if distill and teacher is not None else None
    tx, step_fn = compiled_step(config, lr, steps, warmup, teacher_cfg, distill_weight if distill else 0.0)
    params = init_model(config, seed=seed + (0 if role == "target" else 1)).params
    opt_state = tx.init(params)
    history = {"run": run, "train": [], "eval": [], "wall_s": 0.0}
    start = 0
    if resume and mngr.latest_step() is not None:
        params, opt_state, start, meta = restore_checkpoint(mngr, params, opt_state)
        diff = {k: (meta["run"].get(k), v) for k, v in run.items() if meta["run"].get(k) != v}
        if diff and not (extend and set(diff) <= {"steps", "drill_frac"} and steps > start):
            raise SystemExit(f"--resume: checkpoint in {ckpt_path} was made with other settings {diff}"
                             + ("" if extend else " (--extend allows another --steps / --drill-frac only)"))
        history = meta
        if diff:  # --extend: the cosine schedule is stretched to the new length from here on
            history.setdefault("extended", []).append({"at_step": start, "changed": diff})
            history["run"] = run
        print(f"[{tag}] resumed from step {start}", flush=True)

    if command:
        history.setdefault("commands", []).append({"command": command, "from_step": start})
    teacher_cfg = teacher_params = None
    if distill:
        if teacher is None:
            raise ValueError("--distill needs a trained target (teacher)")
        teacher_cfg, teacher_params = teacher
    eval_rows = data.eval_rows()
    t0 = time.time()
    wall0 = history["wall_s"]
    pbar = tqdm(total=steps, initial=start, desc=tag, disable=not progress, file=sys.stdout,
                mininterval=2.0 if sys.stdout.isatty() else 60.0)
    step = start
    while step < steps:
        rows = jnp.asarray(data.batch(step, batch_size))
        if distill:
            params, opt_state, loss, ce = step_fn(params, opt_state, rows, teacher_params)
        else:
            params, opt_state, loss, ce = step_fn(params, opt_state, rows)
        step += 1
        history["train"].append([step, float(ce)] if not distill else [step, float(ce), float(loss)])
        pbar.update(1)
        pbar.set_postfix(loss=f"{float(ce):.4f}", refresh=False)
        done = step == steps or (stop_after is not None and step >= stop_after)
        if step % eval_every == 0 or done:
            ev = evaluate(config, params, eval_rows)
            history["eval"].append({"step": step, **ev})
            pbar.write(f"[{tag}] step {step}: train {float(ce):.4f}  held-out {ev['loss']:.4f} nats/token, "
                       f"{ev['bits_per_byte']:.3f} bits/byte  ({time.time() - t0:.0f}s)")
        if step % ckpt_every == 0 or done:
            history["wall_s"] = wall0 + time.time() - t0
            save_checkpoint(mngr, step, params, opt_state, history)
        if done:
            break
    pbar.close()
    history["wall_s"] = wall0 + time.time() - t0
    if results_dir:
        save_curves(history, os.path.join(results_dir, pair.name, name),
                    f"{tag}: {config.num_params / 1e6:.2f}M params")
    finished = step == steps
    if out and finished:
        info = {"run": run, "final_eval": history["eval"][-1] if history["eval"] else None,
                "train_wall_s": round(history["wall_s"], 1), "num_params": config.num_params,
                "stored_dtype": export_dtype, "data": data.describe(), "trained_context": seq_len,
                "commands": history.get("commands", [command])}
        dest = os.path.join(out, pair.name, export_as or role)
        export_model(config, params, dest, export_dtype, info)
        print(f"[{tag}] exported to {dest}", flush=True)
    return {"params": params, "history": history, "step": step, "config": config}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(PAIRS), required=True)
    ap.add_argument("--role", choices=["target", "draft", "both"], default="both")
    ap.add_argument("--steps", type=int, default=None, help="default: the pair's setting for the role")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-dir", default=CHECKPOINTS)
    ap.add_argument("--out", default=SHIPPED,
                    help="export root; the model goes to OUT/<pair>/<role>/ ('' to skip)")
    ap.add_argument("--export-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--results-dir", default=CURVES)
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    ap.add_argument("--overwrite", action="store_true", help="discard existing checkpoints and restart")
    ap.add_argument("--extend", action="store_true",
                    help="with --resume: continue with another --steps (the cosine schedule is re-stretched "
                         "from there) or --drill-frac")
    ap.add_argument("--drill-frac", type=float, default=None,
                    help="tiny-arith: share of drill rows in each batch (default: the pair's setting)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--stop-after", type=int, default=None, help="stop (and checkpoint) after this many steps")
    ap.add_argument("--distill", action="store_true",
                    help="train the draft on (1-w)*CE + w*KL(target || draft) against the exported target")
    ap.add_argument("--distill-weight", type=float, default=0.5)
    ap.add_argument("--teacher-dir", default=None,
                    help="--distill: the exported target to distil from (default: OUT/<pair>/target)")
    ap.add_argument("--size", default=None, metavar="HIDDEN,INTERMEDIATE,LAYERS,HEADS,KV_HEADS",
                    help="override the role's model size (e.g. 96,160,3,3,1 for a resized draft)")
    ap.add_argument("--export-as", default=None,
                    help="export to OUT/<pair>/<EXPORT_AS> instead of OUT/<pair>/<role> "
                         "(e.g. drafters/ar-distilled: an extra drafter of the pair, see smcsd.available_drafters)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    pair = PAIRS[args.pair]
    roles = ["target", "draft"] if args.role == "both" else [args.role]
    if (args.size or args.export_as) and len(roles) != 1:
        raise SystemExit("--size / --export-as apply to one role: pass --role target or --role draft")
    config = None
    if args.size:
        try:
            hidden, inter, layers, heads, kv = (int(v) for v in args.size.split(","))
        except ValueError:
            raise SystemExit(f"--size must be five integers HIDDEN,INTERMEDIATE,LAYERS,HEADS,KV_HEADS, got {args.size!r}")
        base = getattr(pair, roles[0]).config
        config = _cfg(hidden, inter, layers, heads, kv, base.max_position_embeddings)
    command = "python -m experiments.train.pair " + " ".join(sys.argv[1:] if argv is None else argv)
    data = make_data(pair, args.seq_len or pair.seq_len, args.seed, args.drill_frac)
    teacher = None
    for role in roles:
        if role == "draft" and args.distill:
            if teacher is None:
                teacher = load_exported(args.teacher_dir or os.path.join(args.out, pair.name, "target"))
        t = time.time()
        res = train_role(pair, role, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                         lr=args.lr, seed=args.seed, ckpt_dir=args.ckpt_dir, resume=args.resume,
                         overwrite=args.overwrite, out=args.out or None, export_dtype=args.export_dtype,
                         results_dir=args.results_dir, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
                         stop_after=args.stop_after, distill=args.distill and role == "draft",
                         distill_weight=args.distill_weight, teacher=teacher, progress=not args.no_progress,
                         data=data, command=command, extend=args.extend, config=config,
                         export_as=args.export_as)
        if role == "target":
            teacher = (res["config"], res["params"])
        print(f"[{pair.name}/{role}] {res['step']} steps, this run {time.time() - t:.0f}s wall, "
              f"total train wall {res['history']['wall_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
