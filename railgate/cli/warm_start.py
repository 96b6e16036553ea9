"""``railgate warm-start``: the warm-started base model as a Hugging Face directory of its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from configs import DEFAULT_CONFIG
from railgate.cli.command import Command, config_options, progress_flag


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="the model directory to write (must not exist, or be empty)",
    )
    config_options(parser, DEFAULT_CONFIG)


def _run(args: argparse.Namespace) -> int:
    from railgate.config import load_config
    from railgate.warm_start import warm_start_to

    cfg = load_config(args.config, args.overrides)
    held_out = warm_start_to(cfg, args.out, progress=progress_flag(args) is not False)
    print(
        f"held-out accuracy: {held_out['accuracy']:.3f} (95% {held_out['accuracy_lo']:.3f} to "
        f"{held_out['accuracy_hi']:.3f}) over {held_out['prompts']} prompts x {held_out['samples']} samples, seed "
        f"{held_out['seed']}"
    )
    print(f"written: {args.out} (train from it with --set model.path={args.out})")
    return 0


COMMAND = Command(
    "warm-start", "the warm-started base model as a Hugging Face directory (model.path=DIR loads it)", _configure, _run
)
