"""``gate.mode: shadow`` in railgate's own trainer: train as GRPO, log what the gate would have done.

The run is built and trained with ``training_config(cfg)`` -- ``cfg`` with ``gate.kind: uniform``
(every group whole; the configured gate's decisions are never applied) -- so it trains exactly
as the same run with ``gate.kind=uniform`` does. Each learner step's batch passes through
``ShadowRecorder`` (the run's ``Buffer``, in front of the Arrow buffer when there is one), which

* writes the step's full groups to ``run_dir/groups/`` as a group log (one write per step,
  ``pipeline.store.grouplog``): prompt text, answer, difficulty and success threshold from the
  prompt pool, completion token ids (text empty: the log keeps tokens, decode them with the run's
  tokenizer), lengths, rewards, ``policy_version`` of each sample, ``step`` = the learner step
  (0-based) the group was trained at; ``finish_order`` = sample index (a committed group keeps its
  samples in index order, not in the order they finished); ``reference_logprob`` null;
* replays the configured gate on those groups (``railgate.shadow_gate``: one replay per step,
  a fresh gate, order seed 0, ``replayed_config(cfg)``) and hands the figures, as ``shadow/NAME``
  and running totals ``shadow/total_NAME``, to the step's line of ``metrics.jsonl``
  (``ShadowMetrics``).

A group with fewer than ``group_size`` trained samples (a sample failed or got no reward) cannot
be a full group of the log: it is left out and counted (``shadow/groups_not_full``).
``python run.py bench replay RUN_DIR/groups --per-step`` recomputes the figures from the log and
its ``shadow.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.store.grouplog import GroupLogWriter, RecordedGroup, RecordedSample
from pipeline.types import CommittedGroup, Prompt, TrainBatch
from railgate.config import RunConfig
from railgate.shadow_gate import ShadowRule, ShadowTally, replayed_config

GROUPS_DIR = "groups"
"""Where in the run directory a shadow run writes its group log."""

PREFIX = "shadow/"


def training_config(cfg: RunConfig) -> RunConfig:
    """What a shadow run trains with: ``cfg`` with ``gate.kind: uniform`` (``gate.mode: live``)."""
    return dataclasses.replace(cfg, gate=dataclasses.replace(cfg.gate, kind="uniform", mode="live"))


def recorded_group(group: CommittedGroup, prompt: Prompt, step: int) -> RecordedGroup:
    """A committed group as a group-log group (the module docstring has the columns)."""
    samples = tuple(
        RecordedSample(
            index=r.sample_index,
            reward=float(r.reward),
            num_tokens=len(r.token_ids),
            finish_order=r.sample_index,
            token_ids=tuple(r.token_ids),
            finish_reason=r.finish_reason,
            policy_version=r.policy_version,
        )
        for r in group.rollouts
    )
    return RecordedGroup(
        group_id=group.group_id,
        prompt_id=group.prompt_id,
        samples=samples,
        step=step,
        prompt_text=prompt.text,
        answer=prompt.answer,
        difficulty=prompt.difficulty,
        reference_logprob=None,
        success_threshold=group.success_threshold,
    )


class ShadowRecorder:
    """The shadow run's ``Buffer``: records each trained batch's groups and their shadow figures,
    then passes the batch to ``inner`` (the Arrow buffer, or none)."""

    def __init__(
        self,
        run_dir: str | Path,
        cfg: RunConfig,
        prompt: Callable[[int], Prompt],
        inner: Any = None,
        run_id: str = "",
    ):
        self.directory = Path(run_dir) / GROUPS_DIR
        self.rule = ShadowRule(replayed_config(cfg))
        self.rule.save(self.directory)
        self.writer = GroupLogWriter(self.directory, run_id=run_id)
        self.prompt, self.inner = prompt, inner
        self.tally = ShadowTally()
        self.not_full = 0
        self.pending: dict[int, dict[str, float]] = {}
        """Figures by the metrics step they belong to (a batch of step s is recorded as s + 1)."""

    def put(self, batch: TrainBatch, advantages: Sequence[Sequence[float]] | None = None) -> Any:
        k = self.rule.group_size
        groups = []
        for g in batch.groups:
            if len(g.rollouts) == k and sorted(r.sample_index for r in g.rollouts) == list(range(k)):
                groups.append(recorded_group(g, self.prompt(g.prompt_id), batch.step))
            else:
                self.not_full += 1
        self.writer.write(groups)
        figures = self.rule.figures(groups)
        record = {**figures, **self.tally.add(figures), "groups_not_full": float(self.not_full)}
        self.pending[batch.step + 1] = {PREFIX + name: value for name, value in record.items()}
        if self.inner is not None:
            return self.inner.put(batch, advantages)
        return None

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            if self.inner is not None:
                self.inner.close()


class ShadowMetrics:
    """The run's metrics writer with each step's ``shadow/*`` figures added to its line (in place,
    so the step callbacks see them too)."""

    def __init__(self, inner: Any, recorder: ShadowRecorder):
        self.inner, self.recorder = inner, recorder

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        metrics.update(self.recorder.pending.pop(step, {}))
        self.inner.write(step, metrics)

    def close(self) -> None:
        self.inner.close()
