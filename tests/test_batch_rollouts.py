"""orchestrator.batch_rollouts: a learner step defined by rollouts generated, abandoned ones included."""

from __future__ import annotations

import anyio
import pytest

from controller.gates.uniform import UniformGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.config.build import ConfigError
from pipeline.config.sections import OrchestratorConfig
from pipeline.core.actions import INLINE, ShellSettings, Start, Stop, Train
from pipeline.core.messages import SampleDone, Started, StepDone, Tick
from pipeline.core.tracker import GroupTracker
from pipeline.types import (
    ActionKind,
    FinishReason,
    GroupAction,
    GroupPlan,
    Prompt,
    SampleFinished,
    ScoredSample,
    StepResult,
)
from railgate.config import load_config

G = 4


class ProbeGate(UniformGate):
    """Probes every prompt with 2 samples; odd prompts are abandoned there, even ones completed
    to ``G`` and committed: half of the groups cost 2 rollouts and train nothing."""

    def admit(self, group_ids, step):
        return [GroupPlan(gid, p, self.group_size, 2) for gid, p in zip(group_ids, self.pool.take(len(group_ids)))]

    def update(self, snapshot, groups):
        n = len(snapshot.rewards)
        if snapshot.prompt.prompt_id % 2 and n == 2:
            return [GroupAction(ActionKind.ABANDON, snapshot.group_id, reason="probe")]
        if n == 2:
            return [GroupAction(ActionKind.LAUNCH, snapshot.group_id, n=self.group_size - 2, reason="complete")]
        if n == self.group_size:
            return [GroupAction(ActionKind.COMMIT, snapshot.group_id, reason="full")]
        return []


class Driver:
    """Runs a tracker to its rollout budget one sample at a time (one group open at once, so
    groups close in id order), training each batch at once; records what every step trained."""

    def __init__(self, gate_cls, budget: int, state: dict | None = None, **cfg):
        pool = PromptPool([Prompt(i, "", (1,)) for i in range(64)], seed=0)
        config = OrchestratorConfig(
            group_size=G,
            steps=10**6,
            max_rollouts=budget,
            max_open_groups=1,
            max_concurrent_samples=G,
            max_async_steps=0,
            **cfg,
        )
        self.tracker = GroupTracker(gate_cls(pool, G), NoopController(), config, shell=ShellSettings(INLINE))
        if state is not None:
            self.tracker.load_state_dict(state)
        self.closes: list[tuple[int, bool, int]] = []  # (group id, committed, rollouts launched)
        self.batches: list[list[int]] = []  # group ids trained per step
        gate_closed = self.tracker.gate.on_closed

        def on_closed(closing, committed):
            self.closes.append((closing.group_id, committed, self.launched[closing.group_id]))
            gate_closed(closing, committed)

        self.tracker.gate.on_closed = on_closed
        self.launched: dict[int, int] = {}
        self._queue: list[Start] = []
        self._groups: dict = {}  # group id -> the tracker's group (read-only here)
        self._paused = self._stopped = False

    def run(self, until_steps: int | None = None) -> Driver:
        """Until the budget is spent, or (``until_steps``) the batch of that step is handed
        over: it is then left untrained, as a kill between two steps leaves it."""
        t = self.tracker
        self._until = until_steps
        self._act(t.handle(Started()))
        self._act(t.handle(Tick()))
        while self._queue and not (self._paused or self._stopped):
            start = self._queue.pop(0)
            group_id = start.request.group_id
            self.launched[group_id] = self._groups[group_id].launched
            done = SampleFinished(start.request.request_id, (7,), (0.0,), FinishReason.STOP, 0)
            [score] = t.handle(done)
            self._act(t.handle(SampleDone(ScoredSample(score.request, score.finished, reward=1.0))))
            self._act(t.handle(Tick()))
        return self

    def _act(self, actions) -> None:
        for action in actions:
            if isinstance(action, Start):
                group_id = action.request.group_id
                self._groups.setdefault(group_id, self.tracker.group(group_id))  # open now: read when popped
                self._queue.append(action)
            elif isinstance(action, Train) and not self._paused:
                if self._until is not None and len(self.batches) == self._until:
                    self._paused = True
                    continue
                self.batches.append([g.group_id for g in action.batch.groups])
                batch = action.batch
                self._act(self.tracker.handle(StepDone(batch, StepResult(batch.step + 1, {}), policy_version=1)))
            elif isinstance(action, Stop):
                self._stopped = True


