"""``railgate replay``: train and evaluate RAIL controllers offline from logged traces."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command, config_options


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces", type=Path, nargs="+", metavar="TRACE", help="trace directories (RUN_DIR/trace) or files"
    )
    config_options(parser, None)
    parser.add_argument("--run-id", default=None, help="which run of a trace holding several")
    parser.add_argument(
        "--run-dir",
        "--out",
        dest="out",
        type=Path,
        default=Path("runs/replay"),
        help="where the report goes, like the other commands' --run-dir (--out: the same)",
    )


def _run(args: argparse.Namespace) -> int:
    from railgate.config import load_config
    from railgate.offpolicy import replay_traces

    cfg = load_config(args.config, args.overrides)
    replay_traces(args.traces, cfg.controller.rail, args.out, run_id=args.run_id, seed=cfg.seed)
    return 0


COMMAND = Command("replay", "train and evaluate RAIL controllers offline from trace directories", _configure, _run)
