"""Guidance on the real torch engine inside the orchestrator (issue 45, first slice).

A tiny seeded GPT-2 on ``TorchEngine``, the SARA gate with ``guidance: 0.5`` and a reward that
asks for the reference's first token: a random model writes it about once in 64 rollouts, so
nearly every probe is all-wrong, and a guided rollout starts with it. Half the prompts have a
reference. One run (a module fixture, a second or two of generation) feeds every test; the
learner trains nothing and keeps its batches, and the held-out evaluation runs after each step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import pytest
import torch

from controller.config import GateConfig, SaraConfig
from controller.gates.registry import build_gate
from controller.guidance import Guidance
from controller.noop import NoopController
from controller.prompts import PromptPool
from learner.packing import pack
from pipeline.clock import WallClock
from pipeline.config.build import ConfigError
from pipeline.engines.torch_engine import TorchEngine
from pipeline.evaluation import SamplingEvaluator
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import Prompt, SampleRequest
from railgate.build import build_components
from railgate.config import load_config
from tests.engine_models import run_then_close, tiny_gpt2
from tests.rail_fakes import ListSink
from tests.test_rail_torch_branching import CFG as BRANCHING_CFG
from tests.test_rail_torch_branching import FrozenLearner

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(120)

EOS = 2
# the RAIL branching test's run, with whole groups of 8, shorter answers and an evaluation each step
CFG = dataclasses.replace(BRANCHING_CFG, group_size=8, max_tokens=12, eval_every=1)


def references(n: int) -> dict[int, tuple[int, ...]]:
    """A 4-token reference (no end-of-sequence token) for each even prompt id below ``n``."""
    g = torch.Generator().manual_seed(7)
    return {i: tuple(int(t) for t in torch.randint(3, 64, (4,), generator=g)) for i in range(0, n, 2)}


REFS = references(64)


class FirstTokenScorer:
    """Success when the response starts with the prompt's reference's first token (a prompt
    without a reference: never)."""

    runs_inline = True

    def __call__(self, prompt, token_ids) -> float:
        ref = REFS.get(prompt.prompt_id % 1000)
        return 1.0 if ref and token_ids and token_ids[0] == ref[0] else 0.0


class RecordingEngine(TorchEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[SampleRequest] = []

    def stream(self, request):
        self.requests.append(request)
        return super().stream(request)


def prompts(ids, offset: int = 0) -> list[Prompt]:
    g = torch.Generator().manual_seed(offset)
    return [Prompt(i + offset, "", tuple(int(t) for t in torch.randint(3, 64, (3,), generator=g))) for i in ids]


@pytest.fixture(scope="module")
def run():
    model = tiny_gpt2(seed=0, initializer_range=0.3)
    engine = RecordingEngine(copy.deepcopy(model), EOS, seed=5, delta_tokens=2)
    gate = build_gate(
        GateConfig(kind="sara", sara=SaraConfig(guidance=0.5)),
        PromptPool(prompts(range(64)), seed=1),
        group_size=CFG.group_size,
        batch_groups=CFG.batch_groups,
        seed=0,
    )
    gate.attach_guidance(Guidance(REFS, 0.5))
    scorer = FirstTokenScorer()
    # Held-out prompts 1000.. share the references of 0.. (prompt_id % 1000): guidance would make them pass.
    evaluator = SamplingEvaluator(engine, prompts(range(8), offset=1000), scorer, samples_per_prompt=4, max_tokens=12)
    sink, learner, clock = ListSink(), FrozenLearner(model), WallClock()
    parts = RunParts(
        engine=engine,
        gate=gate,
        controller=NoopController(),
        scoring=ScoringService(scorer, 5.0, 1),
        learner=learner,
        clock=clock,
        evaluator=evaluator,
    )
    orch = Orchestrator(parts, CFG, RunOutputs(trace=sink), seed=11, run_id="guide")

    summary = run_then_close(orch, engine)
    return summary, engine, gate, sink, learner


def test_all_wrong_groups_of_prompts_with_a_reference_are_guided_and_train_mixed(run):
    summary, engine, gate, _, learner = run
    guided = [r for r in engine.requests if r.guide_len]
    assert guided, "no group was guided"
    for r in guided:
        assert r.prompt.prompt_id in REFS and r.guide_level == 0.5 and r.branch is not None
        assert r.branch.prefix_token_ids == REFS[r.prompt.prompt_id][:2]
    m = gate.metrics()
    assert m["gate/guide_rollouts"] == len(guided) and m["gate/guide_no_reference"] > 0
    trained = [(g.prompt_id, r) for b in learner.batches for g in b.groups for r in g.rollouts if r.guide_len]
    assert trained and m["gate/commit_guided"] > 0
    for prompt_id, r in trained:
        assert r.guide_len == 2 and r.guide_level == 0.5 and r.token_ids[:2] == REFS[prompt_id][:2]
        assert r.reward == 1.0  # the reference's first token is the guided prefix's
        chunk = pack([r], [1.0], pad_id=0, micro_batch=1)[0]
        assert chunk.loss_mask[0, :2].sum() == 0 and chunk.loss_mask[0, 2:].sum() == len(r.token_ids) - 2


def test_no_prompt_without_a_reference_is_guided(run):
    _, engine, _, _, _ = run
    assert not [r for r in engine.requests if r.guide_len and r.prompt.prompt_id not in REFS]


def test_the_held_out_evaluation_is_never_guided(run):
    summary, engine, _, _, _ = run
    evals = [r for r in engine.requests if r.group_id < 0]
    assert len(evals) == 8 * 4 * (CFG.steps + 1)  # before the first step and after each
    assert all(r.branch is None and r.guide_len == 0 for r in evals)
    assert all(r.prompt.prompt_id >= 1000 for r in evals)


def test_the_trace_records_every_guided_launch_with_its_level(run):
    _, engine, _, sink, _ = run
    launches = [d for d in sink.decisions if "guide_level" in d.features]
    assert launches and all(d.chosen == "launch" and d.features["guide_level"] == 0.5 for d in launches)
    guided_per_group = Counter(r.group_id for r in engine.requests if r.guide_len)
    logged = Counter()
    for d in launches:
        logged[d.group_id] += int(d.features["guided_rollouts"])
    assert logged == guided_per_group


def test_the_sim_engine_refuses_guidance_with_the_fix(tmp_path):
    cfg = load_config("configs/sim.yaml", [f"run_dir={tmp_path}", "gate.kind=sara", "gate.sara.guidance=0.5"])
    with pytest.raises(ConfigError, match="engine.kind=sim has none of; use engine.kind=torch"):
        build_components(cfg, progress=False)


def test_configs_guide_yaml_is_the_cpu_default_with_guidance_at_one_half():
    default, guide = load_config("configs/default.yaml"), load_config("configs/guide.yaml")
    assert guide.gate.sara.guidance == 0.5 and default.gate.sara.guidance == 0.0
    assert guide.gate.kind == "sara" and guide.gate.sara.launch == default.gate.sara.launch
    # the reference screen would skip the hard prompts before their probe: guidance never acted under it
    assert default.gate.sara.reference_prior and not guide.gate.sara.reference_prior
    assert guide.orchestrator == default.orchestrator and guide.learner == default.learner
