"""The torch engine's contract under stress: bad requests, a failing model step, one final event per stream, shared prefills, a random mix of aborts, branches and weight updates."""

from __future__ import annotations

import copy

import anyio
import pytest
import torch
from engine_models import read_all
from torch_models import EOS, PROMPTS, collect, greedy_reference, request, tiny_llama
from transformers import LlamaForCausalLM

from pipeline.engines.torch_engine import TorchEngine
from pipeline.types import BranchSpec, FinishReason, SampleFinished, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_invalid_requests_fail_with_the_fix_named():
    engine = TorchEngine(tiny_llama(), EOS)
    try:
        with pytest.raises(ValueError, match=r"prompt of 9 tokens \+ max_tokens=60 = 69 exceeds .* context of 64"):
            engine.stream(request("x", PROMPTS[1], max_tokens=60))
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            engine.stream(request("x", (5, 99)))
        with pytest.raises(ValueError, match="leaves no room"):
            engine.stream(request("x", PROMPTS[0], max_tokens=4, branch=BranchSpec("s", 4, (5, 5, 5, 5))))
        stream = engine.stream(request("x", PROMPTS[0]))
        with pytest.raises(ValueError, match="already running"):
            engine.stream(request("x", PROMPTS[0]))
        await stream.aclose()
        with pytest.raises(ValueError, match="dtype"):
            TorchEngine(tiny_llama(), EOS, dtype="float64")
    finally:
        await engine.aclose()


class _FailingModel(LlamaForCausalLM):
    """A real model whose forward raises on demand: the engine's step-failure path."""

    fail = False

    def forward(self, *args, **kwargs):
        if self.fail:
            raise RuntimeError("injected failure")
        return super().forward(*args, **kwargs)


async def test_a_failed_step_fails_its_rows_and_the_engine_recovers():
    torch.manual_seed(0)
    model = _FailingModel(tiny_llama().config).eval()
    engine = TorchEngine(model, None)
    try:
        model.fail = True
        results = await read_all(engine, [request(f"f{i}", PROMPTS[i], max_tokens=8) for i in range(2)])
        for events in results.values():
            assert events[-1].finish_reason == FinishReason.ERROR and "injected failure" in events[-1].error
        model.fail = False
        final = (await collect(engine, request("ok", PROMPTS[0], max_tokens=8)))[-1]
        assert final.finish_reason == FinishReason.LENGTH and final.num_tokens == 8
        assert engine.open_requests == 0
    finally:
        await engine.aclose()


async def test_every_event_stream_ends_with_one_finished_event():
    engine = TorchEngine(tiny_llama(), EOS, delta_tokens=3)
    try:
        results = await read_all(
            engine, [request(f"d{i}", PROMPTS[i % 4], temperature=1.0, seed=i, max_tokens=10) for i in range(8)]
        )
    finally:
        await engine.aclose()
    for events in results.values():
        *deltas, final = events
        assert isinstance(final, SampleFinished) and all(isinstance(d, TokenDelta) for d in deltas)
        assert all(len(d.token_ids) >= 3 for d in deltas[:-1])
        assert sum((d.token_ids for d in deltas), ()) == final.token_ids
        assert [d.position for d in deltas] == [sum(len(x.token_ids) for x in deltas[:i]) for i in range(len(deltas))]


async def test_a_group_shares_one_prefill_and_late_members_copy_the_cache():
    model = tiny_llama()
    reference = copy.deepcopy(model)
    engine = TorchEngine(model, EOS)
    try:
        first = [request(f"g.s{i}", PROMPTS[3], max_tokens=10, temperature=1.0, seed=i) for i in range(4)]
        late = [request(f"g.s{i}", PROMPTS[3], max_tokens=10) for i in range(4, 8)]
        results: dict[str, list] = {}

        async def read(r, launch_late=False):
            results[r.request_id] = []
            async for ev in engine.stream(r):
                results[r.request_id].append(ev)
                if launch_late and len(results[r.request_id]) == 1:
                    for q in late:
                        tg.start_soon(read, q)

        async with anyio.create_task_group() as tg:
            for i, r in enumerate(first):
                tg.start_soon(read, r, i == 0)
        batch = engine._worker.batch
        # One prefill for the prompt: members in the same step share it, later ones copy a sibling's cache.
        assert batch.prefilled_contexts == 1 and batch.copied_rows >= 4
        want = greedy_reference(reference, PROMPTS[3], 10)
        assert all(list(results[q.request_id][-1].token_ids) == want for q in late)
        assert len({results[r.request_id][-1].token_ids for r in first}) > 1  # members differ
    finally:
        await engine.aclose()


async def test_random_mix_of_aborts_closes_branches_and_updates_keeps_the_contract():
    import random

    rng = random.Random(0)
    model = tiny_llama()
    engine = TorchEngine(model, EOS, max_batch=5)
    finished: dict[str, SampleFinished] = {}
    updates = []

    async def reader(i: int):
        await anyio.sleep(rng.random() * 0.02)
        branch = None
        done = [
            f
            for f in finished.values()
            if f.num_tokens >= 3 and f.finish_reason.is_success and EOS not in f.token_ids[:2]
        ]
        if done and rng.random() < 0.3:
            src = rng.choice(done)
            branch = BranchSpec(src.request_id, 2, src.token_ids[:2], src.logprobs[:2])
        prompt = PROMPTS[i % 4] if branch is None else PROMPTS[int(branch.source_request_id[1:]) % 4]
        req = request(f"m{i}", prompt, temperature=1.0, seed=i, max_tokens=12, branch=branch)
        action = rng.choice(["read", "read", "abort", "close"])
        events = []
        stream = engine.stream(req)
        async for ev in stream:
            events.append(ev)
            if action == "abort" and len(events) == 1 and isinstance(ev, TokenDelta):
                await engine.abort(req.request_id)
            if action == "close" and len(events) == 2:
                await stream.aclose()
                return
        final = events[-1]
        assert isinstance(final, SampleFinished) and sum(1 for e in events if isinstance(e, SampleFinished)) == 1
        start = len(branch.prefix_token_ids) if branch else 0
        assert final.token_ids[:start] == (branch.prefix_token_ids if branch else ())
        assert sum((e.token_ids for e in events[:-1]), ()) == final.token_ids[start:]
        assert final.finish_reason.is_success or final.finish_reason == FinishReason.ABORTED
        finished[req.request_id] = final

    async def updater():
        for _ in range(3):
            await anyio.sleep(0.01)
            updates.append(await engine.update_weights({k: v * 1.01 for k, v in engine.model.state_dict().items()}))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater)
            for i in range(40):
                tg.start_soon(reader, i)
    finally:
        await engine.aclose()
    assert updates == [1, 2, 3] and engine.open_requests == 0
    assert len(finished) >= 20
