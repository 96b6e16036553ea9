"""A run directory is data, never instructions (issue 31): a downloaded run cannot make VW write
files, import code or reach a host, cannot get code unpickled without the user's word, and a
checkpoint of another run is not resumed into this one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import vowpalwabbit
import yaml
from run_helpers import cli, sets, sim_run, tree_digest
from vw_craft import with_options

from controller.rail.bandit import ControllerStateError
from controller.rail.vw_args import VWArgsError, check_extra_args, check_model_options
from controller.rail.vw_backend import VWLearner
from pipeline.config.build import ConfigError
from railgate.checkpoint import CheckpointWriter, latest_checkpoint, load_checkpoint
from railgate.config import load_config

FILE_OPTIONS = [
    "-d data.txt",
    "-f model.vw",
    "--final_regressor model.vw",
    "-i model.vw",
    "--cache_file c",
    "-c",
    "--readable_model r.txt",
    "-p preds.txt",
    "--predictions preds.txt",
    "--invert_hash ih.txt",
    "-r raw.txt",
    "--audit_regressor a.txt",
    "--daemon",
    "--port 26542",
    "--sendto localhost",
    "--save_resume",
    "--output_feature_regularizer_binary x",
    "--feature_mask m.vw",
]


@pytest.mark.parametrize("option", FILE_OPTIONS)
def test_vw_options_that_name_files_or_hosts_are_refused_at_config_load(option, tmp_path):
    with pytest.raises(ConfigError, match="vw_extra_args.*not an option railgate passes to vowpalwabbit.*remove it"):
        load_config(None, [f"controller.rail.vw_extra_args=--l2 1e-6 {option}"])
    with pytest.raises(VWArgsError):
        VWLearner(extra_args=option)  # the Python API holds to the same list


def test_learning_options_pass_and_values_are_checked():
    assert check_extra_args("--l2 1e-6 --power_t=0.5 -q sa --cb_type mtr --noconstant") == [
        "--l2",
        "1e-6",
        "--power_t",
        "0.5",
        "-q",
        "sa",
        "--cb_type",
        "mtr",
        "--noconstant",
    ]
    for bad, why in (
        ("--l2 /tmp/x", "takes a number"),
        ("-q ../../etc", "takes namespace letters"),
        ("--loss_function evil", "takes a name"),
        ("--noconstant=1", "takes no value"),
        ("1e-6", "a value without its option"),
        ("--l2 'unclosed", "cannot be split"),
    ):
        with pytest.raises(VWArgsError, match=why):
            check_extra_args(bad)
    cfg = load_config(None, ["controller.kind=rail", "controller.rail.vw_extra_args=--l2 1e-6 -q ss"])
    assert cfg.controller.rail.vw_extra_args == "--l2 1e-6 -q ss"


def test_a_crafted_vw_model_in_a_checkpoint_writes_no_file(tmp_path):
    """VW re-applies the options a saved model's header holds; a crafted header (checksum made to
    match) could make it write anywhere. The header is checked before VW reads it."""
    state = VWLearner(seed=1).state_dict()
    blob = __import__("base64").b64decode(state["model"])
    target = tmp_path / "pwned.txt"
    crafted = with_options(blob, f" --readable_model {target}")
    # the crafted model is one VW accepts and obeys: that is the danger
    (tmp_path / "m.vw").write_bytes(crafted)
    vowpalwabbit.Workspace(f"--quiet -i {tmp_path / 'm.vw'}").finish()
    assert target.exists()
    target.unlink()
    bad = dict(
        state,
        model=__import__("base64").b64encode(crafted).decode(),
        sha256=__import__("hashlib").sha256(crafted).hexdigest(),
    )
    with pytest.raises(ControllerStateError, match="'--readable_model' is not an option railgate passes"):
        VWLearner(seed=1).load_state_dict(bad)
    assert not target.exists()
    check_model_options(blob)  # an honest model passes
    VWLearner(seed=1).load_state_dict(state)


@pytest.fixture(scope="module")
def rail_run(tmp_path_factory) -> Path:
    """A finished RAIL run whose config.yaml says vw_extra_args="--l2 1e-6"."""
    return sim_run(
        tmp_path_factory.mktemp("untrusted") / "run",
        2,
        *sets("controller.kind=rail", "controller.rail.vw_extra_args=--l2 1e-6"),
    )


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_run_dirs_vw_args_reach_vw_only_when_the_user_passes_them(command, rail_run, tmp_path):
    run = shutil.copytree(rail_run, tmp_path / "run")
    args = (
        ["eval", str(run)]
        if command == "eval"
        else ["train", "--resume", str(run), "--no-progress", "--set", "orchestrator.steps=3"]
    )
    before = tree_digest(run)
    refused = cli(*args)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-2000:]
    assert "config.yaml sets controller.rail.vw_extra_args='--l2 1e-6', which reaches vowpalwabbit" in lines[0]
    assert "--set 'controller.rail.vw_extra_args=--l2 1e-6'" in lines[0]
    assert tree_digest(run) == before
    accepted = cli(*args, "--set", "controller.rail.vw_extra_args=--l2 1e-6")
    assert accepted.returncode == 0, accepted.stderr[-2000:]


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("task.dataset.reward", "my_rewards:score", "names Python code to import and run"),
        ("engine.ray.address", "10.0.0.1:6379", "connects to a Ray cluster"),
        ("task.env.class", "my_envs:Env", "names Python code to import and run"),
    ],
)
def test_a_run_dirs_code_and_hosts_are_not_taken_from_it(key, value, why, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    section, *rest = key.split(".")
    tree: dict = {}
    node = tree.setdefault(section, {})
    for part in rest[:-1]:
        node = node.setdefault(part, {})
    node[rest[-1]] = value
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    result = cli("eval", str(run))
    assert result.returncode == 2 and f"sets {key}='{value}', which {why}" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    """Checkpoints carry their run's id; one copied in from another run is refused, naming both."""
    ours = sim_run(tmp_path / "ours", 2)
    theirs = sim_run(tmp_path / "theirs", 3)
    ours_id, theirs_id = (ours / "run_id").read_text().strip(), (theirs / "run_id").read_text().strip()
    assert ours_id != theirs_id and ours_id.startswith("ours-")
    assert load_checkpoint(latest_checkpoint(ours))["run_id"] == ours_id
    shutil.copy(latest_checkpoint(theirs), ours / "checkpoints")
    (ours / "checkpoints" / "latest").write_text("step-000003.ckpt")
    before = tree_digest(ours)
    result = cli("train", "--resume", str(ours), "--no-progress", "--set", "orchestrator.steps=4")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"belongs to run {theirs_id}, not to this directory's run {ours_id}" in lines[0] and "remove" in lines[0]
    assert tree_digest(ours) == before
    (ours / "checkpoints" / "step-000003.ckpt").unlink()  # the fix the message names
    assert cli("train", "--resume", str(ours), "--no-progress", "--set", "orchestrator.steps=4").returncode == 0


