"""controller.config (GateConfig) and controller.gates.registry.build_gate."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest
from gate_units import pool_of

import controller.config as config_module
from controller.config import GateConfig
from controller.gates.registry import GATE_KINDS, build_gate
from pipeline.config.build import ConfigError, apply_overrides, build
from pipeline.config.sections import OrchestratorConfig

EXPECTED = {
    "uniform": "UniformGate",
    "ds": "DynamicSamplingGate",
    "pilot_commit": "PilotCommitGate",
    "hora": "HoraGate",
    "sara": "SaraGate",
    "dps": "DpsGate",
    "sara_dps": "SaraGate",
    "oracle": "OracleGate",
}


def make(data, group_size=8, batch_groups=4, sp=lambda i: 0.5):
    return build_gate(build(GateConfig, data), pool_of(10), group_size, batch_groups, seed=0, success_probability=sp)


@pytest.mark.parametrize("kind", GATE_KINDS)
def test_every_kind_builds_with_defaults(kind):
    assert type(make({"kind": kind})).__name__ == EXPECTED[kind]


def test_settings_reach_the_gate():
    data = apply_overrides({"kind": "sara"}, ["sara.tau_abandon=0.3", "sara.launch=eager", "sara.prior=[2, 3]"])
    gate = make(data)
    assert (gate.config.tau_abandon, gate.config.launch, gate.prior) == (0.3, "eager", (2.0, 3.0))
    assert make({"kind": "ds", "ds": {"keep_surplus": True, "oversample": 2}}).round_size == 8
    assert make({"kind": "sara_dps", "dps": {"explore": 0.5}}).source.explore == 0.5


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"kind": "sara", "sara": {"tau_abandon": 0.9, "tau_commit": 0.8}},
            "gate.sara.tau_abandon=0.9 must be below gate.sara.tau_commit=0.8; lower tau_abandon or raise tau_commit",
        ),
        ({"sara": {"prior": [-1, 1]}}, "gate.sara.prior=(-1.0, 1.0) must be two positive"),
        ({"hora": {"prior": [1, 0]}}, "gate.hora.prior"),
        ({"hora": {"probe_size": 1}}, "gate.hora.probe_size=1 must be >= 2"),
        ({"pilot_commit": {"p_low": 0.5, "p_up": 0.6}}, "keep band"),
        ({"pilot_commit": {"p_solve": 0.5}}, "gate.pilot_commit.p_solve=0.5"),
        ({"ds": {"max_rounds": 0}}, "gate.ds.max_rounds=0"),
        ({"ds": {"on_round_cap": "retry"}}, "'gate.ds.on_round_cap'='retry' is not one of"),
        ({"dps": {"success_rates": [0.1, 0.9, 0.5]}}, "gate.dps.success_rates"),
        ({"kind": "grpo"}, "'gate.kind'='grpo' is not one of"),
        ({"sara": {"tau_abandn": 0.3}}, "did you mean 'tau_abandon'"),
    ],
)
def test_config_errors_name_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        build(GateConfig, data, path="gate")
    assert message in str(info.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"kind": "sara", "sara": {"probe_size": 10}}, "gate.sara.probe_size=10 is above orchestrator.group_size=8"),
        ({"kind": "sara_dps", "sara": {"probe_size": 9}}, "gate.sara.probe_size=9"),
        (
            {"kind": "pilot_commit", "pilot_commit": {"pilot_size": 12}},
            "gate.pilot_commit.pilot_size=12 is above orchestrator.group_size=8",
        ),
        ({"kind": "hora", "hora": {"probe_size": 10}}, "extra budget R=-8 < 0"),
        (
            {"kind": "hora", "hora": {"budget": 12}},
            "gate.hora.budget=12 is below one probe round batch_groups*probe_size=16",
        ),
    ],
)
def test_size_checks_at_build_time(data, message):
    with pytest.raises(ConfigError) as info:
        make(data)
    assert message in str(info.value)


def test_oracle_without_exact_probabilities_runs_in_hindsight_mode():
    gate = make({"kind": "oracle"}, sp=None)
    assert gate.success_probability is None


def test_every_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(config_module))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (
                        f"{node.name}.{stmt.target.id} has no docstring"
                    )


def test_configs_are_frozen():
    cfg = GateConfig()
    for section in [cfg, cfg.ds, cfg.pilot_commit, cfg.hora, cfg.sara, cfg.dps]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, dataclasses.fields(section)[0].name, None)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("group_size", 1, "orchestrator.group_size=1 must be >= 2 for a group-relative advantage"),
        ("batch_groups", 0, "orchestrator.batch_groups=0 must be >= 1"),
    ],
)
def test_the_orchestrator_config_owns_the_group_and_batch_size_ranges(key, value, message):
    """One place checks them (OrchestratorConfig); gates and GateConfig.check_sizes rely on it."""
    with pytest.raises(ConfigError, match=message):
        build(OrchestratorConfig, {key: value}, path="orchestrator")
