"""What a run is made of and where it writes: the two bundles the orchestrator is built from.

``railgate.build`` makes ``RunParts`` from a run config (``build_orchestrator``); tests and
benchmarks that build parts by hand pass them the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.clock import VirtualClock, WallClock
from pipeline.core.actions import EnvStep
from pipeline.core.hooktimer import HookTimer
from pipeline.core.lifecycles import Lifecycle, SingleTurn
from pipeline.engines.base import Engine
from pipeline.metrics import MetricsWriter, NullMetricsWriter
from pipeline.protocols import (
    Buffer,
    Controller,
    DecisionSink,
    EpisodeService,
    Evaluator,
    Gate,
    Learner,
    ReferenceScores,
)
from pipeline.tasks.rewards.scoring import ScoringService


@dataclass
class RunParts:
    """The working parts of one run."""

    engine: Engine
    gate: Gate
    controller: Controller
    scoring: ScoringService
    """The reward, run off the event loop under a timeout."""
    learner: Learner
    clock: VirtualClock | WallClock
    """Engine time: a ``VirtualClock`` for the simulator (learning then runs inline), else the wall."""
    evaluator: Evaluator | None = None
    """Held-out evaluation at the start and every ``eval_every`` steps; None: none."""
    reference: ReferenceScores | None = None
    """``gate.sara.reference_prior``: where the learner's reference likelihoods go after each step."""
    lifecycle: Lifecycle = field(default_factory=SingleTurn)
    """How a sample runs from its start to its end (``pipeline.core.lifecycles``): one engine request
    (``SingleTurn``), or an episode of turns (``Episodes``, with ``episodes``)."""
    episodes: EpisodeService | None = None
    """The task is an environment: every sample is an episode of turns (``lifecycle`` is
    ``Episodes(episodes.settings)``), stepped through this."""
    prompts_left: Callable[[], int] | None = None
    """A finite prompt source (a replay visits each recorded group once): how many prompts it can
    still hand out. At 0, once nothing can run, the run ends ("prompts exhausted") instead of
    stalling with ``GateStalled``. None: an endless source (an epoch-cycling pool)."""

    def __post_init__(self) -> None:
        steps_envs = self.lifecycle.answer is EnvStep
        if steps_envs != (self.episodes is not None):
            raise ValueError(
                f"RunParts got lifecycle {type(self.lifecycle).__name__} and episodes={self.episodes!r}: a run of "
                "episodes needs both lifecycle=Episodes(service.settings) and episodes=service, a run of single "
                "turns neither"
            )


@dataclass
class RunOutputs:
    """Where a run writes, and whom it tells after each step; everything is optional."""

    buffer: Buffer | None = None
    """Every trained batch (``pipeline.store.buffer.ArrowBuffer``)."""
    trace: DecisionSink | None = None
    """Every decision and outcome (``pipeline.store.tracelog.TraceLog``)."""
    metrics: MetricsWriter | NullMetricsWriter | None = None
    """One line per learner step (``metrics.jsonl``, TensorBoard)."""
    on_step: Callable[[int, dict[str, float]], None] | None = None
    """Called with each step's metrics (progress bars, benchmarks)."""
    checkpoint: Callable[[dict[str, Any]], None] | None = None
    """Writes a checkpoint's state (``railgate.checkpoint.CheckpointWriter``)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (with one at the last step and on an interrupt); 0: none."""
    hook_timer: HookTimer | None = None
    """Times every gate and controller decision hook (``bench overhead``)."""
