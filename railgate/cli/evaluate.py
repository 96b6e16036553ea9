"""``railgate eval``: held-out accuracy of a run's newest checkpoint (or its base, or a model
directory), alone or paired against another policy on the same prompts and draws."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command, overrides

DESCRIPTION = """\
Held-out accuracy with its 95% interval over prompts.

  railgate eval RUN_DIR                      the run's newest checkpoint (writes RUN_DIR/eval_stepN.json)
  railgate eval RUN_DIR --base               the run's base policy (writes RUN_DIR/eval_base.json)
  railgate eval MODEL_DIR --config CONFIG    a Hugging Face model directory, under CONFIG's task and evaluation
  railgate eval A --against B [--json]       A and B on the same prompts and draws: the paired difference A - B

A and B are run directories or model directories; the settings come from A's run, else B's,
else --config. --json prints one JSON object: accuracy_a, accuracy_b, difference, difference_lo,
difference_hi, prompts (prompts both scored), samples (samples per prompt).
"""


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", type=Path, metavar="A", help="a run directory or a model directory")
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="B",
        help="compare with B (a run or model directory) on the same prompts and random draws",
    )
    parser.add_argument("--base", action="store_true", help="A is a run directory: evaluate its base policy")
    parser.add_argument(
        "--samples", type=int, default=None, help="samples per prompt (k of pass@k); default: data.eval_samples"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="settings when neither A nor B is a run directory (default: configs/default.yaml)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    overrides(parser)


def _run(args: argparse.Namespace) -> int:
    from railgate.evaluate import Policy, run_eval

    against = Policy(args.against) if args.against is not None else None
    run_eval(Policy(args.policy, base=args.base), against, args.config, args.overrides, args.samples, args.json)
    return 0


COMMAND = Command(
    "eval",
    "held-out accuracy of a run or model directory; --against B: the paired difference",
    _configure,
    _run,
    description=DESCRIPTION,
)
