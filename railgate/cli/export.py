"""``railgate export``: the policy as a Hugging Face model; buffer and trace as Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command, overrides


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the export goes")
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="the policy after learner step N (a kept checkpoint; 0: the base policy); default: the newest",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export in DIR (model/, buffer.parquet, trace.parquet, export.json)",
    )
    overrides(parser, "override the run's config.yaml, e.g. --set model.path=DIR when the base model moved")


def _run(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.config import load_config
    from railgate.export import export_run

    if not (args.run_dir / "config.yaml").is_file():
        raise ConfigError(f"export {args.run_dir}: no config.yaml there; pass the run_dir of an earlier train run")
    cfg = load_config(args.run_dir / "config.yaml", list(args.overrides) + [f"run_dir={args.run_dir}"])
    report = export_run(cfg, args.run_dir, args.out, step=args.step, force=args.force)
    for name, size in report.files.items():
        print(f"{size / 2**20:10.2f} MiB  {report.out / name}")
    print(
        f"exported {args.run_dir} (policy after learner step {report.step}) to {report.out}"
        if report.step is not None
        else f"exported {args.run_dir} (a simulator run: no model) to {report.out}"
    )
    return 0


COMMAND = Command("export", "DIR/model (Hugging Face), DIR/buffer.parquet, DIR/trace.parquet", _configure, _run)