def test_off_keeps_groups_per_step_and_a_probing_gate_gets_fewer_steps():
    uniform = Driver(UniformGate, budget=20 * 8 * G, batch_groups=8).run()
    probing = Driver(ProbeGate, budget=20 * 8 * G, batch_groups=8).run()
    assert len(uniform.batches) == 20 and all(len(b) == 8 for b in uniform.batches)
    assert all(len(b) == 8 for b in probing.batches)
    assert len(probing.batches) < 17  # the abandoned probes' rollouts bought no step


def test_rollout_steps_count_abandoned_rollouts_toward_their_step():
    need = 8 * G
    run = Driver(ProbeGate, budget=20 * need, batch_groups=8, batch_rollouts=need).run()
    cost = {gid: n for gid, _, n in run.closes}
    committed = [gid for gid, ok, _ in run.closes if ok]
    abandoned = {gid for gid, ok, _ in run.closes if not ok}
    assert abandoned and committed
    # Step k: the groups committed since step k-1, the rollouts of every group abandoned in
    # between counted; it ends at the first commit that brings the run's rollouts to (k+1)*need.
    closed_order = [gid for gid, _, _ in run.closes]
    spent_through = {}
    total = 0
    for gid in closed_order:
        total += cost[gid]
        spent_through[gid] = total
    start = 0
    for k, groups in enumerate(run.batches):
        end = closed_order.index(groups[-1]) + 1
        assert [g for g in closed_order[start:end] if g not in abandoned] == groups
        assert spent_through[groups[-1]] >= (k + 1) * need
        if len(groups) > 1:
            assert spent_through[groups[-2]] < (k + 1) * need
        start = end
    assert all(len(b) < 8 for b in run.batches)  # fewer groups than batch_groups: probes paid for steps


def test_every_gate_takes_the_same_steps_for_the_same_budget():
    need, budget = 8 * G, 20 * 8 * G
    uniform = Driver(UniformGate, budget=budget, batch_groups=8, batch_rollouts=need).run()
    probing = Driver(ProbeGate, budget=budget, batch_groups=8, batch_rollouts=need).run()
    assert len(uniform.batches) == 20 and all(len(b) == 8 for b in uniform.batches)  # = batch_groups=8 for GRPO
    assert len(probing.batches) in (19, 20)  # only the last step's remainder can be lost


def test_checkpoint_keeps_the_rollouts_spent_toward_the_next_step():
    need, budget = 6 * G, 200
    whole = Driver(ProbeGate, budget=budget, batch_groups=8, batch_rollouts=need).run()
    first = Driver(ProbeGate, budget=budget, batch_groups=8, batch_rollouts=need).run(until_steps=3)
    state = first.tracker.state_dict()
    untrained = sum(len(groups) for groups in state["untrained_batches"])
    assert untrained and len(state["pending_cost"]) == untrained + len(state["pending"])
    assert sum(state["pending_cost"]) + state["loose_cost"] > 0  # something is carried
    # The run stopped with step 3's batch handed to the learner and not trained: a resumed
    # tracker cuts the same batch from the carried groups, their costs and the overshoot of steps 0-2.
    resumed = Driver(ProbeGate, budget=budget, state=state, batch_groups=8, batch_rollouts=need)
    [train] = [a for a in resumed.tracker.handle(Tick()) if isinstance(a, Train)]
    assert [g.group_id for g in train.batch.groups] == whole.batches[3]


@pytest.mark.parametrize(
    "value, message",
    [
        ("5", "must be 0 (off: batch_groups groups per step) or at least group_size=8"),
        ("-8", "must be 0 (off"),
    ],
)
def test_batch_rollouts_values_are_checked_at_load(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [f"orchestrator.batch_rollouts={value}", "gate.kind=sara"])


