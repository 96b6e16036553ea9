"""``railgate train``: online RL, the main job (``python run.py`` with no command runs it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from configs import DEFAULT_CONFIG
from railgate.cli.command import Command, config_options, progress_flag


def _configure(parser: argparse.ArgumentParser) -> None:
    config_options(parser, DEFAULT_CONFIG)
    parser.add_argument("--run-dir", type=Path, help="run directory (overrides run_dir)")
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint (its config.yaml, plus any --set)",
    )
    parser.add_argument("--overwrite", action="store_true", help="delete the run already in the run directory first")


def _run(args: argparse.Namespace) -> int:
    from railgate.config import load_config
    from railgate.train import train

    config_path, overrides = args.config, list(args.overrides)
    if args.resume is not None:
        config_path = args.resume / "config.yaml"
        overrides.append(f"run_dir={args.resume}")
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.resume is not None:  # a run directory's settings that run code or programs are not taken from it
        from railgate.trust import check_run_dir_settings

        check_run_dir_settings(config_path, list(args.overrides), f"railgate train --resume {args.resume}")
    cfg = load_config(config_path, overrides)
    result = train(cfg, progress=progress_flag(args), resume=args.resume is not None, overwrite=args.overwrite)
    if result.summary.stop_reason == "interrupted":  # Ctrl-C (railgate.interrupt)
        saved = "checkpoint written" if cfg.log.checkpoint_every else "no checkpoint (log.checkpoint_every=0)"
        print(
            f"interrupted after step {result.summary.steps}: {saved}, trace and buffer flushed; continue with: "
            f"railgate train --resume {result.run_dir}",
            file=sys.stderr,
        )
        return 130
    print((result.run_dir / "report.md").read_text())
    print(f"run directory: {result.run_dir}")
    return 0


COMMAND = Command("train", "online RL training (the default command)", _configure, _run)
