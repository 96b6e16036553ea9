"""Build a run's components from its ``RunConfig``: engine, clock, gate, controller, reward,
learner and evaluator. The only module that chooses concrete classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.gates.registry import build_gate
from controller.noop import NoopController
from controller.prompts import PromptPool
from learner.sim import SimLearner
from pipeline.clock import VirtualClock, WallClock
from pipeline.configuration import ConfigError
from pipeline.engines.sim import SimEngine
from pipeline.protocols import Controller, Evaluator, Gate, Learner, Scorer
from pipeline.seeding import derive_seed
from pipeline.simworld import SimAnswerScorer, SimEvaluator, SimWorld
from railgate.config import RunConfig


@dataclass
class Components:
    """Everything the orchestrator is given, plus what reports need (``world`` for the sim)."""

    engine: Any
    clock: VirtualClock | WallClock
    gate: Gate
    controller: Controller
    scorer: Scorer
    learner: Learner
    evaluator: Evaluator
    pool: PromptPool
    world: SimWorld | None = None


def build_components(cfg: RunConfig) -> Components:
    if cfg.engine.kind == "sim":
        return _build_sim(cfg)
    raise ConfigError(
        f"engine.kind={cfg.engine.kind!r} is not wired into run.py yet; use engine.kind=sim "
        "(the torch, vllm and ray engines land with their issues)"
    )


def _build_sim(cfg: RunConfig) -> Components:
    world = SimWorld(cfg.sim)
    clock: VirtualClock | WallClock = WallClock() if cfg.sim.realtime else VirtualClock()
    engine = SimEngine(world, clock=clock, fail_every=cfg.engine.fail_every)
    pool = PromptPool([engine.prompt(i) for i in range(cfg.sim.num_prompts)], seed=derive_seed(cfg.seed, "prompts"))
    gate = build_gate(
        cfg.gate,
        pool,
        group_size=cfg.orchestrator.group_size,
        batch_groups=cfg.orchestrator.batch_groups,
        seed=derive_seed(cfg.seed, "gate"),
        success_probability=lambda prompt_id: world.success_probability(engine.state, prompt_id),
    )
    return Components(
        engine=engine,
        clock=clock,
        gate=gate,
        controller=NoopController(),
        scorer=SimAnswerScorer(),
        learner=SimLearner(world, cfg.orchestrator.group_size, seed=derive_seed(cfg.seed, "learner")),
        evaluator=SimEvaluator(world, engine),
        pool=pool,
        world=world,
    )
