"""Loading env classes by name, the task.env settings, and SkyRL-format rows: every error
names the value and the fix."""

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config.build import ConfigError, build, to_dict
from pipeline.datafiles import DatasetError
from pipeline.envs.config import EnvConfig
from pipeline.envs.loading import EnvLoadError, load_env_class
from pipeline.envs.rows import load_env_rows
from pipeline.tasks import TaskConfig, build_task


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    (tmp_path / "envmod_ok.py").write_text(
        "class Good:\n    def __init__(self, c, e): pass\n    def init(self, p): return p, {}\n"
        "    def step(self, a): return {}\nclass NoStep:\n    def init(self, p): return p, {}\nTHING = 3\n"
    )
    (tmp_path / "envmod_needs.py").write_text("import not_a_real_package_xyz\n")
    (tmp_path / "envmod_raises.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("envmod_ok", "envmod_needs", "envmod_raises"):
        sys.modules.pop(name, None)


LOAD_ERRORS = [
    ("envmod_ok", "must be 'module:Class'"),
    ("no_such_module_xyz:Env", "no module named 'no_such_module_xyz'; check the spelling"),
    ("envmod_needs:Env", "importing 'envmod_needs' needs 'not_a_real_package_xyz', which is not installed"),
    ("envmod_raises:Env", "importing 'envmod_raises' raised RuntimeError: boom at import; fix the module"),
    ("envmod_ok:Goood", "module 'envmod_ok' has no attribute 'Goood'; did you mean 'Good'?"),
    ("envmod_ok:THING", "is a int, not a class"),
    ("envmod_ok:NoStep", "has no method step; an environment needs init(prompt)"),
]


@pytest.mark.parametrize("spec,message", LOAD_ERRORS, ids=[s for s, _ in LOAD_ERRORS])
def test_load_errors_name_the_value_and_the_fix(module_dir, spec, message):
    with pytest.raises(EnvLoadError) as err:
        load_env_class(spec)
    assert f"task.env.class={spec!r}" in str(err.value) and message in str(err.value)


def test_a_missing_skyrl_gym_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # as if not installed
    with pytest.raises(EnvLoadError, match=r"pip install 'railgate\[skyrl\]'"):
        load_env_class("skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv")


def test_a_good_class_loads(module_dir):
    assert load_env_class("envmod_ok:Good").__name__ == "Good"


def test_task_env_settings_from_yaml_shape():
    task = build(
        TaskConfig,
        {
            "name": "env",
            "env": {"class": "pipeline.envs.wordproblems:WordProblemEnv", "config": {"max_turns": 4}, "reward": "sum"},
        },
    )
    assert task.env.cls == "pipeline.envs.wordproblems:WordProblemEnv" and task.env.config == {"max_turns": 4}
    assert to_dict(task)["env"]["class"] == task.env.cls  # written back under its YAML key
    assert build(TaskConfig, to_dict(task)) == task
    with pytest.raises(ConfigError, match="did you mean 'class'"):
        build(TaskConfig, {"name": "env", "env": {"clas": "a:B"}})


CONFIG_ERRORS = [
    ({"cls": "pipeline.envs.chain"}, "task.env.class='pipeline.envs.chain' must be 'module:Class'"),
    ({"dataset": "rows.csv"}, "task.env.dataset='rows.csv' must be a JSONL or Parquet file"),
    ({"eval_dataset": "e.jsonl"}, "needs task.env.dataset too"),
    ({"max_turns": 0}, "task.env.max_turns=0 must be >= 1"),
    ({"step_timeout_s": -1.0}, "task.env.step_timeout_s=-1.0 must be > 0"),
    ({"max_observation_chars": 0}, "task.env.max_observation_chars=0 must be >= 1"),
    ({"demo_mistakes": 1.5}, "task.env.demo_mistakes=1.5 must be in [0, 1]"),
    ({"config": {1: 2}}, "must be a mapping with string keys"),
]


@pytest.mark.parametrize("kwargs,message", CONFIG_ERRORS, ids=[m[:30] for _, m in CONFIG_ERRORS])
def test_env_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        EnvConfig(**kwargs)


GOOD = {
    "data_source": "t",
    "prompt": [{"role": "user", "content": "3+4="}],
    "env_class": "x",
    "reward_spec": {"method": "rule", "ground_truth": "3+4"},
    "extra_info": {"steps": 1},
}
BAD_ROWS = [
    ([1, 2], "the row is a JSON list, not an object"),
    ({"answer": 3}, "field 'prompt' is missing"),
    ({"prompt": "3+4="}, "prompt is a str"),
    ({"prompt": []}, "prompt is an empty list"),
    ({"prompt": [{"role": "user"}]}, "prompt[0] is not a {'role': str, 'content': str} message"),
    ({**GOOD, "reward_spec": "3+4"}, "reward_spec is a str, not a mapping"),
    ({**GOOD, "extra_info": [1]}, "extra_info is a list, not a mapping"),
]


@pytest.mark.parametrize("row,message", BAD_ROWS, ids=[m[:24] for _, m in BAD_ROWS])
def test_bad_rows_are_skipped_and_counted_or_stop_the_load_naming_the_line(tmp_path, row, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(row) + "\n")
    rows, report = load_env_rows(path)
    assert len(rows) == 1 and report.skipped == 1
    with pytest.raises(DatasetError) as err:
        load_env_rows(path, on_bad_row="error")
    assert str(err.value).startswith(f"{path}, line 2: {message}")
    assert "on_bad_row=skip" in str(err.value)


def test_rows_from_parquet_and_the_prompt_size_limit(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD, {**GOOD, "prompt": [{"role": "user", "content": "x" * 500}]}]), path)
    rows, report = load_env_rows(path, max_chars=100)
    assert [r.prompt for r in rows] == [GOOD["prompt"]] and report.skipped == 1
    assert rows[0].extras["reward_spec"] == GOOD["reward_spec"] and "prompt" not in rows[0].extras
    with pytest.raises(DatasetError, match="no usable rows"):
        load_env_rows(path, max_chars=1)


def test_env_task_from_files_keeps_the_eval_file_out_of_training(tmp_path):
    train = [
        {**GOOD, "prompt": [{"role": "user", "content": f"{i}+1="}], "reward_spec": {"ground_truth": f"{i}+1"}}
        for i in range(30)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in train))
    (tmp_path / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in train[:5]))
    cfg = TaskConfig(
        name="env", env=EnvConfig(dataset=str(tmp_path / "train.jsonl"), eval_dataset=str(tmp_path / "eval.jsonl"))
    )
    task = build_task(cfg)
    train_prompts, eval_prompts = task.train_prompts(100, seed=0), task.eval_prompts(20, seed=0)
    assert {p.text for p in eval_prompts} == {json.dumps(r["prompt"]) for r in train[:5]}
    assert {p.text for p in train_prompts}.isdisjoint({p.text for p in eval_prompts})
    assert task.row(eval_prompts[0].prompt_id).extras["reward_spec"]["ground_truth"] == eval_prompts[0].answer
