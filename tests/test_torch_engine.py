"""The torch engine against transformers itself: greedy parity, log-probs, abort, branch, weights, seeds."""

from __future__ import annotations

import copy

import anyio
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from engine_models import read_all
from pipeline.engines.torch_engine import TorchEngine
from pipeline.types import BranchSpec, FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

EOS = 2
GREEDY = 1e-5  # a temperature this small samples the argmax unless two logits tie within ~1e-4


@pytest.fixture
def anyio_backend():
    return "asyncio"


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=64, initializer_range=0.2,  # peaked logits: no near-ties for greedy parity
    )
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, initializer_range=0.2,
                        bos_token_id=1, eos_token_id=EOS)
    return GPT2LMHeadModel(config).eval()


def request(rid: str, tokens, *, max_tokens=12, temperature=GREEDY, top_p=1.0, seed=0, branch=None) -> SampleRequest:
    prompt = Prompt(prompt_id=0, text="", token_ids=tuple(tokens))
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
    return SampleRequest(rid, group_id=0, sample_index=0, prompt=prompt, params=params, branch=branch)


async def collect(engine, req) -> list:
    return [ev async for ev in engine.stream(req)]


def greedy_reference(model, tokens, max_tokens) -> list[int]:
    ids = torch.tensor([list(tokens)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                         eos_token_id=EOS, pad_token_id=0)
    return out[0, len(tokens):].tolist()


PROMPTS = [(5, 6, 7), (9, 10, 11, 12, 13, 14, 15, 16, 17), (20,), (30, 31, 32, 33, 34, 35)]


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
                if r.request_id == "a1" and sum(len(d.token_ids) for d in deltas) >= 3 and len(deltas) == len(seen["a1"]):
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
            spec = BranchSpec("src", prefix_len=k, prefix_token_ids=tuple(tokens[:k]), prefix_logprobs=tuple(logprobs[:k]))
            branch_events.extend(await collect(engine, request("br", PROMPTS[1], max_tokens=40, branch=spec)))

        async with anyio.create_task_group() as tg:
            async for ev in engine.stream(source):
                events.append(ev)
                got = sum((e.token_ids for e in events if isinstance(e, TokenDelta)), ())
                if source_resident and len(got) >= k and not branch_events and len(events) == len([e for e in events if isinstance(e, TokenDelta)]):
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
        results = await read_all(engine, [
            request("kept", PROMPTS[1], max_tokens=12, temperature=1.0, seed=2, branch=kept),
            request("bare", PROMPTS[1], max_tokens=12, temperature=1.0, seed=3, branch=bare),
        ])
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
        results = await read_all(engine, [request(f"d{i}", PROMPTS[i % 4], temperature=1.0, seed=i, max_tokens=10) for i in range(8)])
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
        done = [f for f in finished.values() if f.num_tokens >= 3 and f.finish_reason.is_success and EOS not in f.token_ids[:2]]
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
