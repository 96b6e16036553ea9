"""What a replay's gate is, built once for both replay paths: the pipeline over the replay engine
(``railgate.build``'s ``_build_replay``) and ``bench replay``'s direct driver
(``railgate.replay.driver``). Both take their gate, its prompt pool, SARA's reference screen,
the oracle's success probability, the refusals and the run's limits from here, so that the
same config and replay order give the same gate in both.

* ``not_replayable(cfg, k)``: why ``cfg`` cannot be replayed on a log of ``k`` samples per group
  ("" when it can). A replay has only the recorded samples, so it refuses what needs new text
  (``controller.kind`` other than none: RAIL's branches and resamples; ``gate.sara.guidance``),
  what the log does not keep (``gate.sara.confident_pilot`` reads log-probabilities, which a
  replay serves as zeros), a HORA group that may grow past ``k`` (``gate.hora.max_group_size``
  must be set, at most ``k``), and DPS (``dps``, ``sara_dps``): DPS revisits prompts as its
  beliefs about them change, and a replay has one recorded group per prompt, offered once; every
  prompt it could pick would be unseen, with one shared belief, so its picks would be a seeded
  shuffle of the replay order and its figures those of its base gate, labelled DPS.
* ``build_replay_gate(cfg, order)``: the gate over a ``controller.prompts.OnePassPool`` of
  ``order.prompts`` (each replayed prompt offered once, in the replay order), seeded as in
  training (``derive_seed(cfg.seed, "gate")``), the oracle's ``success_probability`` the
  recorded group's success share, and, for SARA with ``reference_prior``, a
  ``ReferenceScreen`` holding every recorded ``reference_logprob`` from the start.
* ``replay_orchestrator(o, prompts)``: the run covers the whole log, so ``steps`` is raised
  past the number of replayed prompts (a learner step trains at least one group): the run ends
  at "prompts exhausted" (``pipeline.core.tracker``) or at ``max_rollouts``.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> from railgate.config import load_config
>>> log = GroupLog(tuple(RecordedGroup.of(g, g, (1, 0, 0, 1), reference_logprob=-0.7) for g in range(3)), ("demo",))
>>> cfg = load_config(None, ["gate.kind=sara", "gate.sara.reference_prior=true", "orchestrator.group_size=4"])
>>> parts = build_replay_gate(cfg, ReplayOrder(log))
>>> type(parts.gate).__name__, parts.pool.remaining, round(parts.screen.logprob(2), 2)
('SaraGate', 3, -0.7)
>>> not_replayable(load_config(None, ["gate.kind=hora"]), k=8)
'gate.kind=hora with gate.hora.max_group_size=0 may grow a group past the 8 samples per group the log holds; set gate.hora.max_group_size=8 or less'
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from controller.gates.registry import build_gate
from controller.prompts import OnePassPool
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration
from pipeline.config.build import ConfigError
from pipeline.config.sections import OrchestratorConfig
from pipeline.protocols import Gate
from pipeline.replay.order import ReplayOrder
from pipeline.seeding import derive_seed
from railgate.config import RunConfig


def not_replayable(cfg: RunConfig, k: int | None = None) -> str:
    """Why ``cfg`` cannot be replayed (on a log of ``k`` samples per group; None: any), "" when it can."""
    g = cfg.gate
    sara = g.sara
    if cfg.controller.kind != "none":
        return (
            f"controller.kind={cfg.controller.kind} intervenes with new text (branches, resamples, guidance) "
            "that no log holds; replay with controller.kind=none"
        )
    if g.kind in ("dps", "sara_dps"):
        return (
            f"gate.kind={g.kind}: DPS picks prompts again as its beliefs about them change, and a replay has one "
            "recorded group per prompt, offered once (its picks would be a shuffle of unseen prompts); replay "
            "another gate (uniform, ds, pilot_commit, hora, sara, oracle)"
        )
    if g.kind in ("sara", "sara_dps") and sara.guidance:
        return (
            f"gate.sara.guidance={sara.guidance} continues groups from reference prefixes: new text no log holds; "
            "set gate.sara.guidance=0"
        )
    if g.kind in ("sara", "sara_dps") and sara.confident_pilot:
        return (
            "gate.sara.confident_pilot reads each sample's log-probability, which a group log does not keep; "
            "set gate.sara.confident_pilot=false"
        )
    if g.kind == "hora" and k is not None and not 0 < g.hora.max_group_size <= k:
        return (
            f"gate.kind=hora with gate.hora.max_group_size={g.hora.max_group_size} may grow a group past the {k} "
            f"samples per group the log holds; set gate.hora.max_group_size={k} or less"
        )
    return ""


@dataclass
class ReplayGate:
    """A replay's gate, its one-pass prompt pool (``prompts_left``: ``pool.remaining``) and SARA's
    reference screen (None without ``gate.sara.reference_prior``)."""

    gate: Gate
    pool: OnePassPool
    screen: ReferenceScreen | None


def build_replay_gate(cfg: RunConfig, order: ReplayOrder) -> ReplayGate:
    """``cfg``'s gate for a replay of ``order`` (module docstring), sized by ``cfg.orchestrator``;
    a ``ConfigError`` when ``cfg`` cannot be replayed on ``order``'s log."""
    why = not_replayable(cfg, order.log.group_size)
    if why:
        raise ConfigError(why)
    pool = OnePassPool(order.prompts)

    def recorded_success(prompt_id: int) -> float:
        group = order.group(prompt_id)
        return group.successes / group.size

    gate = build_gate(
        cfg.gate,
        pool,
        group_size=cfg.orchestrator.group_size,
        batch_groups=cfg.orchestrator.batch_groups,
        seed=derive_seed(cfg.seed, "gate"),
        success_probability=recorded_success,
    )
    screen = None
    if cfg.gate.kind == "sara" and cfg.gate.sara.reference_prior:
        screen = recorded_reference_screen(cfg, order, pool)
        gate.attach_reference(screen)  # type: ignore[attr-defined]
    return ReplayGate(gate, pool, screen)


