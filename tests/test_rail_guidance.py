"""RAIL's guidance arms (issue 45): at a rescue of an all-failed group whose prompt has a
reference, the controller may continue the group from 25%, 50% or 75% of that reference; the
arm is priced in rollouts like the others, logged by name, and replayable."""

from __future__ import annotations

import copy

import pytest
import torch
from rail_fakes import ListSink, shadow_config

from controller.config import GateConfig, SaraConfig
from controller.gates.registry import build_gate
from controller.guidance import Guidance
from controller.prompts import PromptPool
from controller.rail.arms import Arm, build_arms, expected_tokens, parse_arm
from controller.rail.controller import RailController
from controller.rail.features import Context
from learner.packing import pack
from pipeline.clock import WallClock
from pipeline.config.build import ConfigError
from pipeline.evaluation import SamplingEvaluator
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import ActionKind, GroupAction, GroupSnapshot, Prompt, SamplingParams
from railgate.build import build_components
from railgate.config import load_config
from tests.engine_models import run_then_close, tiny_gpt2
from tests.test_guidance_torch import CFG, EOS, REFS, FirstTokenScorer, RecordingEngine, prompts
from tests.test_rail_torch_branching import FrozenLearner

REFERENCE = (11, 12, 13, 14)
LEVELS = (0.25, 0.5, 0.75)


def guide_config(**overrides):
    """Shadow mode whose behaviour is the fixed rule (guide at 50%, no exploration): guidance arms only."""
    settings = dict(behaviour="guide", behaviour_epsilon=0.0, resample_sizes=(), guide_levels=LEVELS)
    return shadow_config(**{**settings, **overrides})


def controller(config, references=None) -> tuple[RailController, ListSink]:
    sink = ListSink()
    rail = RailController(config, sink, SamplingParams(max_tokens=16), seed=0)
    rail.attach_guidance(Guidance({0: REFERENCE} if references is None else references, 0.5))
    return rail, sink


def probe(prompt_id: int, rewards=(0.0,) * 4, group_id: int = 1) -> GroupSnapshot:
    n = len(rewards)
    return GroupSnapshot(group_id, Prompt(prompt_id, "", (1,)), 8, tuple(rewards), 0, n, 0, 40, 0, origins=(-1,) * n)


def rescue(rail: RailController, snapshot: GroupSnapshot) -> list[GroupAction]:
    return rail.on_group(snapshot, [GroupAction(ActionKind.ABANDON, snapshot.group_id)])


def test_a_guide_arm_is_named_priced_and_parsed_back():
    arm = Arm("guide", 4, level=0.25)
    assert arm.name == "guide_n4_l0.25" and parse_arm(arm.name) == arm
    assert expected_tokens(arm, length_estimate=8.0, prefix_fraction=0.9) == 4 * 8.0 * 0.75
    ctx = Context.build("rescue", {"length_estimate": 0.008}, build_arms(guide_config()))
    assert ctx.names == ("noop", "guide_n4_l0.25", "guide_n4_l0.5", "guide_n4_l0.75")
    assert ctx.costs == pytest.approx((0.0, 24.0, 16.0, 8.0))  # 4 samples x 8 tokens x the share they write
    with pytest.raises(ValueError, match="a guide arm has a level"):
        Arm("guide", 4)


def test_an_all_failed_rescue_with_a_reference_is_guided_at_the_rules_level_and_logged():
    rail, sink = controller(guide_config(batch_group_decisions=False))
    [launch] = rescue(rail, probe(0))
    assert launch.kind is ActionKind.LAUNCH and launch.n == 4 and launch.origin >= 0
    assert launch.branch.guide_level == 0.5 and launch.branch.prefix_token_ids == REFERENCE[:2]
    [record] = sink.decisions
    assert (
        record.decision_point == "group_rescue"
        and record.chosen == "guide_n4_l0.5"
        and record.decision_id == launch.origin
    )
    assert "guide_n4_l0.75" in record.actions
    assert rail.counts["interventions_guide"] == 1 and rail.guidance.rollouts == 4
    assert rail.counts["guide_level_0.5"] == 1


def test_guidance_arms_are_not_offered_after_a_success_or_without_a_reference():
    rail, sink = controller(guide_config(batch_group_decisions=False, resample_sizes=(2,)))
    rescue(rail, probe(0, rewards=(1.0,) * 4, group_id=1))  # all right: nothing to guide
    rescue(rail, probe(5, group_id=2))  # prompt 5 has no reference
    assert len(sink.decisions) == 2
    assert all(not any(a.startswith("guide") for a in d.actions) for d in sink.decisions)
    only_guides, sink = controller(guide_config(batch_group_decisions=False))
    assert rescue(only_guides, probe(5)) == [GroupAction(ActionKind.ABANDON, 1)]  # no arm but the no-op
    assert sink.decisions == []


