"""Rollouts to padded tensors: the micro-batches a causal LM scores.

Every tensor the loss sees is ``[b, L]``: row i is rollout i's response, right-padded to the
chunk's longest response L; ``targets`` holds the response tokens, ``loss_mask`` is True on
them (but on an episode's observations and a guidance prefix, ``Rollout.guide_len``), ``old_logprobs``
holds the engine's log-probs. What the model runs on comes in one of
two layouts:

* **full rows** (``share_prompts=False``): each row is ``prompt + response``, right-padded,
  with an attention mask; the logits that predict response token j of a prompt of P tokens
  sit at position ``P - 1 + j`` (``score_positions``).
* **shared prompts** (``share_prompts=True``, the default): a group's rollouts share one
  prompt, so each distinct prompt of the chunk runs once (``prompt_ids``, right-padded) and
  its key/value cache is copied to the rows that continue it (``row_prompt``); the responses
  then run on top of that cache at positions ``P, P + 1, ...``. The result is the same (up to
  float rounding) and the gradient too, since copying rows is differentiable; the prompt
  tokens are computed once per group instead of once per rollout (2x fewer tokens on the
  project's tasks, whose prompts are longer than their answers).

Either way every real token sits at its natural position (0, 1, 2, ...), where the engine
sampled it. Rows are ordered by prompt (groups stay together; prompts with the longest
answers first) or, for full rows, by length, so each micro-batch pads only to what it holds; order does not change the result,
since the loss is a weighted sum over tokens with batch-wide normalisers.

>>> from pipeline.types import FinishReason, Rollout
>>> r = lambda p, t: Rollout("r", 0, p, t, (-1.0,) * len(t), 1.0, FinishReason.STOP, 0)
>>> rs = [r((1, 5), (6, 2)), r((1,), (7, 8, 9, 2)), r((1, 5), (4, 2))]
>>> c = pack(rs, [0.5, -0.5, 0.0], pad_id=0, micro_batch=8)[0]
>>> c.index, c.prompt_ids.tolist(), c.row_prompt.tolist()
((1, 0, 2), [[1, 0], [1, 5]], [0, 1, 1])
>>> c.targets.tolist(), c.loss_mask.int().tolist()
([[7, 8, 9, 2], [6, 2, 0, 0], [4, 2, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])
>>> from pipeline.types import Turns            # a turn (7), an observation (3), a turn (9, 2)
>>> episode = Rollout("e", 0, (1,), (7, 3, 9, 2), (-1.0,) * 4, 1.0, FinishReason.STOP, 0,
...                   turns=Turns(ends=(1, 4), rewards=(0.0, 1.0), policy_mask=(True, False, True, True)))
>>> pack([episode], [1.0], pad_id=0, micro_batch=8)[0].loss_mask.int().tolist()   # the observation (3) is left out
[[1, 0, 1, 1]]
>>> guided = Rollout("g", 0, (1,), (7, 8, 9, 2), (0.0,) * 4, 1.0, FinishReason.STOP, 0, guide_len=2, guide_level=0.5)
>>> pack([guided], [1.0], pad_id=0, micro_batch=8)[0].loss_mask.int().tolist()   # the reference's 7, 8 are left out
[[0, 0, 1, 1]]
>>> f = pack(rs, [0.5, -0.5, 0.0], pad_id=0, micro_batch=8, share_prompts=False)[0]
>>> f.index, f.input_ids.tolist()[0], f.score_positions.tolist()[0]
((1, 0, 2), [1, 7, 8, 9, 2], [0, 1, 2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.types import Rollout


class BatchError(ValueError):
    """A train batch the learner cannot use; the message names the group or rollout and the fix."""


@dataclass
class Chunk:
    """One micro-batch. ``index`` maps its rows back to the positions of the packed rollouts;
    ``ref_logprobs`` is filled once by a learner that keeps a reference model."""

    targets: torch.Tensor  # [b, L] int64: response tokens, pad_id after the end
    loss_mask: torch.Tensor  # [b, L] bool: the tokens trained on (an episode's observations are not)
    token_mask: torch.Tensor  # [b, L] bool: every response token, what the model attends to
    old_logprobs: torch.Tensor  # [b, L] float32: the engine's log-probs, 0 after the end
    advantages: torch.Tensor  # [b] float32, or [b, L] when a row has one advantage a token (turn credit)
    index: tuple[int, ...]
    # full rows
    input_ids: torch.Tensor | None = None  # [b, T] prompt + response, right-padded
    attention_mask: torch.Tensor | None = None  # [b, T]
    score_positions: torch.Tensor | None = None  # [b, L]: position whose logits predict targets[:, j]
    # shared prompts
    prompt_ids: torch.Tensor | None = None  # [n_p, P] distinct prompts, right-padded
    prompt_mask: torch.Tensor | None = None  # [n_p, P]
    prompt_lengths: torch.Tensor | None = None  # [n_p]
    row_prompt: torch.Tensor | None = None  # [b]: which prompt each row continues
    ref_logprobs: torch.Tensor | None = None

    @property
    def shared(self) -> bool:
        return self.prompt_ids is not None

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def check_rollout(rollout: Rollout) -> None:
    """Raise ``BatchError`` for a rollout that cannot be scored."""
    if not rollout.token_ids:
        raise BatchError(
            f"rollout {rollout.request_id!r} has no response tokens; commit only samples that generated "
            "at least one token (an engine's EOS counts)"
        )
    if not rollout.prompt_token_ids:
        raise BatchError(
            f"rollout {rollout.request_id!r} has an empty prompt; the first response token needs at least one "
            "context token to be scored (encode prompts with a BOS token)"
        )
    if not 0 <= rollout.guide_len < len(rollout.token_ids):
        raise BatchError(
            f"rollout {rollout.request_id!r} has guide_len={rollout.guide_len} for {len(rollout.token_ids)} tokens; "
            "a guided rollout must generate at least one token of its own after the reference prefix"
        )
    if len(rollout.logprobs) != len(rollout.token_ids):
        raise BatchError(
            f"rollout {rollout.request_id!r} has {len(rollout.logprobs)} log-probs for {len(rollout.token_ids)} "
            "tokens; the engine must report one log-prob per response token"
        )


def pack(
    rollouts: Sequence[Rollout],
    advantages: Sequence[float | np.ndarray],
    pad_id: int,
    micro_batch: int,
    vocab_size: int | None = None,
    device: torch.device | str = "cpu",
    share_prompts: bool = True,
) -> list[Chunk]:
    """Order ``rollouts`` (see the module docstring) and pack them into chunks of ``micro_batch`` rows.
    An advantage is one number for the row, or an array with one per response token."""
    if len(advantages) != len(rollouts):
        raise BatchError(f"{len(advantages)} advantages for {len(rollouts)} rollouts; give one per rollout")
    for a, r in zip(advantages, rollouts):
        if isinstance(a, np.ndarray) and a.shape != (len(r.token_ids),):
            raise BatchError(
                f"rollout {r.request_id!r} has {a.shape} token advantages for {len(r.token_ids)} tokens; give one a token"
            )
    for r in rollouts:
        check_rollout(r)
        if vocab_size is not None:
            _check_vocab(r, vocab_size)
    if share_prompts:
        # Rows of one prompt stay together; prompts with long answers first, so that a chunk
        # holds prompts of similar answer lengths (ties: first appearance).
        first: dict[tuple[int, ...], int] = {}
        longest: dict[tuple[int, ...], int] = {}
        for i, r in enumerate(rollouts):
            first.setdefault(r.prompt_token_ids, i)
            longest[r.prompt_token_ids] = max(longest.get(r.prompt_token_ids, 0), len(r.token_ids))
        key = lambda i: (-longest[rollouts[i].prompt_token_ids], first[rollouts[i].prompt_token_ids])  # noqa: E731
        order = sorted(range(len(rollouts)), key=key)
    else:
        lengths = [len(r.prompt_token_ids) + len(r.token_ids) for r in rollouts]
        order = sorted(range(len(rollouts)), key=lambda i: -lengths[i])
    chunks = []
    for s in range(0, len(order), micro_batch):
        idx = tuple(order[s : s + micro_batch])
        rows = [rollouts[i] for i in idx]
        chunk = _responses(rows, [advantages[i] for i in idx], idx, pad_id)
        (_add_shared if share_prompts else _add_full)(chunk, rows, pad_id)
        chunks.append(_to(chunk, device))
    return chunks


def _responses(rows: list[Rollout], advantages: list[float | np.ndarray], index: tuple[int, ...], pad_id: int) -> Chunk:
    width = max(len(r.token_ids) for r in rows)
    targets = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    tokens = np.zeros((len(rows), width), dtype=bool)
    old = np.zeros((len(rows), width), dtype=np.float32)
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        targets[i, :n] = r.token_ids
        # An episode's observations are the environment's tokens: in the context, not in the loss.
        mask[i, :n] = r.turns.policy_mask if r.turns is not None else True
        # A guidance prefix is the task's reference, not the policy's: context, not loss.
        mask[i, : r.guide_len] = False
        tokens[i, :n] = True  # observations are in the context all the same
        old[i, :n] = r.logprobs
    if not np.isfinite(old).all():
        culprit = next(r for r in rows if not np.isfinite(np.asarray(r.logprobs, dtype=np.float64)).all())
        raise BatchError(
            f"rollout {culprit.request_id!r} has a non-finite log-prob; the engine reported a token it could not sample"
        )
    return Chunk(
        targets=torch.from_numpy(targets),
        loss_mask=torch.from_numpy(mask),
        token_mask=torch.from_numpy(tokens),
        old_logprobs=torch.from_numpy(old),
        advantages=_advantages(advantages, targets.shape),
        index=index,
    )


def _advantages(advantages: list[float | np.ndarray], shape: tuple[int, ...]) -> torch.Tensor:
    """``[b]`` when every row has one advantage; ``[b, L]`` (a row's one advantage repeated) when any has one a token."""
    if not any(isinstance(a, np.ndarray) for a in advantages):
        return torch.tensor(advantages, dtype=torch.float32)
    out = np.zeros(shape, dtype=np.float32)
    for i, a in enumerate(advantages):
        if isinstance(a, np.ndarray):
            out[i, : len(a)] = a
        else:
            out[i, :] = a
    return torch.from_numpy(out)


def _add_full(chunk: Chunk, rows: list[Rollout], pad_id: int) -> None:
    width = max(len(r.prompt_token_ids) + len(r.token_ids) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    positions = np.zeros(tuple(chunk.targets.shape), dtype=np.int64)
    steps = np.arange(positions.shape[1])
    for i, r in enumerate(rows):
        p, n = len(r.prompt_token_ids), len(r.token_ids)
        ids[i, :p] = r.prompt_token_ids
        ids[i, p : p + n] = r.token_ids
        attention[i, : p + n] = 1
        positions[i] = np.minimum(p - 1 + steps, width - 1)  # past the end: any valid index, masked anyway
    chunk.input_ids, chunk.attention_mask = torch.from_numpy(ids), torch.from_numpy(attention)
    chunk.score_positions = torch.from_numpy(positions)


def _add_shared(chunk: Chunk, rows: list[Rollout], pad_id: int) -> None:
    slot: dict[tuple[int, ...], int] = {}
    row_prompt = np.array([slot.setdefault(r.prompt_token_ids, len(slot)) for r in rows], dtype=np.int64)
    prompts = list(slot)
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for j, p in enumerate(prompts):
        ids[j, : len(p)] = p
        mask[j, : len(p)] = 1
    chunk.prompt_ids, chunk.prompt_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    chunk.prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    chunk.row_prompt = torch.from_numpy(row_prompt)


def _to(chunk: Chunk, device: torch.device | str) -> Chunk:
    if torch.device(device).type == "cpu":
        return chunk
    for name, value in vars(chunk).items():
        if isinstance(value, torch.Tensor):
            setattr(chunk, name, value.to(device))
    return chunk


def _check_vocab(rollout: Rollout, vocab_size: int) -> None:
    lo = min(min(rollout.prompt_token_ids), min(rollout.token_ids))
    hi = max(max(rollout.prompt_token_ids), max(rollout.token_ids))
    if lo < 0 or hi >= vocab_size:
        t = lo if lo < 0 else hi
        raise BatchError(
            f"rollout {rollout.request_id!r} holds token id {t}, outside the model's vocabulary [0, {vocab_size}); "
            "the engine and the learner must use the same tokenizer and model"
        )
