"""The multiplexed stream contract (pipeline/engines/mux.py) on the sim engine, and the
orchestrator driving a whole run through it."""

from __future__ import annotations

import dataclasses
import sys
import time

import anyio
import pytest

from pipeline.clock import VirtualClock, WallClock
from pipeline.config.sections import SimConfig
from pipeline.engines.mux import StreamMux, multiplexer_of
from pipeline.sim.engine import SimEngine, SimEngineFault
from pipeline.sim.world import SimWorld
from pipeline.types import BranchSpec, FinishReason, SampleFinished, SampleRequest, SamplingParams, TokenDelta

pytestmark = pytest.mark.timeout(60)


def engine_for(clock=None, fail_every=0, **sim) -> SimEngine:
    cfg = SimConfig(num_prompts=16, num_eval_prompts=8, seed=0, **sim)
    return SimEngine(SimWorld(cfg), clock=clock or VirtualClock(), fail_every=fail_every)


def request(
    engine: SimEngine, rid: str, prompt: int = 3, seed: int = 0, branch: BranchSpec | None = None
) -> SampleRequest:
    return SampleRequest(
        rid,
        group_id=0,
        sample_index=seed,
        prompt=engine.prompt(prompt),
        params=SamplingParams(max_tokens=256, seed=seed),
        branch=branch,
    )


async def drain(mux: StreamMux, n: int) -> dict[str, list]:
    """Every event of ``n`` requests, per request id, until each has ended."""
    events: dict[str, list] = {}
    ended = 0
    while ended < n:
        for rid, event in await mux.next_events():
            events.setdefault(rid, []).append(event)
            ended += not isinstance(event, TokenDelta)
    return events


def test_the_sim_engine_has_a_multiplexer_and_it_gives_the_streams_events():
    """Same requests through ``stream`` and through the multiplexer: the same deltas, the same
    final events at the same engine times, in the clock's order."""

    def reqs(engine):
        return [request(engine, f"r{i}", prompt=i % 5, seed=i) for i in range(12)]

    streamed = {}
    engine = engine_for()

    async def by_streams():
        async def one(req, stream):
            streamed[req.request_id] = [event async for event in stream]

        async with anyio.create_task_group() as tg:
            for req in reqs(engine):  # every stream registered before any waits, as the orchestrator does
                tg.start_soon(one, req, engine.stream(req))

    anyio.run(by_streams)

    engine2 = engine_for()
    mux = multiplexer_of(engine2)
    assert isinstance(mux, StreamMux)
    for req in reqs(engine2):
        mux.start(req)
    assert engine2.open_requests == 12
    muxed = anyio.run(drain, mux, 12)
    assert muxed == streamed
    assert sum(len(e) for e in muxed.values()) > 3 * 12  # several deltas per sample: the order means something
    assert engine2.open_requests == 0 and engine2.clock.now() == engine.clock.now()


def test_abort_ends_a_request_with_the_tokens_of_its_current_chunk_so_far():
    engine = engine_for(chunk_tokens=32, decode_tokens_per_s=200.0)
    mux = engine.multiplexer()
    long = request(engine, "long", prompt=3, seed=2)
    assert anyio.run(lambda: _collect(engine_for().stream(long)))[-1].num_tokens > 64  # at least three chunks
    mux.start(long)
    # Keeps time going while "long" runs, with events between long's (chunks of 0.16 s, 0.03 s later).
    mux.start(dataclasses.replace(request(engine, "other", prompt=2, seed=2), launch_time=0.03))

    async def main():
        first = None
        while first is None:
            for rid, event in await mux.next_events():
                if rid == "long" and isinstance(event, TokenDelta):
                    first = event
        t_first = engine.clock.now()
        while engine.clock.now() <= t_first:  # some engine time into the next chunk
            await mux.next_events()
        mux.abort("long")
        mux.abort("long")  # twice: a no-op
        mux.abort("unknown")
        events = await mux.next_events()
        return first, t_first, [e for rid, e in events if rid == "long"]

    first, t_first, finals = anyio.run(main)
    assert len(finals) == 1 and finals[0].finish_reason is FinishReason.ABORTED
    produced = int((engine.clock.now() - t_first) * 200.0)
    assert finals[0].num_tokens == len(first.token_ids) + produced > len(first.token_ids)
    assert finals[0].token_ids[: len(first.token_ids)] == first.token_ids