def test_guidance_points_see_the_prompts_guidance_history_and_the_runs_pass_rate():
    rail, sink = controller(guide_config(batch_group_decisions=False, resample_sizes=(2,)))
    rescue(rail, probe(0, group_id=1))  # guided: the rule guides every all-failed rescue
    first = sink.decisions[-1].features
    assert (first["guide_count"], first["guide_mixed_rate"], first["run_success_rate"]) == (0.0, 0.5, 0.5)
    rail.on_closed(None, probe(0, rewards=(0.0,) * 8, group_id=1))  # the guided group still failed
    rescue(rail, probe(0, group_id=2))
    second = sink.decisions[-1].features
    assert second["guide_count"] == 1 / 8 and second["guide_mixed_rate"] == pytest.approx(1 / 3)
    assert second["run_success_rate"] == 0.0
    rescue(rail, probe(5, group_id=3))  # no reference: no guidance point, no guidance features
    assert "guide_count" not in sink.decisions[-1].features
    restored, _ = controller(guide_config(batch_group_decisions=False))
    restored.load_state_dict(rail.state_dict())
    assert restored.guide_history.features(0) == rail.guide_history.features(0)


def test_guidance_arm_settings_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="must hold shares of the reference: 0.25, 0.5 or 0.75"):
        guide_config(guide_levels=(0.4,))
    with pytest.raises(ConfigError, match="set branch_sizes=\\[\\] and token_decisions=false, or guide_levels=\\[\\]"):
        guide_config(branch_sizes=(2,))
    with pytest.raises(ValueError, match="without guidance arms; set controller.rail.guide_levels"):
        controller(shadow_config(behaviour="none"))


def test_the_sim_engine_refuses_guidance_arms_and_gate_guidance_beside_rail(tmp_path):
    sim = load_config(
        "configs/sim.yaml",
        [f"run_dir={tmp_path}", "controller.kind=rail", "controller.rail.guide_levels=[0.5]",
         "controller.rail.branch_sizes=[]", "controller.rail.token_decisions=false"],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="guide_levels=\\[0.5\\] continue all-failed groups .* engine.kind=sim"):
        build_components(sim, progress=False)


@pytest.fixture(scope="module")
def run():
    """The guidance torch test's run with RAIL (shadow, the fixed rule acting) doing the guiding."""
    model = tiny_gpt2(seed=0, initializer_range=0.3)
    engine = RecordingEngine(copy.deepcopy(model), EOS, seed=5, delta_tokens=2)
    gate = build_gate(
        GateConfig(kind="sara", sara=SaraConfig()),
        PromptPool(prompts(range(64)), seed=1),
        group_size=CFG.group_size,
        batch_groups=CFG.batch_groups,
        seed=0,
    )
    sink = ListSink()
    rail = RailController(guide_config(), sink, SamplingParams(max_tokens=CFG.max_tokens), seed=3)
    rail.attach_guidance(Guidance(REFS, 0.5))
    scorer = FirstTokenScorer()
    evaluator = SamplingEvaluator(engine, prompts(range(8), offset=1000), scorer, samples_per_prompt=4, max_tokens=12)
    learner = FrozenLearner(model)
    parts = RunParts(
        engine=engine,
        gate=gate,
        controller=rail,
        scoring=ScoringService(scorer, 5.0, 1),
        learner=learner,
        clock=WallClock(),
        evaluator=evaluator,
    )
    torch.set_num_threads(1)
    summary = run_then_close(Orchestrator(parts, CFG, RunOutputs(trace=sink), seed=11, run_id="rail-guide"), engine)
    return summary, engine, rail, sink, learner


def test_rail_guides_all_failed_groups_and_the_guided_rollouts_train_without_their_prefix(run):
    _, engine, rail, sink, learner = run
    guided = [r for r in engine.requests if r.guide_len]
    assert guided and rail.counts["interventions_guide"] > 0
    chosen = {d.decision_id: d.chosen for d in sink.decisions}
    for r in guided:
        assert r.prompt.prompt_id in REFS and r.guide_level == 0.5 and chosen[r.origin] == "guide_n4_l0.5"
    trained = [r for b in learner.batches for g in b.groups for r in g.rollouts if r.guide_len]
    assert trained
    for r in trained:
        chunk = pack([r], [1.0], pad_id=0, micro_batch=1)[0]
        assert chunk.loss_mask[0, : r.guide_len].sum() == 0 and chunk.loss_mask[0, r.guide_len :].all()


def test_every_guidance_decision_gets_an_outcome_and_evaluation_is_never_guided(run):
    _, engine, _, sink, _ = run
    guides = {d.decision_id for d in sink.decisions if d.chosen.startswith("guide")}
    assert guides and guides <= {decision_id for decision_id, _, _ in sink.outcomes}
    evals = [r for r in engine.requests if r.group_id < 0]
    assert evals and all(r.guide_len == 0 and r.branch is None for r in evals)