@pytest.mark.parametrize("kind", ["ds", "pilot_commit", "hora", "oracle"])
def test_gates_with_a_step_quota_are_refused(kind):
    with pytest.raises(ConfigError, match=f"needs a gate that commits group by group .*not gate.kind='{kind}'"):
        load_config(None, ["orchestrator.batch_rollouts=512", f"gate.kind={kind}"])


def test_a_sara_run_on_the_sim_takes_uniforms_steps():
    from railgate.build import build_components, build_orchestrator

    def steps(kind: str, batch_rollouts: int) -> int:
        cfg = load_config(
            "configs/sim.yaml",
            [
                f"gate.kind={kind}",
                "orchestrator.batch_groups=8",
                "orchestrator.steps=1000",
                f"orchestrator.batch_rollouts={batch_rollouts}",
                "orchestrator.max_rollouts=1280",
                "orchestrator.eval_every=0",
                "log.trace=false",
                "log.buffer=false",
                "log.tensorboard=false",
                "log.progress=false",
                "log.checkpoint_every=0",
                "run_dir=/nonexistent-unused",
            ],
        )
        comps = build_components(cfg, progress=False)
        orch = build_orchestrator(cfg, comps, run_id=kind)
        try:
            return anyio.run(orch.run).steps
        finally:
            anyio.run(comps.engine.aclose)

    g = load_config("configs/sim.yaml", []).orchestrator.group_size
    per_step = 8 * g
    assert steps("uniform", per_step) == steps("uniform", 0) == 1280 // per_step
    assert steps("sara", 0) < 1280 // per_step - 1  # probes cost steps when a step is groups
    assert steps("sara", per_step) >= 1280 // per_step - 1  # not when it is rollouts


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["gate.kind=sara"], 512),
        (["gate.kind=sara", "orchestrator.batch_groups=4", "orchestrator.group_size=6"], 24),
        (["gate.kind=uniform", "orchestrator.batch_groups=4"], 32),
        (["gate.kind=hora"], 0),
        (["gate.kind=ds"], 0),
        (["gate.kind=pilot_commit"], 0),
        (["gate.kind=oracle"], 0),
    ],
)
def test_auto_follows_the_batch_size_and_the_gate(sets, expected):
    assert load_config(None, ["orchestrator.batch_rollouts=auto", *sets]).orchestrator.batch_rollouts == expected


def test_the_cpu_default_keeps_its_step_under_overrides():
    """The default says ``auto``: a smaller batch gets a smaller step, and a quota gate still loads."""
    assert load_config("configs/default.yaml").orchestrator.batch_rollouts == 256
    assert load_config("configs/default.yaml", ["orchestrator.batch_groups=4"]).orchestrator.batch_rollouts == 32
    assert load_config("configs/default.yaml", ["gate.kind=pilot_commit"]).orchestrator.batch_rollouts == 0


def test_a_word_other_than_auto_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"batch_rollouts='half' must be an integer .* or 'auto'"):
        load_config(None, ["orchestrator.batch_rollouts=half"])


def test_bench_policies_define_their_own_step_on_an_auto_base():
    """On the CPU default (``auto``), the bench's ``sara`` is plain SARA and ``sara_rollouts`` the
    rollout-defined step; a ``--set`` still wins."""
    from railgate.bench.allocation import RunSpec

    def step(policy: str, extra: tuple[str, ...] = ()) -> int:
        return (
            RunSpec("configs/default.yaml", "", "", policy, 0, 1024, extra=extra).config().orchestrator.batch_rollouts
        )

    assert step("sara") == 0 and step("uniform") == 0
    assert step("sara_rollouts") == 256
    assert step("sara_rollouts", ("orchestrator.batch_groups=8",)) == 64
    assert step("sara_dps") == 0 and step("sara_dps_rollouts") == 256
    assert step("sara", ("orchestrator.batch_rollouts=128",)) == 128
