"""TorchLearner on a tiny random transformers model: scoring, gradients, learning, resume, errors."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from learner.config import LearnerConfig
from learner.packing import BatchError
from learner.torch_learner import TorchLearner
from pipeline.policy.models import build_model
from pipeline.protocols import Learner
from pipeline.store.buffer import ArrowBuffer
from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch

torch.set_num_threads(1)
VOCAB = 32


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    return build_model(VOCAB, 32, 2, 2, 64, seed=seed, pad_id=0, arch="llama", mlp_ratio=2)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    return build_model(VOCAB, 32, 2, 2, 64, seed=seed, pad_id=None)


def make_learner(model=None, **overrides) -> TorchLearner:
    return TorchLearner(model if model is not None else tiny_llama(), LearnerConfig(**overrides), pad_id=0)


def on_policy(learner: TorchLearner, groups, step: int = 0, version: int = 0) -> TrainBatch:
    """A batch whose log-probs are the learner's own (what an engine on the same weights reports).
    ``groups``: a list of (prompt, [(tokens, reward), ...])."""
    committed = []
    for gid, (prompt, samples) in enumerate(groups):
        rollouts = [
            Rollout(f"g{gid}.s{i}", i, tuple(prompt), tuple(t), (0.0,) * len(t), float(r), FinishReason.STOP, version)
            for i, (t, r) in enumerate(samples)
        ]
        lps = learner.logprobs(rollouts)
        rollouts = [
            Rollout(
                r.request_id,
                r.sample_index,
                r.prompt_token_ids,
                r.token_ids,
                lp,
                r.reward,
                r.finish_reason,
                r.policy_version,
            )
            for r, lp in zip(rollouts, lps)
        ]
        committed.append(
            CommittedGroup(
                gid, 100 + gid, tuple(rollouts), launched=len(rollouts), tokens=sum(len(t) for t, _ in samples)
            )
        )
    return TrainBatch(step, tuple(committed))


def random_groups(seed: int = 0, sizes=(2, 3, 5, 1)):
    """Variable-size groups, prompts of 2-6 tokens, responses of 1-7 tokens, mixed rewards."""
    rng = random.Random(seed)
    groups = []
    for size in sizes:
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 5))]
        samples = [
            ([rng.randrange(3, VOCAB) for _ in range(rng.randint(0, 6))] + [2], rng.random() < 0.5) for _ in range(size)
        ]
        samples[0] = (samples[0][0], 1.0)  # at least one success, so most groups are effective
        groups.append((prompt, samples))
    return groups


def plain_logprobs(model, prompt, tokens) -> list[float]:
    """Reference: one unpadded row, full forward, log-softmax, gather."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = len(prompt)
    return [float(logp[p - 1 + j, t]) for j, t in enumerate(tokens)]


def max_rel_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).norm() / (a[k].norm() + 1e-12)) for k in a)


# --- scoring -------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_logprobs_match_a_plain_forward_pass(build, share):
    learner = make_learner(build(), share_prompts=share, micro_batch=3)
    rollouts = [r for g in on_policy(learner, random_groups()).groups for r in g.rollouts]
    for r in rollouts:
        expected = plain_logprobs(learner.model, r.prompt_token_ids, r.token_ids)
        assert r.logprobs == pytest.approx(expected, abs=2e-5)


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_shared_prompts_give_the_same_gradient_as_full_rows(build):
    model = build()
    shared = make_learner(model, share_prompts=True)
    batch = on_policy(shared, random_groups(1))
    full = make_learner(model, share_prompts=False)
    assert max_rel_diff(shared.compute_gradients(batch), full.compute_gradients(batch)) < 1e-4


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_micro_batching_gives_the_same_gradient_as_one_big_batch(agg):
    model = tiny_llama()
    big = make_learner(model, micro_batch=64, loss_agg=agg)
    batch = on_policy(big, random_groups(2))
    reference = big.compute_gradients(batch)
    for micro in (1, 3):
        for share in (True, False):
            small = make_learner(model, micro_batch=micro, loss_agg=agg, share_prompts=share)
            assert max_rel_diff(small.compute_gradients(batch), reference) < 1e-4


def test_all_zero_advantages_give_zero_gradient():
    learner = make_learner()
    batch = on_policy(learner, [([1, 5], [([6, 2], 1.0), ([7, 7, 2], 1.0)]), ([1, 9, 4], [([3, 2], 0.0)] * 3)])
    grads = learner.compute_gradients(batch)
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


# --- learning ------------------------------------------------------------------------------

PROMPT = [1, 5, 6]
GOOD, BAD = [7, 8, 2], [9, 10, 2]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "drgrpo"])
def test_learner_raises_the_logprob_of_the_rewarded_completion(algorithm):
    learner = make_learner(lr=1e-2, algorithm=algorithm)

    def total_logprob(tokens):
        return sum(plain_logprobs(learner.model, PROMPT, tokens))

    good0, bad0 = total_logprob(GOOD), total_logprob(BAD)
    for step in range(5):
        batch = on_policy(
            learner, [(PROMPT, [(GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0)])], step=step, version=step
        )
        result = learner.step(batch)
        assert result.metrics["learner/clip_frac"] == 0.0  # on-policy: ratio 1
        assert result.metrics["learner/approx_kl"] < 1e-6
    assert result.policy_version == 5
    assert total_logprob(GOOD) > good0 + 1.0
    assert total_logprob(BAD) < bad0 - 1.0


