"""RAIL interventions on the real torch engine inside the orchestrator (issue 5).

A tiny seeded GPT-2 on ``TorchEngine``, the uniform GRPO gate and a live ``RailController``
with token-level decisions: at high-entropy tokens of running samples (and at the gate's
commit, from any sample of the group) the controller branches a prefix, and the engine
continues it from the source's tokens, copying the source's KV cache when it is still resident.
The reward is a token-parity rule (a fake scorer: a random model solves no task); the engine,
controller, gate and orchestrator are the real ones. The learner hands the engine its starting
weights back every step, so every log-prob of the run can be checked against one transformers
forward pass of the reference model.

One run (a module fixture, about a second of generation) feeds every test. Arms are no-op and
one branch of 2 at T=1; with an untrained learner SquareCB gives each half the mass and
``gain_threshold=-1`` keeps the live rule from shrinking the branch, so about half of the
~25 decisions branch: a run without any branch has odds of about 2**-25.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from controller.config import GateConfig
from controller.gates.registry import build_gate
from controller.prompts import PromptPool
from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from pipeline.clock import WallClock
from pipeline.config.sections import OrchestratorConfig
from pipeline.engines.torch_engine import TorchEngine
from pipeline.metrics import Budget
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import (
    CommittedGroup,
    GroupSnapshot,
    Prompt,
    SampleFinished,
    SampleRequest,
    SamplingParams,
    StepResult,
    TokenDelta,
    TrainBatch,
)
from tests.engine_models import run_then_close, tiny_gpt2
from tests.rail_fakes import ListSink

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(120)

EOS = 2
CFG = OrchestratorConfig(
    batch_groups=2,
    group_size=4,
    steps=3,
    max_tokens=20,
    max_concurrent_samples=64,
    max_open_groups=8,
    max_async_steps=1,
    eval_every=0,
    reward_threads=1,
)
RAIL = RailConfig(
    mode="live",
    backend="river",
    auto_promote=False,
    branch_sizes=(2,),
    branch_temperatures=(1.0,),
    resample_sizes=(),
    gain_threshold=-1.0,
    # With initializer_range=0.3 token entropies spread over ~1.5-3 nats: about one token in
    # five reaches 2.8, so decisions (and branch points) fall at varied positions.
    token_decisions=True,
    entropy_threshold=2.8,
    min_tokens_between_decisions=3,
    max_token_decisions_per_group=3,
    max_interventions_per_group=2,
    rescue_on_abandon=False,
    extend_on_commit=True,
)


def parity_reward(token_ids) -> float:
    """Success when the token ids sum to an even number (about half the samples)."""
    return 1.0 if sum(token_ids) % 2 == 0 else 0.0


class ParityScorer:
    """A fake task reward (parity of the token sum) that remembers what it was asked to score."""

    runs_inline = True

    def __init__(self) -> None:
        self.scored: list[tuple[int, ...]] = []

    def __call__(self, prompt, token_ids) -> float:
        self.scored.append(tuple(token_ids))
        return parity_reward(token_ids)


class RecordingEngine(TorchEngine):
    """The torch engine, keeping every request, what each stream delivered and, per branch,
    whether its source was still open when the branch was handed to the decode thread."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: dict[str, SampleRequest] = {}
        self.finals: dict[str, SampleFinished] = {}
        self.delivered: Counter[str] = Counter()  # tokens in TokenDeltas, per request
        self.first_position: dict[str, int] = {}
        self.undelivered: Counter[str] = Counter()  # produced by the engine, never sent (closed early)
        self.source_open: dict[str, bool] = {}

    def stream(self, request):
        self.requests[request.request_id] = request
        return _Recorded(super().stream(request), self)

    def _row_spec(self, req):
        spec = super()._row_spec(req)
        if req.request.branch is not None:
            self.source_open[req.request.request_id] = spec.source is not None
        return spec


