"""``eval A --against B``: both on the same prompts and draws, the paired difference with its 95%
interval over prompts; ``--json`` prints one object; A against itself is exactly 0 in [0, 0]."""

from __future__ import annotations

import json

import pytest
from run_helpers import SMALL, cli, cli_ok, sets, sim_run, tiny_base
from run_helpers import TINY_REAL as TINY

KEYS = {"accuracy_a", "accuracy_b", "difference", "difference_lo", "difference_hi", "prompts", "samples"}


def one_json(result) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # exactly one JSON object, nothing else on stdout
    return json.loads(lines[0])


def test_a_sim_run_against_itself_is_exactly_zero(tmp_path):
    run = sim_run(tmp_path / "run")
    got = one_json(cli("eval", str(run), "--against", str(run), "--json", "--no-progress"))
    assert set(got) == KEYS
    assert got["difference"] == got["difference_lo"] == got["difference_hi"] == 0.0
    assert got["accuracy_a"] == got["accuracy_b"] and got["prompts"] == 64
    base = one_json(cli("eval", str(run), "--base", "--against", str(run), "--json"))
    assert base["difference_lo"] <= base["difference"] <= base["difference_hi"] and base["difference"] != 0.0


def test_eval_says_what_it_needs(tmp_path):
    (tmp_path / "empty").mkdir()
    result = cli("eval", str(tmp_path / "empty"), *SMALL)
    assert result.returncode == 2 and "neither a run directory" in result.stderr


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("against")
    tiny_base(root / "base")
    cli_ok(
        "train",
        "--no-progress",
        "--run-dir",
        str(root / "run"),
        "--set",
        f"model.path={root / 'base'}",
        *TINY,
        *sets("orchestrator.steps=2", "orchestrator.batch_groups=8", "log.checkpoint_every=2", "gate.kind=uniform"),
        timeout=900,
    )
    return root


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_model_against_itself_is_exactly_zero_on_the_torch_engine(torch_run):
    base = str(torch_run / "base")
    got = one_json(cli("eval", base, "--against", base, "--json", *TINY))
    assert set(got) == KEYS and got["prompts"] == 64 and got["samples"] == 4
    assert got["accuracy_a"] > 0  # some samples succeed: the zero is not vacuous
    assert got["difference"] == 0.0 and got["difference_lo"] == 0.0 and got["difference_hi"] == 0.0
    # A run's base policy is that model: the same number, the same draws.
    run = str(torch_run / "run")
    same = one_json(cli("eval", run, "--base", "--against", base, "--json"))
    assert same["difference"] == 0.0 and same["accuracy_a"] == got["accuracy_a"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_trained_run_against_its_base_prints_the_paired_difference(torch_run):
    result = cli_ok("eval", str(torch_run / "run"), "--against", str(torch_run / "base"))
    assert "A - B (paired, same draws)" in result.stdout and "64 x 4" in result.stdout