def test_stale_batch_is_clipped_and_stops_pushing():
    learner = make_learner(lr=1e-2)
    stale = on_policy(learner, [(PROMPT, [(GOOD, 1.0), (BAD, 0.0)])])
    clip = [learner.step(stale).metrics["learner/clip_frac"] for _ in range(8)]
    assert clip[0] == 0.0 and clip[-1] > 0.5
    good = sum(plain_logprobs(learner.model, PROMPT, GOOD))
    ratio = math.exp(good - sum(stale.groups[0].rollouts[0].logprobs))
    assert ratio > 1.2  # it moved past the clip range, and then the clip held it back


def test_ppo_epochs_reuse_the_batch_off_policy():
    learner = make_learner(lr=1e-2, ppo_epochs=3)
    result = learner.step(on_policy(learner, random_groups(3)))
    assert result.policy_version == 1
    assert result.metrics["learner/approx_kl"] > 1e-6  # epochs 2 and 3 saw a moved policy


def test_mask_saturated_only_rescales_the_token_mean_gradient():
    groups = [([1, 5], [([6, 2], 1.0), ([7, 8, 2], 0.0)]), ([1, 9], [([3, 3, 3, 2], 1.0), ([4, 2], 1.0)])]
    model = tiny_llama()
    keep = make_learner(model, mask_saturated=False)
    batch = on_policy(keep, groups)
    drop = make_learner(model, mask_saturated=True)
    g_keep, g_drop = keep.compute_gradients(batch), drop.compute_gradients(batch)
    dilution = 5 / 11  # effective tokens / all tokens
    assert max_rel_diff({k: g_drop[k] * dilution for k in g_drop}, g_keep) < 1e-5


def test_all_saturated_batch_with_mask_saturated_skips_the_update():
    learner = make_learner(mask_saturated=True)
    before = learner.weights()
    result = learner.step(on_policy(learner, [([1, 5], [([6, 2], 1.0), ([7, 2], 1.0)])]))
    assert result.metrics["learner/skipped_steps"] == 1.0 and result.policy_version == 1
    assert all(torch.equal(before[k], v) for k, v in learner.weights().items())


def test_kl_penalty_uses_a_frozen_copy_of_the_initial_policy():
    learner = make_learner(lr=1e-2, kl_coef=0.1)
    initial = learner.weights()
    kls = [
        learner.step(on_policy(learner, [(PROMPT, [(GOOD, 1.0), (BAD, 0.0)])])).metrics["learner/kl_ref"]
        for _ in range(3)
    ]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[-1] > 1e-4
    assert all(torch.equal(initial[k], v) for k, v in learner.ref_model.state_dict().items())
    assert "ref_model" in learner.state_dict()


def test_bfloat16_autocast_step_is_finite():
    learner = make_learner(dtype="bfloat16")
    metrics = learner.step(on_policy(learner, random_groups(4))).metrics
    assert all(math.isfinite(v) for v in metrics.values())


# --- protocol, weights, resume -------------------------------------------------------------


def test_learner_satisfies_the_protocol_and_reports_namespaced_metrics():
    learner = make_learner()
    assert isinstance(learner, Learner)
    metrics = learner.step(on_policy(learner, random_groups())).metrics
    for name in (
        "loss",
        "grad_norm",
        "clip_frac",
        "approx_kl",
        "entropy",
        "reward_mean",
        "adv_std",
        "tokens",
        "step_s",
        "saturated_frac",
        "staleness_max",
    ):
        assert f"learner/{name}" in metrics
    assert all(k.startswith("learner/") and math.isfinite(v) for k, v in metrics.items())


def test_weights_are_a_detached_copy_the_engine_can_load_in_place():
    learner = make_learner(lr=1e-2)
    engine_model = copy.deepcopy(learner.model)
    weights = learner.weights()
    frozen = {k: v.clone() for k, v in weights.items()}
    learner.step(on_policy(learner, [(PROMPT, [(GOOD, 1.0), (BAD, 0.0)])]))
    assert all(torch.equal(frozen[k], v) and not v.requires_grad for k, v in weights.items())
    engine_model.load_state_dict(learner.weights())
    assert all(
        torch.equal(a, b) for a, b in zip(engine_model.state_dict().values(), learner.model.state_dict().values())
    )


def test_state_dict_round_trip_resumes_bit_identically():
    learner = make_learner(lr=1e-2)
    batches = [on_policy(learner, random_groups(seed)) for seed in range(3)]
    for b in batches[:2]:
        learner.step(b)
    state = learner.state_dict()
    expected = learner.step(batches[2])
    expected_weights = learner.weights()

    resumed = make_learner(tiny_llama(seed=7), lr=1e-2)  # other initial weights: all must come from the state
    resumed.load_state_dict(state)
    got = resumed.step(batches[2])
    assert got.policy_version == expected.policy_version == 3
    for key in ("learner/loss", "learner/grad_norm", "learner/entropy"):
        assert got.metrics[key] == expected.metrics[key]
    assert all(torch.equal(expected_weights[k], v) for k, v in resumed.weights().items())


