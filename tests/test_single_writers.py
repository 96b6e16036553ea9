"""Each piece of the run's state has the writers docs/design.md names, and no others.

The check reads every module of every package (pipeline/, controller/, learner/, railgate/, at
every depth) and the gate harness with ``ast`` and finds each place that changes an
attribute of another object (``x.field = ...``, ``x.field += ...``, ``x.field.append(...)``;
``self.field`` is an object's own): a sample record's fields may change only in
``pipeline/core/samples.py``, a ``GroupRun``'s only in ``pipeline/core/group.py`` (its own methods), and
the run's ``Budget`` only in the modules listed in ``BUDGET_WRITERS``. A second writer fails
here with the module and line.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from pipeline.core.group import GroupRun
from pipeline.core.samples import Sample
from pipeline.metrics import Budget

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "controller", "learner", "railgate")
CORE = sorted(  # the tracker and its parts, the shells around them and the vocabulary they share
    p for folder in ("", "core", "shells") for p in (ROOT / "pipeline" / folder).glob("*.py")
)
HARNESS = ROOT / "tests" / "gate_harness.py"  # the tests' own shell around the tracker
MUTATORS = {"append", "extend", "pop", "popitem", "clear", "remove", "insert", "update", "setdefault", "add", "discard"}

SAMPLE_FIELDS = frozenset(Sample.__slots__)
GROUP_FIELDS = frozenset(f.name for f in dataclasses.fields(GroupRun))
BUDGET_FIELDS = frozenset(f.name for f in dataclasses.fields(Budget)) | {
    "count_rollout_end",
    "count_turn",
    "count_episode_end",
}
COMMON = frozenset(
    {"state", "request", "group", "params", "branch", "tokens", "closed", "samples"}
    | {"prompt", "launched", "failed", "aborted", "sealed"}
)
"""Field names other objects have too (an episode's ``tokens``, a switch's ``closed``, an
environment session's ``prompt``, a simulated stream's ``aborted``, a gate record's ``sealed``): a
change counts when the object is named like a group or a sample."""

BUDGET_WRITERS = {
    "pipeline/metrics.py",  # Budget's own methods
    "pipeline/core/tracker.py",  # groups, launches, episodes' ends, dropped interventions
    "pipeline/core/ledger.py",  # the stream side: tokens, aborts (a call per delta)
    "pipeline/core/steplog.py",  # what a learner step consumed, and the reward counts reward health reports
}


def _changes(tree: ast.AST):
    """(attribute name, the object's expression, line) of every change to another object's attribute."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute):
                targets = [node.func.value]  # x.field.append(...)
            elif node.func.attr.startswith("count_"):
                targets = [node.func]
        for target in targets:
            for t in ast.walk(target) if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    yield t.attr, ast.unparse(t.value), node.lineno


def _writers(paths, fields: frozenset[str], names: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Modules that change one of ``fields``; a field of ``COMMON`` only on an object whose
    expression holds one of ``names``."""
    found: dict[str, list[str]] = {}
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        for attr, base, line in _changes(ast.parse(path.read_text(encoding="utf-8"))):
            if attr in fields and (attr not in COMMON or any(n in base.lower() for n in names)):
                found.setdefault(rel, []).append(f"{rel}:{line} {base}.{attr}")
    return found


def _everywhere():
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_only_the_sample_table_changes_a_sample_record():
    writers = _writers([*_everywhere(), HARNESS], SAMPLE_FIELDS, ("sample", "run"))
    writers.pop("pipeline/core/samples.py", None)
    assert not writers, f"a sample record changed outside pipeline/core/samples.py (use Samples' methods): {writers}"


def test_only_group_py_changes_a_group_run():
    writers = _writers([*_everywhere(), HARNESS], GROUP_FIELDS, ("group", "run"))
    writers.pop("pipeline/core/group.py", None)
    assert not writers, f"a GroupRun changed outside pipeline/core/group.py (use its methods): {writers}"


def test_the_budget_has_only_its_named_writers():
    writers = {
        m: hits for m, hits in _writers([*_everywhere(), HARNESS], BUDGET_FIELDS).items() if m not in BUDGET_WRITERS
    }
    assert not writers, (
        f"the run's Budget changed in a module that is not one of its writers {sorted(BUDGET_WRITERS)}: "
        f"{writers}; count it in one of them (docs/design.md says why each one writes)"
    )


def test_no_second_count_of_running_samples():
    """What runs is counted from ``pipeline.core.samples`` only: no module of the core keeps an
    ``in_flight`` counter or a ``running`` table of its own."""
    stores = []
    for path in CORE:
        if path.name == "samples.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if node.attr in {"in_flight", "running", "queued"}:
                    stores.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not stores, f"a second count of running samples: {stores}; derive it from pipeline.core.samples.Samples"


def test_the_check_finds_a_second_writer():
    source = (
        "def f(group, budget, run):\n    group.decision_ids.append(1)\n    budget.turns += 1\n    run.streamed = 0\n"
    )
    found = sorted(_changes(ast.parse(source)))
    assert found == [("decision_ids", "group", 2), ("streamed", "run", 4), ("turns", "budget", 3)]


def test_reward_health_reports_and_the_tracker_writes_the_budget():
    """Reward health keeps its counts and reports them (``report``); the tracker books them into
    its budget, from a ``RewardsCounted`` at the run's end as from a step's ``StepDone``."""
    from controller.gates.uniform import UniformGate
    from controller.noop import NoopController
    from controller.prompts import PromptPool
    from pipeline.config.sections import OrchestratorConfig
    from pipeline.core.messages import RewardCounts, RewardsCounted
    from pipeline.core.tracker import GroupTracker
    from pipeline.tasks.rewards.health import RewardHealth
    from pipeline.types import Prompt

    pool = PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0)
    tracker = GroupTracker(UniformGate(pool, 2), NoopController(), OrchestratorConfig(batch_groups=1, group_size=2))
    health = RewardHealth("r")
    health.carry(RewardCounts(errors=3))  # a resumed run's counts, from its checkpoint
    health.failed("timeout", "slow")
    health.failed("none")
    assert not hasattr(health, "record")  # it has no way to write a budget
    tracker.handle(RewardsCounted(health.report()))
    b = tracker.budget
    assert (b.reward_errors, b.reward_timeouts, b.rewards_none) == (3, 1, 1)
    assert tracker.reward_counts() == RewardCounts(3, 1, 1)
