"""``railgate bench``: side-by-side benchmarks, a table of their own.

``bench engine`` takes its own options (``railgate bench engine --help``) and is dispatched before
the rest are parsed (``engine_passthrough``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from configs import CONFIG_DIR, SCENARIO_DIR
from railgate.cli.command import Command, config_options, no_progress, overrides


def _overhead_options(parser: argparse.ArgumentParser) -> None:
    config_options(parser, CONFIG_DIR / "bench_overhead.yaml")
    parser.add_argument("--long-steps", type=int, default=None, help="steps of the long-running memory check")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_overhead"), help="output directory")


def _overhead(args: argparse.Namespace) -> int:
    from railgate.bench.overhead import run_overhead_bench
    from railgate.config import load_config

    cfg = load_config(args.config, args.overrides)
    run_overhead_bench(cfg, args.out, long_steps=args.long_steps, progress=not args.no_progress)
    return 0


def _recover_options(parser: argparse.ArgumentParser) -> None:
    config_options(parser, CONFIG_DIR / "default.yaml")
    parser.add_argument("--prompts", type=int, default=400, help="held-out prompts (default: %(default)s)")
    parser.add_argument("--branches", type=int, default=4, help="continuations per cut point (default: %(default)s)")
    parser.add_argument(
        "--failed-per-prompt", type=int, default=2, help="failed responses branched per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bench_recover"), help="output directory (base model cached there)"
    )


def _recover(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.bench.recover import measure_recoverability, render
    from railgate.config import load_config

    cfg = load_config(args.config, args.overrides)
    if cfg.engine.kind == "sim":
        raise ConfigError(
            f"bench recover needs a real model; {args.config} sets engine.kind=sim: use "
            "configs/default.yaml or set engine.kind=torch"
        )
    if cfg.task.name == "env":  # episodes of turns: branches from failed turns' boundaries
        from railgate.bench.recover_turns import measure_turn_recoverability, render_turns

        measure, show = measure_turn_recoverability, render_turns
    else:
        measure, show = measure_recoverability, render
    report = measure(
        cfg,
        args.out,
        prompts=args.prompts,
        branches=args.branches,
        failed_per_prompt=args.failed_per_prompt,
        progress=not args.no_progress,
    )
    print(show(report))
    print(f"wrote {args.out / 'recover.md'} and {args.out / 'recover.json'}")
    return 0


def _allocation_options(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", type=Path, default=CONFIG_DIR / "bench_allocation.yaml", help="base config")
        parser.add_argument(
            "--scenarios",
            default="balanced",
            help="sim: comma-separated names from configs/scenarios/, or 'all' (default: %(default)s)",
        )
        parser.add_argument(
            "--policies", default="all", help="comma-separated names from railgate/bench/policies.py, or 'all'"
        )
        parser.add_argument(
            "--models", default="effective,normalised", help="sim training models (default: %(default)s)"
        )
        parser.add_argument("--seeds", type=int, default=5 if name == "allocation" else 3)
        parser.add_argument(
            "--first-seed",
            type=int,
            default=0,
            help="seeds run from this one (default: %(default)s); add seeds to an earlier benchmark",
        )
        parser.add_argument(
            "--budget",
            type=int,
            default=None,
            help="rollouts per run, equal for every policy (default: 16384 sim, 20480 real model)",
        )
        parser.add_argument("--target-gain", type=float, default=0.08, help="target = start accuracy + this")
        parser.add_argument("--workers", type=int, default=2, help="parallel runs")
        parser.add_argument("--out", type=Path, default=Path(f"runs/bench_{name}"))
        parser.add_argument(
            "--add",
            action="store_true",
            help="keep the runs already in OUT (other policies or seeds, same --budget and --set) and report all together",
        )
        overrides(parser, "config override applied to every run (repeatable)")

    return configure


def _allocation(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.bench import policies as named
    from railgate.bench.allocation import BenchGrid, is_sim_config, run_allocation_bench

    sim = is_sim_config(args.config)
    scenarios = (
        sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")) if args.scenarios == "all" else args.scenarios.split(",")
    )
    every = named.RAIL if args.bench == "rail" else (named.SIM_ALLOCATION if sim else named.MODEL_ALLOCATION)
    policies = list(every) if args.policies == "all" else args.policies.split(",")
    budget = args.budget if args.budget is not None else (16384 if sim else 20480)
    if args.seeds < 1 or budget < 1 or args.workers < 1:
        raise ConfigError(f"--seeds={args.seeds}, --budget={budget} and --workers={args.workers} must be >= 1")
    if args.first_seed < 0:
        raise ConfigError(f"--first-seed={args.first_seed} must be >= 0")
    title = "RAIL benchmark" if args.bench == "rail" else "Allocation benchmark"
    bench = BenchGrid(
        args.config,
        scenarios if sim else [""],
        policies,
        args.seeds,
        budget,
        args.models.split(",") if sim else [""],
        extra=tuple(args.overrides),
        first_seed=args.first_seed,
    )
    run_allocation_bench(
        bench,
        args.out,
        args.target_gain,
        workers=args.workers,
        title=title,
        progress=not args.no_progress,
        add=args.add,
    )
    return 0


def _trl_options(parser: argparse.ArgumentParser) -> None:
    from railgate.bench.trl import TASKS, TrlBenchSpec
    from railgate.bench.trl_rewards import REWARDS

    d = TrlBenchSpec()
    parser.add_argument(
        "--model",
        choices=("cpu", "smollm"),
        default=d.model,
        help="cpu: the project's CPU model on arithmetic; smollm: SmolLM2-135M-Instruct on word problems",
    )
    parser.add_argument(
        "--task",
        choices=sorted({t for tasks in TASKS.values() for t in tasks}),
        default=d.task or None,
        help="the model's task (default: its first): smollm: word (word problems), questions (one-operation "
        "arithmetic questions, an easier start) or mixed (one-, two- and three-operation questions); cpu: arithmetic",
    )
    parser.add_argument(
        "--reward",
        choices=tuple(REWARDS),
        default=d.reward,
        help="smollm's grading: last (the last number in the completion) or marker (the number after "
        '"Answer:", which the prompt asks for; restating the prompt earns nothing) (default: %(default)s)',
    )
    parser.add_argument(
        "--seeds", type=int, default=d.seeds, help="seeds, each running both trainers (default: %(default)s)"
    )
    parser.add_argument("--first-seed", type=int, default=d.first_seed, help="the first seed (default: %(default)s)")
    parser.add_argument(
        "--budget", type=int, default=d.budget, help="rollouts each run generates (default: %(default)s)"
    )
    parser.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step, help="default: %(default)s")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="num_generations (default: %(default)s)")
    parser.add_argument(
        "--probe-size", type=int, default=d.probe_size, help="gate_probe_size (default: %(default)s: half the group)"
    )
    parser.add_argument(
        "--gate-defaults",
        action="store_true",
        help="the gated trainer keeps GatedGRPOConfig's reference settings (calibrated, not exact; skip 0.45), "
        "not the task's exact reference (output folder MODEL-defaults)",
    )
    parser.add_argument(
        "--gate-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a GatedGRPOConfig gate_* field for the gated trainer, after the task's settings "
        "(repeatable; the output folder names it), e.g. --gate-set gate_reference_skip=0.8",
    )
    parser.add_argument(
        "--eval-every", type=int, default=d.eval_every, help="rollouts between evaluations (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-prompts", type=int, default=d.eval_prompts, help="held-out prompts (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-samples", type=int, default=d.eval_samples, help="samples per held-out prompt (default: %(default)s)"
    )
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate, help="default: %(default)s")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads (default: %(default)s)")
    parser.add_argument(
        "--train-prompts", type=int, default=d.train_prompts, help="smollm: word problems (default: %(default)s)"
    )
    parser.add_argument(
        "--model-dir", default=d.model_dir, help="smollm: a SmolLM2-135M-Instruct directory (default: import it)"
    )
    parser.add_argument(
        "--peer-python",
        default=d.peer_python,
        help="the python of an environment with railgate and trl-cgrpo (which needs TRL < 1.15): C-GRPO runs "
        "there as a third trainer of each seed (docs/trl.md)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bench_trl"), help="output directory (default: %(default)s)"
    )
    no_progress(parser)


def _trl(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.bench.trl import TrlBenchSpec, run_trl_bench

    numbers = {
        k: getattr(args, k)
        for k in (
            "seeds",
            "budget",
            "prompts_per_step",
            "group_size",
            "probe_size",
            "eval_every",
            "eval_prompts",
            "eval_samples",
            "threads",
        )
    }
    least = {"group_size": 2, "probe_size": 0}
    bad = {k: v for k, v in numbers.items() if v < least.get(k, 1)}
    if bad:
        raise ConfigError(
            ", ".join(f"--{k.replace('_', '-')}={v}" for k, v in bad.items())
            + " must be >= 1 (--group-size >= 2, --probe-size >= 0); raise it"
        )
    pairs = [item.partition("=") for item in args.gate_set]
    if any(not sep or not name for name, sep, _ in pairs):
        raise ConfigError(
            f"--gate-set takes NAME=VALUE, got {args.gate_set!r}; e.g. --gate-set gate_reference_skip=0.8"
        )
    spec = TrlBenchSpec(
        model=args.model,
        task=args.task or "",
        reward=args.reward,
        first_seed=args.first_seed,
        learning_rate=args.learning_rate,
        train_prompts=args.train_prompts,
        model_dir=args.model_dir,
        peer_python=args.peer_python,
        gate_defaults=args.gate_defaults,
        gate_settings=tuple((name.strip(), value.strip()) for name, _, value in pairs),
        **numbers,
    )
    if spec.peer_python and not Path(spec.peer_python).exists():
        raise ConfigError(
            f"--peer-python={spec.peer_python} does not exist; make the peer environment first: "
            "python -m venv peer && peer/bin/pip install -e '.[cgrpo-peer]'"
        )
    try:
        spec.check()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    report = run_trl_bench(spec, args.out, progress=not args.no_progress)
    print((args.out / spec.label / "trl.md").read_text())
    return 0 if report["summary"]["seeds"] else 1


def _replay_options(parser: argparse.ArgumentParser) -> None:
    from railgate.replay.bench import DEFAULT_GATES, ReplaySpec

    d = ReplaySpec()
    parser.add_argument(
        "logs", nargs="*", type=Path, metavar="LOG", help="group logs (a directory, segment or file each)"
    )
    parser.add_argument(
        "--synthetic",
        default=None,
        metavar="PROMPTSxSAMPLES",
        help="replay a seeded synthetic log of this size instead (e.g. 1000x16): the replay's speed, not a model's",
    )
    parser.add_argument(
        "--format",
        choices=("auto", "native", "trl", "areal", "verl"),
        default="auto",
        help="the logs' format (default: %(default)s: told by the files)",
    )
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory, for logs that hold only text")
    parser.add_argument(
        "--num-generations", type=int, default=None, help="samples per prompt of a log that does not say (trl)"
    )
    parser.add_argument(
        "--on-bad-row",
        choices=("error", "skip"),
        default="error",
        help="a bad row: stop with its file and row, or leave its group out and count it (default: %(default)s)",
    )
    parser.add_argument(
        "--gates",
        default=",".join(DEFAULT_GATES),
        help="comma-separated policies of railgate/bench/policies.py (default: %(default)s)",
    )
    parser.add_argument("--group-size", type=int, default=0, help="samples per group, at most the log's K (default: K)")
    parser.add_argument(
        "--batch", type=int, default=d.batch, help="informative groups per learner step (default: %(default)s)"
    )
    parser.add_argument(
        "--orders",
        type=int,
        default=d.orders,
        help="replay orders: 0 as recorded, then seeded shuffles of prompts and samples (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write replay.json, replay.csv and replay.png here")
    parser.add_argument(
        "--per-step",
        action="store_true",
        help="a shadow run's log (gate.mode=shadow, gate_mode='shadow'): replay its gate step by step with the run's "
        "rule and print the per-step figures it logged (shadow/*; --out writes per_step.json and per_step.csv)",
    )
    overrides(parser, "config override applied to every gate after its policy's, e.g. --set gate.sara.probe_size=2")


def _replay(args: argparse.Namespace) -> int:
    from pipeline.config.build import ConfigError
    from railgate.replay.bench import ReplaySpec, replay_log
    from railgate.replay.render import table, write_outputs

    if args.per_step:
        return _replay_per_step(args)
    spec = ReplaySpec(
        gates=tuple(g.strip() for g in args.gates.split(",") if g.strip()),
        group_size=args.group_size,
        batch=args.batch,
        orders=args.orders,
        extra=tuple(args.overrides),
    )
    spec.check()
    if bool(args.logs) == bool(args.synthetic):
        raise ConfigError("bench replay: give group logs (LOG ...) or --synthetic PROMPTSxSAMPLES, not both or neither")
    reports = []
    for log in _replay_logs(args):
        report = replay_log(log, spec, progress=not args.no_progress)
        reports.append(report)
        print(table(report))
        print()
    if args.out is not None:
        written = write_outputs(reports, args.out)
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _replay_logs(args: argparse.Namespace):
    """The logs ``bench replay`` replays, read one at a time."""
    from railgate.replay.bench import open_replay_log
    from railgate.replay.synthetic import parse_size, synthetic_log

    if args.synthetic:
        yield synthetic_log(*parse_size(args.synthetic))
    for path in args.logs:
        yield open_replay_log(path, args.format, args.tokenizer, args.num_generations, args.on_bad_row)


def _replay_per_step(args: argparse.Namespace) -> int:
    """``bench replay --per-step``: each shadow log's steps replayed with the rule its run saved."""
    from pipeline.config.build import ConfigError
    from railgate.shadow_gate import per_step_table, replay_per_step, write_per_step

    if args.overrides or args.format not in ("auto", "native"):
        raise ConfigError(
            "--per-step replays a shadow log with the gate and settings its run saved (shadow.json); drop --set "
            "and --format, or replay without --per-step"
        )
    for path in args.logs:
        rows = replay_per_step(path)
        print(f"{path}:")
        print(per_step_table(rows))
        if args.out is not None:
            out = args.out / path.name if len(args.logs) > 1 else args.out
            print("wrote " + ", ".join(str(p) for p in write_per_step(rows, out)))
    return 0


