"""``railgate shadow``: RAIL decides in shadow mode while a randomised behaviour policy acts."""

from __future__ import annotations

import argparse
from pathlib import Path

from configs import DEFAULT_CONFIG
from railgate.cli.command import Command, config_options, progress_flag


def _configure(parser: argparse.ArgumentParser) -> None:
    config_options(parser, DEFAULT_CONFIG)
    parser.add_argument("--run-dir", type=Path, help="run directory (overrides run_dir)")
    parser.add_argument("--overwrite", action="store_true", help="delete the run already in the run directory first")


def _run(args: argparse.Namespace) -> int:
    from railgate.config import load_config
    from railgate.offpolicy import shadow

    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    shadow(load_config(args.config, overrides), progress=progress_flag(args), overwrite=args.overwrite)
    return 0


COMMAND = Command(
    "shadow", "train with RAIL in shadow mode; report the estimated value of promoting it", _configure, _run
)
