"""SARA's streaming launch mode: probe-first's spending, commits as soon as a group is mixed."""

from __future__ import annotations

from gate_harness import GateHarness, HarnessConfig
from gate_units import update
from test_gate_conformance import probabilities

from controller.config import GateConfig, SaraConfig
from controller.gates.registry import build_gate
from controller.gates.sara import SaraGate
from controller.prompts import PromptPool
from pipeline.types import ActionKind, GroupSnapshot, Prompt

PROMPT = Prompt(0, "", (1,))


def snap(rewards, in_flight):
    return GroupSnapshot(
        3,
        PROMPT,
        8,
        tuple(rewards),
        in_flight=in_flight,
        launched=len(rewards) + in_flight,
        failed=0,
        tokens=10,
        policy_version=0,
    )


def gate():
    g = SaraGate(PromptPool([PROMPT], seed=0), group_size=8, config=SaraConfig(probe_size=4, launch="streaming"))
    g.admit(range(3, 4), 0)  # the gate only judges groups it opened: group 3
    return g


def test_commits_a_mixed_group_before_its_probe_is_in():
    actions = update(gate(), snap([1.0, 0.0], in_flight=2))
    assert [(a.kind, a.n) for a in actions] == [(ActionKind.LAUNCH, 4), (ActionKind.COMMIT, 0)]


def test_waits_for_the_probe_while_the_group_is_all_same():
    assert update(gate(), snap([0.0, 0.0, 0.0], in_flight=1)) == []


def test_abandons_after_an_all_same_probe_like_probe_first():
    g = gate()
    assert [a.kind for a in update(g, snap([0.0] * 4, in_flight=0))] == [ActionKind.ABANDON]


def test_lifecycle_in_the_harness():
    p = probabilities(300)
    pool = PromptPool([Prompt(i, f"p{i}", (i,)) for i in sorted(p)], seed=1)
    g = build_gate(GateConfig(kind="sara", sara=SaraConfig(launch="streaming")), pool, 8, 8, seed=0)
    harness = GateHarness(g, p, HarnessConfig(batch_groups=8, steps=6)).run()
    assert harness.stop_reason == "steps" and harness.steps_done == 6
    harness.check_invariants()
    assert harness.gate.metrics()["gate/commit_early"] > 0
