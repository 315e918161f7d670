"""Distil an autoregressive drafter from any target on a text corpus (the `smcsd train-drafter` command).

    PYTHONPATH=. python experiments/train_drafter.py --target tiny-code --corpus README.md docs/ \
        --out /tmp/drafter --draft-config hidden=64,layers=1,heads=1 --steps 300 --batch-size 8 --seq-len 128

All options: `--help`, or smcsd/train/cli.py. The library behind it is `smcsd.train`.
"""

from __future__ import annotations

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smcsd.train.cli import build_parser, run  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["python", "experiments/train_drafter.py"] + argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
