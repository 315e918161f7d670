"""The `train-drafter` command: distil an autoregressive drafter from any target on a text corpus.

    smcsd train-drafter --target tiny-code --corpus docs/ notes.txt --out my-drafter \\
        --draft-config hidden=128,layers=2,heads=2 --steps 1000 --batch-size 8 --seq-len 256
    smcsd train-drafter ... --resume          # continue after an interruption (same settings)

`add_parser(subparsers)` registers the subcommand (its `func` is `run`); `build_parser()` gives a
standalone parser (experiments/train/drafter.py). Errors are ValueError / FileNotFoundError with a
message naming the argument, which the `smcsd` entry point prints as one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time

__all__ = ["add_arguments", "add_device_arguments", "add_parser", "build_parser", "load_target", "mesh_of", "parse_draft_config", "run"]

EXAMPLES = """examples:
  smcsd train-drafter --target tiny-code --corpus README.md docs/ --out drafter --steps 300
  smcsd train-drafter --target path/to/hf-checkpoint --corpus data/ --out drafter \\
      --draft-config hidden=256,layers=2,heads=4 --topk 64 --cache-dir teacher-cache
  smcsd train-drafter ... --resume              # continue the run in --ckpt-dir (same settings)
"""

_ALIASES = {"hidden": "hidden", "hidden_size": "hidden", "layers": "layers", "num_hidden_layers": "layers",
            "heads": "heads", "num_attention_heads": "heads", "kv_heads": "kv_heads",
            "num_key_value_heads": "kv_heads", "intermediate": "intermediate", "intermediate_size": "intermediate"}


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return v


def _nonneg_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return v


# ----------------------------------------------------------------------------------------------- models

def load_target(spec: str, dtype: str | None = None):
    """The target `LanguageModel` of `--target`: a local checkpoint (this project's export, a Hugging Face
    directory or a .gguf file) or a model name (a shipped pair's target, or a fetchable model)."""
    if os.path.exists(spec):
        cfg = os.path.join(spec, "config.json")
        if os.path.isdir(spec) and os.path.isfile(cfg):
            try:
                with open(cfg) as f:
                    keys = set(json.load(f))
                hf_style = bool(keys & {"architectures", "model_type"})
            except ValueError as e:
                raise ValueError(f"--target {spec}: config.json is not valid JSON ({e})") from None
            if not hf_style:
                from smcsd.models.shipped import load_model_dir
                return load_model_dir(spec)
        from smcsd.models import from_pretrained
        from smcsd.models.registry import default_dtype
        return from_pretrained(spec, dtype=dtype or default_dtype())
    from smcsd.models.registry import FETCHABLE, available_models, load_pair
    names = available_models()
    if spec not in names:
        raise ValueError(f"--target {spec}: no such file or directory, nor a known model name "
                         f"(available: {', '.join(names) if names else 'none'})")
    return load_pair(spec, dtype)[0] if spec in FETCHABLE else load_pair(spec)[0]


def parse_draft_config(spec: str | None, target_config):
    """`--draft-config`: None (defaults of `draft_config_for`), a config.json path, or `key=value,...`.

    Keys: hidden, layers, heads, kv_heads, intermediate (or their ModelConfig names), and any other
    ModelConfig field; unspecified fields follow the target (vocabulary, special tokens, RoPE, context).
    """
    from smcsd.models import ModelConfig
    from .loop import draft_config_for
    if spec is None:
        return draft_config_for(target_config)
    if os.path.isfile(spec):
        with open(spec) as f:
            try:
                return ModelConfig.from_dict(json.load(f))
            except (ValueError, TypeError) as e:
                raise ValueError(f"--draft-config {spec}: not a ModelConfig config.json ({e})") from None
    kwargs, overrides = {}, {}
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--draft-config: expected key=value, got {item!r} (or a path to a config.json)")
        try:
            value = json.loads(value)
        except ValueError:
            value = value.strip()
        if key in _ALIASES:
            kwargs[_ALIASES[key]] = value
        elif key in fields:
            overrides[key] = value
        else:
            raise ValueError(f"--draft-config: unknown key {key!r}; use hidden, layers, heads, kv_heads, "
                             f"intermediate or a ModelConfig field ({', '.join(sorted(fields))})")
    return draft_config_for(target_config, **kwargs, **overrides)


# ----------------------------------------------------------------------------------------------- parser

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `train-drafter` (shared by the subcommand and experiments/train/drafter.py)."""
    m = p.add_argument_group("models")
    m.add_argument("--target", required=True, metavar="NAME|PATH",
                   help="the target: a model name (a shipped pair's target, e.g. tiny-code, or a fetchable model "
                        "such as smollm2-135m) or a local checkpoint (exported dir, Hugging Face dir, .gguf)")
    m.add_argument("--target-dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="params dtype of a checkpoint or fetched target (default: float32 on CPU, bfloat16 else)")
    m.add_argument("--draft-config", metavar="SPEC", default=None,
                   help="the drafter's architecture: key=value,... (hidden, layers, heads, kv_heads, intermediate, "
                        "or any ModelConfig field) or a config.json; other fields follow the target "
                        "(default: half the target's width, 2 layers)")
    m.add_argument("--init", metavar="DIR", default=None,
                   help="warm-start from an exported drafter (its config replaces --draft-config)")
    d = p.add_argument_group("data")
    d.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="text files and directories (walked for --ext files), read as UTF-8")
    d.add_argument("--ext", nargs="+", default=[".txt", ".md", ".rst", ".py"],
                   help="file extensions taken from corpus directories (default: %(default)s)")
    d.add_argument("--max-tokens", type=_positive_int, default=None, help="use at most this many corpus tokens")
    d.add_argument("--seq-len", type=_positive_int, default=256, help="tokens per training row (default 256)")
    d.add_argument("--batch-size", type=_positive_int, default=8, help="rows per step (default 8)")
    d.add_argument("--heldout-frac", type=float, default=0.05, help="share of rows held out (default 0.05)")
    d.add_argument("--topk", type=int, default=32,
                   help="keep the target's top-k log-probs per position (0: the full distribution; default 32)")
    d.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="cache the target's outputs here as float16 .npy shards (reused by later epochs, resumed "
                        "and repeated runs)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=_positive_int, default=1000, help="optimiser steps (default 1000)")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    t.add_argument("--warmup", type=int, default=None, help="warmup steps (default min(100, steps/10))")
    t.add_argument("--clip", type=float, default=1.0, help="gradient global-norm bound (default 1.0)")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default 0.1)")
    t.add_argument("--kl-weight", type=_nonneg_float, default=0.5, help="weight of KL(p_target || q) (default 0.5)")
    t.add_argument("--ce-weight", type=_nonneg_float, default=0.5, help="weight of CE on gold tokens (default 0.5)")
    t.add_argument("--seed", type=int, default=0, help="data order and drafter init seed (default 0)")
    t.add_argument("--eval-every", type=_positive_int, default=100)
    t.add_argument("--eval-rows", type=_positive_int, default=64, help="held-out rows per evaluation (default 64)")
    t.add_argument("--stop-after", type=_positive_int, default=None, help=argparse.SUPPRESS)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument("--out", required=True, metavar="DIR",
                   help="export directory: config.json, model.safetensors, training.json, curves.{json,png}")
    o.add_argument("--export-dtype", choices=["float32", "bfloat16"], default="float32")
    o.add_argument("--ckpt-dir", default=None, metavar="DIR", help="orbax checkpoints (default: OUT-ckpt)")
    o.add_argument("--ckpt-every", type=_positive_int, default=100)
    o.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --ckpt-dir")
    o.add_argument("--overwrite", action="store_true", help="discard existing checkpoints and restart")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train-drafter` on an argparse subparsers object; the parser's `func` is `run`."""
    p = subparsers.add_parser("train-drafter", help="distil a small autoregressive drafter from a target on text",
                              description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def build_parser(prog: str = "train_drafter.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


# ----------------------------------------------------------------------------------------------- run

def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """The "devices" flags (--mesh, --distributed, --coordinator, --num-processes, --process-id) that `mesh_of`
    reads; shared by `smcsd train-drafter` and the experiments' training scripts."""
    x = p.add_argument_group("devices")
    x.add_argument("--mesh", default=None, metavar="DATAxMODEL",
                   help="train on a device mesh: rows over DATA, the frozen target's weights over MODEL (e.g. 4x2, "
                        "or 'auto' = every device on data); --batch-size must be a multiple of DATA (default: one "
                        "device)")
    x.add_argument("--distributed", action="store_true",
                   help="join the other processes first (jax.distributed.initialize(): TPU pods, SLURM, "
                        "Kubernetes find the coordinator themselves; else pass --coordinator, --num-processes, "
                        "--process-id); every process runs the same command")
    x.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="with --distributed: process 0's address")
    x.add_argument("--num-processes", type=_positive_int, default=None, help="with --distributed")
    x.add_argument("--process-id", type=int, default=None, help="with --distributed")


def mesh_of(args):
    """The mesh of `--mesh` (None without one), after joining the other processes when `--distributed`."""
    if getattr(args, "distributed", False):
        import jax
        kw = {k: v for k, v in (("coordinator_address", args.coordinator), ("num_processes", args.num_processes),
                                ("process_id", args.process_id)) if v is not None}
        # CPU collectives across processes (no effect on accelerators; set before any backend starts)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(**kw)
    elif any(getattr(args, k, None) is not None for k in ("coordinator", "num_processes", "process_id")):
        raise ValueError("--coordinator / --num-processes / --process-id need --distributed")
    from smcsd.runtime.mesh import parse_mesh
    return parse_mesh(getattr(args, "mesh", None))


def run(args) -> int:
    """Load the target, build the corpus and the drafter, distil, export to --out; prints a summary."""
    from smcsd.models.shipped import load_model_dir
    from .data import TextCorpus, check_vocab
    from .loop import distill_ar_drafter

    if args.resume and args.overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    if args.topk < 0:
        raise ValueError(f"--topk must be >= 0 (0: full distribution), got {args.topk}")
    if args.kl_weight == 0 and args.ce_weight == 0:
        raise ValueError("--kl-weight and --ce-weight are both 0: nothing to train")
    mesh = mesh_of(args)
    if mesh is not None:
        from .loop import placement
        placement(mesh).check_rows(args.batch_size, "--batch-size")
    target = load_target(args.target, args.target_dtype)
    if target.tokenizer is None:
        raise ValueError(f"--target {args.target}: the model has no tokenizer to read the corpus with "
                         "(a Hugging Face checkpoint needs its tokenizer.json)")
    draft = load_model_dir(args.init) if args.init else parse_draft_config(args.draft_config, target.config)
    check_vocab(target, draft)
    if args.topk > target.config.vocab_size:
        raise ValueError(f"--topk {args.topk} exceeds the target's vocab_size {target.config.vocab_size}")
    t0 = time.time()
    corpus = TextCorpus(files=args.corpus, tokenizer=target.tokenizer, seq_len=args.seq_len,
                        batch_size=args.batch_size, seed=args.seed, heldout_frac=args.heldout_frac,
                        extensions=args.ext, max_tokens=args.max_tokens)
    out = os.path.normpath(args.out)
    ckpt_dir = args.ckpt_dir or out + "-ckpt"
    command = getattr(args, "command_line", None) or shlex.join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    dcfg = draft if not hasattr(draft, "params") else draft.config
    if not getattr(args, "no_progress", False):
        print(f"train-drafter: target {getattr(target, 'name', args.target)} ({target.config.vocab_size} vocab), "
              f"drafter hidden {dcfg.hidden_size} x {dcfg.num_hidden_layers} layers; corpus "
              f"{corpus.num_documents} documents, {corpus.num_tokens} tokens, {len(corpus.train_rows)} train / "
              f"{len(corpus.heldout_rows)} held-out rows of {args.seq_len} ({time.time() - t0:.1f}s)", flush=True)
    try:
        res = distill_ar_drafter(target, draft, corpus, steps=args.steps, lr=args.lr, warmup=args.warmup,
                                 clip=args.clip, weight_decay=args.weight_decay, ce_weight=args.ce_weight,
                                 kl_weight=args.kl_weight, topk=args.topk or None, seed=args.seed,
                                 cache_dir=args.cache_dir, ckpt_dir=ckpt_dir, resume=args.resume,
                                 overwrite=args.overwrite, out=out, export_dtype=args.export_dtype,
                                 eval_every=args.eval_every, ckpt_every=args.ckpt_every, eval_rows=args.eval_rows,
                                 progress=not args.no_progress, stop_after=args.stop_after,
                                 curves_path=os.path.join(out, "curves"), command=command, mesh=mesh)
    except FileExistsError:  # a ValueError, which the smcsd entry point prints as one line
        raise ValueError(f"checkpoints exist in {ckpt_dir}: pass --resume to continue that run or --overwrite to "
                         "discard them and restart (or choose another --ckpt-dir)") from None
    h = res.history
    ev = h["eval"][-1] if h["eval"] else {}
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in ev.items() if k != "step")
    where = f"exported to {out}" if h["finished"] else f"stopped at step {h['step']}; checkpoints in {ckpt_dir}"
    print(f"train-drafter: {h['step']}/{args.steps} steps, {h['wall_s']:.0f}s training wall time; "
          f"held-out {metrics or 'n/a'}; {where}", flush=True)
    return 0
