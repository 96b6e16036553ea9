"""``railgate record``: full groups from a real model into a group log, for exact replay of any gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from configs import DEFAULT_CONFIG
from railgate.cli.command import Command, config_options, progress_flag

DESCRIPTION = """\
Sample K completions of each of the first P training prompts of the config's task (the task's
seeded order: data.seed, data.num_train_prompts) with the run's sampling settings
(orchestrator.temperature, top_p, max_tokens), score them with the task's reward and write one
full group per prompt into a group log (groups-NNNNN.arrows segments and record.json in --out).

Without --model it samples the config's model: the project's warm-started model cached in the
config's run directory (built on first use, as `python run.py` does), or model.path. With
--model DIR it loads that Hugging Face directory (e.g. SmolLM2 from `run.py import-model`).

Each finished batch of prompts is written (and fsynced) before the next starts: a run that was
interrupted or crashed resumes with the same command, recording only the prompts it lacks.
A directory recorded with another model, task, seed, P, K, engine or sampling is refused.

With --trl-task word|questions|mixed it records a `bench trl` chat task instead (--model DIR, a
chat model, on the torch engine): the rows a bench trl run of seed --seed trains on, in its order,
the prompts rendered by the model's chat template as TRL renders them, sampled at bench trl's
temperature, top_p and the task's max_completion_length (these replace the config's), scored by
the task's TRL reward (--trl-reward), with the reference column's likelihood as TRL's reference
prior scores it (railgate/record_trl.py). --train-prompts and --eval-prompts are bench trl's
(they decide which rows are training rows; questions needs --eval-prompts 64, as bench trl).

  python run.py record --prompts 256 --out runs/record_default_256
  python run.py record --config configs/smollm2.yaml --model runs/smollm2-hf --prompts 64 --samples 8 --out runs/rec_smol
  python run.py record --config configs/smollm2.yaml --model runs/smollm2-hf --trl-task questions --eval-prompts 64 \
      --prompts 256 --out runs/smollm2_questions_base
"""


def _configure(parser: argparse.ArgumentParser) -> None:
    from railgate.bench.trl import TASKS, TrlBenchSpec
    from railgate.bench.trl_rewards import REWARDS

    config_options(parser, DEFAULT_CONFIG)
    parser.add_argument("--prompts", type=int, required=True, metavar="P", help="the first P training prompts")
    parser.add_argument(
        "--samples", type=int, default=16, metavar="K", help="samples per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="the group log directory (resumed if it holds groups)"
    )
    parser.add_argument("--model", type=Path, metavar="DIR", help="a Hugging Face model directory (sets model.path)")
    parser.add_argument("--task", metavar="NAME", help="the task (sets task.name; its settings: --set task.NAME.*)")
    parser.add_argument(
        "--engine",
        choices=("torch", "vllm"),
        help="the engine (default: the config's engine.kind where it is torch or vllm, else torch)",
    )
    parser.add_argument(
        "--batch-prompts",
        type=int,
        metavar="N",
        help="prompts sampled at once (default: as many as fill torch_engine.max_batch with their K samples)",
    )
    parser.add_argument("--seed", type=int, metavar="S", help="the run seed the samples' seeds derive from (sets seed)")
    trl = parser.add_argument_group("bench trl tasks (railgate/record_trl.py)")
    trl.add_argument(
        "--trl-task",
        choices=TASKS["smollm"],
        help="record this bench trl chat task's training rows in bench trl's order of --seed (needs --model)",
    )
    trl.add_argument(
        "--trl-reward", choices=tuple(REWARDS), default="last", help="the task's grading (default: %(default)s)"
    )
    trl.add_argument(
        "--train-prompts",
        type=int,
        default=TrlBenchSpec.train_prompts,
        help="bench trl's --train-prompts (default: %(default)s)",
    )
    trl.add_argument(
        "--eval-prompts",
        type=int,
        default=TrlBenchSpec.eval_prompts,
        help="bench trl's --eval-prompts (default: %(default)s; questions: 64)",
    )


def _run(args: argparse.Namespace) -> int:
    from railgate.config import ConfigError, load_config
    from railgate.record import RecordPlan, record

    overrides = list(args.overrides)
    if args.model is not None:
        overrides.append(f"model.path={args.model}")
    if args.task is not None:
        overrides.append(f"task.name={args.task}")
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    source = None
    if args.trl_task is not None:
        from railgate.record_trl import TrlRecordSource

        if args.task is not None or args.model is None or args.engine == "vllm":
            raise ConfigError(
                f"--trl-task {args.trl_task} records a bench trl task from --model DIR on the torch engine; "
                "give --model, and leave out --task and --engine vllm"
            )
        source = TrlRecordSource(args.trl_task, args.trl_reward, args.train_prompts, args.eval_prompts)
        seed = load_config(args.config, overrides).seed
        sampling = source.sampling(source.task(), seed)
        overrides += [f"orchestrator.{k}={v}" for k, v in sampling.items()] + ["engine.kind=torch"]
    cfg = load_config(args.config, overrides)
    engine = args.engine or (cfg.engine.kind if cfg.engine.kind in ("torch", "vllm") else "torch")
    if engine != cfg.engine.kind:
        cfg = load_config(args.config, [*overrides, f"engine.kind={engine}"])
    plan = RecordPlan(args.prompts, args.samples, args.batch_prompts)
    try:
        result = record(cfg, args.out, plan, progress=progress_flag(args), source=source)
    except KeyboardInterrupt:
        from pipeline.store.grouplog import recorded_groups

        held = len(recorded_groups(args.out)) if args.out.exists() else 0
        print(
            f"interrupted: {args.out} keeps the {held} groups written before it (the batch being sampled is lost); "
            "run the same command again to record the rest",
            file=sys.stderr,
        )
        return 130
    print(result.summary())
    return 0


COMMAND = Command(
    "record",
    "full groups of K samples per prompt from a real model, into a group log (for replaying gates)",
    _configure,
    _run,
    description=DESCRIPTION,
)