def test_a_failing_request_comes_out_as_an_exception_and_the_others_go_on():
    engine = engine_for(fail_every=2)
    mux = engine.multiplexer()
    for i in range(4):
        mux.start(request(engine, f"r{i}", seed=i))
    events = anyio.run(drain, mux, 4)
    ends = {rid: e[-1] for rid, e in events.items()}
    assert isinstance(ends["r1"], SimEngineFault) and isinstance(ends["r3"], SimEngineFault)
    assert all(isinstance(ends[r], SampleFinished) and ends[r].finish_reason.is_success for r in ("r0", "r2"))
    assert engine.open_requests == 0


def test_a_branch_from_an_unknown_sample_fails_that_request_not_the_caller():
    engine = engine_for()
    mux = engine.multiplexer()
    mux.start(request(engine, "b", branch=BranchSpec("nobody", 2, (5, 5))))  # does not raise
    ((rid, error),) = anyio.run(mux.next_events)
    assert rid == "b" and isinstance(error, ValueError) and "does not remember" in str(error)


def test_a_branch_continues_from_the_prefix_of_a_finished_sample():
    engine = engine_for()
    mux = engine.multiplexer()
    mux.start(request(engine, "src", prompt=4, seed=9))
    src = anyio.run(drain, mux, 1)["src"][-1]
    k = min(4, src.num_tokens - 1)
    mux.start(
        request(engine, "br", prompt=4, seed=10, branch=BranchSpec("src", k, src.token_ids[:k], src.logprobs[:k]))
    )
    branched = anyio.run(drain, mux, 1)["br"]
    assert branched[-1].token_ids[:k] == src.token_ids[:k]
    assert branched[0].position == k


def test_close_returns_the_running_requests_aborted_and_releases_the_clock():
    engine = engine_for()
    mux = engine.multiplexer()
    for i in range(3):
        mux.start(request(engine, f"r{i}", seed=i))
    finals = mux.close()
    assert sorted(f.request_id for f in finals) == ["r0", "r1", "r2"]
    assert all(f.finish_reason is FinishReason.ABORTED for f in finals)
    assert engine.open_requests == 0
    # Nothing waits for the closed multiplexer: a stream on the same clock runs to its end.
    events = anyio.run(lambda: _collect(engine.stream(request(engine, "after"))))
    assert isinstance(events[-1], SampleFinished) and events[-1].finish_reason.is_success
    with pytest.raises(RuntimeError, match="closed multiplexer"):
        anyio.run(mux.next_events)
    with pytest.raises(RuntimeError, match="take a new one"):
        mux.start(request(engine, "late"))


async def _collect(stream):
    return [event async for event in stream]


def test_on_the_wall_clock_an_abort_wakes_the_consumer_at_once():
    """A chunk of 64 tokens at 20 tokens/s takes 3.2 s; the abort must not wait for it."""
    engine = engine_for(clock=WallClock(), chunk_tokens=64, decode_tokens_per_s=20.0, prefill_s=0.0)
    mux = engine.multiplexer()

    async def main():
        mux.start(request(engine, "slow", seed=1))
        async with anyio.create_task_group() as tg:

            async def abort_soon():
                await anyio.sleep(0.2)
                mux.abort("slow")

            tg.start_soon(abort_soon)
            started = time.monotonic()
            events = await mux.next_events()
            return events, time.monotonic() - started

    ((rid, final),) = (events := anyio.run(main))[0]
    assert rid == "slow" and final.finish_reason is FinishReason.ABORTED
    assert events[1] < 2.0


def test_both_orchestrator_drivers_run_the_same_samples_to_the_same_result(monkeypatch):
    """The multiplexer keeps each request's timeline and the clock's order of events due at the
    same time, so a run is the same under either driver: every rollout, token (the chunks cut
    at the run's end included), evaluation and engine time. (With abandons the two may free an
    aborted sample's slot at different points of the same tick: there only the bookkeeping is
    the same, which tests/test_orchestrator.py checks under both.)"""
    sys.path.insert(0, "tests")
    import test_orchestrator as orchestrator_tests

    from controller.gates.uniform import UniformGate

    class AheadUniform(UniformGate):
        abandons = True  # admission may open the next step's groups, so the run's end cuts samples

    results = []
    for multiplex in (True, False):
        monkeypatch.setattr(orchestrator_tests, "MULTIPLEX", multiplex)
        orch, engine = orchestrator_tests.make(
            gate=lambda pool: AheadUniform(pool, orchestrator_tests.SMALL.group_size)
        )
        summary = anyio.run(orch.run)
        evals = [{k: v for k, v in e.items() if "wall_s" not in k} for e in summary.evals]
        metrics = {k: v for k, v in summary.budget.as_metrics().items() if "wall_s" not in k}
        results.append((metrics, evals, engine.clock.now()))
    assert results[0][0]["pipeline/rollouts_aborted"] > 0  # samples cut at the run's end
    assert results[0] == results[1]
