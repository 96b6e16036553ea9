"""The orchestrator on the sim engine: accounting, faults, cancellation, backpressure.

Every test runs twice: with the sim engine's multiplexer driving all samples from one task
(``orchestrator.multiplex_streams``, the default) and with a task per sample."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import anyio
import pytest

from controller.gates.uniform import UniformGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.clock import VirtualClock, WallClock
from pipeline.config.sections import OrchestratorConfig, SimConfig
from pipeline.core.actions import Stop
from pipeline.protocols import GateStalled
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.sim.engine import SimEngine
from pipeline.sim.learner import SimLearner
from pipeline.sim.world import SimAnswerScorer, SimEvaluator, SimWorld
from pipeline.store.buffer import ArrowBuffer, read_all
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import ActionKind, GroupAction, SampleFinished

SMALL = OrchestratorConfig(
    batch_groups=8, group_size=4, steps=5, max_concurrent_samples=64, max_open_groups=32, eval_every=5
)
MULTIPLEX = True  # set per test by the ``driver`` fixture


@pytest.fixture(autouse=True, params=["multiplexed", "task per sample"])
def driver(request, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "MULTIPLEX", request.param == "multiplexed")
    return request.param


def make(
    cfg=SMALL, sim=None, gate=None, scorer=None, fail_every=0, realtime=False, timeout_s=5.0, learner=None, buffer=None
):
    cfg = dataclasses.replace(cfg, multiplex_streams=MULTIPLEX)
    world = SimWorld(sim or SimConfig(num_prompts=256, num_eval_prompts=64, seed=3))
    clock = WallClock() if realtime else VirtualClock()
    engine = SimEngine(world, clock=clock, fail_every=fail_every)
    pool = PromptPool([engine.prompt(i) for i in range(world.config.num_prompts)], seed=1)
    parts = RunParts(
        engine=engine,
        gate=gate(pool) if gate else UniformGate(pool, cfg.group_size),
        controller=NoopController(),
        scoring=ScoringService(scorer or SimAnswerScorer(), timeout_s, 2),
        learner=(learner or SimLearner)(world, cfg.group_size, seed=0),
        clock=clock,
        evaluator=SimEvaluator(world, engine),
    )
    orch = Orchestrator(parts, cfg, RunOutputs(buffer=buffer), seed=7)
    return orch, engine


def test_uniform_run_accounts_every_rollout_and_learns():
    orch, engine = make()
    summary = anyio.run(orch.run)
    b = summary.budget
    assert summary.steps == SMALL.steps and summary.stop_reason == "steps"
    assert b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert b.rollouts_trained == SMALL.steps * SMALL.batch_groups * SMALL.group_size
    assert b.groups_committed >= SMALL.steps * SMALL.batch_groups
    assert b.tokens_generated >= b.tokens_trained > 0
    assert engine.open_requests == 0
    assert engine.policy_version == SMALL.steps
    assert summary.evals[-1]["eval/accuracy"] > summary.evals[0]["eval/accuracy"]


def test_runs_are_reproducible_with_the_same_seed():
    first = anyio.run(make()[0].run).budget.as_metrics()
    second = anyio.run(make()[0].run).budget.as_metrics()
    assert first == second


def test_engine_failure_fails_one_sample_and_the_run_goes_on():
    orch, engine = make(fail_every=7)
    summary = anyio.run(orch.run)
    b = summary.budget
    assert b.rollouts_failed > 0
    assert summary.steps == SMALL.steps
    assert b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert engine.open_requests == 0


class FlakyScorer:
    runs_inline = False

    def __init__(self):
        self.calls = 0

    def __call__(self, prompt, token_ids):
        self.calls += 1
        if self.calls % 5 == 0:
            raise ValueError("unparseable answer")
        return SimAnswerScorer()(prompt, token_ids)


def test_reward_that_raises_gives_zero_and_is_counted():
    orch, _ = make(scorer=FlakyScorer())
    summary = anyio.run(orch.run)
    assert summary.budget.reward_errors > 0
    assert summary.steps == SMALL.steps


class HangOnceScorer:
    runs_inline = False

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, prompt, token_ids):
        self.calls += 1
        if self.calls == 3:
            self.release.wait(30)  # hangs until the test lets it go
        return SimAnswerScorer()(prompt, token_ids)


def test_reward_that_hangs_times_out_and_the_run_goes_on():
    scorer = HangOnceScorer()
    cfg = dataclasses.replace(SMALL, steps=2)
    orch, _ = make(cfg=cfg, scorer=scorer, timeout_s=0.2)
    started = time.monotonic()
    try:
        summary = anyio.run(orch.run)
    finally:
        scorer.release.set()
    assert summary.budget.reward_timeouts == 1
    assert summary.steps == 2
    assert time.monotonic() - started < 20


def test_cancelling_the_run_mid_group_leaves_no_orphan_requests():
    sim = SimConfig(num_prompts=256, num_eval_prompts=64, decode_tokens_per_s=100.0, realtime=True)
    orch, engine = make(cfg=dataclasses.replace(SMALL, steps=50), sim=sim, realtime=True)
    seen_open = []

    async def main():
        with anyio.move_on_after(0.4):
            async with anyio.create_task_group() as tg:
                tg.start_soon(orch.run)
                await anyio.sleep(0.3)
                seen_open.append(engine.open_requests)
        await anyio.sleep(0)

    anyio.run(main)
    assert seen_open and seen_open[0] > 0  # it really was mid-group
    assert engine.open_requests == 0


class AbandonAfterFirstGate(UniformGate):
    """Launches full groups, abandons every other group at its first finished sample."""

    def update(self, snapshot, groups):
        if snapshot.group_id % 2 == 0 and snapshot.in_flight > 0:
            return [GroupAction(ActionKind.ABANDON, snapshot.group_id, reason="test")]
        return super().update(snapshot, groups)


def test_abandon_aborts_in_flight_siblings_and_counts_their_tokens():
    orch, engine = make(gate=lambda pool: AbandonAfterFirstGate(pool, SMALL.group_size))
    summary = anyio.run(orch.run)
    b = summary.budget
    assert b.groups_abandoned > 0
    assert b.rollouts_aborted > 0
    assert b.tokens_wasted > 0
    assert b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert engine.open_requests == 0


class NothingGate(UniformGate):
    def admit(self, group_ids, step):
        return []


def test_a_gate_that_opens_nothing_raises_a_clear_error():
    orch, _ = make(gate=lambda pool: NothingGate(pool, 4))
    with pytest.raises(GateStalled, match="prompt pool may be exhausted"):
        anyio.run(orch.run)


class RecordingGate(UniformGate):
    """Records the engine time of every update it gets, per group."""

    def __init__(self, pool, group_size):
        super().__init__(pool, group_size)
        self.clock = None  # the engine's, set once the engine is built
        self.seen: dict[int, list[float]] = {}

    def update(self, snapshot, groups):
        self.seen.setdefault(snapshot.group_id, []).append(self.clock.now())
        return super().update(snapshot, groups)


def test_virtual_clock_delivers_samples_in_engine_time_order():
    """Samples of a group start together; in engine time they end shortest first, the pipeline
    reads every final in engine-time order, and the gate acts on each one at the engine time it
    finished (decisions take no engine time)."""
    holder = {}

    def gate(pool):
        holder["gate"] = RecordingGate(pool, 4)
        return holder["gate"]

    orch, engine = make(gate=gate, cfg=dataclasses.replace(SMALL, steps=1))
    holder["gate"].clock = engine.clock
    finals = []  # (group_id, launch_time, tokens, engine_time) in the order the pipeline read them
    inner_stream, inner_mux = engine.stream, engine.multiplexer

    async def recording_stream(request):
        events = inner_stream(request)
        try:
            async for event in events:
                if isinstance(event, SampleFinished):
                    finals.append((request.group_id, request.launch_time, event.num_tokens, event.engine_time))
                yield event
        finally:
            await events.aclose()

    class RecordingMux:
        def __init__(self):
            self.mux, self.requests = inner_mux(), {}
            self.abort, self.close = self.mux.abort, self.mux.close

        def start(self, request):
            self.requests[request.request_id] = request
            self.mux.start(request)

        async def next_events(self):
            events = await self.mux.next_events()
            for request_id, event in events:
                if isinstance(event, SampleFinished):
                    request = self.requests[request_id]
                    finals.append((request.group_id, request.launch_time, event.num_tokens, event.engine_time))
            return events

    engine.stream, engine.multiplexer = recording_stream, RecordingMux
    anyio.run(orch.run)
    times = [t for *_, t in finals]
    assert len(finals) >= SMALL.batch_groups * 4 and times == sorted(times)
    together: dict[tuple[int, float], list[int]] = {}
    for group_id, launched, tokens, _ in finals:
        together.setdefault((group_id, launched), []).append(tokens)
    assert any(len(set(lengths)) > 1 for lengths in together.values())  # lengths differ: the order means something
    for lengths in together.values():
        assert lengths == sorted(lengths)
    assert holder["gate"].seen
    for group_id, update_times in holder["gate"].seen.items():  # until the group is done or the run stops
        assert update_times == [t for g, *_, t in finals if g == group_id][: len(update_times)]


class OpenAheadGate(UniformGate):
    """Uniform, but the tracker may open groups beyond what the remaining steps train on (as a
    gate that abandons may): samples are still running when the run stops."""

    abandons = True


def test_engine_time_ends_with_the_run():
    """The clock stands still from the tracker's Stop on: the samples still running are cut at
    the stop's engine time, and nothing due later (a chunk, a final) counts in the run. The task
    group cancels the sample tasks in an order of its own (a set's), so a clock that moved on as
    each cut stream left it cut the last ones with tokens that hung on that order."""
    orch, engine = make(gate=lambda pool: OpenAheadGate(pool, SMALL.group_size))
    stops: list[float] = []
    handle = orch.tracker.handle

    def recording_handle(msg):
        actions = handle(msg)
        if any(type(action) is Stop for action in actions):
            stops.append(engine.clock.now())
        return actions

    orch.tracker.handle = recording_handle
    summary = anyio.run(orch.run)
    b = summary.budget
    assert stops and engine.clock.now() == stops[0]
    assert b.rollouts_aborted > 0  # samples were running at the stop: the end had something to cut
    assert b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert engine.open_requests == 0


def test_step_ahead_limit_bounds_staleness():
    cfg = dataclasses.replace(SMALL, max_async_steps=0, steps=4)
    orch, _ = make(cfg=cfg)
    summary = anyio.run(orch.run)
    assert summary.budget.staleness_max <= 1


def test_stop_at_target_accuracy():
    cfg = dataclasses.replace(SMALL, steps=200, eval_every=1, target_accuracy=0.52)
    sim = SimConfig(num_prompts=256, num_eval_prompts=64, seed=3, learning_rate=0.5)
    orch, _ = make(cfg=cfg, sim=sim)
    summary = anyio.run(orch.run)
    assert summary.steps < 200
    assert "target accuracy" in summary.stop_reason
    assert summary.evals[-1]["eval/accuracy"] >= 0.52


class AdvantageLearner(SimLearner):
    """Keeps the batches it trains on; its advantages number each group's rollouts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches = []

    def step(self, batch):
        self.batches.append(batch)
        numbered = tuple(tuple(float(i) for i in range(len(g.rollouts))) for g in batch.groups)
        return dataclasses.replace(super().step(batch), advantages=numbered)


def test_the_learner_trains_from_memory_and_the_buffer_records_its_advantages(tmp_path):
    with ArrowBuffer(tmp_path) as buffer:
        orch, _ = make(cfg=dataclasses.replace(SMALL, steps=2), learner=AdvantageLearner, buffer=buffer)
        anyio.run(orch.run)
    learner = orch.learn.learner
    trained = [g for batch in learner.batches for g in batch.groups]
    assert len(learner.batches) == 2 and all(g.trained_tokens > 0 for g in trained)  # an Arrow round trip drops them
    table = read_all(tmp_path)
    assert table.column("group_id").to_pylist() == [g.group_id for g in trained for _ in g.rollouts]
    assert table.column("advantage").to_pylist() == [float(i) for g in trained for i in range(len(g.rollouts))]
