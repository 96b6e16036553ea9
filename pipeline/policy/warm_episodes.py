"""The supervised warm start of an environment task (``task.name: env``): whole episodes.

``episode_batch`` turns the task's demonstration episodes (``EnvTask.sft_episodes``: a teacher's
answers played through the real environment, some first answered wrong and then corrected) into
one right-padded batch: the context is the rendered prompt, every turn and every observation;
the loss is on the teacher's right answers only (a demonstrated mistake and the environment's
observations are context, not targets), so the model learns both to answer and to use the
environment's feedback.

``measure_episodes`` plays episodes with the model itself, turn by turn, every episode's turn of
one round sampled in one batch (``warmstart.sample_groups``) and stepped through its own
``EnvSession``; the accuracy is the share of episodes that end with a reward above the prompt's
success threshold. The warm start checks it on the way to its target (``warm_start``), as it
checks sampled accuracy on a single-turn task.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pipeline.envs.render import PlainRenderer
from pipeline.policy.sampling import PolicyStats, sample_groups
from pipeline.policy.sft_rows import IGNORE, padded_batch


def renderer_of(tokenizer: Any) -> PlainRenderer:
    """The renderer the project's character model reads and writes episodes with."""
    return PlainRenderer(tokenizer)


def episode_row(renderer: PlainRenderer, demo: Any) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one demonstration episode; labels only on its target turns."""
    ids = list(renderer.prompt_ids(list(demo.conversation)))
    labels = [IGNORE] * len(ids)
    for turn in demo.turns:
        action = renderer.action_ids(turn.action)
        ids += action
        labels += action if turn.target else [IGNORE] * len(action)
        observation = renderer.observation_ids(list(turn.observations)) if turn.observations else []
        ids += observation
        labels += [IGNORE] * len(observation)
    return ids, labels


def episode_batch(task: Any, tokenizer: Any, batch: int, seed: int, max_len: int | None = None):
    """``(input_ids, attention_mask, labels)`` of ``batch`` demonstration episodes."""
    renderer = renderer_of(tokenizer)
    rows = [episode_row(renderer, demo) for demo in task.sft_episodes(batch, seed=seed)]
    remedy = "shorten the episodes (fewer steps, task.env.max_turns)"
    return padded_batch(rows, tokenizer.pad_id, max_len, what="a demonstration episode", remedy=remedy)


@torch.no_grad()
def measure_episodes(
    task: Any,
    tokenizer: Any,
    model: Any,
    n_prompts: int = 256,
    group_size: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    split: str = "eval",
    turn_tokens: int = 8,
) -> Any:
    """Play ``group_size`` episodes of each of ``n_prompts`` prompts of ``split`` with ``model``;
    a ``warmstart.PolicyStats`` of the episodes' success (an environment failure is a failure)."""
    start = time.perf_counter()
    renderer = renderer_of(tokenizer)
    prompts = (
        task.eval_prompts(n_prompts, seed, renderer.prompt_ids)
        if split == "eval"
        else task.train_prompts(n_prompts, seed, renderer.prompt_ids)
    )
    episodes = []  # [session, context, prompt index]
    for k, prompt in enumerate(prompts):
        row = task.row(prompt.prompt_id)
        for _ in range(group_size):
            session = task.runner.session(row.extras)
            started = session.start(row.prompt)
            episodes.append([session, list(renderer.prompt_ids(list(started.conversation))), k])
    turn = 0
    try:
        while True:
            live = [e for e in episodes if not e[0].done and not e[0].failed]
            if not live or turn >= task.config.max_turns:
                break
            answers = sample_groups(
                model, tokenizer, [e[1] for e in live], 1, temperature, turn_tokens, seed=seed * 1009 + turn
            )
            for episode, [response] in zip(live, answers):
                result = episode[0].step(renderer.action_text(response + [tokenizer.eos_id]))
                episode[1] += response + [tokenizer.eos_id]
                if not result.done and not result.error:
                    episode[1] += renderer.observation_ids(list(result.observations))
            turn += 1
    finally:
        for episode in episodes:
            episode[0].close()
    success = [0.0] * len(prompts)
    for session, _, k in episodes:
        ok = not session.failed and session.done and session.episode_reward > prompts[k].success_threshold
        success[k] += ok / group_size
    return PolicyStats.of(prompts, success, group_size, time.perf_counter() - start)
