"""Build the gate a ``GateConfig`` names.

Seeds: a gate's random sources derive from the run seed here, in one place
(``pipeline.seeding.derive_seed(seed, "gate", kind, ...)``); the prompt pool keeps its own.

>>> from pipeline.types import Prompt
>>> from controller.config import GateConfig, SaraConfig
>>> from controller.prompts import PromptPool
>>> pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
>>> type(build_gate(GateConfig(kind="sara_dps"), pool, group_size=8, batch_groups=4, seed=0)).__name__
'SaraGate'
>>> build_gate(GateConfig(kind="sara", sara=SaraConfig(probe_size=10)), pool, group_size=8, batch_groups=4, seed=0)
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: gate.sara.probe_size=10 is above orchestrator.group_size=8; lower gate.sara.probe_size or raise orchestrator.group_size
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import get_args

from controller.config import DpsConfig, GateConfig, GateKind
from controller.gates.dps import DpsGate
from controller.gates.dynamic_sampling import DynamicSamplingGate
from controller.gates.hora import HoraGate
from controller.gates.oracle import OracleGate
from controller.gates.pilot_commit import PilotCommitGate
from controller.gates.sara import SaraGate
from controller.gates.uniform import UniformGate
from controller.prompts import PromptPool
from controller.selectors.dps import DpsSelector
from pipeline.config.build import ConfigError
from pipeline.protocols import Gate
from pipeline.seeding import derive_seed

__all__ = ["GATE_KINDS", "build_gate", "build_dps_selector"]

GATE_KINDS: tuple[str, ...] = get_args(GateKind)
"""Every ``gate.kind``, in the order ``controller.config.GateKind`` (their one list) names them."""


def build_dps_selector(config: DpsConfig, pool: PromptPool, seed: int) -> DpsSelector:
    """The DPS selector of ``config`` over ``pool``, seeded from the run seed."""
    return DpsSelector(pool, seed=derive_seed(seed, "gate", "dps"), **asdict(config))


def build_gate(
    config: GateConfig,
    pool: PromptPool,
    group_size: int,
    batch_groups: int,
    seed: int,
    success_probability: Callable[[int], float] | None = None,
) -> Gate:
    """The gate ``config.kind`` over ``pool``.

    ``success_probability(prompt_id)`` (the simulator's exact p) is used by ``oracle`` only;
    without it the oracle runs in hindsight mode (``controller.gates.oracle``).
    Configuration mistakes raise ``ConfigError`` naming the key.
    """
    config.check_sizes(group_size, batch_groups)
    kind = config.kind
    try:
        if kind == "uniform":
            return UniformGate(pool, group_size)
        if kind == "ds":
            return DynamicSamplingGate(pool, group_size, batch_groups, config.ds)
        if kind == "pilot_commit":
            return PilotCommitGate(pool, group_size, batch_groups, config.pilot_commit)
        if kind == "hora":
            return HoraGate(pool, group_size, batch_groups, config.hora)
        if kind == "sara":
            return SaraGate(pool, group_size, config.sara)
        if kind == "dps":
            return DpsGate(build_dps_selector(config.dps, pool, seed), group_size)
        if kind == "sara_dps":
            return SaraGate(build_dps_selector(config.dps, pool, seed), group_size, config.sara)
        if kind == "oracle":
            return OracleGate(pool, group_size, success_probability, seed=derive_seed(seed, "gate", "oracle"))
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"gate.{kind}: {exc}") from exc
    raise ConfigError(f"gate.kind={kind!r} is not one of {', '.join(GATE_KINDS)}")
