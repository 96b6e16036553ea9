"""Exact replay through the pipeline (``engine.kind: replay``): the replay engine, the recorded
reward, the learner that trains nothing, the config and build rules, and
``railgate.replay.pipeline_run``, on synthetic group logs written here."""

from __future__ import annotations

import dataclasses

import anyio
import numpy as np
import pytest

from pipeline.config.build import ConfigError
from pipeline.engines.replay import PLACEHOLDER_TOKEN, ReplayEngine
from pipeline.replay.learner import NoLearner
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.replay.reward import RecordedReward
from pipeline.replay.timing import DEFAULT_RATE
from pipeline.store.grouplog import GroupLog, GroupLogWriter, RecordedGroup, RecordedSample
from pipeline.types import BranchSpec, FinishReason, SampleFinished, SampleRequest, SamplingParams, TokenDelta
from railgate.build import build_components, build_orchestrator
from railgate.config import load_config
from railgate.replay.pipeline_run import run_replay

pytestmark = pytest.mark.timeout(60)

K = 8


def world(n_groups: int = 48, seed: int = 0, with_ids: bool = True) -> list[RecordedGroup]:
    """Groups of K samples: a pass rate per prompt (a third all-wrong, a sixth all-right), rewards
    drawn from it, lengths that differ between samples (so finishing order and aborts matter)."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        p = (0.0, 1.0, *rng.uniform(0.05, 0.95, size=4))[g % 6]
        rewards = (rng.random(K) < p).astype(float)
        lengths = rng.integers(5, 60, size=K)
        order = np.argsort(lengths, kind="stable")
        finish = np.empty(K, dtype=int)
        finish[order] = np.arange(K)
        samples = tuple(
            RecordedSample(
                index=k,
                reward=float(rewards[k]),
                num_tokens=int(lengths[k]),
                finish_order=int(finish[k]),
                token_ids=tuple(int(t) for t in rng.integers(3, 200, size=lengths[k])) if with_ids else (),
            )
            for k in range(K)
        )
        groups.append(
            RecordedGroup(g, prompt_id=1000 + g, samples=samples, reference_logprob=float(np.log(max(p, 0.01))))
        )
    return groups


def write_log(tmp_path, groups, name="log") -> str:
    d = tmp_path / name
    with GroupLogWriter(d, fsync=False) as w:
        w.write(groups)
    return str(d)


def config(log: str, *overrides: str):
    return load_config(
        None,
        [
            "engine.kind=replay",
            f"replay.log={log}",
            f"orchestrator.group_size={K}",
            "orchestrator.batch_groups=4",
            "orchestrator.steps=1000",
            *overrides,
        ],
    )


def test_uniform_commits_every_group_and_its_mixed_groups_are_the_worlds(tmp_path):
    groups = world()
    mixed = sum(1 for g in groups if 0 < sum(s.reward > 0.5 for s in g.samples) < K)  # counted here, not by the log
    run = run_replay(config(write_log(tmp_path, groups), "gate.kind=uniform"))
    assert run.summary.stop_reason == "prompts exhausted"
    assert [o.verdict for o in run.outcomes] == ["committed"] * len(groups)
    assert run.summary.budget.groups_effective == mixed
    assert [o.samples for o in run.outcomes] == [K] * len(groups)
    assert [o.tokens for o in run.outcomes] == [sum(s.num_tokens for s in g.samples) for g in groups]
    assert all(o.decided_at == 1 for o in run.outcomes)  # uniform commits at its first sample
    assert run.engine_metrics["replay/not_replayable"] == 0


@pytest.mark.parametrize("gate", ["sara", "ds"])
def test_gates_run_to_the_end_cost_no_more_than_recorded_and_repeat_exactly(tmp_path, gate):
    groups = world()
    cfg = config(write_log(tmp_path, groups), f"gate.kind={gate}", "replay.order_seed=3")
    first = run_replay(cfg)
    assert first.summary.stop_reason == "prompts exhausted"
    assert {o.verdict for o in first.outcomes} <= {"committed", "abandoned", "dropped", "skipped"}
    assert all(o.samples <= K for o in first.outcomes)
    assert sum(o.samples for o in first.outcomes) == first.summary.budget.rollouts_started <= K * len(groups)
    assert sum(o.tokens for o in first.outcomes) == first.summary.budget.tokens_generated
    assert first.engine_metrics["replay/not_replayable"] == 0
    assert any(o.verdict == "committed" for o in first.outcomes)
    if gate == "sara":  # it abandons all-wrong probes: some groups cost less than K
        assert any(o.verdict == "abandoned" and o.samples < K for o in first.outcomes)
    assert run_replay(cfg).outcomes == first.outcomes


def test_aborts_pay_the_tokens_out_at_the_abandon(tmp_path):
    """SARA abandoning while siblings stream: what they cost is what timing.tokens_out says, and
    the outcomes' tokens add up to the run's."""
    groups = world(seed=1)
    cfg = config(write_log(tmp_path, groups), "gate.kind=sara", "gate.sara.launch=eager")
    run = run_replay(cfg)
    assert run.engine_metrics["replay/aborted"] > 0
    assert sum(o.tokens for o in run.outcomes) == run.summary.budget.tokens_generated
    for o, g in zip(run.outcomes, groups):
        if o.verdict == "abandoned":
            assert o.tokens < g.tokens


def test_each_sample_scores_its_recorded_reward_even_with_equal_tokens(tmp_path):
    """A text-only log (placeholder tokens) whose samples have one length: equal token ids, different
    rewards. Every trained rollout carries the reward recorded for its sample."""
    rng = np.random.default_rng(5)
    groups = [
        RecordedGroup.of(g, prompt_id=g, rewards=rng.integers(0, 2, size=K).astype(float).tolist(), num_tokens=12)
        for g in range(12)
    ]
    cfg = config(write_log(tmp_path, groups), "gate.kind=uniform", "replay.order_seed=7")
    parts = build_components(cfg, progress=False)

    class Recording(NoLearner):
        batches: list = []

        def step(self, batch):
            self.batches.append(batch)
            return super().step(batch)

    learner = Recording()
    anyio.run(build_orchestrator(cfg, dataclasses.replace(parts, learner=learner)).run)
    order = parts.engine.order
    seen = 0
    for batch in learner.batches:
        for group in batch.groups:
            for r in group.rollouts:
                assert r.token_ids == (PLACEHOLDER_TOKEN,) * 12
                assert r.reward == order.sample(group.prompt_id, r.sample_index).reward
                seen += 1
    assert seen == 12 * K
    assert len(parts.engine.served) == 0  # every noted sample was scored once


def request(order: ReplayOrder, prompt: int, k: int, branch: BranchSpec | None = None) -> SampleRequest:
    return SampleRequest(f"g{prompt}-s{k}", prompt, k, order.prompts[prompt], SamplingParams(), branch=branch)


async def events_of(engine: ReplayEngine, req: SampleRequest) -> list:
    return [event async for event in engine.stream(req)]


def test_the_engine_serves_the_kth_recorded_sample_in_engine_time():
    groups = world(n_groups=3)
    order = ReplayOrder(GroupLog(tuple(groups), ("t",)), seed=0)
    engine = ReplayEngine(order, rate=50.0)
    sample = order.sample(2, 5)
    events = anyio.run(events_of, engine, request(order, 2, 5))
    *deltas, final = events
    assert all(isinstance(d, TokenDelta) for d in deltas) and isinstance(final, SampleFinished)
    assert final.token_ids == sample.token_ids and sum((d.token_ids for d in deltas), ()) == sample.token_ids
    assert final.finish_reason == FinishReason.STOP and final.logprobs == (0.0,) * sample.num_tokens
    assert final.engine_time == pytest.approx(sample.num_tokens / 50.0)
    assert RecordedReward(engine.served)(order.prompts[2], final.token_ids) == sample.reward


def test_branches_guidance_and_requests_past_k_are_refused_and_counted():
    order = ReplayOrder(GroupLog(tuple(world(n_groups=2)), ("t",)), seed=0)
    engine = ReplayEngine(order)
    branch = BranchSpec("g0-s0", 3, (5, 6, 7), (0.0, 0.0, 0.0))
    guided = BranchSpec("reference-0", 3, (5, 6, 7), guide_level=0.5)
    for req, says in [
        (request(order, 0, 1, branch), "branches from g0-s0"),
        (request(order, 0, 2, guided), "is guided"),
        (request(order, 1, K), f"past the {K} recorded"),
    ]:
        with pytest.raises(NotReplayable, match=says):
            anyio.run(events_of, engine, req)
    assert engine.metrics()["replay/not_replayable"] == 3
    assert engine.open_requests == 0


def test_a_group_larger_than_the_log_and_a_missing_log_are_config_errors(tmp_path):
    log = write_log(tmp_path, world(n_groups=2))
    with pytest.raises(ConfigError, match=rf"orchestrator.group_size=16 is above the {K} samples.*group_size={K}"):
        build_components(config(log, "orchestrator.group_size=16"), progress=False)
    with pytest.raises(ConfigError, match=r"--set replay.log=PATH"):
        load_config(None, ["engine.kind=replay"])
    with pytest.raises(ConfigError, match="replay.log=.*does not exist"):
        build_components(config(str(tmp_path / "nowhere")), progress=False)
    with pytest.raises(ConfigError, match="bench replay --format trl"):
        build_components(config(log, "replay.format=trl"), progress=False)


def test_the_config_rate_default_is_the_timing_rules():
    assert load_config(None, []).replay.rate == DEFAULT_RATE


def test_the_multiplexer_times_an_abort_when_it_is_called():
    """An abort at engine time u ends the sample with exactly ``tokens_out(t, n, rate, u)`` tokens,
    and the samples not aborted stream as ``stream`` serves them."""
    from pipeline.replay.timing import tokens_out

    order = ReplayOrder(GroupLog(tuple(world(n_groups=2)), ("t",)), seed=0)
    engine = ReplayEngine(order, rate=100.0, chunk_tokens=4)
    mux = engine.multiplexer()
    short, victim = sorted(range(K), key=lambda k: order.sample(0, k).num_tokens)[:: K - 1]
    for k in (short, victim):
        mux.start(request(order, 0, k))

    async def run():
        finals = {}
        while len(finals) < 2:
            for rid, event in await mux.next_events():
                if isinstance(event, SampleFinished):
                    finals[rid] = event
                    if rid == f"g0-s{short}":
                        mux.abort(f"g0-s{victim}")
        return finals

    finals = anyio.run(run)
    u = order.sample(0, short).num_tokens / 100.0
    aborted = finals[f"g0-s{victim}"]
    assert aborted.finish_reason == FinishReason.ABORTED and aborted.engine_time == pytest.approx(u)
    n = order.sample(0, victim).num_tokens
    assert aborted.token_ids == order.sample(0, victim).token_ids[: tokens_out(0.0, n, 100.0, u)]
    assert engine.usage(0) == (2, order.sample(0, short).num_tokens + len(aborted.token_ids))
    assert engine.open_requests == 0


def test_per_request_streams_replay_as_the_multiplexer_does(tmp_path):
    log = write_log(tmp_path, world())
    muxed = run_replay(config(log, "gate.kind=sara")).outcomes
    assert run_replay(config(log, "gate.kind=sara", "orchestrator.multiplex_streams=false")).outcomes == muxed
