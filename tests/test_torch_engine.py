"""The torch engine against transformers itself: greedy parity, log-probs, abort, branch, weights, seeds."""

from __future__ import annotations

import copy

import anyio
import pytest
import torch
from engine_models import read_all
from torch_models import EOS, PROMPTS, collect, greedy_reference, request, tiny_gpt2, tiny_llama

from pipeline.engines.torch_engine import TorchEngine
from pipeline.types import BranchSpec, FinishReason, SampleFinished, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
async def test_greedy_matches_generate_for_ragged_batch_and_late_joiner(make):
    model = make()
    reference = copy.deepcopy(model)  # the engine switches its own model's attention kernel
    engine = TorchEngine(model, EOS)
    try:
        first = [request(f"r{i}", p) for i, p in enumerate(PROMPTS[:3])]
        results = await read_all(engine, first)
        # A late joiner: enters a batch whose rows are already several tokens in.
        late = request("late", PROMPTS[3])
        early = request("early", PROMPTS[1], max_tokens=20)
        events: dict[str, list] = {"early": [], "late": []}

        async def read_early():
            async for ev in engine.stream(early):
                events["early"].append(ev)
                if len(events["early"]) == 1:  # early's row is already decoding when late joins
                    tg.start_soon(read_late)

        async def read_late():
            events["late"] = await collect(engine, late)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_early)
        results.update(events)
        for req in first + [early, late]:
            final = results[req.request_id][-1]
            want = greedy_reference(reference, req.prompt.token_ids, req.params.max_tokens)
            assert list(final.token_ids) == want, req.request_id
            assert final.finish_reason == (FinishReason.STOP if want[-1] == EOS else FinishReason.LENGTH)
    finally:
        await engine.aclose()


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])  # gpt2: the lean decode step
async def test_logprobs_and_entropies_are_the_policy_at_temperature_one(make):
    model = make()
    reference = copy.deepcopy(model)
    engine = TorchEngine(model, EOS)
    try:
        reqs = [request(f"s{i}", PROMPTS[i % 4], temperature=0.7, top_p=0.9, seed=i, max_tokens=16) for i in range(6)]
        results = await read_all(engine, reqs)
    finally:
        await engine.aclose()
    for req in reqs:
        events = results[req.request_id]
        final = events[-1]
        ids = torch.tensor([list(req.prompt.token_ids) + list(final.token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(reference(ids).logits[0].float(), dim=-1)
        n = len(req.prompt.token_ids)
        rows = logp[n - 1 : n - 1 + final.num_tokens]
        want = rows.gather(1, torch.tensor(final.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(final.logprobs), want, atol=1e-4)
        entropies = [e for ev in events[:-1] for e in ev.entropies]
        want_ent = -(rows.exp() * rows).sum(-1)
        assert torch.allclose(torch.tensor(entropies), want_ent, atol=1e-4)


async def test_abort_one_row_leaves_the_others_running():
    engine = TorchEngine(tiny_llama(), None)
    try:
        reqs = [request(f"a{i}", PROMPTS[i], max_tokens=20, temperature=1.0, seed=i) for i in range(3)]
        seen: dict[str, list] = {r.request_id: [] for r in reqs}

        async def read(r):
            async for ev in engine.stream(r):
                seen[r.request_id].append(ev)
                deltas = [e for e in seen[r.request_id] if isinstance(e, TokenDelta)]
                if (
                    r.request_id == "a1"
                    and sum(len(d.token_ids) for d in deltas) >= 3
                    and len(deltas) == len(seen["a1"])
                ):
                    await engine.abort("a1")

        async with anyio.create_task_group() as tg:
            for r in reqs:
                tg.start_soon(read, r)
        aborted = seen["a1"][-1]
        assert aborted.finish_reason == FinishReason.ABORTED
        assert sum((e.token_ids for e in seen["a1"][:-1]), ()) == aborted.token_ids
        assert 3 <= aborted.num_tokens < 20
        for rid in ("a0", "a2"):
            assert seen[rid][-1].finish_reason == FinishReason.LENGTH and seen[rid][-1].num_tokens == 20
        await engine.abort("a1")  # finished: a no-op
        await engine.abort("nobody")
        assert engine.open_requests == 0
    finally:
        await engine.aclose()


async def test_closing_or_cancelling_a_stream_releases_it():
    engine = TorchEngine(tiny_llama(), None)
    try:
        stream = engine.stream(request("c0", PROMPTS[0], max_tokens=30))
        assert isinstance(await stream.__anext__(), TokenDelta)
        assert engine.open_requests == 1
        await stream.aclose()
        assert engine.open_requests == 0
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

        got = []
        with anyio.CancelScope() as scope:  # the consumer is cancelled mid-stream
            async for ev in engine.stream(request("c1", PROMPTS[1], max_tokens=50, temperature=1.0)):
                got.append(ev)
                scope.cancel()
        assert scope.cancelled_caught and not isinstance(got[-1], SampleFinished)
        assert engine.open_requests == 0
        # The engine keeps serving, and the rows of closed streams are gone.
        final = (await collect(engine, request("c2", PROMPTS[2], max_tokens=5)))[-1]
        assert final.finish_reason.is_success and engine.open_requests == 0
        assert engine._worker.batch.num_rows - engine._worker.batch.num_finished == 0
    finally:
        await engine.aclose()


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("source_resident", [True, False], ids=["copy-cache", "prefill"])
async def test_branch_continues_the_prefix(source_resident, make):
    model = make()
    engine = TorchEngine(model, None)
    try:
        source = request("src", PROMPTS[1], max_tokens=40)
        k = 6
        events: list = []
        branch_events: list = []

        async def branch_from(tokens, logprobs):
            spec = BranchSpec(
                "src", prefix_len=k, prefix_token_ids=tuple(tokens[:k]), prefix_logprobs=tuple(logprobs[:k])
            )
            branch_events.extend(await collect(engine, request("br", PROMPTS[1], max_tokens=40, branch=spec)))

        async with anyio.create_task_group() as tg:
            async for ev in engine.stream(source):
                events.append(ev)
                got = sum((e.token_ids for e in events if isinstance(e, TokenDelta)), ())
                if (
                    source_resident
                    and len(got) >= k
                    and not branch_events
                    and len(events) == len([e for e in events if isinstance(e, TokenDelta)])
                ):
                    lps = sum((e.logprobs for e in events if isinstance(e, TokenDelta)), ())
                    tg.start_soon(branch_from, got, lps)
                    source_resident = None  # launch once
            if source_resident is False:
                await collect(engine, request("other", PROMPTS[0], max_tokens=2))  # the source's row leaves
                await branch_from(events[-1].token_ids, events[-1].logprobs)
        batch = engine._worker.batch
        assert (batch.copied_rows, batch.prefilled_contexts) == ((1, 1) if source_resident is None else (0, 3))
        src, br = events[-1], branch_events[-1]
        assert br.token_ids[:k] == src.token_ids[:k]
        assert br.token_ids == src.token_ids  # greedy: the continuation is the source's own
        assert torch.allclose(torch.tensor(br.logprobs), torch.tensor(src.logprobs), atol=1e-4)
        assert branch_events[0].position == k
        assert sum((e.token_ids for e in branch_events[:-1]), ()) == br.token_ids[k:]
    finally:
        await engine.aclose()


async def test_a_branch_keeps_the_callers_prefix_logprobs_across_a_weight_update():
    """The prefix was sampled by the old weights, so its log-probs stay theirs (as on vLLM and
    the sim); a branch sent without them gets the current weights' values."""
    new_weights = tiny_llama(seed=1)
    engine = TorchEngine(tiny_llama(), None)
    k = 5
    try:
        src = (await collect(engine, request("src", PROMPTS[1], max_tokens=12, temperature=1.0, seed=1)))[-1]
        await engine.update_weights(copy.deepcopy(new_weights).state_dict())
        kept = BranchSpec("src", k, src.token_ids[:k], src.logprobs[:k])
        bare = BranchSpec("src", k, src.token_ids[:k])
        results = await read_all(
            engine,
            [
                request("kept", PROMPTS[1], max_tokens=12, temperature=1.0, seed=2, branch=kept),
                request("bare", PROMPTS[1], max_tokens=12, temperature=1.0, seed=3, branch=bare),
            ],
        )
    finally:
        await engine.aclose()
    ids = torch.tensor([list(PROMPTS[1]) + list(src.token_ids[:k])])
    with torch.no_grad():
        logp = torch.log_softmax(new_weights(ids).logits[0].float(), dim=-1)
    n = len(PROMPTS[1])
    now = logp[n - 1 : n - 1 + k].gather(1, torch.tensor(src.token_ids[:k])[:, None])[:, 0]
    assert not torch.allclose(now, torch.tensor(src.logprobs[:k]), atol=1e-2)  # the update changed them
    kept_final, bare_final = results["kept"][-1], results["bare"][-1]
    assert kept_final.token_ids[:k] == bare_final.token_ids[:k] == src.token_ids[:k]
    assert kept_final.logprobs[:k] == src.logprobs[:k]
    assert torch.allclose(torch.tensor(bare_final.logprobs[:k]), now, atol=1e-4)


async def test_update_weights_bumps_the_version_and_changes_samples():
    engine = TorchEngine(tiny_llama(), None)
    try:
        before = (await collect(engine, request("w0", PROMPTS[1], max_tokens=16)))[-1]
        assert before.policy_version == 0
        new = {k: v + 0.3 * torch.randn_like(v) for k, v in tiny_llama(seed=1).state_dict().items()}
        assert await engine.update_weights(new) == 1 == engine.policy_version
        after = (await collect(engine, request("w0", PROMPTS[1], max_tokens=16)))[-1]
        assert after.policy_version == 1
        assert after.token_ids != before.token_ids
        with pytest.raises(RuntimeError):  # load_state_dict is strict
            await engine.update_weights({"nonsense": torch.zeros(1)})
        assert engine.policy_version == 1
    finally:
        await engine.aclose()


async def test_gpt2_decodes_with_the_new_weights_after_an_update():
    """The lean GPT-2 step reads the parameters at every call: an in-place load reaches it."""
    new_weights = tiny_gpt2(seed=1)
    engine = TorchEngine(tiny_gpt2(), EOS)
    try:
        assert engine._worker.batch._fast is not None  # the lean path is the one under test
        await collect(engine, request("w0", PROMPTS[1]))
        await engine.update_weights(copy.deepcopy(new_weights).state_dict())
        after = (await collect(engine, request("w1", PROMPTS[1])))[-1]
    finally:
        await engine.aclose()
    assert list(after.token_ids) == greedy_reference(new_weights, PROMPTS[1], 12)


async def test_same_seed_same_sample_whatever_runs_beside_it():
    engine = TorchEngine(tiny_llama(), None)
    try:
        req = request("g0.s0", PROMPTS[0], max_tokens=16, temperature=1.0, seed=7)
        alone = (await collect(engine, req))[-1]
        again = (await collect(engine, req))[-1]
        crowd = [request(f"other{i}", PROMPTS[i % 4], max_tokens=16, temperature=1.0, seed=i) for i in range(5)]
        batched = (await read_all(engine, crowd + [req]))[req.request_id][-1]
        other_seed = (await collect(engine, request("g0.s0", PROMPTS[0], max_tokens=16, temperature=1.0, seed=8)))[-1]
        assert alone.token_ids == again.token_ids == batched.token_ids
        assert other_seed.token_ids != alone.token_ids
    finally:
        await engine.aclose()


async def test_top_p_keeps_only_the_nucleus():
    model = tiny_llama()
    reference = copy.deepcopy(model)
    engine = TorchEngine(model, EOS)
    try:
        reqs = [request(f"p{i}", PROMPTS[1], temperature=1.0, top_p=1e-6, seed=i, max_tokens=10) for i in range(4)]
        results = await read_all(engine, reqs)
    finally:
        await engine.aclose()
    want = greedy_reference(reference, PROMPTS[1], 10)
    assert all(list(results[r.request_id][-1].token_ids) == want for r in reqs)


async def test_requests_beyond_max_batch_queue_and_complete():
    model = tiny_llama()
    reference = copy.deepcopy(model)
    engine = TorchEngine(model, EOS, max_batch=2)
    try:
        reqs = [request(f"q{i}", PROMPTS[i % 4], max_tokens=8) for i in range(5)]
        results = await read_all(engine, reqs)
    finally:
        await engine.aclose()
    for r in reqs:
        assert list(results[r.request_id][-1].token_ids) == greedy_reference(reference, r.prompt.token_ids, 8)
