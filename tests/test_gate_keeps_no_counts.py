"""A gate keeps no count of a group's samples of its own: it reads them from the tracker's
record, handed over as snapshots (the reported group's at ``update``, every open group's at
``update`` and ``on_step``: ``pipeline.protocols.OpenGroups``; the closing one at ``on_closed``).

Three checks: no gate's record has a field named after a snapshot's counts; under the real
tracker, a gate's record of a group changes only on a call that decides on that group (a copy
of counts, refreshed at every snapshot, changes on calls that decide nothing); and the two
gates that decide on groups other than the one reported (HORA's batch allocation,
Pilot-Commit's buffered commits) follow the open groups' snapshots as they stand, not the ones
they saw before.
"""

from __future__ import annotations

import dataclasses

import pytest
from gate_harness import GateHarness, HarnessConfig
from gate_units import admit, kinds, on_step, pool_of, snap, update
from test_gate_conformance import make_gate, probabilities

from controller.allocation import hora_allocate
from controller.config import HoraConfig
from controller.gates.base import BaseGate
from controller.gates.hora import HoraGate
from controller.gates.pilot_commit import PilotCommitGate
from controller.gates.registry import GATE_KINDS
from pipeline.types import ActionKind, GroupSnapshot, TrainBatch

# What a snapshot counts of a group: its fields and properties, but for the group's identity.
SNAPSHOT_COUNTS = {f.name for f in dataclasses.fields(GroupSnapshot)} | {
    name for name, member in vars(GroupSnapshot).items() if isinstance(member, property)
}
SNAPSHOT_COUNTS -= {"group_id", "prompt", "target_size", "policy_version"}


def test_the_snapshot_counts_are_what_this_file_thinks():
    assert {"rewards", "in_flight", "launched", "failed", "finished", "successes", "verdict_counts"} <= SNAPSHOT_COUNTS


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_no_record_field_is_a_snapshot_count(kind):
    gate = make_gate(kind, probabilities(20), batch_groups=4)
    if not isinstance(gate, BaseGate):  # uniform: no records; the COMMITs it proposed, nothing counted
        assert kind == "uniform"
        return
    fields = {f.name for f in dataclasses.fields(gate.Record)}
    assert not fields & SNAPSHOT_COUNTS, f"{type(gate).__name__}'s record copies {fields & SNAPSHOT_COUNTS}"


def records(gate) -> dict[int, dict]:
    """The gate's per-group records, as its checkpoint holds them (all its per-group state)."""
    return {int(g): r for g, r in gate.state_dict().get("groups", {}).items()}


@pytest.mark.parametrize("kind", GATE_KINDS)
@pytest.mark.parametrize("setting", ["default", "failures", "batch_of_one"])
def test_a_record_changes_only_with_a_decision_on_its_group(kind, setting):
    """Under the real tracker, every ``update`` and ``on_step`` that changes a group's record
    returns an action on that group: the record holds the gate's decisions, and no count the
    snapshots carry (which would change with every ended sample, decided on or not)."""
    configs = {
        "default": HarnessConfig(batch_groups=4, steps=4),
        "failures": HarnessConfig(batch_groups=4, steps=4, fail_prob=0.15),
        "batch_of_one": HarnessConfig(batch_groups=1, steps=6),
    }
    gate = make_gate(kind, probabilities(60), batch_groups=configs[setting].batch_groups)
    calls, silent_changes = 0, []

    def watched(method):
        def call(*args):
            nonlocal calls
            before = records(gate)
            actions = method(*args)
            after, decided = records(gate), {a.group_id for a in actions}
            calls += 1
            silent_changes.extend(
                (method.__name__, g, before[g], after[g])
                for g in before.keys() & after.keys()
                if before[g] != after[g] and g not in decided
            )
            return actions

        return call

    gate.update = watched(gate.update)
    gate.on_step = watched(gate.on_step)
    harness = GateHarness(gate, probabilities(60), configs[setting]).run()
    assert harness.steps_done == configs[setting].steps and calls > configs[setting].steps  # updates too
    assert not silent_changes, f"records changed with no decision on their group: {silent_changes[:3]}"


def test_hora_allocates_on_the_probes_as_they_stand():
    """A waiting group grew after the gate last saw it (a controller's samples ended, say): the
    batch's allocation reads its 4 of 8 from the open groups, not the 0 of 4 it was handed."""
    gate = HoraGate(pool_of(10), group_size=12, batch_groups=2, config=HoraConfig(probe_size=4))
    a, b = admit(gate, 2)
    assert kinds(update(gate, snap(a.group_id, a.prompt, (0, 0, 0, 0)))) == [("hold", a.group_id, 0)]
    grown = snap(a.group_id, a.prompt, (0, 0, 0, 0, 1, 1, 1, 1))
    last = snap(b.group_id, b.prompt, (1, 0, 0, 0))
    actions = gate.update(last, {a.group_id: grown, b.group_id: last})
    now = hora_allocate([4, 1], [8, 4], gate.extra_budget, prior=gate.prior)
    then = hora_allocate([0, 1], [4, 4], gate.extra_budget, prior=gate.prior)
    assert gate.extra_budget == 16 and now != then
    assert [x.n for x in actions if x.kind is ActionKind.LAUNCH] == [m for m in now if m > 0]


def test_pilot_commit_tops_a_buffered_pilot_up_from_its_snapshot_now():
    """A kept pilot of 4 waits in the buffer; by the next step it holds 6 rollouts (a controller
    added two): its commit launches the 2 the group still lacks, read from the open groups."""
    gate = PilotCommitGate(pool_of(10), group_size=8, batch_groups=1)
    plans = admit(gate, 3)
    first, second = plans[0], plans[1]
    assert kinds(update(gate, snap(first.group_id, first.prompt, (1, 0, 1, 0))))[-1] == ("commit", first.group_id, 0)
    assert kinds(update(gate, snap(second.group_id, second.prompt, (1, 0, 1, 0)))) == [("hold", second.group_id, 0)]
    grown = snap(second.group_id, second.prompt, (1, 0, 1, 0, 1, 1))
    actions = gate.on_step(0, TrainBatch(0, ()), {second.group_id: grown})
    assert kinds(actions) == [("launch", second.group_id, 2), ("commit", second.group_id, 0)]
    # handed the snapshot it saw, it launches the 4 of a pilot of 4
    again = PilotCommitGate(pool_of(10), group_size=8, batch_groups=1)
    first, second = admit(again, 3)[:2]
    update(again, snap(first.group_id, first.prompt, (1, 0, 1, 0)))
    update(again, snap(second.group_id, second.prompt, (1, 0, 1, 0)))
    assert kinds(on_step(again, 0, TrainBatch(0, ()))) == [
        ("launch", second.group_id, 4),
        ("commit", second.group_id, 0),
    ]
