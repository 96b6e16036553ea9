"""A careless or hostile user at the command line: every bad input is one clear line.

Each case of ``CASES`` runs ``python run.py ...`` in a subprocess against a copy of a finished
simulator run (or a fresh directory) and asserts: exit status 2, exactly one line on stderr
naming the problem, no traceback, no line longer than ``MAX_LINE`` (long values are
shortened), the run directory unchanged (every file's bytes hashed before and after), and
no code from the input ran (no marker file). The cases are the ones issue 15 lists and
their neighbours; the note on the issue lists them with their outcomes.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from run_helpers import SMALL, cli, sets, sim_run, tree_digest

MAX_LINE = 1000
SIM = ("--config", "configs/sim.yaml")


class RunsCode:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[Path, Path], list[str]]  # (run, tmp) -> argv; run: a copy of a finished run
    expect: str  # in the error line
    setup: Callable[[Path, Path], Any] | None = None  # may return something to keep alive during the call
    fresh: bool = False  # the command targets tmp/fresh (must stay absent) instead of the finished run


def fresh_train(*assignments: str) -> Callable[[Path, Path], list[str]]:
    def args(run: Path, tmp: Path) -> list[str]:
        return ["train", *SIM, "--run-dir", str(tmp / "fresh"), *SMALL, *sets(*assignments)]

    return args


def config_file(text: str | bytes) -> Callable[[Path, Path], Any]:
    def setup(run: Path, tmp: Path) -> None:
        path = tmp / "bad.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return setup


def with_config(run: Path, tmp: Path) -> list[str]:
    return ["train", "--config", str(tmp / "bad.yaml"), "--run-dir", str(tmp / "fresh"), "--no-progress"]


def resume(*extra: str) -> Callable[[Path, Path], list[str]]:
    return lambda run, tmp: ["train", "--resume", str(run), "--no-progress", *extra]


def evaluate(run: Path, tmp: Path) -> list[str]:
    return ["eval", str(run)]


def newest(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def truncate(run: Path, tmp: Path) -> None:
    path = newest(run)
    path.write_bytes(path.read_bytes()[:1000])


def flip_bit(run: Path, tmp: Path) -> None:
    path = newest(run)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def plant_pickle(run: Path, tmp: Path) -> None:
    for old in (run / "checkpoints").glob("step-*"):
        old.unlink()
    (run / "checkpoints" / "step-000003.pt").write_bytes(pickle.dumps({"step": 3, "learner": RunsCode(tmp / "pwned")}))
    (run / "checkpoints" / "latest").write_text("step-000003.pt")


def latest_escapes(run: Path, tmp: Path) -> None:
    shutil.copy(newest(run), tmp / "step-000009.ckpt")
    (run / "checkpoints" / "latest").write_text("../../step-000009.ckpt")


def latest_is_link(run: Path, tmp: Path) -> None:
    (tmp / "pointer").write_text(newest(run).name)
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "latest").symlink_to(tmp / "pointer")


def latest_names_missing(run: Path, tmp: Path) -> None:
    for old in (run / "checkpoints").glob("step-*"):
        old.unlink()


def no_checkpoint(run: Path, tmp: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def broken_config_yaml(run: Path, tmp: Path) -> None:
    (run / "config.yaml").write_text("gate: [unclosed\n")


def hold_lock(run: Path, tmp: Path) -> Any:
    fd = os.open(run / ".railgate.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "command": "railgate train", "started": "now"}).encode())
    return fd


def file_in_the_way(run: Path, tmp: Path) -> None:
    (tmp / "a_file").write_text("not a directory")


def malformed_superseded(run: Path, tmp: Path) -> None:
    with open(run / "trace" / "superseded.jsonl", "a") as f:
        f.write(
            '["not", "a", "rule"]\n{"prefix": "decisions", "before_segment": 1, "column": "decision_id", "start": 0}\n'
        )


def two_runs_in_one_trace(run: Path, tmp: Path) -> None:
    other = sim_run(tmp / "other", 2, "--set", "controller.kind=rail")
    for kind in ("decisions", "outcomes"):
        shutil.copy(other / "trace" / f"{kind}-00000.arrows", run / "trace" / f"{kind}-00007.arrows")


def not_arrow(run: Path, tmp: Path) -> None:
    (tmp / "notes.arrows").write_text("these are my notes\n")


ALIAS_BOMB = "a: &a [x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}]\n" for p, c in zip("abcdefghijklmnopqrstuvw", "bcdefghijklmnopqrstuvwx")
)
ALIAS_BOMB += "y: [" + ", ".join(["*x"] * 200) + "]\n"

NESTED_BOMB = "a: &a [x, x]\n" + "".join(
    f"l{i}: &l{i} [*{p}, *{p}]\n" for i, p in enumerate(["a"] + [f"l{j}" for j in range(29)])
)
assert NESTED_BOMB.count("*") == 60  # far under the alias limit; 2^30 values once expanded

CASES = [
    # configuration values
    Case("unknown key", fresh_train("orchestrator.group_sise=8"), "did you mean 'group_size'", fresh=True),
    Case("wrong type", fresh_train("orchestrator.steps=abc"), "must be an integer", fresh=True),
    Case("boolean for a number", fresh_train("orchestrator.steps=true"), "not a boolean", fresh=True),
    Case("NaN float", fresh_train("sim.learning_rate=.nan"), "finite", fresh=True),
    Case("infinite timeout", fresh_train("orchestrator.reward_timeout_s=.inf"), "finite", fresh=True),
    Case("infinite integer", fresh_train("orchestrator.steps=.inf"), "must be an integer", fresh=True),
    Case("integer overflow", fresh_train("orchestrator.steps=1e400"), "must be an integer", fresh=True),
    Case(
        "NaN difficulty",
        fresh_train("sim.difficulty=[{weight: 1, mean: .nan, std: 1}]"),
        "difficulty[0].mean",
        fresh=True,
    ),
    Case(
        "negative max_rollouts", fresh_train("orchestrator.max_rollouts=-5"), "max_rollouts=-5 must be >= 0", fresh=True
    ),
    Case("negative eval_every", fresh_train("orchestrator.eval_every=-1"), "eval_every=-1", fresh=True),
    Case("huge batch_groups", fresh_train("orchestrator.batch_groups=1000000000"), "above its limit", fresh=True),
    Case("huge sim pool", fresh_train("sim.num_prompts=1000000000"), "above its limit", fresh=True),
    Case("zero temperature", fresh_train("orchestrator.temperature=0"), "temperature=0.0 must be > 0", fresh=True),
    Case("top_p above 1", fresh_train("orchestrator.top_p=1.5"), "top_p=1.5 must be in (0, 1]", fresh=True),
    Case("unknown gate kind", fresh_train("gate.kind=bogus"), "is not one of", fresh=True),
    Case("100k-character value", fresh_train("gate.kind=" + "x" * 100_000), "characters)", fresh=True),
    Case("--set not YAML", fresh_train("orchestrator.steps=["), "not a YAML scalar", fresh=True),
    Case(
        "--set without =",
        lambda run, tmp: ["train", *SIM, "--run-dir", str(tmp / "fresh"), "--set", "novalue"],
        "must look like key.sub=value",
        fresh=True,
    ),
    Case("--set empty key", fresh_train("=3"), "empty key", fresh=True),
    Case("--set into a value", fresh_train("seed.x=1"), "is a value, not a section", fresh=True),
    Case("--set alias bomb", fresh_train("x=[&a [1, 1], " + ", ".join(["*a"] * 150) + "]"), "aliases", fresh=True),
    Case(
        "empty run_dir", lambda run, tmp: ["train", *SIM, "--set", "run_dir="], "run_dir must not be empty", fresh=True
    ),
    # configuration files
    Case(
        "config file missing",
        lambda run, tmp: ["train", "--config", str(tmp / "nope.yaml"), "--run-dir", str(tmp / "fresh")],
        "does not exist",
        fresh=True,
    ),
    Case("config not YAML", with_config, "is not valid YAML", setup=config_file("gate: [unclosed\n"), fresh=True),
    Case(
        "config with a python tag",
        with_config,
        "is not valid YAML",
        setup=lambda run, tmp: config_file(f"x: !!python/object/apply:os.system ['touch {tmp / 'pwned'}']\n")(run, tmp),
        fresh=True,
    ),
    Case("config alias bomb", with_config, "aliases", setup=config_file(ALIAS_BOMB), fresh=True),
    Case("config not a mapping", with_config, "must hold a mapping", setup=config_file("- 1\n- 2\n"), fresh=True),
    Case(
        "config alias bomb of 60 aliases",
        with_config,
        "expands to 8.59e+09 values",
        setup=config_file(NESTED_BOMB),
        fresh=True,
    ),
    Case("config alias inside itself", with_config, "it never ends", setup=config_file("a: &a [1, *a]\n"), fresh=True),
    Case(
        "--set alias bomb of 60 aliases",
        fresh_train(
            "x=[&a [1, 1], "
            + ", ".join(
                f"&b{i} [{'*a' if i == 0 else f'*b{i - 1}'}, {'*a' if i == 0 else f'*b{i - 1}'}]" for i in range(29)
            )
            + "]"
        ),
        "expands to",
        fresh=True,
    ),
    Case(
        "vw option that writes a file",
        fresh_train("controller.rail.vw_extra_args=--l2 1e-6 -f /tmp/model.vw"),
        "'-f' is not an option railgate passes to vowpalwabbit",
        fresh=True,
    ),
    Case(
        "reward timeout of 1e300",
        fresh_train("orchestrator.reward_timeout_s=1e300"),
        "must be in (0, 3600] seconds",
        fresh=True,
    ),
    Case("config not UTF-8", with_config, "not UTF-8", setup=config_file(b"seed: 1\nrun_id: caf\xe9\n"), fresh=True),
    # run directories
    Case(
        "train into a used directory",
        lambda run, tmp: ["train", *SIM, "--run-dir", str(run), *SMALL],
        "already holds a run",
    ),
    Case(
        "train while another holds the lock",
        lambda run, tmp: ["train", *SIM, "--run-dir", str(run), "--overwrite", *SMALL],
        "in use by another railgate process (pid 4242 on elsewhere",
        setup=hold_lock,
    ),
    Case(
        "run dir under a file",
        lambda run, tmp: ["train", *SIM, "--run-dir", str(tmp / "a_file" / "run"), *SMALL],
        "cannot create the run directory",
        setup=file_in_the_way,
    ),
    Case("--resume and --overwrite", resume("--overwrite"), "pass one of them"),
    Case(
        "--resume a missing directory",
        lambda run, tmp: ["train", "--resume", str(tmp / "nope")],
        "does not exist",
        fresh=True,
    ),
    Case("--resume without a checkpoint", resume(), "no checkpoint", setup=no_checkpoint),
    Case("--resume with another gate", resume("--set", "gate.kind=sara"), "gate.kind was 'uniform'"),
    Case("--resume with another seed", resume("--set", "seed=5"), "seed was 0 and would be 5"),
    Case("--resume with a broken config.yaml", resume(), "is not valid YAML", setup=broken_config_yaml),
    Case("--resume a truncated checkpoint", resume(), "damaged", setup=truncate),
    Case("--resume a flipped bit", resume(), "damaged", setup=flip_bit),
    Case("--resume a crafted pickle", resume(), "convert-checkpoint", setup=plant_pickle),
    Case("--resume when latest escapes", resume(), "not a checkpoint file name", setup=latest_escapes),
    Case("--resume when latest is a link", resume(), "link or leads outside", setup=latest_is_link),
    Case(
        "--resume when latest names a missing file", resume(), "no other checkpoint exists", setup=latest_names_missing
    ),
    Case("eval a crafted pickle", evaluate, "convert-checkpoint", setup=plant_pickle),
    Case("eval a truncated checkpoint", evaluate, "damaged", setup=truncate),
    Case(
        "eval with zero samples", lambda run, tmp: ["eval", str(run), "--samples", "0"], "eval_samples=0 must be >= 1"
    ),
    Case("eval a directory without config", lambda run, tmp: ["eval", str(tmp / "nope")], "does not exist", fresh=True),
    Case(
        "convert-checkpoint with nothing to convert", lambda run, tmp: ["convert-checkpoint", str(run)], "no old-format"
    ),
    Case(
        "convert-checkpoint without --trust-pickle",
        lambda run, tmp: ["convert-checkpoint", str(run)],
        "unpickling runs any code a file holds",
        setup=plant_pickle,
    ),
    Case(
        "shadow into a used directory",
        lambda run, tmp: ["shadow", *SIM, "--run-dir", str(run), *SMALL],
        "replace it with shadow --overwrite, or shadow into another --run-dir",
    ),
    Case(
        "replay into a run's directory",
        lambda run, tmp: ["replay", str(run / "trace"), "--out", str(run)],
        "pass another --out",
    ),
    Case(
        "export into a run's directory",
        lambda run, tmp: ["export", str(run), "--out", str(run), "--force"],
        "it holds a run",
    ),
    # traces
    Case(
        "replay a missing path",
        lambda run, tmp: ["replay", str(tmp / "nope"), "--out", str(tmp / "out")],
        "does not exist",
    ),
    Case(
        "replay a file that is not Arrow",
        lambda run, tmp: ["replay", str(tmp / "notes.arrows"), "--out", str(tmp / "out")],
        "not an Arrow IPC stream",
        setup=not_arrow,
    ),
    Case(
        "replay a malformed superseded.jsonl",
        lambda run, tmp: ["replay", str(run / "trace"), "--out", str(tmp / "out")],
        "superseded.jsonl line 1 is not a supersede rule",
        setup=malformed_superseded,
    ),
    Case(
        "replay two runs without --run-id",
        lambda run, tmp: ["replay", str(run / "trace"), "--out", str(tmp / "out")],
        "pick one with --run-id, e.g. --run-id run-",
        setup=two_runs_in_one_trace,
    ),
    Case(
        "replay an unknown --run-id",
        lambda run, tmp: ["replay", str(run / "trace"), "--run-id", "nope", "--out", str(tmp / "out")],
        "holds no run 'nope'",
    ),
    Case(
        "replay a trace without RAIL decisions",
        lambda run, tmp: ["replay", str(run / "trace"), "--out", str(tmp / "out")],
        "no usable RAIL decisions",
    ),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    return sim_run(tmp_path_factory.mktemp("adversarial") / "run", 3)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line_and_changes_nothing(case: Case, finished_run: Path, tmp_path: Path):
    run = shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    keep = case.setup(run, tmp_path) if case.setup else None
    target = tmp_path / "fresh" if case.fresh else run
    before = tree_digest(target)
    try:
        result = cli(*case.args(run, tmp_path))
    finally:
        if isinstance(keep, int):
            os.close(keep)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert case.expect in lines[0], lines[0]
    assert len(lines[0]) <= MAX_LINE
    assert tree_digest(target) == before
    assert not (case.fresh and target.exists()), "a refused run left a directory behind"
    assert not (tmp_path / "pwned").exists(), "the input ran code"
