"""One rule in every shell around the group tracker: an action it does not carry out is refused
with a ``TypeError`` naming the action's type (``pipeline.actions.cannot_carry_out``), never
dropped in silence."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import anyio
import pytest

from controller.gates.uniform import UniformGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.actions import Evaluate
from pipeline.config.sections import OrchestratorConfig
from pipeline.rounds import RoundDriver
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