def test_buffer_round_trip_keeps_the_step_identical():
    model = tiny_llama()
    direct, buffered = make_learner(copy.deepcopy(model)), make_learner(copy.deepcopy(model))
    batch = on_policy(direct, random_groups(5))
    record_batch = ArrowBuffer(None, persist=False).put(batch, advantages=direct.advantages(batch))
    assert record_batch.column("advantage").to_pylist()[0] == pytest.approx(direct.advantages(batch)[0][0], rel=1e-6)
    again = ArrowBuffer.to_train_batch(record_batch)
    assert direct.step(batch).metrics["learner/loss"] == buffered.step(again).metrics["learner/loss"]


# --- bad input -----------------------------------------------------------------------------


def _batch_of(*rollouts: Rollout) -> TrainBatch:
    return TrainBatch(4, (CommittedGroup(0, 0, tuple(rollouts), launched=len(rollouts), tokens=1),))


def _rollout(rid="g0.s0", prompt=(1, 5), tokens=(6, 2), logprobs=(-1.0, -1.0)) -> Rollout:
    return Rollout(rid, 0, prompt, tokens, logprobs, 1.0, FinishReason.STOP, 0)


@pytest.mark.parametrize(
    "batch, message",
    [
        (TrainBatch(4, ()), r"TrainBatch\(step=4\) has no groups"),
        (TrainBatch(4, (CommittedGroup(3, 0, (), 0, 0),)), "group 3 of step 4 has no rollouts"),
        (_batch_of(_rollout(), _rollout("g0.s1", tokens=(), logprobs=())), "rollout 'g0.s1' has no response tokens"),
        (_batch_of(_rollout(prompt=())), "rollout 'g0.s0' has an empty prompt"),
        (_batch_of(_rollout(logprobs=(-1.0,))), "has 1 log-probs for 2 tokens"),
        (_batch_of(_rollout(tokens=(6, 99))), r"token id 99, outside the model's vocabulary \[0, 32\)"),
        (_batch_of(_rollout(logprobs=(-1.0, float("nan")))), "non-finite log-prob"),
    ],
)
def test_bad_input_gives_a_clear_error(batch, message):
    learner = make_learner()
    with pytest.raises(BatchError, match=message):
        learner.step(batch)
    assert learner.policy_version == 0


def test_engine_logprobs_agree_with_the_learner():
    import anyio

    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.types import Prompt, SampleRequest, SamplingParams

    learner = make_learner()
    engine = TorchEngine(copy.deepcopy(learner.model), tokenizer_eos_id=2)
    prompt = Prompt(prompt_id=0, text="", token_ids=(1, 5, 6))

    async def sample(i):
        req = SampleRequest(f"g0.s{i}", 0, i, prompt, SamplingParams(max_tokens=6, seed=i))
        return [ev async for ev in engine.stream(req)][-1]

    async def main():
        return [await sample(i) for i in range(4)]

    finals = anyio.run(main)
    rollouts = tuple(
        Rollout(f.request_id, i, prompt.token_ids, f.token_ids, f.logprobs, float(i % 2), f.finish_reason, 0)
        for i, f in enumerate(finals)
    )
    result = learner.step(TrainBatch(0, (CommittedGroup(0, 0, rollouts, 4, 0),)))
    assert result.metrics["learner/approx_kl"] < 1e-6 and result.metrics["learner/clip_frac"] == 0.0


@pytest.mark.parametrize("share_prompts", [True, False])
def test_an_episode_is_on_policy_with_its_observations_in_context_and_out_of_the_loss(share_prompts):
    """The learner attends to an episode's observations (the engine's context held them) and
    trains only on the policy's turns: on-policy, the first step's approx KL is 0 and the
    tokens trained are the turns' alone."""
    from pipeline.types import Turns

    learner = make_learner(share_prompts=share_prompts)
    tokens, mask = (5, 6, 2, 9, 9, 9, 7, 2), (True, True, True, False, False, False, True, True)
    episodes = []
    for i, reward in enumerate((0.0, 1.0)):
        r = Rollout(
            f"e{i}",
            i,
            (1, 3, 4),
            tokens[:6] + ((7, 2) if i else (8, 2)),
            (0.0,) * 8,
            reward,
            FinishReason.STOP,
            0,
            turns=Turns((3, 8), (0.0, reward), mask),
        )
        [lp] = learner.logprobs([r])  # every response token, observations included, as the engine scored them
        episodes.append(
            Rollout(r.request_id, i, r.prompt_token_ids, r.token_ids, lp, reward, r.finish_reason, 0, turns=r.turns)
        )
    metrics = learner.step(TrainBatch(0, (CommittedGroup(0, 7, tuple(episodes), launched=2, tokens=16),))).metrics
    assert abs(metrics["learner/approx_kl"]) < 1e-5
    assert metrics["learner/tokens"] == 2 * sum(mask)
