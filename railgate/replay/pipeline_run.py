"""A replay through the real pipeline: the orchestrator, its group tracker and the configured gate
and controller, unchanged, over the replay engine (``engine.kind: replay``), with the learner off.

``replay_through_pipeline(cfg)`` returns one ``PromptOutcome`` per replayed prompt, sorted by
prompt id: what ``bench replay``'s direct driver is held to. How each field is read:

* ``opened``: the gate opened a group for the prompt (each prompt at most once: the pool is one
  pass, ``controller.prompts.OnePassPool``); never opened -> ``skipped`` with 0 samples (SARA's
  reference screen passing it over, or the run ending first).
* ``verdict``: ``committed`` when the group shipped; ``dropped`` when the gate committed it and it
  closed unshipped (fewer than two valid samples); ``abandoned`` when it closed otherwise;
  ``open`` when the run ended with it still open (a held group).
* ``samples`` and ``tokens``: the requests the engine served for the prompt (failed ones
  included) and the tokens they generated, aborted samples' partial tokens included
  (``ReplayEngine.usage``).
* ``decided_at``: the samples of the group that had ended (valid, failed or unrewarded) when the
  gate first proposed ``COMMIT`` or ``ABANDON`` for it (0: never); read by watching the gate's
  snapshots and actions (``_Watched``).

The run covers the whole log: ``orchestrator.steps`` is raised to the number of replayed prompts
(a step trains at least one group), so the run ends when every prompt was offered and nothing
can run any more (``stop_reason`` "prompts exhausted"), or at ``orchestrator.max_rollouts``.

>>> import tempfile
>>> from pipeline.store.grouplog import GroupLogWriter, RecordedGroup
>>> d = tempfile.mkdtemp()
>>> with GroupLogWriter(d, fsync=False) as w:
...     w.write([RecordedGroup.of(g, prompt_id=g, rewards=[g % 2, 1, 0, 1]) for g in range(6)])
>>> from railgate.config import load_config
>>> cfg = load_config(None, ["engine.kind=replay", f"replay.log={d}", "gate.kind=uniform",
...                          "orchestrator.group_size=4", "orchestrator.batch_groups=2"])
>>> [(o.prompt_id, o.verdict, o.samples, o.tokens) for o in replay_through_pipeline(cfg)][:2]
[(0, 'committed', 4, 32), (1, 'committed', 4, 32)]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import anyio

from pipeline.config.build import ConfigError
from pipeline.orchestrator import RunSummary
from pipeline.protocols import Gate
from pipeline.replay.outcome import PromptOutcome
from pipeline.types import ActionKind, GroupAction, GroupPlan, GroupSnapshot, TrainBatch
from railgate.build import build_components, build_orchestrator
from railgate.config import RunConfig


@dataclass
class PipelineReplay:
    """What one replay through the pipeline did: per prompt, the run's summary, the engine's counters."""

    outcomes: list[PromptOutcome]
    summary: RunSummary
    engine_metrics: dict[str, float]


def replay_through_pipeline(cfg: RunConfig) -> list[PromptOutcome]:
    """One ``PromptOutcome`` per replayed prompt of ``cfg.replay.log``, sorted by prompt id (module docstring)."""
    return run_replay(cfg).outcomes


def run_replay(cfg: RunConfig) -> PipelineReplay:
    """Replay ``cfg.replay.log`` through the pipeline (``engine.kind`` must be ``replay``)."""
    if cfg.engine.kind != "replay":
        raise ConfigError(
            f"engine.kind={cfg.engine.kind}: a pipeline replay needs engine.kind=replay (--set engine.kind=replay "
            "--set replay.log=PATH)"
        )
    parts = build_components(cfg, progress=False)
    prompts = len(parts.engine.order.prompts)
    o = cfg.orchestrator
    cfg = dataclasses.replace(cfg, orchestrator=dataclasses.replace(o, steps=max(o.steps, prompts)))
    watched = _Watched(parts.gate)
    orchestrator = build_orchestrator(cfg, dataclasses.replace(parts, gate=watched))
    try:
        summary = anyio.run(orchestrator.run)
    finally:
        anyio.run(parts.engine.aclose)
        parts.scoring.close()
    engine = parts.engine
    outcomes = [watched.outcome(p.prompt_id, engine.usage(p.prompt_id)) for p in engine.order.prompts]
    return PipelineReplay(sorted(outcomes, key=lambda x: x.prompt_id), summary, engine.metrics())


class _Watched(Gate):
    """The run's gate, unchanged, with what a replay's outcomes need noted on the way: which
    prompt each group is, how many of its samples had ended when the gate first committed or
    abandoned it, what it proposed last and how the group closed."""

    def __init__(self, inner: Gate):
        self.inner = inner
        self._group_of: dict[int, int] = {}  # prompt id -> its group id
        self._ended: dict[int, int] = {}  # group id -> samples ended at its latest snapshot
        self._decided_at: dict[int, int] = {}
        self._last: dict[int, ActionKind] = {}  # group id -> the gate's latest COMMIT or ABANDON
        self._closed: dict[int, bool] = {}  # group id -> shipped

    @property
    def abandons(self) -> bool:  # type: ignore[override]
        return self.inner.abandons

    @property
    def uncounted_rollouts(self) -> int:
        return self.inner.uncounted_rollouts

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        plans = self.inner.admit(group_ids, step)
        for plan in plans:
            pid = plan.prompt.prompt_id
            if pid in self._group_of:
                raise RuntimeError(
                    f"the gate opened a second group for replayed prompt {pid}; a replay has one group of samples "
                    "per prompt (its pool is one pass)"
                )
            self._group_of[pid] = plan.group_id
        return plans

    def update(self, snapshot: GroupSnapshot) -> list[GroupAction]:
        self._ended[snapshot.group_id] = len(snapshot.rewards) + snapshot.failed
        return self._saw(self.inner.update(snapshot))

    def on_step(self, step: int, batch: TrainBatch) -> list[GroupAction]:
        return self._saw(self.inner.on_step(step, batch))

    def on_closed(self, group_id: int, committed: bool) -> None:
        self._closed[group_id] = committed
        self.inner.on_closed(group_id, committed)

    def _saw(self, actions: list[GroupAction]) -> list[GroupAction]:
        for a in actions:
            if a.kind is ActionKind.COMMIT or a.kind is ActionKind.ABANDON:
                self._decided_at.setdefault(a.group_id, self._ended.get(a.group_id, 0))
                self._last[a.group_id] = a.kind
        return actions

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def outcome(self, prompt_id: int, usage: tuple[int, int]) -> PromptOutcome:
        samples, tokens = usage
        gid = self._group_of.get(prompt_id)
        if gid is None:
            return PromptOutcome(prompt_id, False, "skipped", samples, tokens, 0)
        if gid not in self._closed:
            verdict = "open"
        elif self._closed[gid]:
            verdict = "committed"
        else:
            verdict = "dropped" if self._last.get(gid) is ActionKind.COMMIT else "abandoned"
        return PromptOutcome(prompt_id, True, verdict, samples, tokens, self._decided_at.get(gid, 0))
