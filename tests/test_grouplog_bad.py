"""Bad group logs: the native reader (segment directory and Parquet) and the importers name the
file, the row and the fix; with on_bad_row="skip" they leave the bad groups out, count them,
and keep the good ones. A torn last segment keeps its complete batches, with a warning."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.store.arrowio import SegmentKind, SegmentWriter, TornSegmentWarning
from pipeline.store.foreign import read_log
from pipeline.store.grouplog import (
    GROUPS,
    GroupLogError,
    GroupLogWriter,
    RecordedGroup,
    RecordedSample,
    group_table,
    read_group_log,
    write_parquet,
)

SKIP_FLAG = "--on-bad-row skip"


def words(text: str) -> list[int]:
    return [0] * len(text.split())


def good(gid: int) -> RecordedGroup:
    return RecordedGroup.of(gid, prompt_id=gid, rewards=[1, 0, 1, 0])


def native(tmp_path: Path, groups: list[RecordedGroup], kind: str) -> tuple[Path, str]:
    """The groups written as a native log of ``kind``; and the file its rows are in."""
    if kind == "parquet":
        path = write_parquet(groups, tmp_path / "log.parquet")
        return path, str(path)
    with GroupLogWriter(tmp_path / "log", fsync=False) as w:
        w.write(groups)
    return tmp_path / "log", str(w.path)


def three_groups(middle: RecordedGroup) -> list[RecordedGroup]:
    return [good(0), middle, good(2)]


def assert_skipped(log, groups: int, rows: int, kept: list[int]) -> None:
    assert (log.skipped_groups, log.skipped_rows) == (groups, rows)
    assert [g.group_id for g in log.groups] == kept


# --- native reader: directory and Parquet -------------------------------------------------


@pytest.mark.parametrize("kind", ["dir", "parquet"])
def test_groups_of_mixed_sizes(tmp_path, kind):
    path, file = native(tmp_path, three_groups(RecordedGroup.of(1, prompt_id=1, rewards=[1, 0, 1])), kind)
    with pytest.raises(GroupLogError) as err:
        read_group_log(path)
    message = str(err.value)
    assert f"{file} row 4 (group 1)" in message and "has 3 samples where most groups have 4" in message
    assert "record every group with the same number of samples" in message and SKIP_FLAG in message
    assert_skipped(read_group_log(path, on_bad_row="skip"), 1, 3, [0, 2])


@pytest.mark.parametrize("kind", ["dir", "parquet"])
def test_nan_reward(tmp_path, kind):
    path, file = native(tmp_path, three_groups(RecordedGroup.of(1, prompt_id=1, rewards=[1, 0, math.nan, 0])), kind)
    with pytest.raises(GroupLogError) as err:
        read_group_log(path)
    message = str(err.value)
    assert f"{file} row 6 (group 1)" in message and "reward is nan" in message
    assert "give every sample a numeric reward" in message
    assert_skipped(read_group_log(path, on_bad_row="skip"), 1, 4, [0, 2])


@pytest.mark.parametrize("kind", ["dir", "parquet"])
def test_duplicate_sample_indices(tmp_path, kind):
    samples = tuple(RecordedSample(i, 1.0, 3, n) for n, i in enumerate([0, 1, 1, 3]))
    path, file = native(tmp_path, three_groups(RecordedGroup(1, 1, samples)), kind)
    with pytest.raises(GroupLogError) as err:
        read_group_log(path)
    message = str(err.value)
    assert f"{file} row 6 (group 1): sample_index 1 appears twice (also at {file} row 5)" in message
    assert "give each sample of a group its own index 0 .. K-1" in message
    assert_skipped(read_group_log(path, on_bad_row="skip"), 1, 4, [0, 2])


def test_group_split_across_segments(tmp_path):
    with GroupLogWriter(tmp_path, fsync=False) as w:
        w.write([good(0), RecordedGroup.of(1, prompt_id=1, rewards=[1, 0])])
    first = w.path
    with GroupLogWriter(tmp_path, fsync=False) as w:  # a resumed run writes the group's other half
        w.write([RecordedGroup(1, 1, (RecordedSample(2, 1.0, 3, 2), RecordedSample(3, 0.0, 3, 3))), good(2)])
    with pytest.raises(GroupLogError) as err:
        read_group_log(tmp_path)
    message = str(err.value)
    assert f"{first} row 4 (group 1): the group is split across files {first}, {w.path}" in message
    assert "write each group's samples into one file" in message
    assert_skipped(read_group_log(tmp_path, on_bad_row="skip"), 1, 4, [0, 2])


def parquet_table(tmp_path: Path, **replace_columns) -> Path:
    table = group_table([good(0), good(1), good(2)])
    for name, values in replace_columns.items():
        if values is None:
            table = table.drop_columns([name])
        else:
            table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    return path


def test_missing_column_parquet(tmp_path):
    path = parquet_table(tmp_path, reward=None)
    with pytest.raises(GroupLogError) as err:
        read_group_log(path, on_bad_row="skip")  # no reward at all: nothing to skip to
    message = str(err.value)
    assert f"{path}: missing column(s) reward" in message and "a group log needs group_id, prompt_id" in message


def test_missing_column_segment(tmp_path):
    # a segment that claims to hold groups but lacks the reward column
    table = group_table([good(0)]).drop_columns(["reward"])
    kind = SegmentKind(GROUPS.prefix, table.schema, GROUPS.version)
    with SegmentWriter(tmp_path, kind, number=0) as w:
        w.write(table.to_batches()[0])
    with pytest.raises(GroupLogError) as err:
        read_group_log(tmp_path, on_bad_row="skip")
    message = str(err.value)
    assert f"{w.path} claims groups version 1 but its columns differ (missing column(s) reward" in message
    assert "write groups segments with railgate's writer" in message


def test_non_numeric_reward_column(tmp_path):
    rewards = ["1", "0", "1", "0", "1", "oops", "1", "0", "1.5", "0", "1", "0"]
    path = parquet_table(tmp_path, reward=rewards)
    with pytest.raises(GroupLogError) as err:
        read_group_log(path)
    message = str(err.value)
    assert f"{path} row 5 (group 1): reward 'oops' is not a number" in message
    assert "write each sample's reward as a number" in message
    log = read_group_log(path, on_bad_row="skip")
    assert_skipped(log, 1, 4, [0, 2])
    assert log.groups[1].rewards == (1.5, 0.0, 1.0, 0.0)  # strings that are numbers are read as numbers


def test_ids_that_are_not_whole_numbers(tmp_path):
    # pandas turns an integer column with a gap into floats: NaN is a row without a group
    ids = [0.0] * 4 + [1.0, math.nan, 1.0, 1.0] + [2.0] * 4
    path = parquet_table(tmp_path, group_id=ids)
    with pytest.raises(GroupLogError, match=rf"{path} row 5: group_id is nan, not a whole number; give every row"):
        read_group_log(path)
    log = read_group_log(path, on_bad_row="skip")
    # the row without a group is counted; group 1 is left with 3 samples, a size no other group has
    assert_skipped(log, 1, 4, [0, 2])


def test_finish_order_must_be_each_position_once(tmp_path):
    path = parquet_table(tmp_path, finish_order=[0, 1, 2, 3, 0, 0, 2, 3, 3, 2, 1, 0])
    with pytest.raises(GroupLogError, match=rf"{path} row 4 \(group 1\): finish_order values \[0, 0, 2, 3\]"):
        read_group_log(path)
    log = read_group_log(path, on_bad_row="skip")
    assert_skipped(log, 1, 4, [0, 2])
    assert [s.index for s in log.groups[1].in_finish_order()] == [3, 2, 1, 0]


def test_torn_last_segment_keeps_its_complete_batches(tmp_path):
    with GroupLogWriter(tmp_path, fsync=False) as w:
        w.write([good(0), good(1)])
        size = w.path.stat().st_size
        w.write([good(2), good(3)])
    data = w.path.read_bytes()
    w.path.write_bytes(data[: size + (len(data) - size) // 2])  # killed in the middle of the second batch
    with pytest.warns(TornSegmentWarning, match="torn tail"):
        log = read_group_log(tmp_path)
    assert [g.group_id for g in log.groups] == [0, 1] and (log.skipped_groups, log.skipped_rows) == (0, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole log reads without one
        with GroupLogWriter(tmp_path / "whole", fsync=False) as w:
            w.write([good(0)])
        read_group_log(tmp_path / "whole")


# --- importers ------------------------------------------------------------------------------


def areal_log(tmp_path: Path, edit=None) -> Path:
    """Three AReaL groups (task ids 0-2 at version 1); ``edit(task, lines)`` changes task 1's lines."""
    for task in range(3):
        lines = [
            {"task_id": task, "sample_idx": i, "seqlen": 6, "prompt_len": 2, "head_version": 1, "tail_version": 1}
            | {"reward": float(i % 2), "prompt": f"prompt {task}", "completion": "a b c d"}
            for i in range(4)
        ]
        if task == 1 and edit is not None:
            lines = edit(lines)
        d = tmp_path / "rollout" / "1"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{task}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def task_file(tmp_path: Path) -> str:
    return str(tmp_path / "rollout" / "1" / "1.jsonl")