def recorded_reference_screen(cfg: RunConfig, order: ReplayOrder, pool: OnePassPool) -> ReferenceScreen:
    """``gate.sara.reference_prior`` in a replay: every recorded ``reference_logprob`` held from the
    start (nothing is scored: no learner runs, so there are no references to score); a group
    without one (null, or NaN in a log built in memory) opens with the gate's own prior, as an
    unscored prompt does in training. Exact or a lower bound as ``replay.reference_exact`` says;
    ``gate.sara.reference_calibrate`` fits the map only where it is a lower bound (as in training:
    ``ReferenceScreen`` ignores a calibration when exact)."""
    sara = cfg.gate.sara
    scores: dict[int, float] = {}
    for p in order.prompts:
        lp = order.reference_logprob(p.prompt_id)
        if lp is None or math.isnan(lp):
            continue
        if lp > 1e-6:
            group = order.group(p.prompt_id)
            raise ConfigError(
                f"log group {group.group_id} (prompt {group.prompt_id}) has reference_logprob={lp}, not the log of a "
                "probability; fix the log's reference scores or set gate.sara.reference_prior=false"
            )
        scores[p.prompt_id] = lp
    if not scores:
        raise ConfigError(
            "gate.sara.reference_prior=true reads each group's reference_logprob, which no group of the log has; "
            "record with reference scoring, or set gate.sara.reference_prior=false"
        )
    screen = ReferenceScreen(
        {},  # nothing to score: every likelihood is in the log
        pool.peek,
        exact=cfg.replay.reference_exact,
        strength=sara.reference_strength,
        ahead=sara.scored_ahead(cfg.orchestrator.batch_groups),
        calibration=ReferenceCalibration() if sara.reference_calibrate else None,
    )
    screen.update(scores, tokens=0)
    return screen


def replay_orchestrator(o: OrchestratorConfig, prompts: int) -> OrchestratorConfig:
    """``o`` for a replay of ``prompts`` replayed prompts: ``steps`` past any the log can fill (a
    step trains at least one group), so the run ends when the log is used up ("prompts
    exhausted") or at ``max_rollouts``, never at ``steps``.

    >>> replay_orchestrator(OrchestratorConfig(steps=5), prompts=40).steps
    41
    """
    return dataclasses.replace(o, steps=max(o.steps, prompts + 1))


def with_sizes(cfg: RunConfig, group_size: int, batch_groups: int) -> RunConfig:
    """``cfg`` with ``orchestrator.group_size`` and ``batch_groups`` set (``bench replay``'s
    ``--group-size`` and ``--batch``); a step of rollouts (``batch_rollouts``) is kept at least a group."""
    o = cfg.orchestrator
    if (o.group_size, o.batch_groups) == (group_size, batch_groups):
        return cfg
    o = dataclasses.replace(
        o,
        group_size=group_size,
        batch_groups=batch_groups,
        batch_rollouts=o.batch_rollouts and max(o.batch_rollouts, group_size),
    )
    return dataclasses.replace(cfg, orchestrator=o)


__all__ = [
    "ReplayGate",
    "build_replay_gate",
    "not_replayable",
    "recorded_reference_screen",
    "replay_orchestrator",
    "with_sizes",
]
