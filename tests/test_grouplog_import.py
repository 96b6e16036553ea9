"""Importers of other frameworks' rollout logs: each fixture (tests/fixtures/grouplogs, written
from one set of groups by make_fixtures.py) reads to the same groups as the native log."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.store.foreign import FORMATS, detect_format, read_log
from pipeline.store.foreign.verl import looks_filtered
from pipeline.store.grouplog import GroupLog, GroupLogError, GroupLogWriter, RecordedGroup, read_group_log
from railgate.replay.logs import log_lines, open_log

FIXTURES = Path(__file__).parent / "fixtures" / "grouplogs"
NATIVE = FIXTURES / "native" / "groups.parquet"


def words(text: str) -> list[int]:
    """The fixtures' tokenizer: one token per whitespace-separated word."""
    return [0] * len(text.split())


def summary(log: GroupLog) -> list[tuple]:
    return [
        (
            g.prompt_id,
            g.step,
            g.rewards,
            tuple(s.num_tokens for s in g.samples),
            tuple(s.text for s in g.samples),
            tuple(s.policy_version for s in g.samples),
            tuple(s.finish_order for s in g.samples),
        )
        for g in log.groups
    ]


@pytest.fixture(scope="module")
def native() -> GroupLog:
    return read_group_log(NATIVE)


@pytest.mark.parametrize("name, fmt", [("trl", "trl"), ("trl_chat", "trl"), ("areal", "areal"), ("verl", "verl")])
@pytest.mark.parametrize("how", ["named", "detected"])
def test_each_format_reads_to_the_native_groups(native, name, fmt, how):
    log = read_log(FIXTURES / name, fmt=fmt if how == "named" else "auto", tokenize=words)
    assert log.format == fmt and (log.skipped_groups, log.skipped_rows) == (0, 0)
    assert len(log.groups) == 6 and log.group_size == 4
    assert summary(log) == summary(native)
    for got, want in zip(log.groups, native.groups):
        if name == "trl_chat":
            assert json.loads(got.prompt_text) == [{"role": "user", "content": want.prompt_text}]
        else:
            assert got.prompt_text == want.prompt_text
    assert [g.is_mixed for g in log.groups] == [True, False, True, False, True, True]


def test_verl_keeps_the_reference_answer(native):
    log = read_log(FIXTURES / "verl", tokenize=words)
    assert [g.answer for g in log.groups] == [g.answer for g in native.groups]


@pytest.mark.parametrize(
    "relative, fmt",
    [
        ("native/groups.parquet", "native"),
        ("trl", "trl"),
        ("trl/completions", "trl"),
        ("trl/completions/completions_00002.parquet", "trl"),
        ("areal", "areal"),
        ("areal/rollout", "areal"),
        ("areal/rollout/2", "areal"),
        ("areal/rollout/2/4.jsonl", "areal"),
        ("verl", "verl"),
        ("verl/2.jsonl", "verl"),
    ],
)
def test_detection_names_each_layout(relative, fmt):
    assert detect_format(FIXTURES / relative) == fmt


def test_detection_finds_segments_and_refuses_what_it_cannot_tell(tmp_path):
    with GroupLogWriter(tmp_path / "log", fsync=False) as w:
        w.write([RecordedGroup.of(0, prompt_id=0, rewards=[1, 0])])
    assert detect_format(tmp_path / "log") == "native"
    (tmp_path / "log" / "1.jsonl").write_text(json.dumps({"input": "a", "output": "b", "score": 1}) + "\n")
    with pytest.raises(GroupLogError, match=r"could be a native or a verl log; pass --format native\|verl"):
        detect_format(tmp_path / "log")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GroupLogError, match="--format native|trl|areal|verl"):
        detect_format(tmp_path / "empty")
    assert FORMATS == ("native", "trl", "areal", "verl")


def test_trl_reads_a_batch_logged_twice_once():
    log = read_log(FIXTURES / "trl", tokenize=words)
    assert log.duplicate_rows == 12 and len(log.groups) == 6
    assert [g.step for g in log.groups] == [1, 1, 1, 2, 2, 2]  # the copy logged at step 3 is gone
    assert any("repeated a batch" in n for n in log.notes)
    assert any("accuracy_reward, format_reward" in n for n in log.notes)  # which columns were summed
    assert read_log(FIXTURES / "trl" / "completions" / "completions_00003.parquet", tokenize=words).duplicate_rows == 0


def test_trl_reward_columns_can_be_chosen(native):
    log = read_log(FIXTURES / "trl", tokenize=words, reward_columns=["accuracy_reward"])
    assert log.groups[0].rewards == (1.0, 1.0, 0.0, 1.0)


def _trl_file(directory: Path, prompts: list[str], rewards: list[float | None], extra: dict | None = None) -> Path:
    out = directory / "completions"
    out.mkdir(parents=True, exist_ok=True)
    columns = {"step": [5] * len(prompts), "prompt": prompts, "completion": ["a b"] * len(prompts), "r": rewards}
    columns.update(extra or {})
    columns["advantage"] = [0.0] * len(prompts)
    pd.DataFrame(columns).to_parquet(out / "completions_00005.parquet")
    return directory


