"""What one subcommand of the command line is: its name, its help, its options and its handler.

Each subcommand lives in its own module of ``railgate/cli/`` and exports one ``Command``; the
table in ``railgate/cli/__init__.py`` lists them in the order ``--help`` shows them.

>>> import argparse
>>> def hello(args): print(f"hello {args.who}"); return 0
>>> cmd = Command("hello", "say hello", lambda p: p.add_argument("who"), hello)
>>> parser = argparse.ArgumentParser(prog="demo")
>>> _ = cmd.register(parser.add_subparsers(dest="command"))
>>> args = parser.parse_args(["hello", "world"])
>>> args.handler(args)
hello world
0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure`` adds its options to its parser, ``run`` does the work and
    returns the exit status. Errors of the user's input are raised, not printed: the one place
    that turns them into a clear line and exit status 2 is ``railgate.cli.main``."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Handler
    description: str = ""
    """Longer text for ``railgate NAME --help``; defaults to ``help``."""

    def register(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add the command's parser; every command that has no subcommands takes ``--no-progress``."""
        parser = subparsers.add_parser(
            self.name,
            help=self.help,
            description=self.description or self.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.configure(parser)
        if parser._subparsers is None and not any(a.dest == "no_progress" for a in parser._actions):
            no_progress(parser)
        parser.set_defaults(handler=self.run)
        return parser


def config_options(parser: argparse.ArgumentParser, default_config: Path | None, progress: bool = True) -> None:
    """``--config``, repeatable ``--set`` and (for commands that run long) ``--no-progress``."""
    parser.add_argument("--config", type=Path, default=default_config, help="YAML config (default: %(default)s)")
    overrides(parser)
    if progress:
        no_progress(parser)


def overrides(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=help_text or "override one config value, e.g. --set orchestrator.steps=20 (repeatable)",
    )


def no_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress", action="store_true", help="print no progress bar (railgate's or any library's)"
    )


def progress_flag(args: argparse.Namespace) -> bool | None:
    """The ``progress`` argument of the long jobs: ``False`` with ``--no-progress``, else ``None``
    (a bar when the output is a terminal)."""
    return False if getattr(args, "no_progress", False) else None
