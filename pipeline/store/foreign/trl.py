"""TRL's completion logs as a group log.

``GRPOTrainer`` with ``log_completions=True`` (TRL 1.16) writes, at each logging step,
``output_dir/completions/completions_{global_step:05d}.parquet``: one row per completion of
the last generation batch, with the columns

* ``step``: the global step it was logged at;
* ``prompt``, ``completion``: plain text, or chat messages (a list of ``{role, content}``);
* one float column per reward function, named after it: that function's raw score (NaN where
  it returned None, that is, it does not apply to the sample);
* the columns reward functions logged through ``log_extra`` (any type);
* ``advantage``.

The log keeps no group id, no lengths and no finish order. What this importer assumes:

* **Groups**: TRL's sampler repeats each prompt ``num_generations`` times in a row, so a file's
  rows are consecutive blocks of ``num_generations`` samples of one prompt. Pass
  ``num_generations`` (the run's ``GRPOConfig.num_generations``); without it, it is read off the
  runs of identical prompts, when every run in every file has the same length (a prompt drawn
  twice in a row would double a run: then it must be passed). Every block's prompt must be the
  same in all its rows; a block that is not (a wrong ``num_generations``, a file starting
  inside a group) or a file ending inside a block is a bad group.
* **Reward**: the sum of the reward columns, skipping NaN as TRL's own sum does (all NaN: the
  sample has no reward, a bad row). The reward columns are ``reward_columns`` when given, else
  every numeric column but ``step`` and ``advantage``, so a *numeric* column logged through
  ``log_extra`` is summed too: pass ``reward_columns`` for such a log. TRL's
  ``reward_weights`` are not in the log: a weighted run's rewards are read unweighted. The
  columns summed are named in the log's notes.
* **Lengths**: the completion's text re-tokenised (``tokenize``; chat completions: their
  contents joined), which counts what a tokenizer makes of the decoded text, not what the
  model sampled (it can differ by a token at special tokens).
* **Step, policy version**: the row's ``step`` (the batch was generated at or before it).
* **Repeats**: a file holds the last generation batch, so when generation is rarer than
  logging (``steps_per_generation`` > ``logging_steps``) two files hold one batch; a block equal
  to one of the previous file's (every column but ``step``) is dropped and counted
  (``GroupLog.duplicate_rows``). With ``logging_steps`` > 1 the batches in between were never
  written: the log is every logging step's batch, not every batch.
* Prompt text: plain text, or chat messages as JSON; finish order: index order; finish reason:
  "stop"; prompt ids: one per distinct prompt text.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.store.foreign.common import (
    ImportedRows,
    Problems,
    Tokenize,
    count_tokens,
    message_text,
    prompt_key,
    require_tokenizer,
)
from pipeline.store.grouplog import GroupLog, GroupLogError, OnBadRow

FILE_PATTERN = re.compile(r"completions_(\d+)\.parquet")
NOT_REWARDS = ("step", "advantage")
"""Numeric columns TRL writes that are not reward functions."""


def trl_files(path: str | os.PathLike) -> list[Path]:
    """The ``completions_*.parquet`` files of a TRL log (the file itself, the ``completions``
    directory, or the trainer's ``output_dir`` holding it), in global-step order."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise GroupLogError(f"{path} does not exist; pass TRL's output_dir/completions directory or one of its files")
    directory = path / "completions" if not _matches(path) and (path / "completions").is_dir() else path
    files = _matches(directory)
    if not files:
        raise GroupLogError(
            f"{directory} holds no completions_NNNNN.parquet files; TRL writes them with "
            "GRPOConfig(log_completions=True) into output_dir/completions"
        )
    return files


def _matches(directory: Path) -> list[Path]:
    found = [
        (int(m.group(1)), p) for p in directory.glob("completions_*.parquet") if (m := FILE_PATTERN.fullmatch(p.name))
    ]
    return [p for _, p in sorted(found)]


def read_trl(
    path: str | os.PathLike,
    tokenize: Tokenize | None = None,
    num_generations: int | None = None,
    on_bad_row: OnBadRow = "error",
    reward_columns: Sequence[str] | None = None,
) -> GroupLog:
    """Read a TRL completions log (see the module docstring for what is assumed)."""
    files = trl_files(path)
    tokenize = require_tokenizer(tokenize, str(path), "TRL completion", "keep no token counts")
    problems = Problems(on_bad_row)
    tables = [_read(f) for f in files]
    k = num_generations if num_generations is not None else infer_num_generations(files, tables)
    if k < 1:
        raise GroupLogError(f"num_generations={k}; pass the run's GRPOConfig.num_generations (--num-generations N)")

    rows = ImportedRows("trl")
    summed: dict[str, None] = {}
    duplicates = 0
    previous: set[str] = set()
    group_id = 0
    for file, table in zip(files, tables):
        columns = _reward_columns(file, table, reward_columns)
        summed.update(dict.fromkeys(columns))
        prompts = table.column("prompt").to_pylist()
        keys = [prompt_key(p) for p in prompts]
        completions = table.column("completion").to_pylist()
        steps = _steps(file, table)
        rewards = [_reward(values) for values in zip(*(table.column(c).to_pylist() for c in columns))]
        signatures = table.drop_columns(["step"]) if "step" in table.column_names else table
        index = rows.file(file)
        current: set[str] = set()
        for start in range(0, table.num_rows, k):
            block = range(start, min(start + k, table.num_rows))
            if len(block) < k:
                problems.report(
                    f"{file} row {start}",
                    f"the file's last {len(block)} rows are not a whole group of num_generations={k}",
                    "pass the run's GRPOConfig.num_generations (--num-generations N)",
                    rows=len(block),
                    groups=1,
                )
                continue
            other = next((i for i in block if keys[i] != keys[start]), None)
            if other is not None:
                problems.report(
                    f"{file} row {other}",
                    f"its prompt differs from row {start}'s, in a block of num_generations={k} rows that should be "
                    "one prompt's group",
                    "pass the run's GRPOConfig.num_generations (--num-generations N)",
                    rows=k,
                    groups=1,
                )
                continue
            signature = json.dumps(signatures.slice(start, k).to_pylist(), default=str)
            current.add(signature)
            if signature in previous:
                duplicates += k
                continue
            prompt = keys[start]
            for sample, i in enumerate(block):
                text = message_text(completions[i])
                rows.add(
                    index,
                    i,
                    group_id=group_id,
                    step=steps[i],
                    prompt=prompt,
                    completion=text,
                    num_tokens=count_tokens(tokenize, text),
                    reward=rewards[i],
                    sample_index=sample,
                )
            group_id += 1
        previous = current

    notes = [
        f"reward = the sum of TRL's reward columns {', '.join(summed)} (NaN skipped, as TRL sums them; "
        "reward_weights are not logged); pass reward_columns to choose others"
    ]
    if duplicates:
        notes.append(
            f"{duplicates} rows ({duplicates // k} groups) repeated a batch already read from the previous file "
            "(TRL logs the last generation batch at every logging step) and were read once"
        )
    return rows.log(problems, notes, duplicate_rows=duplicates)


def infer_num_generations(files: Sequence[Path], tables: Sequence[pa.Table]) -> int:
    """``num_generations`` from runs of identical prompts, when all runs have one length (>= 2)."""
    runs: Counter[int] = Counter()
    for table in tables:
        keys = [prompt_key(p) for p in table.column("prompt").to_pylist()]
        length = 0
        for i, key in enumerate(keys):
            length += 1
            if i + 1 == len(keys) or keys[i + 1] != key:
                runs[length] += 1
                length = 0
    if len(runs) == 1 and next(iter(runs)) >= 2:
        return next(iter(runs))
    where = files[0] if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    found = ", ".join(f"{n} of length {length}" for length, n in sorted(runs.items())) or "none"
    raise GroupLogError(
        f"{where}: cannot tell TRL's num_generations from the log (runs of identical prompts: {found}); "
        "pass the run's GRPOConfig.num_generations (num_generations=N; on the command line --num-generations N)"
    )


def _read(file: Path) -> pa.Table:
    try:
        table = pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise GroupLogError(
            f"{file} is not a readable Parquet file ({exc}); TRL writes it with pandas.to_parquet"
        ) from None
    missing = [c for c in ("prompt", "completion") if c not in table.column_names]
    if missing:
        raise GroupLogError(
            f"{file}: missing column(s) {', '.join(missing)} (it has {', '.join(table.column_names) or 'none'}); "
            "a TRL completions file has step, prompt, completion, one column per reward function and advantage "
            "(pass --format if this is another framework's log)"
        )
    return table


def _reward_columns(file: Path, table: pa.Table, chosen: Sequence[str] | None) -> list[str]:
    if chosen is not None:
        missing = [c for c in chosen if c not in table.column_names]
        if missing:
            raise GroupLogError(
                f"{file}: no reward column(s) {', '.join(missing)} (it has {', '.join(table.column_names)}); "
                "pass reward_columns that the file has"
            )
        return list(chosen)
    numeric = [
        f.name
        for f in table.schema
        if f.name not in NOT_REWARDS
        and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type) or pa.types.is_boolean(f.type))
    ]
    if not numeric:
        raise GroupLogError(
            f"{file}: no numeric reward column (it has {', '.join(table.column_names)}); TRL writes one float column "
            "per reward function: pass reward_columns naming them"
        )
    return numeric


def _steps(file: Path, table: pa.Table) -> list[int]:
    if "step" in table.column_names and pa.types.is_integer(table.schema.field("step").type):
        return [int(s) if s is not None else 0 for s in table.column("step").to_pylist()]
    m = FILE_PATTERN.fullmatch(file.name)
    return [int(m.group(1)) if m else 0] * table.num_rows


def _reward(values: Sequence[Any]) -> Any:
    """The sum of one row's reward-function values, NaN and None skipped; None when none is a
    number; a value that is not a number is returned as is (the common checks name it)."""
    total, any_number = 0.0, False
    for v in values:
        if v is None:
            continue
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return v
        v = float(v)
        if math.isnan(v):
            continue
        total += v
        any_number = True
    return total if any_number else None
