"""``railgate convert-checkpoint``: rewrite the pickled checkpoints of older releases as data."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, metavar="RUN_DIR", help="run directory (or one step-NNNNNN.pt file)")


def _run(args: argparse.Namespace) -> int:
    from railgate.checkpoint_convert import convert_checkpoints

    for path in convert_checkpoints(args.target):
        print(f"written: {path}")
    return 0


COMMAND = Command("convert-checkpoint", "rewrite a run's pickled checkpoints (older releases) as data; reading them "
                  "runs code they hold, so only for runs whose origin you trust", _configure, _run)