def test_areal_mixed_sizes(tmp_path):
    path = areal_log(tmp_path, lambda lines: lines[:3])
    with pytest.raises(GroupLogError) as err:
        read_log(path)
    message = str(err.value)
    assert f"{task_file(tmp_path)} line 1 (group 1): the group has 3 samples where most groups have 4" in message
    assert "record every group with the same number of samples" in message
    log = read_log(path, on_bad_row="skip")
    assert_skipped(log, 1, 3, [0, 2])


def test_areal_nan_reward(tmp_path):
    def nan(lines):
        lines[2]["reward"] = math.nan  # json writes NaN, as AReaL's json.dumps does
        return lines

    path = areal_log(tmp_path, nan)
    with pytest.raises(
        GroupLogError, match=rf"{task_file(tmp_path)} line 3 \(group 1\): reward is nan .*numeric reward"
    ):
        read_log(path)
    assert_skipped(read_log(path, on_bad_row="skip"), 1, 4, [0, 2])


def test_areal_duplicate_sample_indices(tmp_path):
    def duplicate(lines):
        lines[3]["sample_idx"] = 0
        return lines

    path = areal_log(tmp_path, duplicate)
    file = task_file(tmp_path)
    with pytest.raises(GroupLogError) as err:
        read_log(path)
    message = str(err.value)
    assert f"{file} line 4 (group 1): sample_index 0 appears twice (also at {file} line 1)" in message
    assert "its own index 0 .. K-1" in message
    assert_skipped(read_log(path, on_bad_row="skip"), 1, 4, [0, 2])


