"""The command-line scaffolding the drafter-training scripts share (block_drafter.py, flex.py, specblock.py,
mask_drafter.py, local_head.py, eagle.py, smc_proposal.py): their common runs of flags, the per-pair
defaults, the "--out or --export" rule, the target they load, and the keyword arguments of the training call
that are the same in all of them (`from experiments.train import common as train_cli`).

Each script still declares its own flags, in its own order, and its own call; only the standard library is
imported here at module level (smcsd inside `load_pair`), so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments.common import CHECKPOINTS, CURVES, SHIPPED  # CURVES: the default --curves-dir

EXPORT_DTYPES = ["float32", "bfloat16"]


# ----------------------------------------------------------------------------------- flags

def new_parser(doc: str, defaults: dict) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of the script's `doc`, with --pair (one of `defaults`' keys)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(defaults), default="tiny-code")
    return ap


def add_size_args(ap, names, lr: bool = True) -> None:
    """An int flag --NAME per name (default None: the pair's value, see `fill_defaults`), then --max-tokens and,
    with `lr`, --lr."""
    for k in names:
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    if lr:
        ap.add_argument("--lr", type=float, default=None)


def add_schedule_args(ap, eval_every: int = 100, eval_rows: int = 32, ckpt_every: int = 50,
                      cache_dir: bool = True) -> None:
    """--eval-every, --eval-rows, --ckpt-every, --stop-after and, with `cache_dir`, --cache-dir (the teacher's)."""
    ap.add_argument("--eval-every", type=int, default=eval_every)
    ap.add_argument("--eval-rows", type=int, default=eval_rows)
    ap.add_argument("--ckpt-every", type=int, default=ckpt_every)
    ap.add_argument("--stop-after", type=int, default=None)
    if cache_dir:
        ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/smcsd/teacher"))


def add_output_args(ap, export_help: str, out_help: str | None = None) -> None:
    """--out DIR and --export (into the pair's shipped drafters)."""
    ap.add_argument("--out", default=None, help=out_help)
    ap.add_argument("--export", action="store_true", help=export_help)


def add_run_flags(ap) -> None:
    """--resume, --overwrite, --no-progress."""
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--curves-dir", default=CURVES,
                    help="where the training curves (<tag>.json / .png) go")


def add_device_args(ap) -> None:
    """--mesh DATAxMODEL, --distributed (+ --coordinator / --num-processes / --process-id): `start_devices` reads
    them (the flags of `smcsd train-drafter`)."""
    from smcsd.train.cli import add_device_arguments
    add_device_arguments(ap)


def start_devices(args):
    """Join the other processes (--distributed) and build the --mesh (None: one device), before anything touches
    JAX; `loop_kwargs` passes the mesh to the recipe. Returns it."""
    from smcsd.train.cli import mesh_of
    args.device_mesh = mesh_of(args)
    return args.device_mesh


def add_training_args(ap, export_help: str, eval_every: int = 100, eval_rows: int = 32, ckpt_every: int = 50,
                      cache_dir: bool = True, ckpt_dir: bool = False) -> None:
    """The usual tail of a training script's flags: --export-dtype, `add_schedule_args`, (with `ckpt_dir`)
    --ckpt-dir, `add_output_args`, `add_run_flags`, `add_device_args`."""
    ap.add_argument("--export-dtype", choices=EXPORT_DTYPES, default=None)
    add_schedule_args(ap, eval_every, eval_rows, ckpt_every, cache_dir)
    if ckpt_dir:
        ap.add_argument("--ckpt-dir", default=None)
    add_output_args(ap, export_help)
    add_run_flags(ap)
    add_device_args(ap)


def fill_defaults(args, defaults: dict):
    """Set each flag in `defaults` (one pair's row of the script's DEFAULTS) that was not given; returns `args`."""
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def require_out_or_export(ap, args, what: str) -> None:
    """Exit with a usage error unless --out or --export was given; `what` completes "--export to ship ..."."""
    if not args.export and not args.out:
        ap.error(f"give --out DIR, or --export to ship {what}")


# ----------------------------------------------------------------------------------- the run

def load_pair(pair: str, drafter: str | None = "prompt-lookup"):
    """`smcsd.load(pair, drafter)`: (target, drafter), the fetched smollm2-135m target in float32 for training."""
    import smcsd
    return smcsd.load(pair, drafter=drafter, dtype="float32" if pair == "smollm2-135m" else None)


def teacher_cache_dir(args) -> str | None:
    """--cache-dir where the teacher's outputs are cached (smollm2-135m only; the toy's runs on the fly)."""
    return args.cache_dir if args.pair == "smollm2-135m" else None


def output_dir(args, name: str) -> str | None:
    """Where the trained drafter goes: the pair's shipped drafter `name` with --export, else --out."""
    return os.path.join(SHIPPED, args.pair, "drafters", name) if args.export else args.out


def loop_kwargs(args, tag: str, out: str | None, command: str, ckpt_dir: str | None = None) -> dict:
    """The keyword arguments every `smcsd.train` call here takes from the shared flags: checkpoints under
    checkpoints/<tag>/ (unless `ckpt_dir`), curves under experiments/results/train/<tag>, export to `out`, and the
    device mesh of `start_devices`."""
    if getattr(args, "mesh", None) is not None and not hasattr(args, "device_mesh"):
        raise RuntimeError("this script reads --mesh but never called train_cli.start_devices(args)")
    return dict(mesh=getattr(args, "device_mesh", None), ckpt_dir=ckpt_dir or os.path.join(CHECKPOINTS, tag), resume=args.resume,
                overwrite=args.overwrite, out=out, export_dtype=args.export_dtype, eval_every=args.eval_every,
                ckpt_every=args.ckpt_every, eval_rows=args.eval_rows, progress=not args.no_progress,
                stop_after=args.stop_after, curves_path=os.path.join(getattr(args, "curves_dir", None) or CURVES, tag),
                command=command)


def last_eval(res):
    """The last held-out evaluation of a training result (None when it never evaluated)."""
    return res.history["eval"][-1] if res.history["eval"] else None


def print_summary(res, out, **extra) -> None:
    """Print the run's JSON summary: final_eval, wall_s, then `extra`, then out."""
    print(json.dumps({"final_eval": last_eval(res), "wall_s": round(res.history["wall_s"], 1), **extra, "out": out},
                     indent=1))
