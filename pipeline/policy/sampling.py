"""Sampling a policy's groups with the model itself (no engine), and what such a sample says.

``sample_groups`` is the warm start's sampler: a plain KV-cache loop over a batch of prompts;
``PolicyStats`` is the competence it measures (``warmstart.measure_policy``,
``warm_episodes.measure_episodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline.policy.tokenizer import CharTokenizer
from pipeline.types import Prompt


@dataclass(frozen=True)
class PolicyStats:
    """Sampled competence of a policy on held-out prompts, in groups of ``group_size``."""

    accuracy: float
    saturated: float  # share of groups all right or all wrong
    all_correct: float
    all_wrong: float
    n_prompts: int
    group_size: int
    by_difficulty: tuple[tuple[float, float], ...]  # (difficulty, accuracy), ascending
    wall_s: float

    @classmethod
    def of(cls, prompts: Sequence[Prompt], rates: Sequence[float], group_size: int, wall_s: float) -> PolicyStats:
        """The statistics of per-prompt success rates (``rates[i]`` of ``prompts[i]``).

        >>> from pipeline.types import Prompt
        >>> s = PolicyStats.of([Prompt(0, "", (), difficulty=1), Prompt(1, "", (), difficulty=2)], [1.0, 0.5], 4, 0.0)
        >>> s.accuracy, s.saturated, s.by_difficulty
        (0.75, 0.5, ((1, 1.0), (2, 0.5)))
        """
        by_d: dict[float, list[float]] = {}
        for prompt, rate in zip(prompts, rates):
            by_d.setdefault(prompt.difficulty, []).append(rate)
        n = max(1, len(rates))
        return cls(
            accuracy=sum(rates) / n,
            saturated=sum(r in (0.0, 1.0) for r in rates) / n,
            all_correct=sum(r == 1.0 for r in rates) / n,
            all_wrong=sum(r == 0.0 for r in rates) / n,
            n_prompts=len(rates),
            group_size=group_size,
            by_difficulty=tuple((d, sum(v) / len(v)) for d, v in sorted(by_d.items())),
            wall_s=wall_s,
        )


@torch.no_grad()
def sample_groups(
    model,
    tokenizer: CharTokenizer,
    prompt_ids,
    group_size: int,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> list[list[list[int]]]:
    """``group_size`` sampled responses per prompt (token ids, without ``<eos>``).

    A plain KV-cache loop rather than ``generate``: prompts are left-padded and every row
    gets explicit position ids counted from its first real token (GPT-2's positions are
    absolute), and sampling draws from its own seeded ``torch.Generator``. Responses are
    cut at the model's position limit.
    """
    rows = [list(p) for p in prompt_ids for _ in range(group_size)]
    width = max(len(r) for r in rows)
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if limit is not None:
        if width >= limit:
            raise ValueError(
                f"a prompt of {width} tokens leaves no room under the model's max_len={limit}; raise model.max_len"
            )
        max_new_tokens = min(max_new_tokens, limit - width)
    n = len(rows)
    ids = torch.full((n, width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator().manual_seed(seed)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    next_pos = positions[:, -1:] + 1
    done = torch.zeros(n, dtype=torch.bool)
    responses: list[list[int]] = [[] for _ in range(n)]
    for _ in range(max_new_tokens):
        probs = torch.softmax(out.logits[:, -1].float() / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        finished = token == tokenizer.eos_id
        for i, (t, was_done) in enumerate(zip(token.tolist(), done.tolist())):
            if not was_done and t != tokenizer.eos_id:
                responses[i].append(t)
        done |= finished
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        next_pos = next_pos + 1
    return [responses[i : i + group_size] for i in range(0, n, group_size)]
