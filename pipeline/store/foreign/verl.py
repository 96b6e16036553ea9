"""verl's rollout dumps as a group log.

With ``trainer.rollout_data_dir`` set, verl's PPO trainer writes ``{global_step}.jsonl`` into
it at every step, one JSON line per sample of the step's training batch:

* ``input``: the prompt, decoded with special tokens skipped (padding gone);
* ``output``: the response, decoded the same way;
* ``gts``: the reference answer (``reward_model.ground_truth``), ``score``: the sample's
  reward (the sum of its token-level scores, or the ``score`` the reward manager reports in
  its extra fields, which overwrite it), ``step``: the global step;
* the reward manager's extra fields (``acc``, ``pred``, ...).

There is no group id and no length, and a group's samples are not contiguous (the batch is
reordered to balance sequence lengths). What this importer assumes:

* **Groups**: the samples of one step with identical ``input`` text; sample index = their
  order in the file. Two rows of the data set with the same prompt text in one step merge
  into one group of 2 K: a group whose size is a multiple of K (``num_generations``, else the
  most common size) is split into groups of K in file order (the samples are draws of one
  policy on one prompt, so any split is a fair one) and the log's notes say so.
* **Lengths**: ``output`` re-tokenised (``tokenize``); the decoded text lost the special
  tokens, so a count can be short by the end-of-sequence token.
* **Step, policy version**: ``step`` (else the file's number); finish order: file order;
  finish reason "stop"; answer: ``gts``; prompt ids: one per distinct prompt text.
* **Filtered logs**: with DAPO's ``algorithm.filter_groups`` verl trains, and dumps, only the
  groups whose metric varies: whole groups of equal scores never reach the file. This cannot
  be read from the config, so it is read from the log: when it has at least
  ``FILTER_MIN_GROUPS`` groups and none has all-equal scores, the log's notes say it looks
  filtered and that its replay is biased. (Filtering drops whole groups, so it leaves group
  sizes equal; unequal sizes are the merged prompts above or a cut batch, not the filter.)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.store.foreign.common import (
    ImportedRows,
    Problems,
    Tokenize,
    as_int,
    checked_jsonl,
    count_tokens,
    require_tokenizer,
)
from pipeline.store.grouplog import GroupLog, GroupLogError, OnBadRow

REQUIRED = ("input", "output", "score")
FILTER_MIN_GROUPS = 4
"""A log with fewer groups is too small to say that none of equal scores means filtering."""

FILTERED_NOTE = (
    "every one of the {groups} groups has unequal scores, as a log written with DAPO's "
    "algorithm.filter_groups.enable=true looks: verl then dumps only the groups it kept, so a replay "
    "of this log is biased (whole groups' yield looks perfect, and a gate cannot be credited for "
    "skipping the all-equal groups it never sees). For an unbiased log, record with "
    "algorithm.filter_groups.enable=false, or with railgate's shadow mode."
)


def verl_files(path: str | os.PathLike) -> list[Path]:
    """The ``{step}.jsonl`` files of a verl rollout directory (or the one file), in step order."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise GroupLogError(f"{path} does not exist; pass verl's trainer.rollout_data_dir or one of its files")
    files = sorted(path.glob("*.jsonl"), key=lambda p: (int(p.stem), "") if p.stem.isdigit() else (1 << 62, p.stem))
    if not files:
        raise GroupLogError(
            f"{path} holds no {{step}}.jsonl files; verl writes them with trainer.rollout_data_dir=DIR "
            "(pass --format if this is another framework's log)"
        )
    return files


def read_verl(
    path: str | os.PathLike,
    tokenize: Tokenize | None = None,
    num_generations: int | None = None,
    on_bad_row: OnBadRow = "error",
) -> GroupLog:
    """Read a verl rollout dump (see the module docstring for what is assumed)."""
    files = verl_files(path)
    tokenize = require_tokenizer(tokenize, str(path), "verl rollout", "keep no token counts")
    problems = Problems(on_bad_row)
    rows = ImportedRows("verl", unit="line")
    samples: dict[tuple[int, str], list[tuple[int, int, dict[str, Any]]]] = {}
    for file in files:
        index = rows.file(file)
        fix = (
            "a verl rollout line has input, output, gts, score and step (pass --format if this is another "
            "framework's log)"
        )
        for line, _where, record in checked_jsonl(file, problems, "verl", REQUIRED, fix):
            step = as_int(record.get("step"))
            if step is None:
                step = int(file.stem) if file.stem.isdigit() else 0
            samples.setdefault((step, str(record["input"])), []).append((index, line, record))

    sizes = Counter(len(s) for s in samples.values())
    k = num_generations or (min(sizes, key=lambda n: (-sizes[n], n)) if sizes else 0)
    notes = []
    merged = 0
    group_id = 0
    uniform = 0
    for (step, prompt), members in samples.items():
        parts = [members]
        if k and len(members) > k and len(members) % k == 0:
            parts = [members[i : i + k] for i in range(0, len(members), k)]
            merged += 1
        for part in parts:
            scores = [r["score"] for _, _, r in part]
            uniform += len({float(s) if isinstance(s, (int, float)) else repr(s) for s in scores}) == 1
            for sample, (index, line, record) in enumerate(part):
                output = str(record["output"] or "")
                rows.add(
                    index,
                    line,
                    group_id=group_id,
                    step=step,
                    prompt=prompt,
                    completion=output,
                    num_tokens=count_tokens(tokenize, output),
                    reward=record["score"],
                    sample_index=sample,
                    answer=_answer(record.get("gts")),
                )
            group_id += 1
    if merged:
        notes.append(
            f"{merged} prompt(s) appeared in one step with a multiple of {k} samples (the same prompt text in "
            f"several rows of the data set) and were split into groups of {k} in file order"
        )
    if group_id >= FILTER_MIN_GROUPS and uniform == 0:
        notes.append(FILTERED_NOTE.format(groups=group_id))
    return rows.log(problems, notes)


def looks_filtered(log: GroupLog) -> bool:
    """Whether the log carries the note that it looks written with DAPO's group filter."""
    return any("filter_groups" in note for note in log.notes)


def _answer(gts: Any) -> str:
    if gts is None:
        return ""
    if isinstance(gts, str):
        return gts
    return json.dumps(gts, ensure_ascii=False, default=str)