def _engine_placeholder(args: argparse.Namespace) -> int:  # reached only through engine_passthrough
    return engine_passthrough([])


BENCHES: tuple[Command, ...] = (
    Command(
        "overhead", "pipeline vs raw engine throughput; hook latency; long-run memory", _overhead_options, _overhead
    ),
    Command(
        "allocation",
        "every allocation policy side by side (sim; a real model with --config configs/bench_allocation_torch.yaml)",
        _allocation_options("allocation"),
        _allocation,
    ),
    Command(
        "rail",
        "SARA alone, with the ARPO heuristic, with RAIL (live, shadow-to-live); GRPO and the oracle",
        _allocation_options("rail"),
        _allocation,
    ),
    Command(
        "recover",
        "success of branches from failed responses' prefixes vs fresh samples (a fixed warm-started base model)",
        _recover_options,
        _recover,
    ),
    Command(
        "trl",
        "TRL's GRPOTrainer against GatedGRPOTrainer on the same model, data, reward and budget (needs the trl extra)",
        _trl_options,
        _trl,
    ),
    Command(
        "replay",
        "every gate replayed exactly on the same recorded groups (group logs), paired: yield per rollout and "
        "token, cost of a step, wrong abandons, selection",
        _replay_options,
        _replay,
    ),
    Command(
        "engine",
        "the torch engine's tokens/s against transformers generate and continuous batching, same run "
        "(options: python run.py bench engine --help); 'bench engine vllm|ray' for those engines",
        lambda parser: None,
        _engine_placeholder,
    ),
)


def engine_passthrough(argv: Sequence[str]) -> int:
    """``bench engine [vllm|ray] ...``: the engine benchmarks parse their own options."""
    if list(argv[:1]) in (["vllm"], ["ray"]):
        from railgate.bench.engines import main as bench_engines_main

        bench_engines_main(list(argv))
    else:
        from railgate.bench.throughput import main as bench_engine_main

        bench_engine_main(list(argv))
    return 0


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for bench in BENCHES:
        bench.register(sub)


def _run(args: argparse.Namespace) -> int:  # each bench sets its own handler, which replaces this one
    raise AssertionError(f"bench {args.bench}: no handler registered")


COMMAND = Command("bench", "side-by-side benchmarks", _configure, _run)
