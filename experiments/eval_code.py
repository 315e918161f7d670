"""Held-out bits per byte of the shipped tiny-code target and draft on the standard-library split.

    PYTHONPATH=. python experiments/eval_code.py --windows 256

Windows of --seq-len bytes (each after a BOS, as in training) from the held-out files (split by a
hash of the file path, see train_pair.py); all target nats are charged to the byte targets.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments import report  # noqa: E402
from experiments import train_pair as tp  # noqa: E402
from models.shipped import load_model_dir, load_shipped  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pair-dir", default=None, help="a directory with target/ and draft/ (default: shipped)")
    ap.add_argument("--out", default=report.results_path("code_bpb.json"))
    args = ap.parse_args(argv)
    data = tp.CodeData(args.seq_len)
    rng = np.random.default_rng(4321)
    starts = rng.integers(0, len(data.heldout) - args.seq_len, args.windows)
    rows = data._windows(data.heldout, starts)
    if args.pair_dir:
        models = {r: load_model_dir(os.path.join(args.pair_dir, r)) for r in ("target", "draft")}
    else:
        models = dict(zip(("target", "draft"), load_shipped("tiny-code")))
    out = {"data": data.describe(), "windows": args.windows, "seq_len": args.seq_len}
    for role, m in models.items():
        ev = tp.evaluate(m.config, m.params, rows, batch=16)
        out[role] = {"num_params": m.num_params, **ev}
        print(f"{role}: {m.num_params / 1e6:.2f}M params, held-out {ev['bits_per_byte']:.3f} bits/byte "
              f"({ev['loss']:.3f} nats/token over {ev['tokens']} tokens)", flush=True)
    report.write_json(args.out, out)


if __name__ == "__main__":
    main()
