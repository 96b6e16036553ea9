"""AReaL's rollout dumps as a group log.

With ``dump_to_file`` set, AReaL's workflow executor appends each finished episode's samples
to ``{log_path}/rollout/{version}/{task_id}.jsonl`` (evaluation episodes go to
``eval-rollout/``, which is not read), one JSON line per sample:

* ``task_id``: the episode (one prompt's group, in the single-turn RLVR workflow);
* ``sample_idx``: the sample's index within the episode's batch;
* ``seqlen``: the tokens of prompt and completion; ``prompt_len``: ``seqlen`` minus the tokens
  under the loss mask, so ``seqlen - prompt_len`` is the number of tokens the model generated;
* ``head_version`` / ``tail_version``: the oldest and newest weights' version among the
  sample's tokens (the directory is the episode's newest version);
* ``reward``, ``prompt``, ``completion`` (decoded with special tokens kept).

AReaL dumps an episode *before* its ``should_accept_fn`` filter, so rejected groups are in the
log: replaying it is not biased by that filter.

What this importer assumes (checked against AReaL's ``workflow_executor._dump_trajectory``):

* group = (version directory, ``task_id``); sample index = ``sample_idx``;
* num_tokens = ``seqlen - prompt_len`` (the loss-masked tokens: in a multi-turn episode the
  model's turns, not the tool outputs between them). A line without them is re-tokenised
  from ``completion`` when ``tokenize`` is given;
* step = the version directory; policy version = ``head_version`` (the oldest weights that
  wrote part of the sample); finish order: index order (not recorded); finish reason "stop";
* prompt ids: one per distinct prompt text.

AReaL leaves out samples with an empty completion, so such a group has a gap in its indices
(a bad group: ``on_bad_row="skip"`` drops it). One episode returning several interactions
(agentic workflows) is read as one group of them, which is what the dump holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.store.foreign.common import (
    TOKENIZER_FIX,
    ImportedRows,
    Problems,
    Tokenize,
    as_int,
    checked_jsonl,
    count_tokens,
)
from pipeline.store.grouplog import GroupLog, GroupLogError, OnBadRow

REQUIRED = ("task_id", "sample_idx", "reward", "completion")
"""Fields every line must have (``seqlen``/``prompt_len`` too unless a tokenizer is given)."""


def areal_files(path: str | os.PathLike) -> list[tuple[int | None, Path]]:
    """``(version, file)`` for each dump file of an AReaL log: the log path (holding
    ``rollout/``), the ``rollout`` directory, one version directory, or one file; in version
    then task order. The version is the directory name (None when it is not a number)."""
    path = Path(path)
    if path.is_file():
        return [(_version(path.parent), path)]
    if not path.is_dir():
        raise GroupLogError(f"{path} does not exist; pass AReaL's {{log_path}}/rollout directory or one of its files")
    base = path / "rollout" if (path / "rollout").is_dir() else path
    versions = [d for d in base.iterdir() if d.is_dir() and _version(d) is not None]
    if versions:
        files = [(_version(d), f) for d in versions for f in d.glob("*.jsonl")]
    else:
        files = [(_version(base), f) for f in base.glob("*.jsonl")]
    if not files:
        raise GroupLogError(
            f"{path} holds no rollout/<version>/<task_id>.jsonl files; AReaL writes them with dump_to_file "
            "(pass --format if this is another framework's log)"
        )
    return sorted(files, key=lambda vf: (vf[0] if vf[0] is not None else -1, _task_order(vf[1])))


def _version(directory: Path) -> int | None:
    return int(directory.name) if re.fullmatch(r"\d+", directory.name) else None


def _task_order(file: Path) -> tuple[int, str]:
    return (int(file.stem), "") if file.stem.isdigit() else (1 << 62, file.stem)


def read_areal(path: str | os.PathLike, tokenize: Tokenize | None = None, on_bad_row: OnBadRow = "error") -> GroupLog:
    """Read an AReaL rollout dump (see the module docstring for what is assumed)."""
    problems = Problems(on_bad_row)
    rows = ImportedRows("areal", unit="line")
    groups: dict[tuple[int, str], int] = {}
    for version, file in areal_files(path):
        index = rows.file(file)
        fix = (
            "an AReaL dump line has task_id, sample_idx, seqlen, prompt_len, head_version, tail_version, "
            "reward, prompt and completion (pass --format if this is another framework's log)"
        )
        for line, where, record in checked_jsonl(file, problems, "AReaL", REQUIRED, fix):
            step = version if version is not None else as_int(record.get("tail_version"))
            sample = as_int(record["sample_idx"])
            if step is None or sample is None:
                name = "sample_idx" if sample is None else "tail_version"
                problems.report(
                    where,
                    f"{name} is {record.get(name)!r}, not a whole number",
                    "keep AReaL's dump as written (rollout/<version>/<task_id>.jsonl)",
                )
                continue
            completion = str(record["completion"] or "")
            num_tokens = _length(record, completion, tokenize, where)
            key = (step, str(record["task_id"]))
            group_id = groups.setdefault(key, len(groups))
            head = as_int(record.get("head_version"))
            rows.add(
                index,
                line,
                group_id=group_id,
                step=step,
                prompt=str(record.get("prompt") or ""),
                completion=completion,
                num_tokens=num_tokens,
                reward=record["reward"],
                sample_index=sample,
                policy_version=head if head is not None else step,
            )
    return rows.log(problems)


def _length(record: dict, completion: str, tokenize: Tokenize | None, where: str) -> int:
    seqlen, prompt_len = as_int(record.get("seqlen")), as_int(record.get("prompt_len"))
    if seqlen is not None and prompt_len is not None:
        return seqlen - prompt_len  # a negative count is named by the common checks
    if tokenize is None:
        raise GroupLogError(
            f"{where}: no seqlen/prompt_len to count the completion's tokens by (it has {', '.join(record)}); "
            f"{TOKENIZER_FIX}"
        )
    return count_tokens(tokenize, completion)