def test_areal_missing_field_and_torn_line(tmp_path):
    def broken(lines):
        del lines[1]["reward"]
        return lines

    path = areal_log(tmp_path, broken)
    with pytest.raises(GroupLogError) as err:
        read_log(path)
    message = str(err.value)
    assert f"{task_file(tmp_path)} line 2: no reward" in message and "an AReaL dump line has task_id" in message
    # skip: the line is dropped (1 row, in no group), its group is then short and dropped too (3 rows)
    assert_skipped(read_log(path, on_bad_row="skip"), 1, 4, [0, 2])
    torn = areal_log(tmp_path / "torn", lambda lines: lines[:3])
    with open(task_file(torn), "a") as f:
        f.write('{"task_id": 1, "sample_')  # a line cut off by a crash
    with pytest.raises(GroupLogError, match=rf"{task_file(torn)} line 4: not JSON"):
        read_log(torn)
    assert_skipped(read_log(torn, on_bad_row="skip"), 1, 4, [0, 2])


def verl_log(tmp_path: Path, score=lambda i: float(i % 2)) -> Path:
    lines = [
        {"input": f"prompt {g}", "output": "a b", "gts": "x", "score": score(4 * g + i), "step": 3}
        for i in range(4)
        for g in range(3)
    ]
    (tmp_path / "3.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_verl_non_numeric_score(tmp_path):
    path = verl_log(tmp_path, score=lambda n: "oops" if n == 6 else float(n % 2))
    file = tmp_path / "3.jsonl"
    with pytest.raises(GroupLogError) as err:
        read_log(path, tokenize=words)
    message = str(err.value)
    # sample 2 of group 1 is line 2*3 + 1 + 1 = 8 (the file interleaves the groups)
    assert f"{file} line 8 (group 1): reward 'oops' is not a number" in message
    assert "write each sample's reward as a number" in message
    assert_skipped(read_log(path, tokenize=words, on_bad_row="skip"), 1, 4, [0, 2])


def test_verl_missing_column(tmp_path):
    (tmp_path / "1.jsonl").write_text(json.dumps({"input": "p", "output": "o", "step": 1}) + "\n")
    with pytest.raises(GroupLogError) as err:
        read_log(tmp_path, fmt="verl", tokenize=words)
    message = str(err.value)
    assert f"{tmp_path / '1.jsonl'} line 1: no score" in message and "a verl rollout line has input, output" in message


def trl_file(path: Path, prompts: list[str], rewards: list, columns: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"step": [1] * len(prompts), "prompt": prompts, "completion": ["a b"] * len(prompts)}
    data.update({"reward_fn": rewards} if columns is None else columns)
    data["advantage"] = [0.0] * len(prompts)
    pd.DataFrame(data).to_parquet(path)
    return path


def test_trl_missing_column(tmp_path):
    file = trl_file(tmp_path / "completions" / "completions_00001.parquet", ["p"] * 2, [1.0, 0.0])
    pq.write_table(pq.read_table(file).drop_columns(["completion"]), file)
    with pytest.raises(GroupLogError) as err:
        read_log(tmp_path, tokenize=words)
    message = str(err.value)
    assert f"{file}: missing column(s) completion" in message and "a TRL completions file has step, prompt" in message


def test_trl_sample_without_any_reward(tmp_path):
    prompts = ["x"] * 2 + ["y"] * 2 + ["z"] * 2
    file = trl_file(tmp_path / "completions" / "completions_00001.parquet", prompts, [1.0, 0.0, 1.0, None, 0.0, 1.0])
    with pytest.raises(GroupLogError, match=rf"{file} row 3 \(group 1\): reward is nan .*numeric reward"):
        read_log(tmp_path, tokenize=words)
    log = read_log(tmp_path, tokenize=words, on_bad_row="skip")
    assert_skipped(log, 1, 2, [0, 2])


def test_trl_group_cut_at_the_end_of_a_file(tmp_path):
    # the file ends inside a group (its rows are not a whole number of groups)
    trl_file(tmp_path / "completions" / "completions_00001.parquet", ["x"] * 2 + ["y"], [1.0, 0.0, 1.0])
    trl_file(tmp_path / "completions" / "completions_00002.parquet", ["z"] * 2, [1.0, 0.0])
    file = tmp_path / "completions" / "completions_00001.parquet"
    with pytest.raises(GroupLogError) as err:
        read_log(tmp_path, tokenize=words, num_generations=2)
    message = str(err.value)
    assert f"{file} row 2: the file's last 1 rows are not a whole group of num_generations=2" in message
    assert "--num-generations N" in message
    log = read_log(tmp_path, tokenize=words, num_generations=2, on_bad_row="skip")
    assert [g.prompt_text for g in log.groups] == ["x", "z"] and (log.skipped_groups, log.skipped_rows) == (1, 1)