class _Recorded:
    def __init__(self, inner, engine: RecordingEngine):
        self._inner, self._engine = inner, engine

    def __aiter__(self):
        return self

    async def __anext__(self):
        event = await self._inner.__anext__()
        e = self._engine
        if isinstance(event, TokenDelta):
            e.first_position.setdefault(event.request_id, event.position)
            e.delivered[event.request_id] += len(event.token_ids)
        else:
            e.finals[event.request_id] = event
        return event

    async def aclose(self):
        state = self._inner._state
        if state.request.request_id not in self._engine.finals:
            self._engine.undelivered[state.request.request_id] = len(state.tokens) - state.delivered
        await self._inner.aclose()


class FrozenLearner:
    """Trains nothing: gives the engine its starting weights back (a new policy version with
    the same numbers) and keeps the batches it was given."""

    def __init__(self, model: torch.nn.Module):
        self._weights = {k: v.clone() for k, v in model.state_dict().items()}
        self.batches: list[TrainBatch] = []

    def step(self, batch: TrainBatch) -> StepResult:
        self.batches.append(batch)
        return StepResult(batch.step, batch.step + 1)

    def weights(self):
        return self._weights

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None


class RecordingRail(RailController):
    """Keeps every closed group (``None`` when dropped) with its final snapshot."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.closed: list[tuple[CommittedGroup | None, GroupSnapshot]] = []

    def on_closed(self, group, snapshot):
        self.closed.append((group, snapshot))
        super().on_closed(group, snapshot)


def prompts(n: int, seed: int = 0) -> list[Prompt]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(2, 6, (1,), generator=g))
        out.append(Prompt(i, "", tuple(int(t) for t in torch.randint(3, 64, (length,), generator=g))))
    return out


@dataclass
class Run:
    budget: Budget
    steps: int
    engine: RecordingEngine
    rail: RecordingRail
    sink: ListSink
    learner: FrozenLearner
    scorer: ParityScorer
    reference: torch.nn.Module

    @property
    def branches(self) -> list[SampleRequest]:
        return [r for r in self.engine.requests.values() if r.branch is not None]

    @property
    def committed(self) -> list[tuple[CommittedGroup, GroupSnapshot]]:
        return [(g, s) for g, s in self.rail.closed if g is not None]

    def new_tokens(self, request_id: str) -> int:
        """Tokens a request's stream delivered beyond its branch prefix."""
        final = self.engine.finals.get(request_id)
        if final is None:
            return self.engine.delivered[request_id]
        b = self.engine.requests[request_id].branch
        return final.num_tokens - (b.prefix_len if b else 0)


def execute() -> Run:
    """One seeded run of the orchestrator with RAIL on the torch engine."""
    model = tiny_gpt2(seed=0, initializer_range=0.3)
    reference = copy.deepcopy(model)  # the engine owns (and may adapt) its model
    engine = RecordingEngine(model, EOS, seed=5, delta_tokens=1)
    gate = build_gate(
        GateConfig(kind="uniform"),
        PromptPool(prompts(32), seed=1),
        group_size=CFG.group_size,
        batch_groups=CFG.batch_groups,
        seed=0,
    )
    sink = ListSink()
    clock = WallClock()
    rail = RecordingRail(
        RAIL, sink, SamplingParams(max_tokens=CFG.max_tokens), seed=3, run_id="branching", clock=clock.now
    )
    learner = FrozenLearner(reference)
    scorer = ParityScorer()
    parts = RunParts(
        engine=engine, gate=gate, controller=rail, scoring=ScoringService(scorer, 5.0, 1), learner=learner, clock=clock
    )
    orch = Orchestrator(parts, CFG, RunOutputs(trace=sink), seed=11, run_id="branching")

    summary = run_then_close(orch, engine)
    assert engine.open_requests == 0
    return Run(summary.budget, summary.steps, engine, rail, sink, learner, scorer, reference)


@pytest.fixture(scope="module")
def run() -> Run:
    return execute()


