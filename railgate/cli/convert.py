"""``railgate convert-checkpoint``: rewrite the pickled checkpoints of older releases as data."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", type=Path, metavar="RUN_DIR", help="run directory (or one step-NNNNNN.pt file)")
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="read the pickled files, which runs any code they hold: only for files whose origin you trust",
    )


def _run(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.checkpoint_convert import convert_checkpoints, legacy_sources

    if not args.trust_pickle:  # said before a byte of any pickle is read
        sources, _ = legacy_sources(args.target)
        names = ", ".join(p.name for p in sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
        raise ConfigError(
            f"convert-checkpoint unpickles {names} in {sources[0].parent}, and unpickling runs any code a file holds "
            f"(a downloaded run directory can hold any); if you trust where these files came from, run it again with "
            f"--trust-pickle: railgate convert-checkpoint {args.target} --trust-pickle"
        )
    for path in convert_checkpoints(args.target):
        print(f"written: {path}")
    return 0


COMMAND = Command(
    "convert-checkpoint",
    "rewrite a run's pickled checkpoints (older releases) as data; reading them "
    "runs code they hold, so only for runs whose origin you trust",
    _configure,
    _run,
)
