"""Supervised warm start of the base policy, and a quick measure of how competent it is.

An environment task (``task.name: env``) is warm-started on whole demonstration episodes and
measured by playing episodes (``pipeline.policy.warm_episodes``); everything else below holds
for it too, with episode success as the accuracy.

RL from a random policy gets no reward signal: every group is all-wrong. ``warm_start``
trains the model on the task's reference solutions (loss on the response tokens only) for a
budget of steps chosen to stop at *partial* competence: a sampled accuracy around 0.3-0.5
with pass rates spread across prompts, so that a good share of groups is mixed and RL has
something to learn from (docs/design.md, "0. Wiring", has the measured figures).

**Landing on the target.** Competence jumps steeply once the model starts to solve the task:
on the CPU default about 0.15 of sampled accuracy per 25 steps near 0.4, and where a check every
25 steps lands depended on the machine (0.38, 0.53 and 0.58 at step 0 on three machines of one
config). So the warm start checks coarsely (``check_every`` steps, ``check_prompts`` prompts)
until a check reaches the target, then goes back to the last checkpoint below it (model and
optimizer state; the data of every step is seeded by its index, so the steps replay) and walks
forward again, checking every ``fine_every`` steps on ``fine_prompts`` prompts, and keeps
whichever of the two checks around the crossing is nearer the target. ``WarmStartReport.checks``
lists every check, ``kept_step`` the checkpoint kept.

``measure_policy`` samples groups from held-out prompts and reports accuracy and the share
of saturated groups (all right or all wrong), the quantity adaptive allocation lives on.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

from pipeline.policy.sampling import PolicyStats, sample_groups
from pipeline.policy.sft_rows import IGNORE, padded_batch
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.policy.warm_episodes import episode_batch, measure_episodes
from pipeline.tasks.base import Task
from pipeline.types import Prompt


@dataclass(frozen=True)
class WarmStartReport:
    """What the warm start did: its budget, its wall time and its loss at the start and end."""

    steps: int
    batch: int
    lr: float
    wall_s: float
    cpu_s: float  # process CPU time, all threads: comparable across machines that are shared
    first_loss: float
    final_loss: float  # mean over the last 10% of steps
    target_accuracy: float = 0.0  # 0: no target, all steps ran
    checks: tuple[tuple[int, float], ...] = ()  # (steps done, sampled accuracy on training prompts), in order
    kept_step: int = -1  # the checkpoint kept (steps done); -1: the last step
    kept_accuracy: float = math.nan  # its check's accuracy (nan: not checked)


def sft_batch(task: Task, tokenizer: CharTokenizer, problems, max_len: int | None = None):
    """``(input_ids, attention_mask, labels)`` of right-padded ``<bos> prompt target <eos>``
    sequences; labels are -100 except on the target and ``<eos>``."""
    rows = []
    for problem in problems:
        prompt_text, target_text = task.sft_example(problem)
        prompt = tokenizer.encode_prompt(prompt_text)
        target = tokenizer.encode_response(target_text)
        rows.append((prompt + target, [IGNORE] * len(prompt) + target))
    remedy = "make the task smaller (fewer digits or numbers)"
    return padded_batch(rows, tokenizer.pad_id, max_len, what="an SFT example", remedy=remedy)


def sequence_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over each sequence's target tokens, then over sequences.

    Why not token-mean: a 5-digit answer has 6 target tokens and a 1-digit one 2, so a token
    mean spends most of the gradient on the hardest problems and the easy ones (what a short
    warm start can actually teach) are learned several times more slowly.
    """
    logits, labels = logits[:, :-1], labels[:, 1:]  # position t predicts token t + 1
    per_token = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(labels.shape)
    counts = (labels != IGNORE).sum(dim=1).clamp(min=1)
    return (per_token.sum(dim=1) / counts).mean()