def test_branch_interventions_run_on_the_engine_and_join_committed_groups(run):
    assert run.steps == CFG.steps
    decisions = {d.decision_id: d for d in run.sink.decisions}
    branches = run.branches
    assert len(branches) >= 2 and run.rail.counts["interventions_branch"] >= 1
    assert run.rail.counts["decisions_token"] > 0
    for r in branches:
        b = r.branch
        d = decisions[r.origin]  # every branch comes from a logged RAIL decision
        source = run.engine.requests[b.source_request_id]
        assert d.chosen == "branch_b2_t1" and d.decision_point in ("token", "group_extend")
        assert (
            d.group_id == r.group_id == source.group_id and d.prompt_id == r.prompt.prompt_id == source.prompt.prompt_id
        )
        assert d.sample_index == source.sample_index and d.token_position == b.prefix_len >= 1
        assert r.params.temperature == 1.0 and r.params.max_tokens == CFG.max_tokens
        # The prefix sent is the source's own first tokens (a source cancelled when the run
        # stopped has no final event to compare with), and the branch streams on from there.
        source_final = run.engine.finals.get(source.request_id)
        if source_final is not None:
            assert b.prefix_token_ids == source_final.token_ids[: b.prefix_len]
        assert run.engine.first_position.get(r.request_id, b.prefix_len) == b.prefix_len
    # Token-level branches, some of them from a sample still running in the engine.
    token_branches = [r for r in branches if decisions[r.origin].decision_point == "token"]
    assert token_branches and any(run.engine.source_open[r.request_id] for r in token_branches)
    assert run.engine._worker.batch.copied_rows > 0
    # Branched samples are members of committed groups, tagged with their decision.
    joined = 0
    for group, snap in run.committed:
        origins = {ro.request_id: run.engine.requests[ro.request_id].origin for ro in group.rollouts}
        assert Counter(o for o in snap.origins if o >= 0) == Counter(o for o in origins.values() if o >= 0)
        for ro in group.rollouts:
            req = run.engine.requests[ro.request_id]
            if req.branch is None:
                continue
            joined += 1
            p = req.branch.prefix_len
            source = run.engine.finals[req.branch.source_request_id]
            assert ro.prompt_token_ids == req.prompt.token_ids
            assert ro.token_ids[:p] == source.token_ids[:p] and len(ro.token_ids) > p
    assert joined >= 2
    # A branch decision of a committed group launched its arm's two samples.
    committed_ids = {g.group_id for g, _ in run.committed}
    launched = Counter(r.origin for r in branches)
    for d in decisions.values():
        if d.chosen.startswith("branch") and d.group_id in committed_ids:
            assert launched[d.decision_id] == 2
    assert run.budget.interventions_dropped == 0


def test_budget_counts_every_delivered_token_branches_included(run):
    b = run.budget
    requests = run.engine.requests
    assert b.rollouts_started == len(requests) == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert b.rollouts_intervention == sum(1 for r in requests.values() if r.origin >= 0) == len(run.branches)
    # A stream's deltas add up to its final response minus the branch prefix.
    for rid, _final in run.engine.finals.items():
        assert run.engine.delivered[rid] == run.new_tokens(rid), rid
    # The orchestrator's invariant: every token any stream delivered, a branch's prefix not again.
    branch_tokens = sum(run.new_tokens(r.request_id) for r in run.branches)
    assert branch_tokens > 0
    assert b.tokens_generated == sum(run.new_tokens(rid) for rid in requests)
    # A committed group pays for its own samples' new tokens, its branches' included.
    for group, _ in run.committed:
        members = [rid for rid, r in requests.items() if r.group_id == group.group_id]
        assert group.tokens == sum(run.new_tokens(rid) for rid in members)
        assert group.launched == len(members)
    # Trained tokens count what the trained rollouts generated themselves (a branch's prefix
    # was generated by its source), so tokens_wasted = generated - trained is never negative.
    trained = [ro for batch in run.learner.batches for g in batch.groups for ro in g.rollouts]
    assert b.rollouts_trained == len(trained)
    assert b.tokens_trained == sum(run.new_tokens(ro.request_id) for ro in trained)


