"""One suite, every gate kind: the group lifecycle of pipeline/protocols.py, run by the real
GroupTracker (pipeline/core/tracker.py) on synthetic rewards (tests/gate_harness.py)."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap

import numpy as np
import pytest
from gate_harness import GateHarness, HarnessConfig, ProtocolViolation
from gate_units import checkpoint_roundtrip

from controller.config import GateConfig
from controller.gates.registry import GATE_KINDS, build_gate
from controller.prompts import PromptPool
from pipeline.protocols import Gate
from pipeline.types import GroupSnapshot, Prompt, TrainBatch


def probabilities(n: int, seed: int = 0) -> dict[int, float]:
    """A wide spread of difficulties: many prompts near 0 or 1, some in between."""
    rng = np.random.default_rng(seed)
    p = rng.beta(0.5, 0.5, size=n)
    p[: n // 10] = 0.0  # some prompts are never solved
    return {i: float(x) for i, x in enumerate(p)}


def make_gate(kind: str, p: dict[int, float], batch_groups: int, group_size: int = 8, seed: int = 0) -> Gate:
    pool = PromptPool([Prompt(i, f"p{i}", (i,)) for i in sorted(p)], seed=seed + 1)
    return build_gate(
        GateConfig(kind=kind), pool, group_size, batch_groups, seed=seed, success_probability=p.__getitem__
    )


SETTINGS = {
    "default": HarnessConfig(batch_groups=8, steps=8),
    "sync": HarnessConfig(batch_groups=8, steps=6, max_async_steps=0),
    "run_ahead": HarnessConfig(batch_groups=4, steps=8, max_async_steps=3, learner_time=3.0),
    "failures": HarnessConfig(batch_groups=8, steps=6, fail_prob=0.15),
    "tight": HarnessConfig(batch_groups=8, steps=6, max_open_groups=12, max_concurrent_samples=96),
    "batch_of_one": HarnessConfig(batch_groups=1, steps=10),
    # a RAIL-like controller replaces ABANDONs by interventions and extends committed groups
    "intervening": HarnessConfig(batch_groups=8, steps=8, override_abandon=0.5, extend_commit=0.2),
}


def protocol_stubs(protocol: type) -> list[str]:
    """The members of ``protocol`` with no default: methods whose body is only ``...``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(protocol)))
    stubs = []
    for node in tree.body[0].body:
        if isinstance(node, ast.FunctionDef):
            body = [
                s
                for s in node.body
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
            ]
            if not body or all(isinstance(s, ast.Expr) and s.value.value is Ellipsis for s in body):
                stubs.append(node.name)
    return stubs


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_is_a_gate(kind):
    """Every gate subclasses the ``Gate`` Protocol, so ``isinstance`` would hold even for one that
    forgot a method: it would silently inherit the Protocol's stub, which returns None. Each
    member without a default is the gate's own, and ``admit`` keeps the protocol's numbering."""
    gate = make_gate(kind, probabilities(20), batch_groups=4)
    required = protocol_stubs(Gate)
    assert {"admit", "update", "on_closed", "on_step", "state_dict", "load_state_dict"} <= set(required)
    inherited = [name for name in required if getattr(type(gate), name) is getattr(Gate, name)]
    assert not inherited, f"{type(gate).__name__} leaves {inherited} to the Protocol's stubs"
    plans = gate.admit(range(5, 8), step=0)
    assert 1 <= len(plans) <= 3 and [p.group_id for p in plans] == list(range(5, 5 + len(plans)))
    assert isinstance(gate.on_step(0, TrainBatch(step=0, groups=()), {}), list)  # the stub would return None


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_declares_its_capabilities_as_class_attributes(kind):
    """``abandons`` is a class attribute (the Protocol's True unless the gate's class says
    otherwise), read as ``gate.abandons`` by the tracker and forwarded by wrappers."""
    gate = make_gate(kind, probabilities(20), batch_groups=4)
    assert isinstance(type(gate).abandons, bool) and gate.abandons is type(gate).abandons
    assert gate.abandons is (kind not in ("uniform", "dps"))


FAST = ("default", "failures", "intervening")


def settings(names):
    """Settings outside FAST run with the slow marker (CI runs them)."""
    return [name if name in FAST else pytest.param(name, marks=pytest.mark.slow) for name in names]