def test_trl_sums_reward_functions_skipping_the_ones_that_do_not_apply(tmp_path):
    # TRL writes NaN where a reward function returned None; its total is the sum of the others.
    path = _trl_file(tmp_path, ["p"] * 2, [1.0, None], extra={"other": [0.5, 0.25]})
    log = read_log(path, tokenize=words)
    assert log.groups[0].rewards == (1.5, 0.25)


def test_trl_group_size_is_inferred_only_when_unambiguous(tmp_path):
    # the same prompt twice in a row makes a run of 8 beside runs of 4: K cannot be told
    path = _trl_file(tmp_path, ["x"] * 8 + ["y"] * 4, [1.0, 0.0] * 6)
    with pytest.raises(
        GroupLogError, match=r"runs of identical prompts: 1 of length 4, 1 of length 8.*--num-generations N"
    ):
        read_log(path, tokenize=words)
    log = read_log(path, tokenize=words, num_generations=4)
    assert [g.prompt_text for g in log.groups] == ["x", "x", "y"] and log.group_size == 4


def test_trl_with_the_wrong_group_size_names_the_row_and_the_flag(tmp_path):
    path = _trl_file(tmp_path, ["x"] * 4 + ["y"] * 4, [1.0, 0.0] * 4)
    with pytest.raises(GroupLogError, match=r"completions_00005.parquet row 4: .*--num-generations N"):
        read_log(path, tokenize=words, num_generations=6)
    skipped = read_log(path, tokenize=words, num_generations=3, on_bad_row="skip")
    # blocks 0-2 (x) kept; 3-5 mixes x and y; the last 2 rows are no whole group
    assert [g.prompt_text for g in skipped.groups] == ["x"]
    assert (skipped.skipped_groups, skipped.skipped_rows) == (2, 5)


@pytest.mark.parametrize("name", ["trl", "verl"])
def test_logs_without_lengths_ask_for_a_tokenizer(name):
    with pytest.raises(GroupLogError, match=r"keep no token counts.*--tokenizer DIR.*--tokenizer chars"):
        read_log(FIXTURES / name)


def test_areal_needs_no_tokenizer_and_leaves_evaluation_out():
    log = read_log(FIXTURES / "areal")
    assert not any("eval-rollout" in s for s in log.sources) and len(log.sources) == 6


def test_areal_policy_version_is_the_oldest_weights(tmp_path):
    d = tmp_path / "rollout" / "7"
    d.mkdir(parents=True)
    lines = [
        {"task_id": 0, "sample_idx": i, "seqlen": 5, "prompt_len": 2, "head_version": 6 - i, "tail_version": 7}
        | {"reward": 1.0 - i, "prompt": "p", "completion": "a b c"}
        for i in range(2)
    ]
    (d / "0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    group = read_log(tmp_path).groups[0]
    assert group.step == 7 and [s.policy_version for s in group.samples] == [6, 5] and group.tokens == 6


def test_verl_filtered_log_carries_the_bias_note():
    log = open_log(FIXTURES / "verl_filtered", tokenizer="chars")
    assert len(log.groups) == 4 and all(g.is_mixed for g in log.groups)
    assert looks_filtered(log)
    printed = "\n".join(log_lines(log))
    assert "note: every one of the 4 groups has unequal scores" in printed
    assert "biased" in printed and "filter_groups.enable=false" in printed and "shadow mode" in printed
    assert not looks_filtered(read_log(FIXTURES / "verl", tokenize=words))


def test_verl_splits_a_prompt_drawn_twice_in_one_step(tmp_path):
    prompts = ["a"] * 8 + ["b"] * 4  # two rows of the data set with prompt "a"
    lines = [{"input": p, "output": "o", "score": float(i % 2), "step": 1} for i, p in enumerate(prompts)]
    (tmp_path / "1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    log = read_log(tmp_path, tokenize=words)
    assert [g.prompt_text for g in log.groups] == ["a", "a", "b"] and log.group_size == 4
    assert any("split into groups of 4" in n for n in log.notes)


def test_open_log_counts_characters_or_names_the_flag(tmp_path):
    chars = open_log(FIXTURES / "verl", tokenizer="chars")
    assert chars.groups[0].samples[0].num_tokens == len("The answer is 5")
    with pytest.raises(GroupLogError, match=r"--tokenizer .*nowhere: no such directory.*--tokenizer chars"):
        open_log(FIXTURES / "verl", tokenizer=tmp_path / "nowhere")
    with pytest.raises(GroupLogError, match=r"keep no token counts.*--tokenizer DIR"):
        open_log(FIXTURES / "verl")


@pytest.mark.slow  # imports transformers (seconds)
def test_open_log_builds_the_tokenizer_from_a_directory(tmp_path, native):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "5": 1}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    log = open_log(FIXTURES / "trl", tokenizer=tmp_path / "tok")
    assert summary(log) == summary(native)
    (tmp_path / "empty").mkdir()
    with pytest.raises(GroupLogError, match=r"--tokenizer .*empty: AutoTokenizer cannot load"):
        open_log(FIXTURES / "verl", tokenizer=tmp_path / "empty")
