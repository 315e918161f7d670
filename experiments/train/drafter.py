"""Distil an autoregressive drafter from any target on a text corpus (the `smcsd train-drafter` command).

    python -m experiments.train.drafter --target tiny-code --corpus README.md docs/ \
        --out /tmp/drafter --draft-config hidden=64,layers=1,heads=1 --steps 300 --batch-size 8 --seq-len 128

All options: `--help`, or smcsd/train/cli.py. The library behind it is `smcsd.train`.
"""

from __future__ import annotations

import shlex
import sys

from smcsd.train.cli import build_parser, run


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["python", "-m", "experiments.train.drafter"] + argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