def warm_start(
    task: Task,
    tokenizer: CharTokenizer,
    model,
    steps: int = 600,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
    threads: int | None = None,
    target_accuracy: float = 0.0,
    check_every: int = 25,
    check_prompts: int = 128,
    fine_every: int = 5,
    fine_prompts: int = 512,
) -> WarmStartReport:
    """Train ``model`` in place on up to ``steps`` batches of fresh training problems.

    AdamW, linear warm-up over the first 5% of steps, cosine decay to a tenth of ``lr``.
    With ``target_accuracy`` > 0 the sampled accuracy (T = 1, 4 samples each) on training
    prompts is checked on the way, and training stops at the checkpoint nearest the target (see
    the module docstring: coarse checks every ``check_every`` steps on ``check_prompts``
    prompts, then fine ones every ``fine_every`` steps on ``fine_prompts`` prompts from the
    last coarse checkpoint below the target). Why a target and not a step count: competence can
    jump steeply (arithmetic with ``padding="max"`` went from 0.11 to 0.76 between steps 200
    and 400), so a fixed step count lands at very different places for other seeds, tasks and
    models. ``threads`` sets torch's thread count for the duration (None: leave it).
    """
    if not 0 <= target_accuracy < 1:
        raise ValueError(f"target_accuracy={target_accuracy} must be in [0, 1); 0 runs all steps")
    if check_every < 1 or fine_every < 1:
        raise ValueError(f"check_every={check_every} and fine_every={fine_every} must be >= 1")
    from tqdm.auto import tqdm

    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    max_len = getattr(model.config, "max_position_embeddings", None)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    episodic = callable(getattr(task, "sft_episodes", None))  # an environment: whole episodes (warm_episodes)
    measure = measure_episodes if episodic else measure_policy

    def check(done: int, prompts: int) -> float:
        # seed -1 - seed: a fixed check set that is not also the first training batch
        stats = measure(task, tokenizer, model, n_prompts=prompts, group_size=4, seed=-1 - seed, split="train")
        model.train()
        checks.append((done, stats.accuracy))
        bar.set_postfix(loss=f"{losses[-1]:.3f}" if losses else "", acc=f"{stats.accuracy:.2f}")
        return stats.accuracy

    def snapshot(done: int, accuracy: float) -> tuple[int, float, dict, dict]:
        return done, accuracy, copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())

    losses: list[float] = []
    checks: list[tuple[int, float]] = []
    kept_step, kept_accuracy = -1, math.nan
    below = snapshot(0, math.nan)  # the last checkpoint whose check fell short of the target
    every, prompts = check_every, check_prompts
    refine = fine_every < check_every  # a second, finer pass once a coarse check crosses the target
    model.train()
    start, cpu_start = time.perf_counter(), time.process_time()
    bar = tqdm(total=steps, desc=f"warm start ({task.name})", disable=not progress, leave=False)
    try:
        step = 0
        while step < steps:
            # a fresh seeded batch per step: the same seed replays the same data
            if episodic:
                ids, mask, labels = episode_batch(task, tokenizer, batch, seed * 1_000_003 + step, max_len)
            else:
                problems = task.train_problems(batch, seed=seed * 1_000_003 + step)
                ids, mask, labels = sft_batch(task, tokenizer, problems, max_len)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = sequence_mean_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            bar.update(step - bar.n)
            if step % 10 == 1:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if not target_accuracy or (step % every and step != steps):
                continue
            accuracy = check(step, prompts)
            if accuracy < target_accuracy:
                below = snapshot(step, accuracy)
                continue
            if refine:
                # 1) crossed between two coarse checks: back to the last one below, then walk in fine steps
                step, _, weights, optimizer = below
                model.load_state_dict(weights)
                opt.load_state_dict(optimizer)
                del losses[step:]
                every, prompts, refine = fine_every, fine_prompts, False
                if step == 0 or check(step, prompts) < target_accuracy:
                    below = snapshot(step, checks[-1][1] if step else math.nan)
                    continue
                kept_step, kept_accuracy = step, checks[-1][1]  # the coarse check there was low by noise
                break
            # 2) crossed between two checks of the same size: keep whichever is nearer the target
            kept_step, kept_accuracy = step, accuracy
            if below[0] > 0 and target_accuracy - below[1] < accuracy - target_accuracy:
                kept_step, kept_accuracy = below[0], below[1]
                model.load_state_dict(below[2])
                del losses[kept_step:]
            break
    finally:
        bar.close()
        model.eval()
        torch.set_num_threads(old_threads)
    tail = losses[-max(1, len(losses) // 10) :] if losses else [float("nan")]
    return WarmStartReport(
        steps=len(losses),
        batch=batch,
        lr=lr,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu_start,
        first_loss=losses[0] if losses else float("nan"),
        final_loss=sum(tail) / len(tail),
        target_accuracy=target_accuracy,
        checks=tuple(checks),
        kept_step=kept_step,
        kept_accuracy=kept_accuracy,
    )


def measure_policy(
    task: Task,
    tokenizer: CharTokenizer,
    model,
    n_prompts: int = 256,
    group_size: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int | None = None,
    batch_prompts: int = 64,
    split: str = "eval",
) -> PolicyStats:
    """Sample ``group_size`` responses for each of ``n_prompts`` prompts of ``split`` (held-out
    by default) and grade them with the task's reward. ``max_new_tokens``: default the task's
    ``sample_tokens`` (32; a scratchpad task's longest response)."""
    start = time.perf_counter()
    if max_new_tokens is None:
        max_new_tokens = task.sample_tokens
    problems = task.problems(split, n_prompts, seed=seed)
    prompts = [task.to_prompt(p, tokenizer.encode_prompt) for p in problems]
    rates: list[float] = []
    graded: list[Prompt] = []
    for lo in range(0, n_prompts, batch_prompts):
        chunk = prompts[lo : lo + batch_prompts]
        groups = sample_groups(
            model,
            tokenizer,
            [p.token_ids for p in chunk],
            group_size,
            temperature,
            max_new_tokens,
            seed=seed * 7919 + lo,
        )
        for prompt, group in zip(chunk, groups):
            rewards = [task.score(prompt, tokenizer.decode(r)) for r in group]
            rewards = [r for r in rewards if r is not None]  # None: no reward for that response (a user's function)
            if rewards:
                rates.append(sum(rewards) / len(rewards))
                graded.append(prompt)
    return PolicyStats.of(graded, rates, group_size, time.perf_counter() - start)
