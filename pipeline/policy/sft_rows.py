"""Supervised (SFT) rows as a right-padded batch: token ids, attention mask and labels, the
labels ``IGNORE`` wherever the loss must not look (prompts, observations, padding)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

IGNORE = -100
"""The label of a position left out of the loss (``torch.nn.functional.cross_entropy``'s default)."""


def padded_batch(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    max_len: int | None = None,
    what: str = "a row",
    remedy: str = "use shorter rows",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)`` of ``(ids, labels)`` rows, right-padded to the longest.

    ``ValueError`` when a row is longer than ``max_len``, naming the row as ``what`` and the
    other fix besides raising ``model.max_len`` as ``remedy``.

    >>> ids, mask, labels = padded_batch([([5, 6, 7], [IGNORE, 6, 7]), ([8], [8])], pad_id=0)
    >>> ids.tolist(), mask.tolist(), labels.tolist()
    ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]], [[-100, 6, 7], [8, -100, -100]])
    >>> padded_batch([([5, 6, 7], [5, 6, 7])], pad_id=0, max_len=2)
    Traceback (most recent call last):
    ...
    ValueError: a row of 3 tokens exceeds the model's max_len=2; raise model.max_len or use shorter rows
    """
    width = max(len(ids) for ids, _ in rows)
    if max_len is not None and width > max_len:
        raise ValueError(
            f"{what} of {width} tokens exceeds the model's max_len={max_len}; raise model.max_len or {remedy}"
        )
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return ids, mask, labels
