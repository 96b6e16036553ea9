"""``railgate eval``: held-out accuracy and pass@k of a run's newest checkpoint (or its base)."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command, overrides


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--base", action="store_true", help="evaluate the base policy instead of the checkpoint")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per prompt (k of pass@k); default: data.eval_samples")
    overrides(parser)


def _run(args: argparse.Namespace) -> int:
    from railgate.evaluate import evaluate_run
    from railgate.trust import run_dir_config

    cfg = run_dir_config(args.run_dir, list(args.overrides) + [f"run_dir={args.run_dir}"], f"railgate eval {args.run_dir}")
    evaluate_run(cfg, base=args.base, samples=args.samples)
    return 0


COMMAND = Command("eval", "held-out accuracy and pass@k of a run's newest checkpoint", _configure, _run)
