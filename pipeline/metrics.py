"""Budget accounting and metric output.

Metric names are namespaced (``pipeline/``, ``gate/``, ``controller/``, ``learner/``,
``engine/``, ``eval/``) against one global step -- the learner step -- and are the same in the
JSONL log, TensorBoard and the final report.

>>> b = Budget()
>>> b.rollouts_started += 8; b.rollouts_finished += 8; b.groups_opened += 1; b.groups_effective += 1
>>> b.as_metrics()["pipeline/effective_yield"]
1.0
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline.types import FinishReason


@dataclass
class Budget:
    """Everything the run paid for, and what it got. Cumulative over the run."""

    rollouts_started: int = 0
    rollouts_finished: int = 0  # completed normally (STOP or LENGTH)
    rollouts_aborted: int = 0
    rollouts_failed: int = 0  # the engine raised
    tokens_generated: int = 0  # every token any sample produced, aborted ones included
    tokens_trained: int = 0  # tokens of samples that reached the learner
    groups_opened: int = 0
    groups_committed: int = 0
    groups_abandoned: int = 0
    groups_effective: int = 0  # committed and with non-zero reward spread
    groups_dropped_empty: int = 0  # committed with fewer than 2 valid samples
    reward_errors: int = 0
    reward_timeouts: int = 0
    rewards_none: int = 0  # completed samples the reward function gave no reward (None): not trained on
    staleness_sum: int = 0
    staleness_max: int = 0
    rollouts_trained: int = 0
    rollouts_intervention: int = 0  # launched by a controller's intervention (branch, resample)
    turns: int = 0  # turns of multi-turn episodes (a rollout is an episode there)
    env_failures: int = 0  # episodes ended by an environment that failed (raised, hung, answered wrongly)
    episodes_truncated_context: int = 0  # episodes ended because their next turn could not fit the model's context
    interventions_dropped: int = 0  # token-level interventions that arrived after their group closed

    def count_rollout_end(self, reason: FinishReason) -> None:
        """Count a rollout that ended for ``reason``: aborted, failed (the engine raised) or finished.

        >>> b = Budget()
        >>> for r in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORTED, FinishReason.ERROR):
        ...     b.count_rollout_end(r)
        >>> b.rollouts_finished, b.rollouts_aborted, b.rollouts_failed
        (2, 1, 1)
        """
        if reason is FinishReason.ABORTED:
            self.rollouts_aborted += 1
        elif reason is FinishReason.ERROR:
            self.rollouts_failed += 1
        else:
            self.rollouts_finished += 1

    def count_turn(self, reason: FinishReason) -> None:
        """Count one turn of a multi-turn episode, whatever its reason (the episode's end is
        counted as a rollout once it is scored, ``count_episode_end``)."""
        self.turns += 1

    def count_episode_end(self, reason: FinishReason, env_failed: bool, truncated: bool) -> None:
        """Count an episode that ended for ``reason``: a rollout's end, and an environment
        failure or a truncation at the model's context."""
        self.env_failures += env_failed
        self.episodes_truncated_context += truncated
        self.count_rollout_end(reason)

    @property
    def tokens_wasted(self) -> int:
        return self.tokens_generated - self.tokens_trained

    @property
    def rollouts_untrained(self) -> int:
        """Rollouts started that no step trained on: abandoned, failed, left without a reward,
        or in groups still open when the run ended."""
        return self.rollouts_started - self.rollouts_trained

    def as_metrics(self) -> dict[str, float]:
        out = {f"pipeline/{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out["pipeline/tokens_wasted"] = float(self.tokens_wasted)
        out["pipeline/rollouts_untrained"] = float(self.rollouts_untrained)
        out["pipeline/effective_yield"] = self.groups_effective / max(1, self.groups_opened)
        out["pipeline/rollouts_per_effective_group"] = (
            self.rollouts_started / self.groups_effective if self.groups_effective else math.nan
        )
        out["pipeline/staleness_mean"] = self.staleness_sum / max(1, self.rollouts_trained)
        return out

    def state_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, int(state[f.name]))


class MetricsWriter:
    """Appends one JSON line per step to ``metrics.jsonl`` (and TensorBoard scalars when the
    ``tensorboard`` package is installed and enabled)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1)
        self._tb = None
        # find_spec first: torch.utils.tensorboard imports torch (seconds) before it finds
        # that the tensorboard package is missing, and a simulator run needs no torch
        if tensorboard and importlib.util.find_spec("tensorboard") is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except Exception:  # tensorboard is optional; JSONL is the record
                self._tb = None

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        record = {
            "step": step,
            **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in clean.items()},
        }
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


class NullMetricsWriter:
    """Writes nothing (benchmarks that collect metrics in memory)."""

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


SUPERSEDED = "superseded"
"""The key ``mark_superseded_steps`` adds (true) to the lines a resumed run writes again."""


def mark_superseded_steps(path: str | Path, after_step: int) -> int:
    """Mark the lines of steps above ``after_step`` (written by a run killed after the checkpoint
    of that step, which the resumed run does again) with ``"superseded": true``, and drop a torn
    last line; the file is rewritten whole (``pipeline.store.atomic``). Returns the lines marked.

    ``metrics.jsonl`` stays append-only otherwise: a reader skips the marked lines
    (``read_metrics`` does), and then holds each step once, as the run that counted it wrote it.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
    >>> _ = path.write_text('{"step": 1, "x": 1}\\n{"step": 2, "x": 2}\\n{"step": 3, "x": 3}\\n{"step": 4')
    >>> mark_superseded_steps(path, 1)
    2
    >>> _ = path.open("a").write('{"step": 2, "x": 20}\\n')
    >>> [(m["step"], m["x"]) for m in read_metrics(path)]
    [(1, 1), (2, 20)]
    """
    from pipeline.store.atomic import atomic_write

    path = Path(path)
    lines, marked = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line (a kill mid-write): nothing of it is usable
        if isinstance(record, dict) and not record.get(SUPERSEDED) and _step(record) > after_step:
            record[SUPERSEDED] = True
            marked += 1
            line = json.dumps(record)
        lines.append(line)
    atomic_write(path, "".join(f"{line}\n" for line in lines))
    return marked


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a ``metrics.jsonl`` except those a resumed run superseded
    (``mark_superseded_steps``); a torn line is skipped."""
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and not record.get(SUPERSEDED):
            out.append(record)
    return out


def _step(record: dict[str, Any]) -> float:
    step = record.get("step")
    return float(step) if isinstance(step, (int, float)) else float("-inf")