@pytest.mark.parametrize("setting", settings(sorted(SETTINGS)))
@pytest.mark.parametrize("kind", GATE_KINDS)
def test_lifecycle_and_counts(kind, setting):
    cfg = SETTINGS[setting]
    p = probabilities(300)
    gate = make_gate(kind, p, cfg.batch_groups)
    harness = GateHarness(gate, p, cfg).run()
    assert harness.stop_reason == "steps", (harness.stop_reason, harness.stats)
    assert harness.steps_done == cfg.steps
    harness.check_invariants()
    opened = sum(1 for entry in harness.log if entry[0] == "plan")
    assert opened == harness.stats["opened"] > 0


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_tiny_pool_smaller_than_a_batch(kind):
    p = {0: 0.5, 1: 0.3, 2: 0.7}
    harness = GateHarness(make_gate(kind, p, batch_groups=4), p, HarnessConfig(batch_groups=4, steps=4)).run()
    assert harness.stop_reason == "steps", (harness.stop_reason, harness.stats)
    harness.check_invariants()


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_adaptive_gates_train_only_on_effective_groups(kind):
    p = probabilities(300)
    harness = GateHarness(make_gate(kind, p, 8), p, HarnessConfig(batch_groups=8, steps=8)).run()
    trained = [g for batch in harness.batch_log for g in batch.groups]
    effective = sum(g.is_effective for g in trained) / len(trained)
    if kind in ("ds", "pilot_commit", "sara", "sara_dps"):
        assert effective == 1.0
    else:  # uniform, hora, dps and oracle train on whatever the groups turned out to be
        assert 0.0 < effective <= 1.0


@pytest.mark.parametrize("setting", settings(["default", "failures", "run_ahead", "intervening"]))
@pytest.mark.parametrize("kind", GATE_KINDS)
def test_checkpoint_restore_is_exact(kind, setting):
    cfg = SETTINGS[setting]
    p = probabilities(300)
    gate = make_gate(kind, p, cfg.batch_groups)
    harness = GateHarness(gate, p, cfg).run(max_events=200)
    assert harness.stop_reason == ""  # stopped mid-run, with groups open
    assert harness.groups
    restored = checkpoint_roundtrip(gate, lambda: make_gate(kind, p, cfg.batch_groups))
    twin = harness.clone_with(restored)
    cut = len(harness.log)
    harness.run()
    twin.run()
    assert len(harness.log) > cut
    assert twin.log == harness.log
    assert twin.stats == harness.stats
    assert json.dumps(restored.state_dict(), sort_keys=True) == json.dumps(gate.state_dict(), sort_keys=True)


@pytest.mark.parametrize("setting", settings(["default", "failures", "run_ahead"]))
@pytest.mark.parametrize("kind", GATE_KINDS)
def test_resume_at_a_step_boundary_drops_open_groups_cleanly(kind, setting):
    """train --resume: the gate is restored, every group open at the checkpoint is closed
    uncommitted (even ones the gate never heard from), and the run still completes."""
    cfg = SETTINGS[setting]
    p = probabilities(300)
    gate = make_gate(kind, p, cfg.batch_groups)
    harness = GateHarness(gate, p, cfg).run(until_step=3)
    assert harness.steps_done == 3
    restored = checkpoint_roundtrip(gate, lambda: make_gate(kind, p, cfg.batch_groups))
    resumed = harness.resumed_with(restored).run()
    assert resumed.stop_reason == "steps", (resumed.stop_reason, resumed.stats)
    assert resumed.stats["lost"] == len(harness.groups)
    resumed.check_invariants()


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_restoring_nothing_diverges(kind):
    """Control for the test above: a gate that did not load the checkpoint does not match."""
    cfg = SETTINGS["default"]
    p = probabilities(300)
    gate = make_gate(kind, p, cfg.batch_groups)
    harness = GateHarness(gate, p, cfg).run(max_events=200)
    twin = harness.clone_with(make_gate(kind, p, cfg.batch_groups))
    harness.run()
    try:
        twin.run()
    except (ValueError, KeyError, ProtocolViolation):
        return  # the fresh gate does not know the open groups
    assert twin.log != harness.log


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_same_seed_same_run(kind):
    p = probabilities(200)
    logs = []
    for _ in range(2):
        h = GateHarness(make_gate(kind, p, 4), p, HarnessConfig(batch_groups=4, steps=5, seed=7)).run()
        logs.append(h.log)
    assert logs[0] == logs[1]


@pytest.mark.parametrize("kind", [k for k in GATE_KINDS if k != "uniform"])
def test_update_for_a_group_it_never_opened_is_an_error(kind):
    p = probabilities(20)
    gate = make_gate(kind, p, 4)
    stranger = GroupSnapshot(
        99, Prompt(5, "p5", (5,)), 8, (1.0,), in_flight=0, launched=1, failed=0, tokens=1, policy_version=0
    )
    with pytest.raises(ValueError, match="never opened"):
        gate.update(stranger, {99: stranger})


@pytest.mark.parametrize("kind", [k for k in GATE_KINDS if k != "uniform"])
def test_metrics_are_namespaced(kind):
    p = probabilities(100)
    gate = make_gate(kind, p, 4)
    GateHarness(gate, p, HarnessConfig(batch_groups=4, steps=3)).run()
    metrics = gate.metrics()
    assert metrics and all(k.startswith("gate/") for k in metrics)
