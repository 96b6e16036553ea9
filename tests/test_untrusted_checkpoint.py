"""Untrusted files are data: resuming or evaluating a shared run directory never runs its code.

Checkpoints are a JSON tree plus safetensors behind a SHA-256 (railgate/checkpoint.py); the
pickled ``.pt`` checkpoints of older releases are refused with the conversion command, which
the user runs knowingly; ``checkpoints/latest`` cannot lead outside the run directory; any
flipped bit is caught; and the state comes back exactly."""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import math
import os
import pickle
import random
import shutil
import struct

import numpy as np
import pytest
import torch
from run_helpers import cli, sim_run, tree_digest

from controller.rail.bandit import ControllerStateError
from controller.rail.config import RailConfig
from controller.rail.learners import build_learner, learner_from_state
from pipeline.types import CommittedGroup, FinishReason, Rollout
from railgate.checkpoint import MAGIC, CheckpointError, dump_checkpoint, latest_checkpoint, load_checkpoint
from railgate.state_codec import decode_state, encode_state


class RunsCode:
    """Unpickling this runs ``touch MARKER``: what a hostile checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return sim_run(tmp_path_factory.mktemp("finished") / "run")


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


def _plant_legacy(run_dir, payload: bytes) -> None:
    checkpoints = run_dir / "checkpoints"
    for old in checkpoints.glob("step-*"):
        old.unlink()
    (checkpoints / "step-000003.pt").write_bytes(payload)
    (checkpoints / "latest").write_text("step-000003.pt")


def _torch_saved(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_crafted_old_checkpoint_runs_no_code(finished_run, tmp_path, writer, command):
    run = _copy(finished_run, tmp_path)
    marker = tmp_path / "pwned"
    state = {"step": 3, "learner": RunsCode(marker)}
    _plant_legacy(run, pickle.dumps(state) if writer == "pickle" else _torch_saved(state))
    args = ["eval", str(run)] if command == "eval" else ["train", "--resume", str(run), "--no-progress"]
    result = cli(*args)
    assert not marker.exists(), "reading the checkpoint ran its code"
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "convert-checkpoint" in result.stderr


def _forge(path, tree) -> None:
    """A checkpoint file holding ``tree``, with a valid checksum (as an attacker can compute it)."""
    document = json.dumps({"format": 1, "state": tree}).encode()
    body = struct.pack("<Q", len(document)) + document + struct.pack("<Q", 0) + struct.pack("<Q", 0)
    path.write_bytes(MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


@pytest.mark.parametrize(
    "tree",
    [
        {"step": 3, "x": {"__rg__": "dataclass", "type": "os.system", "fields": {"command": "touch MARKER"}}},
        {"step": 3, "x": {"__rg__": "enum", "type": "subprocess.Popen", "value": ["touch", "MARKER"]}},
        {"step": 3, "x": {"__rg__": "pickle", "b64": "gASVAAAAAAAAAAB9lC4="}},
        {"step": 3, "x": {"__rg__": "tensor", "key": "../../etc/passwd"}},
    ],
)
def test_a_forged_checkpoint_of_the_new_format_is_refused(tmp_path, tree):
    path = tmp_path / "step-000003.ckpt"
    _forge(path, json.loads(json.dumps(tree).replace("MARKER", str(tmp_path / "pwned"))))
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_latest_cannot_lead_outside_the_run_directory(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    checkpoints = run / "checkpoints"
    newest = latest_checkpoint(run)
    outside = tmp_path / "outside.ckpt"
    shutil.copy(newest, outside)

    (checkpoints / "latest").write_text("../../outside.ckpt")
    with pytest.raises(CheckpointError, match="not a checkpoint file name"):
        latest_checkpoint(run)

    (checkpoints / "latest").unlink()
    (checkpoints / "latest").symlink_to(tmp_path / "pointer")
    (tmp_path / "pointer").write_text(newest.name)
    with pytest.raises(CheckpointError, match="link or leads outside"):
        latest_checkpoint(run)

    (checkpoints / "latest").unlink()
    (checkpoints / "latest").write_text(newest.name)
    newest.unlink()
    newest.symlink_to(outside)
    with pytest.raises(CheckpointError, match="link or leads outside"):
        latest_checkpoint(run)

    shutil.move(checkpoints, tmp_path / "elsewhere")
    checkpoints.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="link or leads outside"):
        latest_checkpoint(run)


def test_every_flipped_bit_is_caught(finished_run):
    data = latest_checkpoint(finished_run).read_bytes()
    rng = random.Random(0)
    for _ in range(200):
        position = rng.randrange(len(data) * 8)
        flipped = bytearray(data)
        flipped[position // 8] ^= 1 << (position % 8)
        path = finished_run.parent / "flipped.ckpt"
        path.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError):
            load_checkpoint(path)
    for cut in (0, 10, len(data) // 2, len(data) - 1):  # truncated copies
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            load_checkpoint(path)


def test_state_round_trips_exactly(tmp_path):
    weights = collections.OrderedDict(w=torch.randn(3, 4), b=torch.tensor([1.5, -0.0], dtype=torch.bfloat16))
    weights._metadata = collections.OrderedDict({"": {"version": 1}})
    rollout = Rollout("g1-s0", 0, (1, 2), (3, 4), (-0.5, -0.25), 1.0, FinishReason.LENGTH, 7)
    state = {
        "step": 12,
        "evals": [{"eval/accuracy": 0.25, "step": 10.0}],
        "nan": math.nan,
        "neg_zero": -0.0,
        "big": 2**100,
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2, 2)}},
            "param_groups": [{"betas": (0.9, 0.999), "params": [0, 1]}],
        },
        "model": weights,
        "shared": [weights["w"], weights["w"][0]],
        "rng": torch.get_rng_state(),
        "np": np.arange(6, dtype=np.int16).reshape(2, 3),
        "np_scalar": np.float32(0.1),
        "pending": [CommittedGroup(4, 9, (rollout,), 8, 100)],
        "ids": {1, 2},
        "frozen": frozenset({"a"}),
        "window": collections.deque([1.0, 2.0], maxlen=5),
        "blob": b"\x00\xff",
        "tuple_keys": {(1, "a"): None},
        "__rg__": "a user key that looks like a marker",
    }
    path = tmp_path / "state.ckpt"
    path.write_bytes(dump_checkpoint(state))
    back = load_checkpoint(path)
    assert back.keys() == state.keys()
    assert isinstance(back["model"], collections.OrderedDict) and back["model"]._metadata == weights._metadata
    assert back["model"]["b"].dtype == torch.bfloat16
    assert torch.equal(back["model"]["b"].view(torch.int16), weights["b"].view(torch.int16))
    assert torch.equal(back["shared"][1], weights["w"][0]) and torch.equal(back["rng"], state["rng"])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert list(back["optimizer"]["state"]) == [0]
    assert back["pending"] == state["pending"] and back["pending"][0].rollouts[0].finish_reason is FinishReason.LENGTH
    assert back["np"].dtype == np.int16 and (back["np"] == state["np"]).all()
    assert type(back["np_scalar"]) is np.float32 and back["np_scalar"] == state["np_scalar"]
    assert math.isnan(back["nan"]) and math.copysign(1, back["neg_zero"]) == -1 and back["big"] == 2**100
    assert (back["ids"], back["frozen"], back["blob"], back["tuple_keys"]) == (
        {1, 2},
        frozenset({"a"}),
        b"\x00\xff",
        {(1, "a"): None},
    )
    assert back["window"] == state["window"] and back["window"].maxlen == 5
    assert back["__rg__"] == state["__rg__"]


def test_only_known_types_are_written():
    class Mine:
        pass

    with pytest.raises(ValueError, match="cannot hold a .*Mine"):
        encode_state({"x": Mine()})
    with pytest.raises(ValueError, match="dtype object"):
        encode_state({"x": np.array([object()])})
    tree, tensors, arrays = encode_state({"x": (1, 2)})
    assert decode_state(tree, tensors, arrays) == {"x": (1, 2)}


def test_old_checkpoints_convert_when_the_user_asks(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    state = load_checkpoint(latest_checkpoint(run))
    _plant_legacy(run, pickle.dumps(state))
    refused = cli("train", "--resume", str(run), "--no-progress")
    assert refused.returncode == 2 and "convert-checkpoint" in refused.stderr and "--trust-pickle" in refused.stderr
    converted = cli("convert-checkpoint", str(run), "--trust-pickle")
    assert converted.returncode == 0, converted.stderr
    assert (run / "checkpoints" / "latest").read_text() == "step-000003.ckpt"
    resumed = cli("train", "--resume", str(run), "--no-progress", "--set", "orchestrator.steps=5")
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(latest_checkpoint(run))["step"] == 5


def test_convert_checkpoint_says_it_runs_code_and_reads_nothing_without_trust_pickle(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    _plant_legacy(run, pickle.dumps({"step": 3, "learner": RunsCode(tmp_path / "pwned")}))
    before = tree_digest(run)
    refused = cli("convert-checkpoint", str(run))
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "unpickles step-000003.pt" in lines[0] and "runs any code" in lines[0] and "--trust-pickle" in lines[0]
    assert not (tmp_path / "pwned").exists() and tree_digest(run) == before
    cli("convert-checkpoint", str(run), "--trust-pickle")
    assert (tmp_path / "pwned").exists()  # the flag is what lets the file's code run: it did


def test_an_old_pickled_river_state_is_refused_without_running_it(tmp_path):
    cfg = RailConfig(backend="river")
    state = build_learner(cfg, seed=1).state_dict()
    blob = pickle.dumps(RunsCode(tmp_path / "pwned"))
    old = {k: v for k, v in state.items() if k != "format"}
    old.update(models=base64.b64encode(blob).decode(), sha256=hashlib.sha256(blob).hexdigest())
    with pytest.raises(ControllerStateError, match="pickle format"):
        learner_from_state(old, cfg, seed=0)
    assert not (tmp_path / "pwned").exists()
    assert learner_from_state(state, cfg, seed=0).state_dict() == state  # the data form loads