def test_logprobs_are_the_policy_at_temperature_one_branch_prefixes_included(run):
    """A branch's prefix log-probs are the ones its request carried, which RAIL took from the
    source's stream (those of the weights that sampled the prefix); every log-prob is the
    reference model's log-softmax at T=1, whatever temperature sampled the token (the weights
    never change here, so one forward pass checks them all)."""
    checked = 0
    for group, _ in run.committed:
        for ro in group.rollouts:
            assert len(ro.logprobs) == len(ro.token_ids) and all(math.isfinite(x) for x in ro.logprobs)
            ids = torch.tensor([list(ro.prompt_token_ids) + list(ro.token_ids)])
            with torch.no_grad():
                logp = torch.log_softmax(run.reference(ids).logits[0].float(), dim=-1)
            n = len(ro.prompt_token_ids)
            want = logp[n - 1 : n - 1 + len(ro.token_ids)].gather(1, torch.tensor(ro.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(ro.logprobs), want, atol=1e-4), ro.request_id
            req = run.engine.requests[ro.request_id]
            if req.branch is not None:
                p = req.branch.prefix_len
                source = run.engine.finals[req.branch.source_request_id]
                assert ro.logprobs[:p] == req.branch.prefix_logprobs == source.logprobs[:p]
                checked += 1
    assert checked >= 2


def test_every_decision_of_a_closed_group_has_one_outcome(run):
    closed = {s.group_id for _, s in run.rail.closed}
    outcomes = Counter(d for d, _, _ in run.sink.outcomes)
    assert all(n == 1 for n in outcomes.values())
    assert all(math.isfinite(r) and t >= 0 for _, r, t in run.sink.outcomes)
    decided = [d for d in run.sink.decisions if d.group_id in closed]
    assert {d.decision_point for d in decided} >= {"gate", "token"}
    for d in decided:
        assert outcomes[d.decision_id] == 1, (d.decision_point, d.decision_id, d.group_id)
    rail_decided = [d for d in decided if d.decision_point in ("token", "group_extend")]
    assert run.rail.counts["outcomes"] == len(rail_decided) > 0
    assert all(0.0 < d.propensity <= 1.0 and d.mode == "live" for d in rail_decided)


# --- defects this file found (fixed), and the documented handling of groups cut off by the stop ---


def test_branched_samples_are_scored_on_their_whole_response(run):
    assert any(run.engine.requests[ro.request_id].branch for g, _ in run.committed for ro in g.rollouts)
    scored = Counter(run.scorer.scored)
    for group, _ in run.committed:
        for ro in group.rollouts:
            assert scored[ro.token_ids] >= 1, ro.request_id
            assert ro.reward == parity_reward(ro.token_ids), ro.request_id


def test_only_decisions_of_groups_cut_off_by_the_stop_lack_an_outcome(run):
    # A group still open when the run stops never finishes, so its decisions have no realised
    # gain: they keep no outcome (replay skips and counts them) rather than a made-up one.
    closed = {s.group_id for _, s in run.rail.closed}
    outcomes = {d for d, _, _ in run.sink.outcomes}
    missing = {d.group_id for d in run.sink.decisions if d.decision_id not in outcomes}
    assert not missing & closed


def test_tokens_wasted_is_the_generated_tokens_never_trained(run):
    trained_ids = {ro.request_id for batch in run.learner.batches for g in batch.groups for ro in g.rollouts}
    assert any(run.engine.requests[rid].branch for rid in trained_ids)  # the seeded run trains branches
    untrained = sum(run.new_tokens(rid) for rid in run.engine.requests if rid not in trained_ids)
    assert run.budget.tokens_wasted == untrained
