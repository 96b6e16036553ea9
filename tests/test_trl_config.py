"""railgate.trl's settings and refusals: gate_* fields never shadow GRPOConfig's, and what the
gate cannot run fails at construction naming the setting and the fix."""

from __future__ import annotations

import dataclasses

import pytest

trl = pytest.importorskip("trl")

from datasets import Dataset, IterableDataset  # noqa: E402
from trl_fixtures import MATCHED, arithmetic_rows, length_reward, model_dir  # noqa: E402

from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer  # noqa: E402
from railgate.trl.config import gate_fields  # noqa: E402


def args(tmp_path, **overrides):
    return GatedGRPOConfig(output_dir=str(tmp_path / "out"), **{**MATCHED, "gate_probe_size": 2, **overrides})


def test_gate_fields_are_namespaced_and_shadow_no_grpo_config_field():
    grpo = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    added = gate_fields()
    assert len(added) >= 15 and all(name.startswith("gate_") for name in added)
    assert not set(added) & grpo
    # And every GRPOConfig field keeps its default (trl-cgrpo's `delta` changed TRL's clamp).
    for f in dataclasses.fields(trl.GRPOConfig):
        mine = next(g for g in dataclasses.fields(GatedGRPOConfig) if g.name == f.name)
        assert (mine.default, mine.default_factory) == (f.default, f.default_factory), f.name


def test_every_gate_field_has_a_docstring():
    import ast
    import inspect

    import railgate.trl.config as module

    tree = ast.parse(inspect.getsource(module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GatedGRPOConfig")
    documented = set()
    for a, b in zip(cls.body, cls.body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            documented.add(a.target.id)
    assert set(gate_fields()) <= documented


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"gate_probe_size": 4},
            r"gate_probe_size=4 is not below num_generations=4.*lower gate_probe_size or raise num_generations",
        ),
        ({"gate_kind": "pilot"}, r"gate_kind='pilot' is not one of sara, hora, ds, uniform"),
        ({"gate_tau_abandon": 0.9}, r"gate_tau_abandon=0.9 must be below gate_tau_commit=0.5"),
        ({"gate_reference_skip": 1.0}, r"gate_reference_skip=1.0 must be in \[0, 1\)"),
        ({"temperature": 0.7}, r"gate_reference_prior=True .* temperature=0.7 .* set gate_reference_prior=False"),
        ({"gate_kind": "hora", "gate_hora_budget": 3}, r"gate_hora_budget=3 is below one probe round"),
        ({"gate_kind": "hora", "gate_probe_size": 1}, r"gate_probe_size=1 must be >= 2"),
        ({"gate_step_rollouts": 0.5}, r"gate_step_rollouts=0.5 must be >= 1"),
    ],
)
def test_bad_settings_fail_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        args(tmp_path, **overrides)


def test_the_reference_prior_off_accepts_any_temperature(tmp_path):
    assert args(tmp_path, temperature=0.7, gate_reference_prior=False).gate_config().sara.reference_prior is False


def trainer(tmp_path, rows=None, **kwargs):
    defaults = dict(
        model=model_dir(tmp_path),
        reward_funcs=length_reward,
        args=args(tmp_path),
        train_dataset=Dataset.from_list(rows or arithmetic_rows(8)),
    )
    return GatedGRPOTrainer(**{**defaults, **kwargs})


def test_modes_the_gate_cannot_split_are_refused(tmp_path):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return a + b

    with pytest.raises(ValueError, match=r"tools=\['add'\]: the gate .* cannot split a tool-calling loop"):
        trainer(tmp_path, tools=[add])

    def rollout(prompts, trainer):
        return {}

    with pytest.raises(ValueError, match=r"rollout_func=rollout: a custom rollout function owns generation"):
        trainer(tmp_path, rollout_func=rollout)


def test_a_plain_grpo_config_is_refused(tmp_path):
    plain = trl.GRPOConfig(output_dir=str(tmp_path / "out"), **MATCHED)
    with pytest.raises(TypeError, match="GatedGRPOTrainer needs a GatedGRPOConfig, got GRPOConfig"):
        trainer(tmp_path, args=plain)


def test_datasets_the_gate_cannot_index_are_refused(tmp_path):
    stream = IterableDataset.from_generator(lambda: iter(arithmetic_rows(8)))
    with pytest.raises(ValueError, match="train_dataset=IterableDataset: the gate picks prompts by row index"):
        trainer(tmp_path, train_dataset=stream)
    with pytest.raises(ValueError, match="no 'prompt' column .*rename the prompt column"):
        trainer(tmp_path, rows=[{"question": "1+1=", "answer": "2"}] * 4)
    with pytest.raises(ValueError, match=r"gate_reference_column='target' is not a column of the train dataset"):
        trainer(tmp_path, args=args(tmp_path, gate_reference_column="target"))


@pytest.mark.parametrize("group, probe", [(2, 1), (4, 2), (8, 4)])
def test_the_probe_size_derives_from_num_generations_unless_set(tmp_path, group, probe):
    derived = args(tmp_path, num_generations=group, per_device_train_batch_size=2 * group, gate_probe_size=0)
    assert derived.probe_size == derived.gate_config().sara.probe_size == probe
    hora = args(tmp_path, num_generations=8, per_device_train_batch_size=16, gate_probe_size=0, gate_kind="hora")
    assert hora.gate_config().hora.probe_size == 4
    assert args(tmp_path, num_generations=8, per_device_train_batch_size=16, gate_probe_size=3).probe_size == 3


def test_an_explicit_probe_size_is_still_checked(tmp_path):
    with pytest.raises(ValueError, match=r"gate_probe_size=8 is not below num_generations=8"):
        args(tmp_path, num_generations=8, per_device_train_batch_size=16, gate_probe_size=8)
    with pytest.raises(ValueError, match=r"gate_probe_size=-1 must be >= 0 \(0: num_generations // 2\)"):
        args(tmp_path, gate_probe_size=-1)
