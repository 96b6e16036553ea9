"""RAIL inside the real loop: sim engine + orchestrator + SARA gate + RailController."""

from __future__ import annotations

import anyio
import pytest

from controller.config import GateConfig, SaraConfig
from controller.gates.registry import build_gate
from controller.prompts import PromptPool
from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from pipeline.clock import VirtualClock
from pipeline.config.sections import OrchestratorConfig, SimConfig
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.sim.engine import SimEngine
from pipeline.sim.learner import SimLearner
from pipeline.sim.world import SimAnswerScorer, SimWorld
from pipeline.store.tracelog import TraceLog, read_trace
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import SamplingParams

CFG = OrchestratorConfig(
    batch_groups=8, group_size=8, steps=6, max_concurrent_samples=128, max_open_groups=32, eval_every=0, max_tokens=256
)


class RecordingRail(RailController):
    """Keeps every closed group's final snapshot (to check where intervention samples went)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.closed = []

    def on_closed(self, group, snapshot):
        self.closed.append((group is not None, snapshot))
        super().on_closed(group, snapshot)


def run(tmp_path, launch, mode, backend):
    world = SimWorld(SimConfig(num_prompts=256, num_eval_prompts=16, seed=3))
    clock = VirtualClock()
    engine = SimEngine(world, clock=clock)
    pool = PromptPool([engine.prompt(i) for i in range(256)], seed=1)
    gate = build_gate(
        GateConfig(kind="sara", sara=SaraConfig(launch=launch)), pool, group_size=8, batch_groups=8, seed=0
    )
    trace = TraceLog(tmp_path, run_id="it")
    rail = RecordingRail(
        RailConfig(mode=mode, backend=backend, min_decisions=20, evaluate_every=20, warmup_decisions=20),
        trace,
        SamplingParams(max_tokens=CFG.max_tokens),
        seed=0,
        run_id="it",
        clock=clock.now,
    )
    parts = RunParts(
        engine=engine,
        gate=gate,
        controller=rail,
        scoring=ScoringService(SimAnswerScorer(), 5.0, 2),
        learner=SimLearner(world, 8, seed=0),
        clock=clock,
    )
    orch = Orchestrator(parts, CFG, RunOutputs(trace=trace), seed=7)
    summary = anyio.run(orch.run)
    trace.close()
    return summary, rail, engine


@pytest.mark.parametrize("launch, mode, backend", [("probe_first", "shadow", "vw"), ("eager", "live", "river")])
def test_interventions_join_groups_and_their_outcomes_are_logged(tmp_path, launch, mode, backend):
    summary, rail, engine = run(tmp_path, launch, mode, backend)
    assert summary.steps == CFG.steps and engine.open_requests == 0
    b = summary.budget
    assert b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    # Interventions happened, at token and group level, and launched samples.
    assert rail.counts["interventions"] > 0 and b.rollouts_intervention > 0
    assert rail.counts["decisions_token"] > 0 and rail.counts["decisions_rescue"] > 0
    # Their samples joined the groups: origins name logged RAIL decisions.
    trace = read_trace(tmp_path)
    rows = trace.joined().to_pylist()
    rail_ids = {r["decision_id"] for r in rows if r["decision_point"] in ("token", "group_rescue", "group_extend")}
    joined = {o for _, snap in rail.closed for o in snap.origins if o >= 0}
    assert joined and joined <= rail_ids
    shipped_with_interventions = [s for shipped, s in rail.closed if shipped and any(o >= 0 for o in s.origins)]
    assert shipped_with_interventions
    # Every decision of a closed group has its outcome in the trace.
    decided = {r["decision_id"]: r for r in rows if r["decision_id"] in rail_ids}
    closed_groups = {s.group_id for _, s in rail.closed}
    for r in decided.values():
        if r["group_id"] in closed_groups:
            assert r["reward"] is not None and r["tokens"] is not None
        assert 0.0 < r["behaviour_propensity"] <= 1.0 and r["mode"] in ("shadow", "live")
    assert rail.counts["outcomes"] == sum(1 for r in decided.values() if r["reward"] is not None)
    assert rail.metrics()["controller/decisions"] == len(rail_ids)
