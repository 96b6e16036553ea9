"""Opening a group log from the command line's words: ``open_log(path, fmt, tokenizer,
num_generations, on_bad_row)``.

``tokenizer`` is what ``--tokenizer`` says: a model or tokenizer directory (loaded with
``transformers.AutoTokenizer``), the word ``chars`` (a completion's length is its number of
characters), or None (the log must keep its lengths: railgate's own and AReaL's do, TRL's
and verl's do not). Errors name the flag that fixes them (``--tokenizer DIR``,
``--num-generations N``, ``--format``); ``log_lines`` is what the command prints about the
log it read, its notes (a biased log's warning) included.

>>> import json, tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> lines = [{"input": "2+2?", "output": o, "gts": "4", "score": s, "step": 1} for o, s in [("4", 1.0), ("four", 0.0)]]
>>> _ = (d / "1.jsonl").write_text("".join(json.dumps(x) + "\\n" for x in lines))
>>> log = open_log(d, tokenizer="chars")
>>> [s.num_tokens for s in log.groups[0].samples]
[1, 4]
>>> print(log_lines(log)[0])  # doctest: +ELLIPSIS
verl log .../1.jsonl: 1 groups of 2 samples (1 mixed), 2 samples
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.store.foreign import read_log
from pipeline.store.grouplog import GroupLog, GroupLogError, OnBadRow

CHARS = "chars"
"""``--tokenizer chars``: count characters instead of tokens."""


def open_log(
    path: str | os.PathLike,
    fmt: str = "auto",
    tokenizer: str | os.PathLike | None = None,
    num_generations: int | None = None,
    on_bad_row: OnBadRow = "error",
) -> GroupLog:
    """The group log at ``path`` (any format ``pipeline.store.foreign.read_log`` reads); its
    ``notes`` say what the reader should know (``log_lines`` prints them)."""
    return read_log(
        path, fmt=fmt, tokenize=make_tokenize(tokenizer), num_generations=num_generations, on_bad_row=on_bad_row
    )


def make_tokenize(tokenizer: str | os.PathLike | None) -> Callable[[str], Sequence[int]] | None:
    """The ``tokenize`` function ``--tokenizer`` names (see the module docstring)."""
    if tokenizer is None:
        return None
    if str(tokenizer) == CHARS:
        return _characters
    directory = Path(tokenizer)
    if not directory.is_dir():
        raise GroupLogError(
            f"--tokenizer {tokenizer}: no such directory; pass the model's (or its tokenizer's) directory, "
            f"or --tokenizer {CHARS} to count characters"
        )
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
        raise GroupLogError(
            f"--tokenizer {tokenizer}: AutoTokenizer cannot load a tokenizer from it ({type(exc).__name__}: "
            f"{str(exc)[:200]}); pass the directory the model's tokenizer was saved in "
            f"(tokenizer.save_pretrained(DIR)), or --tokenizer {CHARS}"
        ) from None

    def tokenize(text: str) -> list[int]:
        return loaded(text, add_special_tokens=False)["input_ids"]

    return tokenize


def log_lines(log: GroupLog) -> list[str]:
    """What a command prints about a log it read: what it holds, what was left out, its notes."""
    where = log.sources[0] if len(log.sources) == 1 else f"{log.sources[0]} (+{len(log.sources) - 1} files)"
    mixed = sum(g.is_mixed for g in log.groups)
    lines = [
        f"{log.format} log {where}: {len(log.groups)} groups of {log.group_size} samples "
        f"({mixed} mixed), {log.samples} samples"
    ]
    if log.skipped_groups or log.skipped_rows:
        lines.append(f"left out (--on-bad-row skip): {log.skipped_groups} groups, {log.skipped_rows} rows")
    if log.duplicate_rows:
        lines.append(f"read once: {log.duplicate_rows} repeated rows")
    lines.extend(f"note: {note}" for note in log.notes)
    return lines


def _characters(text: str) -> list[int]:
    return [ord(c) for c in text]
