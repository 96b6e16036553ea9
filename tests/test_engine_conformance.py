"""The Engine contract (pipeline/engines/base.py, points 1-6), checked against every engine.

To add an engine, append one ``EngineCase`` to ``ENGINE_FACTORIES`` (mark it ``integration``
when it needs a heavy optional dependency):

    ENGINE_FACTORIES.append(EngineCase("vllm", make_vllm_case, max_tokens=16, marks=(pytest.mark.integration,)))

A factory returns the engine, a prompt maker (``prompt(i) -> Prompt``) and a weights maker
(``new_weights(engine) -> weights`` accepted by ``update_weights``). An engine that is slow to
start (vllm, ray) sets ``shared=True``: one engine serves every test of the module and is
closed at its end (the module runs on one event loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import torch
from engine_models import read_all

from pipeline.config.sections import SimConfig
from pipeline.engines.base import Engine
from pipeline.sim.engine import SimEngine
from pipeline.sim.world import SimWorld
from pipeline.types import BranchSpec, FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@dataclass(frozen=True)
class Opened:
    engine: Any
    prompt: Callable[[int], Prompt]
    new_weights: Callable[[Any], Any]
    max_tokens: int = 16
    refuses_branches: type[Exception] | None = None
    """The error a branch request's stream raises in an engine that cannot branch (replay: it has
    only the recorded samples); None: the engine branches (contract point 4)."""


@dataclass(frozen=True)
class EngineCase:
    name: str
    make: Callable[[], Opened]
    max_tokens: int  # long enough for several deltas per sample
    marks: tuple = field(default_factory=tuple)
    shared: bool = False  # one engine for the whole module (slow start); closed at the module's end


def make_sim() -> Opened:
    engine = SimEngine(SimWorld(SimConfig(num_prompts=16, num_eval_prompts=8, seed=0)))

    def new_weights(eng: SimEngine):
        state = eng.state.copy()
        state.theta += 0.5
        return state

    return Opened(engine, engine.prompt, new_weights)


def make_torch(lockstep: bool = False) -> Opened:
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.policy.models import build_model

    torch.manual_seed(0)  # the perturbed weights' draws
    model = build_model(64, 32, 2, 2, 64, seed=0, pad_id=None, arch="llama", mlp_ratio=2)
    engine = TorchEngine(model, tokenizer_eos_id=None, seed=0, lockstep=lockstep)

    def prompt(i: int) -> Prompt:
        return Prompt(prompt_id=i, text="", token_ids=tuple(3 + (i * 7 + j) % 60 for j in range(2 + i % 5)))

    def new_weights(eng) -> dict:
        return {k: v + 0.1 * torch.randn_like(v) for k, v in eng.model.state_dict().items()}

    return Opened(engine, prompt, new_weights)


def make_replay() -> Opened:
    from pipeline.engines.replay import ReplayEngine
    from pipeline.replay.order import NotReplayable, ReplayOrder
    from pipeline.store.grouplog import GroupLog, RecordedGroup, RecordedSample

    groups = tuple(
        RecordedGroup(
            g,
            prompt_id=100 + g,
            samples=tuple(
                RecordedSample(
                    k, float((g + k) % 2), 40 + 7 * k, k, tuple(3 + (g * 5 + k + j) % 60 for j in range(40 + 7 * k))
                )
                for k in range(4)
            ),
        )
        for g in range(16)
    )
    order = ReplayOrder(GroupLog(groups, ("conformance",)), seed=0)
    return Opened(
        ReplayEngine(order, rate=200.0), order.prompts.__getitem__, lambda eng: None, refuses_branches=NotReplayable
    )


def engine_prompt(i: int) -> Prompt:
    """Prompts of the model-backed cases (vocabulary 64)."""
    return Prompt(prompt_id=i, text="", token_ids=tuple(3 + (i * 7 + j) % 60 for j in range(2 + i % 5)))


def perturbed_tiny_gpt2(eng) -> dict:
    from engine_models import tiny_gpt2

    return {k: v + 0.1 * torch.randn_like(v) for k, v in tiny_gpt2(vocab_size=64).state_dict().items()}


def make_vllm() -> Opened:
    import tempfile

    from engine_models import save_tiny_gpt2

    from pipeline.engines.vllm_engine import VllmEngine

    root = tempfile.mkdtemp(prefix="railgate-vllm-conformance-")
    model_dir = save_tiny_gpt2(f"{root}/model", vocab_size=64)
    return Opened(VllmEngine(model_dir, f"{root}/cache", eos_id=None, seed=0), engine_prompt, perturbed_tiny_gpt2)


def make_ray() -> Opened:
    import tempfile

    from engine_models import save_tiny_gpt2

    from pipeline.engines.ray_engine import RayEngine
    from pipeline.engines.ray_replica import TorchEngineFactory

    model_dir = save_tiny_gpt2(f"{tempfile.mkdtemp(prefix='railgate-ray-conformance-')}/model", vocab_size=64)
    engine = RayEngine(
        TorchEngineFactory(str(model_dir), eos_id=None), replicas=2, ray_init_kwargs={"log_to_driver": False}
    )
    return Opened(engine, engine_prompt, perturbed_tiny_gpt2)


ENGINE_FACTORIES: list[EngineCase] = [
    EngineCase("sim", make_sim, max_tokens=512),
    EngineCase("torch", make_torch, max_tokens=24),
    EngineCase("replay", make_replay, max_tokens=64),
    # orchestrator.deterministic: decode steps on the event loop, no thread
    EngineCase("torch-lockstep", lambda: make_torch(lockstep=True), max_tokens=24),
    EngineCase(
        "vllm", make_vllm, max_tokens=16, shared=True, marks=(pytest.mark.integration, pytest.mark.timeout(600))
    ),
    EngineCase("ray", make_ray, max_tokens=24, shared=True, marks=(pytest.mark.integration, pytest.mark.timeout(300))),
]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
async def shared_engines():
    """Engines of ``shared`` cases by name, started on first use, closed when the module ends."""
    engines: dict[str, Opened] = {}
    try:
        yield engines
    finally:
        for o in engines.values():
            await o.engine.aclose()


@pytest.fixture(params=[pytest.param(c, id=c.name, marks=c.marks) for c in ENGINE_FACTORIES])
async def opened(request, shared_engines):
    case = request.param
    if case.shared:
        if case.name not in shared_engines:
            shared_engines[case.name] = case.make()
        yield dataclasses.replace(shared_engines[case.name], max_tokens=case.max_tokens)
        return
    o = dataclasses.replace(case.make(), max_tokens=case.max_tokens)
    try:
        yield o
    finally:
        await o.engine.aclose()


def sample(o: Opened, rid: str, i: int, *, seed: int = 0, branch: BranchSpec | None = None) -> SampleRequest:
    params = SamplingParams(temperature=1.0, max_tokens=o.max_tokens, seed=seed)
    return SampleRequest(rid, group_id=i, sample_index=0, prompt=o.prompt(i), params=params, branch=branch)


def check_stream(events: list, rid: str, start: int = 0) -> SampleFinished:
    """Deltas then exactly one SampleFinished; deltas concatenate to the response after ``start``."""
    *deltas, final = events
    assert isinstance(final, SampleFinished) and final.request_id == rid
    assert all(isinstance(d, TokenDelta) and d.request_id == rid for d in deltas)
    assert len(final.logprobs) == len(final.token_ids)
    position = start
    for d in deltas:
        assert d.position == position and len(d.logprobs) == len(d.token_ids) > 0
        position += len(d.token_ids)
    streamed = sum((d.token_ids for d in deltas), ())
    if final.finish_reason.is_success:
        assert final.token_ids[start:] == streamed
    else:  # an aborted sample may end with tokens produced after its last delta
        assert final.token_ids[start : start + len(streamed)] == streamed
    return final


async def test_is_an_engine(opened):
    assert isinstance(opened.engine, Engine)
    assert isinstance(opened.engine.name, str) and opened.engine.open_requests == 0


async def test_1_deltas_concatenate_to_the_final_response(opened):
    reqs = [sample(opened, f"c1.{i}", i, seed=i) for i in range(4)]
    results = await read_all(opened.engine, reqs)
    for r in reqs:
        final = check_stream(results[r.request_id], r.request_id)
        assert final.finish_reason.is_success and final.policy_version == opened.engine.policy_version
        assert len(results[r.request_id]) >= 2  # at least one delta
    assert opened.engine.open_requests == 0


async def test_2_abort_finishes_the_stream_with_aborted(opened):
    engine = opened.engine
    reqs = [sample(opened, "c2.victim", 1), sample(opened, "c2.bystander", 2)]
    events: dict[str, list] = {r.request_id: [] for r in reqs}
    ended_after_finished = []

    async def read(r):
        stream = engine.stream(r)
        async for ev in stream:
            events[r.request_id].append(ev)
            if r.request_id == "c2.victim" and isinstance(ev, TokenDelta) and len(events[r.request_id]) == 1:
                await engine.abort("c2.victim")
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        ended_after_finished.append(r.request_id)

    async with anyio.create_task_group() as tg:
        for r in reqs:
            tg.start_soon(read, r)
    victim = check_stream(events["c2.victim"], "c2.victim")
    assert victim.finish_reason == FinishReason.ABORTED
    assert check_stream(events["c2.bystander"], "c2.bystander").finish_reason.is_success
    assert sorted(ended_after_finished) == ["c2.bystander", "c2.victim"]
    await engine.abort("c2.victim")  # finished: no-op
    await engine.abort("c2.never-existed")  # unknown: no-op
    assert engine.open_requests == 0


async def test_3_closing_or_cancelling_a_stream_releases_it(opened):
    engine = opened.engine
    stream = engine.stream(sample(opened, "c3.closed", 0))
    other = engine.stream(sample(opened, "c3.never-read", 1))
    assert engine.open_requests == 2
    await other.aclose()  # closed before it was ever read
    assert engine.open_requests == 1
    assert isinstance(await stream.__anext__(), TokenDelta)
    await stream.aclose()
    assert engine.open_requests == 0

    # A consumer cancelled mid-stream; it holds the stream in ``aclosing``, as consumers should.
    with anyio.CancelScope() as scope:
        async with contextlib.aclosing(engine.stream(sample(opened, "c3.cancelled", 2))) as events:
            async for _ in events:
                scope.cancel()
                await anyio.sleep(0)
    assert scope.cancelled_caught
    assert engine.open_requests == 0


async def test_4_branch_starts_with_the_prefix(opened):
    engine = opened.engine
    source = check_stream((await read_all(engine, [sample(opened, "c4.src", 3, seed=1)]))["c4.src"], "c4.src")
    k = max(1, source.num_tokens // 2)
    spec = BranchSpec(
        "c4.src", prefix_len=k, prefix_token_ids=source.token_ids[:k], prefix_logprobs=source.logprobs[:k]
    )
    if opened.refuses_branches is not None:  # contract point 6: the stream raises, nothing is invented
        stream = engine.stream(sample(opened, "c4.branch", 3, seed=2, branch=spec))
        with pytest.raises(opened.refuses_branches):
            await stream.__anext__()
        await stream.aclose()
        assert engine.open_requests == 0
        return
    events = (await read_all(engine, [sample(opened, "c4.branch", 3, seed=2, branch=spec)]))["c4.branch"]
    final = check_stream(events, "c4.branch", start=k)
    assert final.finish_reason.is_success
    assert final.token_ids[:k] == source.token_ids[:k]
    assert engine.open_requests == 0


async def test_5_update_weights_bumps_the_version(opened):
    engine = opened.engine
    before = engine.policy_version
    after = await engine.update_weights(opened.new_weights(engine))
    assert after > before and engine.policy_version == after
    final = check_stream((await read_all(engine, [sample(opened, "c5", 0)]))["c5"], "c5")
    assert final.policy_version == after


async def test_6_request_ids_must_be_unique_among_open_streams(opened):
    engine = opened.engine
    stream = engine.stream(sample(opened, "c6", 0))
    with pytest.raises(ValueError):
        engine.stream(sample(opened, "c6", 1))
    await stream.aclose()
    # Once closed, the id may be used again.
    assert check_stream((await read_all(engine, [sample(opened, "c6", 1)]))["c6"], "c6").finish_reason.is_success