def test_a_run_of_an_older_release_keeps_its_name_as_its_id(tmp_path):
    """No run_id file and checkpoints without one: the run's name is its id, written on resume."""
    run = sim_run(tmp_path / "old", 2)
    (run / "run_id").unlink()
    for path in (run / "checkpoints").glob("step-*.ckpt"):
        state = load_checkpoint(path)
        del state["run_id"]
        path.unlink()
        CheckpointWriter(run, keep=5)(state)  # rewritten as an older release wrote it: no run id
    result = cli("train", "--resume", str(run), "--no-progress", "--set", "orchestrator.steps=3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run / "run_id").read_text().strip() == "old"
    assert load_checkpoint(latest_checkpoint(run))["run_id"] == "old"


@pytest.mark.parametrize("command", ["resume", "eval"])
@pytest.mark.parametrize("entry", [".railgate.lock", "metrics.jsonl", "trace/superseded.jsonl", "eval_step2.json"])
def test_links_in_a_run_directory_lead_no_write_outside_it(entry, command, tmp_path):
    """A shared run directory whose files are links must not make railgate truncate, append to or
    replace the files they name (the lock file once truncated its link's target)."""
    run = sim_run(tmp_path / "run", 2)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = run / entry
    if link.exists():
        link.unlink()
    link.symlink_to(victim)
    args = (
        ["eval", str(run)]
        if command == "eval"
        else ["train", "--resume", str(run), "--no-progress", "--set", "orchestrator.steps=3"]
    )
    result = cli(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"{link} is a link" in lines[0]
    assert victim.read_text() == "precious\n" and link.is_symlink()
