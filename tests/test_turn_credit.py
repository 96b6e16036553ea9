"""``learner.turn_credit``: a multi-turn episode's tokens also learn from their own turn's reward."""

from __future__ import annotations

import pytest
import torch
from torch_models import llama_config
from transformers import LlamaForCausalLM

from learner.config import LearnerConfig
from learner.packing import BatchError, pack
from learner.torch_learner import TorchLearner
from learner.turn_credit import turn_advantages
from pipeline.advantages import grpo_advantages
from pipeline.config.build import ConfigError
from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch, Turns

torch.set_num_threads(1)
PROMPT = (1, 3, 4)
RIGHT, WRONG, OBS = (7, 2), (8, 2), (9, 9)
MASK = (True, True, False, False, True, True)  # turn 1, the environment's answer, turn 2


def _learner(**overrides) -> TorchLearner:
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(32, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    return TorchLearner(model, LearnerConfig(**overrides), pad_id=0)


def _failed_episodes(learner: TorchLearner, step: int = 0) -> TrainBatch:
    """Two failed episodes (episode reward 0 each: no episode advantage): one got its first
    step right and its second wrong, the other both wrong. On-policy log-probs."""
    episodes = []
    for i, first in enumerate((RIGHT, WRONG)):
        tokens = first + OBS + WRONG
        turns = Turns(ends=(2, 6), rewards=(float(first == RIGHT), 0.0), policy_mask=MASK)
        r = Rollout(f"e{i}", i, PROMPT, tokens, (0.0,) * 6, 0.0, FinishReason.STOP, step, turns=turns)
        [lp] = learner.logprobs([r])
        episodes.append(Rollout(r.request_id, i, PROMPT, tokens, lp, 0.0, FinishReason.STOP, step, turns=turns))
    return TrainBatch(step, (CommittedGroup(0, 5, tuple(episodes), launched=2, tokens=12),))


def _first_turn_logprob(learner: TorchLearner, first: tuple[int, ...]) -> float:
    r = Rollout("x", 0, PROMPT, first, (0.0,) * len(first), 0.0, FinishReason.STOP, 0)
    return sum(learner.logprobs([r])[0])


def test_without_turn_credit_a_group_of_failed_episodes_teaches_nothing():
    learner = _learner()
    grads = learner.compute_gradients(_failed_episodes(learner))
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


def test_with_turn_credit_the_right_step_of_a_failed_episode_is_reinforced():
    learner = _learner(turn_credit=1.0, lr=1e-2)
    right0, wrong0 = _first_turn_logprob(learner, RIGHT), _first_turn_logprob(learner, WRONG)
    for step in range(5):
        result = learner.step(_failed_episodes(learner, step))
        assert result.metrics["learner/approx_kl"] < 1e-5  # on-policy, observations out of the loss
    assert _first_turn_logprob(learner, RIGHT) > right0 + 0.5
    assert _first_turn_logprob(learner, WRONG) < wrong0 - 0.5


def test_single_turn_rollouts_train_the_same_with_or_without_turn_credit():
    batches = []
    for credit in (0.0, 1.0):
        learner = _learner(turn_credit=credit)
        rollouts = []
        for i, (tokens, reward) in enumerate(((RIGHT, 1.0), (WRONG, 0.0))):
            r = Rollout(f"r{i}", i, PROMPT, tokens, (0.0,) * 2, reward, FinishReason.STOP, 0)
            rollouts.append(
                Rollout(r.request_id, i, PROMPT, tokens, learner.logprobs([r])[0], reward, r.finish_reason, 0)
            )
        batch = TrainBatch(0, (CommittedGroup(0, 5, tuple(rollouts), launched=2, tokens=4),))
        batches.append(learner.compute_gradients(batch))
    assert all(torch.equal(batches[0][k], batches[1][k]) for k in batches[0])


def test_bad_turn_credit_and_mismatched_token_advantages_are_named():
    with pytest.raises(ConfigError, match=r"learner.turn_credit=-1.0 must be a finite number >= 0"):
        LearnerConfig(turn_credit=-1.0)
    r = Rollout("e0", 0, PROMPT, RIGHT, (0.0, 0.0), 1.0, FinishReason.STOP, 0)
    import numpy as np

    with pytest.raises(BatchError, match="'e0' has \\(3,\\) token advantages for 2 tokens"):
        pack([r], [np.zeros(3, dtype=np.float32)], pad_id=0, micro_batch=4)


def test_turn_advantages_are_the_run_advantage_function_over_the_group_turns():
    """Per-turn credit is GRPO's group-relative advantage (pipeline.advantages, the one advantage
    function of both learners) over the group's turns pooled, split back into episodes; a
    group whose turns all earned the same gets exact zeros, as a saturated group does."""
    episodes = [
        Turns(ends=(2, 6), rewards=(1.0, 0.0), policy_mask=MASK),
        None,  # a rollout without turns
        Turns(ends=(2, 4, 6), rewards=(0.0, 0.5, 1.0), policy_mask=(True,) * 6),
    ]
    (pooled,) = grpo_advantages([(1.0, 0.0, 0.0, 0.5, 1.0)])
    assert turn_advantages(episodes) == [pooled[:2], None, pooled[2:]]
    same = [
        Turns(ends=(2, 6), rewards=(0.1, 0.1), policy_mask=MASK),
        Turns(ends=(6,), rewards=(0.1,), policy_mask=MASK),
    ]
    assert turn_advantages(same) == [(0.0, 0.0), (0.0,)]  # (0.1 + 0.1 + 0.1) / 3 is not 0.1: no residue over eps
