"""The ray engine on a local Ray cluster: balancing, aborts, weight broadcast, replica failure.

One local Ray instance and one 2-replica pool serve the module (Ray takes 3-15 s to start
here); replicas run the torch engine with one thread each. The contract itself is checked in
test_engine_conformance.py.
"""

from __future__ import annotations

import time

import anyio
import pytest
import torch
from engine_models import counting_prompt, module_engine_fixtures, read_all, tiny_gpt2

from pipeline.engines.base import EngineError
from pipeline.types import FinishReason, SampleFinished, SampleRequest, SamplingParams, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(300)]

VOCAB = 48


def two_replicas(model_dir):
    from pipeline.engines.ray_engine import RayEngine
    from pipeline.engines.ray_replica import TorchEngineFactory

    return RayEngine(
        TorchEngineFactory(str(model_dir), eos_id=None), replicas=2, ray_init_kwargs={"log_to_driver": False}
    )


anyio_backend, model_dir, engine = module_engine_fixtures("ray", VOCAB, two_replicas)


def request(rid: str, i: int, max_tokens: int = 16, seed: int = 0) -> SampleRequest:
    prompt = counting_prompt(i, VOCAB)
    return SampleRequest(
        rid, group_id=i, sample_index=0, prompt=prompt, params=SamplingParams(max_tokens=max_tokens, seed=seed)
    )


async def test_requests_are_balanced_across_replicas(engine):
    streams = [engine.stream(request(f"bal{i}", i)) for i in range(6)]
    assert engine.outstanding() == [3, 3]
    for s in streams:
        await s.aclose()
    assert engine.outstanding() == [0, 0] and engine.open_requests == 0


async def test_samples_match_the_model_and_the_replicas_release_them(engine):
    model = tiny_gpt2(vocab_size=VOCAB, seed=3)
    reqs = [request(f"lp{i}", i, seed=i) for i in range(4)]
    results = await read_all(engine, reqs)
    for r in reqs:
        final = results[r.request_id][-1]
        assert final.finish_reason == FinishReason.LENGTH and final.num_tokens == 16
        ids = torch.tensor([list(r.prompt.token_ids) + list(final.token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits.float(), -1)[0, len(r.prompt.token_ids) - 1 : -1]
        ref = logp.gather(1, torch.tensor(final.token_ids)[:, None])[:, 0].tolist()
        assert final.logprobs == pytest.approx(ref, abs=1e-4)
    assert [s["open_requests"] for s in await engine.replica_stats()] == [0, 0]


async def test_abort_and_close_reach_the_replica(engine):
    long = [request(f"ab{i}", i, max_tokens=48, seed=i) for i in range(4)]
    streams = [engine.stream(r) for r in long]
    for s in streams:
        assert isinstance(await s.__anext__(), TokenDelta)
    await engine.abort("ab0")
    final = await streams[0].__anext__()
    assert isinstance(final, SampleFinished) and final.finish_reason == FinishReason.ABORTED
    for s in streams[1:]:
        await s.aclose()
    assert engine.open_requests == 0
    with anyio.fail_after(10):  # the replicas' engines drop them too
        while any(s["open_requests"] or s["pumps"] for s in await engine.replica_stats()):
            await anyio.sleep(0.02)


async def test_weights_are_broadcast_to_every_replica(engine):
    model = tiny_gpt2(vocab_size=VOCAB, seed=3)
    before = await read_all(engine, [request(f"w{i}", i, seed=i) for i in range(4)])
    torch.manual_seed(0)
    version = await engine.update_weights({k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()})
    assert version == engine.policy_version
    after = await read_all(engine, [request(f"w{i}", i, seed=i) for i in range(4)])
    for rid in before:
        assert after[rid][-1].policy_version == version
        assert after[rid][-1].token_ids != before[rid][-1].token_ids
    await engine.update_weights(model.state_dict())  # back to the original weights for the tests below


async def test_a_replica_dying_mid_group_fails_only_its_samples(engine):
    reqs = [request(f"die{i}", i, max_tokens=48, seed=i) for i in range(6)]
    streams = {r.request_id: engine.stream(r) for r in reqs}
    owner = {rid: engine.replica_of(rid) for rid in streams}
    for s in streams.values():
        await s.__anext__()
    engine.kill_replica(0)
    finals: dict[str, SampleFinished] = {}

    async def drain(rid, s):
        async for ev in s:
            if isinstance(ev, SampleFinished):
                assert rid not in finals  # exactly one final per sample
                finals[rid] = ev

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for rid, s in streams.items():
                tg.start_soon(drain, rid, s)
    assert sorted(finals) == sorted(streams)
    for rid, final in finals.items():
        expected = FinishReason.ERROR if owner[rid] == 0 else FinishReason.LENGTH
        assert final.finish_reason == expected, (rid, final.error)
    assert engine.replicas_alive == 1
    # The dead replica is replaced on the next request and serves it with the pool's weights.
    restarts = engine.restarts
    more = await read_all(engine, [request(f"after{i}", i) for i in range(4)])
    assert engine.restarts == restarts + 1 and engine.replicas_alive == 2
    assert all(
        evs[-1].finish_reason == FinishReason.LENGTH and evs[-1].policy_version == engine.policy_version
        for evs in more.values()
    )


def test_an_address_that_does_not_answer_is_a_clear_error_not_a_hang():
    from pipeline.engines.ray_engine import RayEngine
    from pipeline.engines.ray_replica import TorchEngineFactory

    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not answer"):
        RayEngine(TorchEngineFactory("unused", eos_id=None), address="127.0.0.1:1", connect_timeout_s=2)
    with pytest.raises(EngineError, match="did not answer"):
        RayEngine(
            TorchEngineFactory("unused", eos_id=None), address="192.0.2.1:6379", connect_timeout_s=1
        )  # TEST-NET: no reply
    assert time.monotonic() - t0 < 10
