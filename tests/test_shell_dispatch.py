"""Every shell around the group tracker carries actions out through a handler table declared once
(``pipeline.shells.handlers``) that names every action type the tracker can emit, with a handler, a
``Skip`` or a named refusal; an action it does not carry out is refused with a ``TypeError``
naming the action's type (``pipeline.core.actions.cannot_carry_out``), never dropped in silence."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import anyio
import pytest

from controller.gates.uniform import UniformGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.config.sections import OrchestratorConfig
from pipeline.core.actions import ACTION_TYPES, Evaluate, Post, Record
from pipeline.shells.handlers import HandlerTable, Refuse, Skip
from pipeline.shells.rounds import RoundDriver
from pipeline.types import Prompt


class Unheard(NamedTuple):
    """An action no shell knows."""

    what: str


def test_the_round_driver_refuses_an_action_it_does_not_carry_out():
    pool = PromptPool([Prompt(i, "", (1,)) for i in range(4)], seed=0)
    driver = RoundDriver(
        UniformGate(pool, 2), NoopController(), OrchestratorConfig(batch_groups=1, group_size=2, max_async_steps=0)
    )
    with pytest.raises(
        TypeError, match=r"the round driver cannot carry out the action Evaluate \(Evaluate\(step=3\)\)"
    ):
        driver._do([Evaluate(3)])


def test_the_tracking_loop_refuses_an_action_it_does_not_carry_out(tmp_path, monkeypatch):
    from railgate.build import build_components, build_orchestrator
    from railgate.config import load_config

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    cfg = load_config(Path("configs/sim.yaml"), ["sim.num_prompts=16", "sim.num_eval_prompts=4", f"run_dir={tmp_path}"])
    orchestrator = build_orchestrator(cfg, build_components(cfg, progress=False))
    with pytest.raises(
        TypeError, match=r"the tracking loop cannot carry out the action Unheard \(Unheard\(what='x'\)\)"
    ):
        anyio.run(orchestrator._act, [Unheard("x")])


# --- every shell's handler table names every action --------------------------------------


def _shell_tables():
    """Every handler table of every shell around the tracker, by name."""
    from gate_harness import GateHarness

    from pipeline.shells.orchestrator import Orchestrator
    from railgate.replay.driver import _Replay

    return {
        "orchestrator (tracking loop)": Orchestrator._TRACKING,
        "orchestrator (sample task)": Orchestrator._SAMPLE_TASK,
        "orchestrator (stream task)": Orchestrator._STREAM_TASK,
        "round driver": RoundDriver.HANDLERS,
        "bench replay's driver": _Replay.HANDLERS,
        "gate harness": GateHarness.HANDLERS,
    }


def test_the_action_types_are_every_action_the_actions_module_declares():
    import pipeline.core.actions as actions

    declared = {
        value
        for value in vars(actions).values()
        if isinstance(value, type) and issubclass(value, tuple) and value.__module__ == actions.__name__
    }
    assert declared == set(ACTION_TYPES)


@pytest.mark.parametrize("shell", sorted(_shell_tables()))
def test_every_shell_names_a_handler_or_a_named_refusal_for_every_action(shell):
    table = _shell_tables()[shell]
    assert set(table.declared) == set(ACTION_TYPES)
    for kind, entry in table.declared.items():
        if isinstance(entry, (Refuse, Skip)):
            assert entry.why, f"{shell}: the {type(entry).__name__} of {kind.__name__} names no reason"
        else:
            assert callable(entry), f"{shell}: the handler of {kind.__name__} is {entry!r}"


def test_every_action_is_carried_out_somewhere_in_the_async_shell():
    tables = [t for name, t in _shell_tables().items() if name.startswith("orchestrator")]
    for kind in ACTION_TYPES:
        assert any(not isinstance(t.declared[kind], Refuse) for t in tables), kind.__name__


def test_a_refusal_names_the_shell_the_action_and_why():
    table = _shell_tables()["bench replay's driver"]
    with pytest.raises(TypeError, match=r"bench replay's driver cannot carry out the action Post .*: a gate whose"):
        table[Post](object(), Post("a message"))
    assert table[Record](object(), Record(1, {})) is None  # a Skip does nothing


def test_a_table_that_leaves_out_an_action_or_names_a_stranger_is_refused_where_declared():
    entries = {kind: Skip("x") for kind in ACTION_TYPES}
    HandlerTable("a shell", entries)
    with pytest.raises(TypeError, match=r"a shell's handler table names no handler, Skip or Refuse for Evaluate"):
        HandlerTable("a shell", {k: v for k, v in entries.items() if k is not Evaluate})
    with pytest.raises(TypeError, match=r"names Unheard, which the tracker never emits"):
        HandlerTable("a shell", {**entries, Unheard: Skip("x")})


def test_a_score_is_answered_one_way_in_every_shell():
    """Every shell answers a ``Score`` through ``Score.answer``: none builds a ``SampleDone`` itself."""
    root = Path(__file__).resolve().parents[1]
    shells = [
        "pipeline/shells/orchestrator.py",
        "pipeline/shells/rounds.py",
        "railgate/replay/driver.py",
        "tests/gate_harness.py",
    ]
    for path in shells:
        text = (root / path).read_text(encoding="utf-8")
        assert "SampleDone(" not in text and ".answer(" in text, path
