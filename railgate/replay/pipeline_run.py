"""A replay through the real pipeline: the orchestrator, its group tracker and the configured gate
and controller, unchanged, over the replay engine (``engine.kind: replay``), with the learner off.

``replay_through_pipeline(cfg)`` returns one ``PromptOutcome`` per replayed prompt, sorted by
prompt id: what ``bench replay``'s direct driver is held to. How each field is read:

* ``opened``: the gate opened a group for the prompt (each prompt at most once: the pool is one
  pass, ``controller.prompts.OnePassPool``); never opened -> ``skipped`` with 0 samples (SARA's
  reference screen passing it over, or the run ending first).
* ``verdict`` and ``decided_at``: as ``pipeline.replay.watch.WatchedGate`` reads them from the
  gate, the same watcher ``bench replay``'s driver uses.
* ``samples`` and ``tokens``: the requests the engine served for the prompt (failed ones
  included) and the tokens they generated, aborted samples' partial tokens included
  (``ReplayEngine.usage``).

The run covers the whole log (``railgate.replay.gate_parts.replay_orchestrator``): it ends when
every prompt was offered and nothing can run any more (``stop_reason`` "prompts exhausted"), or
at ``orchestrator.max_rollouts``.

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

import anyio

from pipeline.config.build import ConfigError
from pipeline.replay.outcome import PromptOutcome
from pipeline.replay.watch import WatchedGate
from pipeline.shells.orchestrator import RunSummary
from railgate.build import build_components, build_orchestrator
from railgate.config import RunConfig
from railgate.replay.gate_parts import replay_orchestrator


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
    cfg = dataclasses.replace(cfg, orchestrator=replay_orchestrator(cfg.orchestrator, len(parts.engine.order.prompts)))
    watched = WatchedGate(parts.gate)
    orchestrator = build_orchestrator(cfg, dataclasses.replace(parts, gate=watched))
    try:
        summary = anyio.run(orchestrator.run)
    finally:
        anyio.run(parts.engine.aclose)
        parts.scoring.close()
    engine = parts.engine
    outcomes = [watched.outcome(p.prompt_id, *engine.usage(p.prompt_id)) for p in engine.order.prompts]
    return PipelineReplay(sorted(outcomes, key=lambda x: x.prompt_id), summary, engine.metrics())
