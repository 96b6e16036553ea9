"""Multi-turn episodes: the book's rules, the tracker's turn loop, a whole run through the shell."""

from __future__ import annotations

import anyio
import pytest
from stub_gates import AbandonAtFirstEnd

from controller.gates.uniform import UniformGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.config.sections import EpisodeSettings, OrchestratorConfig
from pipeline.core.actions import INLINE, CloseEpisode, EnvStep, ForkEpisode, ShellSettings, Start, Train
from pipeline.core.episodes import EpisodeBook
from pipeline.core.lifecycles import Episodes
from pipeline.core.messages import Started, StreamCut, Tick, TurnDone
from pipeline.core.tracker import GroupTracker
from pipeline.types import (
    ActionKind,
    BranchSpec,
    FinishReason,
    GroupAction,
    Prompt,
    SampleFinished,
    SampleRequest,
    SamplingParams,
)

RULES = EpisodeSettings(max_turns=3, max_episode_tokens=40, turn_tokens=4)


def request(rid="g0-s0", prompt=(1, 2)) -> SampleRequest:
    return SampleRequest(rid, 0, 0, Prompt(0, "", prompt), SamplingParams(max_tokens=4))


def turn(req: SampleRequest, tokens=(7, 8), reason=FinishReason.STOP) -> SampleFinished:
    return SampleFinished(req.request_id, tokens, (-0.5,) * len(tokens), reason, 3)


@pytest.mark.parametrize(
    "case, ends_after",
    [
        ("done", 2),
        ("max_turns", 3),
        ("tokens", 2),
        ("failed turn", 1),
        ("env error", 2),
    ],
)
def test_an_episode_ends_by_each_rule(case, ends_after):
    rules = EpisodeSettings(max_turns=3, max_episode_tokens=12 if case == "tokens" else 40, turn_tokens=4)
    book = EpisodeBook(rules)
    req = book.begin(request())
    for t in range(1, 4):
        reason = FinishReason.ERROR if case == "failed turn" else FinishReason.STOP
        error = "EnvError: step 2 raised" if case == "env error" and t == 2 else ""
        scored = book.turn_done(
            req,
            turn(req, reason=reason),
            observation=(5, 5, 5),
            reward=float(t == 2),
            done=case == "done" and t == 2,
            error=error,
        )
        if scored is not None:
            break
        req = book.next_request(req)
    assert t == ends_after and scored.turns.count == t
    failed = case in ("failed turn", "env error")
    assert scored.is_valid is not failed
    assert scored.reward == (0.0 if failed or case == "max_turns" else 1.0)  # the final turn's reward trains
    assert len(scored.result.token_ids) == len(scored.turns.policy_mask) == 2 * t + 3 * (t - 1)
    assert scored.turns.observation_tokens == 3 * (t - 1)


def test_an_episode_that_outgrows_the_context_ends_truncated():
    """Each turn sent fits prompt + max_tokens <= max_context; the turn after the third would
    not (14 tokens of context, 3 of observation, 4 to generate > 16), so the episode ends there,
    truncated, though the environment is not done and max_turns allows more."""
    book = EpisodeBook(EpisodeSettings(max_turns=5, max_episode_tokens=400, turn_tokens=4, max_context=16))
    req = book.begin(request())
    for t in range(1, 6):
        assert len(req.prompt.token_ids) + req.params.max_tokens <= 16  # the engine takes it
        scored = book.turn_done(req, turn(req), observation=(5, 5, 5), reward=float(t), done=False)
        if scored is not None:
            break
        req = book.next_request(req)
    assert t == 3 and scored.turns.truncated and scored.is_valid
    assert scored.result.finish_reason is FinishReason.LENGTH and scored.reward == 3.0
    assert scored.result.token_ids == (7, 8, 5, 5, 5, 7, 8, 5, 5, 5, 7, 8)  # no observation after the last turn


def test_the_sum_of_turn_rewards_trains_when_asked():
    book = EpisodeBook(EpisodeSettings(max_turns=2, max_episode_tokens=40, turn_tokens=4, reward="sum"))
    req = book.begin(request())
    assert book.turn_done(req, turn(req), observation=(5,), reward=0.25, done=False) is None
    req = book.next_request(req)
    assert req.request_id == "g0-s0-t1" and req.prompt.token_ids == (1, 2, 7, 8, 5)
    assert book.turn_done(req, turn(req), observation=(), reward=0.5, done=False).reward == 0.75


def test_a_branch_continues_the_context_after_its_turn_boundary():
    book = EpisodeBook(RULES)
    req = book.begin(request())
    book.turn_done(req, turn(req, (7, 8)), observation=(5, 6), reward=0.0, done=False)
    req = book.next_request(req)
    book.turn_done(req, turn(req, (9,)), observation=(4,), reward=0.0, done=False)
    assert book.boundary("g0-s0", 1) == 4 and book.boundary("g0-s0", 2) == 6
    branch = SampleRequest(
        "g0-s1", 0, 1, request().prompt, SamplingParams(max_tokens=4), branch=BranchSpec("g0-s0", 4, turns=1)
    )
    first = book.begin(branch, "g0-s0", 1)
    assert first.prompt.token_ids == (1, 2, 7, 8, 5, 6) and first.branch is None
    scored = book.turn_done(first, turn(first, (3,)), observation=(), reward=1.0, done=True)
    assert scored.result.token_ids == (7, 8, 5, 6, 3) and scored.turns.ends == (2, 5)
    assert scored.request.branch.turns == 1  # its prefix was paid for by its source


class Harness:
    """A tracker with episodes driven by hand: every turn finishes, the environment answers."""

    def __init__(self, group_size=2, gate=None, **rules):
        pool = PromptPool([Prompt(i, "", (1, 2)) for i in range(8)], seed=0)
        cfg = OrchestratorConfig(
            batch_groups=1, group_size=group_size, steps=1, max_open_groups=1, max_concurrent_samples=2 * group_size
        )
        settings = EpisodeSettings(**{"max_turns": 3, "max_episode_tokens": 64, "turn_tokens": 4, **rules})
        self.tracker = GroupTracker(
            gate or UniformGate(pool, group_size),
            NoopController(),
            cfg,
            shell=ShellSettings(INLINE),
            lifecycle=Episodes(settings),
        )
        self.closed: list[str] = []
        self.forks: list[ForkEpisode] = []

    def start(self) -> list[Start]:
        return self.collect([*self.tracker.handle(Started()), *self.tracker.handle(Tick())])

    def collect(self, actions):
        self.closed += [a.key for a in actions if isinstance(a, CloseEpisode)]
        self.forks += [a for a in actions if isinstance(a, ForkEpisode)]
        return [a for a in actions if isinstance(a, Start)]

    def finish_turn(self, start: Start, tokens=(7,), reason=FinishReason.STOP) -> EnvStep:
        [step] = self.tracker.handle(SampleFinished(start.request.request_id, tokens, (-0.1,) * len(tokens), reason, 0))
        assert isinstance(step, EnvStep)
        return step

    def answer(self, step: EnvStep, reward=0.0, done=False, observation=(5,), error=""):
        actions = [
            *self.tracker.handle(TurnDone(step.request, step.finished, observation, reward, done, error)),
            *self.tracker.handle(Tick()),
        ]
        return actions, self.collect(actions)


def test_the_tracker_runs_each_episode_turn_by_turn_and_trains_the_group():
    h = Harness()
    starts = h.start()
    assert [s.request.request_id for s in starts] == ["g0-s0", "g0-s1"]
    for s in starts:  # turn 0 of both, then turn 1: done
        _, [following] = h.answer(h.finish_turn(s))
        assert following.request.request_id == s.request.request_id + "-t1"
        assert following.request.prompt.token_ids == (1, 2, 7, 5)
        actions, _ = h.answer(h.finish_turn(following), reward=float(s.request.sample_index), done=True)
    train = next(a for a in actions if isinstance(a, Train))
    [group] = train.batch.groups
    assert [r.reward for r in group.rollouts] == [0.0, 1.0] and group.is_effective
    assert all(r.turns.policy_mask == (True, False, True) for r in group.rollouts)
    b = h.tracker.budget
    assert (b.rollouts_started, b.rollouts_finished, b.turns) == (2, 2, 4)
    assert sorted(h.closed) == ["g0-s0", "g0-s1"]


def test_the_tracker_counts_an_episode_truncated_by_the_context_and_trains_it():
    m = OrchestratorConfig().max_tokens  # each turn's max_tokens
    h = Harness(max_context=m + 6)
    starts = h.start()
    for s in starts:
        _, [following] = h.answer(h.finish_turn(s))  # context 2 + 1, observation 1, + m <= m + 6: it goes
        actions, more = h.answer(h.finish_turn(following, tokens=(7, 7)))  # 4 + 2, 1, + m > m + 6
        assert more == []
    train = next(a for a in actions if isinstance(a, Train))
    assert all(r.turns.truncated and r.turns.count == 2 for r in train.batch.groups[0].rollouts)
    b = h.tracker.budget
    assert (b.episodes_truncated_context, b.rollouts_finished, b.rollouts_failed) == (2, 2, 0)
    assert b.as_metrics()["pipeline/episodes_truncated_context"] == 2.0
    assert sorted(h.closed) == ["g0-s0", "g0-s1"]


def test_an_environment_failure_ends_the_episode_as_a_failed_sample_and_is_counted():
    h = Harness()
    a, b = h.start()
    h.answer(h.finish_turn(a), error="ChainEnv step 1: step() returned a list, not a dict")
    assert h.tracker.budget.env_failures == 1 and h.tracker.budget.rollouts_failed == 1
    assert h.closed == ["g0-s0"]


def test_episodes_that_all_fail_by_their_environment_stop_the_run_with_the_first_failure():
    from pipeline.core.lifecycles import EnvironmentFailing

    h = Harness(check_first=2)
    a, b = h.start()
    h.answer(h.finish_turn(a), error="ChainEnv step 1: step() returned a list, not a dict")
    with pytest.raises(
        EnvironmentFailing, match=r"first 2 episodes .* the first: ChainEnv step 1: step\(\) returned a list"
    ):
        h.answer(h.finish_turn(b), error="ChainEnv step 1: timed out")


def test_one_episode_that_ends_well_first_means_no_stop():
    h = Harness(check_first=1)
    a, b = h.start()
    h.answer(h.finish_turn(a), done=True)
    h.answer(h.finish_turn(b), error="ChainEnv step 1: timed out")  # no EnvironmentFailing
    assert h.tracker.budget.env_failures == 1


def test_an_abandoned_group_closes_its_episodes_and_counts_each_once():
    """Two episodes are generating a turn when the group is abandoned: one's turn completes
    anyway, the other's stream is cut; each is counted aborted once."""
    h = Harness(group_size=3, gate=AbandonAtFirstEnd(PromptPool([Prompt(i, "", (1, 2)) for i in range(8)], seed=0), 3))
    a, b, c = h.start()
    h.answer(h.finish_turn(a), done=True)  # a ends; the gate abandons the group
    assert "g0-s1" in h.closed and "g0-s2" in h.closed
    assert h.tracker.handle(SampleFinished(b.request.request_id, (7,), (0.0,), FinishReason.STOP, 0)) == ()  # cut
    h.tracker.handle(StreamCut(c.request.request_id, tokens=2))  # c's turn was streaming: the shell cut it
    budget = h.tracker.budget
    assert (budget.rollouts_finished, budget.rollouts_aborted, budget.rollouts_failed) == (1, 2, 0)
    assert h.tracker.samples.started == budget.rollouts_started - 3  # only the next group's episodes run


class _BranchAtFirstBoundary(NoopController):
    """Branches one new episode from sample 0's first turn boundary."""

    def on_turn(self, snapshot, sample_index, point):
        if sample_index == 0 and point.turns == 1:
            return [
                GroupAction(
                    ActionKind.LAUNCH,
                    snapshot.group_id,
                    n=1,
                    origin=7,
                    branch=BranchSpec(point.key, point.prefix_len, turns=point.turns),
                )
            ]
        return []


def test_an_episode_abandoned_while_its_environment_answers_is_counted_then():
    h = Harness(group_size=2, gate=AbandonAtFirstEnd(PromptPool([Prompt(i, "", (1, 2)) for i in range(8)], seed=0), 2))
    a, b = h.start()
    waiting = h.finish_turn(b)  # b's environment is answering ...
    h.answer(h.finish_turn(a), done=True)  # ... when a ends and the gate abandons the group
    assert h.tracker.budget.rollouts_aborted == 1 and "g0-s1" in h.closed
    assert h.tracker.handle(TurnDone(waiting.request, waiting.finished, (5,), 0.0, False)) == ()  # dropped
    assert h.tracker.budget.rollouts_aborted == 1


def test_a_turn_branch_forks_the_environment_and_starts_from_the_source_context():
    h = Harness(group_size=2)
    h.tracker = GroupTracker(
        h.tracker.gate, _BranchAtFirstBoundary(), h.tracker.config, shell=h.tracker.shell, lifecycle=h.tracker.lifecycle
    )
    a, b = h.start()
    _, starts = h.answer(h.finish_turn(a, (7, 8)), observation=(5, 6))
    assert h.forks == [ForkEpisode("g0-s0", 1, "g0-s2")]
    assert [s.request.request_id for s in starts] == ["g0-s0-t1", "g0-s2"]
    assert starts[1].request.prompt.token_ids == (1, 2, 7, 8, 5, 6) and starts[1].request.branch is None
    assert h.tracker.budget.rollouts_intervention == 1


class ChainService:
    """An episode service without an environment: every turn is answered with one observation
    token; the episode is done after its third turn, a success when that turn's token sum is odd."""

    settings = EpisodeSettings(max_turns=3, max_episode_tokens=4096, turn_tokens=256)

    def __init__(self):
        self.turns: dict[str, int] = {}
        self.open: set[str] = set()
        self.closed: list[str] = []

    async def step(self, request, finished):
        from pipeline.core.episodes import episode_key

        await anyio.sleep(0)  # an environment answers later, off the event loop
        key = episode_key(request)
        self.open.add(key)
        if not finished.finish_reason.is_success:
            return TurnDone(request, finished, done=True)
        t = self.turns[key] = self.turns.get(key, 0) + 1
        return TurnDone(
            request, finished, observation=(3,), reward=float(t == 3 and sum(finished.token_ids) % 2 == 1), done=t == 3
        )

    def fork(self, source, turns, key):
        self.turns[key] = turns

    def close(self, key):
        self.closed.append(key)
        self.open.discard(key)


class Collect:
    """A buffer that keeps the trained batches in memory."""

    def __init__(self):
        self.batches = []

    def put(self, batch, advantages=None):
        self.batches.append(batch)

    def close(self):
        pass


@pytest.mark.parametrize("gate", ["uniform", "sara"])
def test_a_run_of_episodes_through_the_shell_adds_up(gate):
    from controller.config import GateConfig
    from controller.gates.registry import build_gate
    from pipeline.clock import VirtualClock
    from pipeline.config.sections import SimConfig
    from pipeline.shells.orchestrator import Orchestrator
    from pipeline.shells.parts import RunOutputs, RunParts
    from pipeline.sim.engine import SimEngine
    from pipeline.sim.learner import SimLearner
    from pipeline.sim.world import SimAnswerScorer, SimWorld
    from pipeline.tasks.rewards.scoring import ScoringService

    world = SimWorld(SimConfig(num_prompts=64, num_eval_prompts=8, seed=3))
    clock = VirtualClock()
    engine = SimEngine(world, clock=clock)
    pool = PromptPool([engine.prompt(i) for i in range(64)], seed=1)
    service = ChainService()
    cfg = OrchestratorConfig(batch_groups=4, group_size=4, steps=3, max_concurrent_samples=64)
    parts = RunParts(
        engine=engine,
        gate=build_gate(GateConfig(kind=gate), pool, group_size=4, batch_groups=4, seed=0),
        controller=NoopController(),
        scoring=ScoringService(SimAnswerScorer(), 5.0, 1),
        learner=SimLearner(world, 4, seed=0),
        clock=clock,
        episodes=service,
        lifecycle=Episodes(service.settings),
    )
    buffer = Collect()
    summary = anyio.run(Orchestrator(parts, cfg, RunOutputs(buffer=buffer), seed=7).run)
    b = summary.budget
    assert summary.steps == 3 and b.rollouts_started == b.rollouts_finished + b.rollouts_aborted + b.rollouts_failed
    assert b.turns >= 3 * b.rollouts_finished and b.rollouts_trained == sum(
        len(g.rollouts) for t in buffer.batches for g in t.groups
    )
    rollouts = [r for t in buffer.batches for g in t.groups for r in g.rollouts]
    assert rollouts and all(r.turns.count == 3 and r.turns.observation_tokens == 2 for r in rollouts)
    assert not service.open  # every environment that opened was closed


class EndlessService(ChainService):
    """Never done: every turn is answered with a four-token observation, so each episode's
    context grows until the next turn cannot fit the model's."""

    settings = EpisodeSettings(max_turns=64, max_episode_tokens=4096, turn_tokens=6, max_context=32)

    async def step(self, request, finished):
        await anyio.sleep(0)
        self.open.add(request.request_id.split("-t")[0])
        if not finished.finish_reason.is_success:
            return TurnDone(request, finished, done=True)
        return TurnDone(
            request, finished, observation=(3, 4, 5, 6), reward=float(sum(finished.token_ids) % 2), done=False
        )


class FrozenLearner:
    """Trains nothing: hands the engine its own weights back each step."""

    def __init__(self, model):
        self._weights = {k: v.clone() for k, v in model.state_dict().items()}

    def step(self, batch):
        from pipeline.types import StepResult

        return StepResult(batch.step, batch.step + 1)

    def weights(self):
        return self._weights

    def advantages(self, batch):
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None


def test_episodes_that_outgrow_a_real_models_context_end_truncated_and_the_run_goes_on():
    """On the torch engine, whose requests may not exceed the model's 32 tokens (it refuses
    one that would, and the run stopped on that refusal), episodes that never end by their
    environment end truncated by the context; the run trains its steps and counts them."""
    pytest.importorskip("torch")
    from pipeline.clock import WallClock
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.shells.orchestrator import Orchestrator
    from pipeline.shells.parts import RunOutputs, RunParts
    from pipeline.sim.world import SimAnswerScorer
    from pipeline.tasks.rewards.scoring import ScoringService
    from tests.engine_models import tiny_gpt2

    model = tiny_gpt2(max_len=32, seed=1)
    engine = TorchEngine(model, 2, max_batch=8, seed=0, max_context=32)
    pool = PromptPool([Prompt(i, "", (1, 5 + i, 6 + i)) for i in range(8)], seed=1)
    service = EndlessService()
    cfg = OrchestratorConfig(
        batch_groups=2, group_size=2, steps=2, max_tokens=6, max_concurrent_samples=8, eval_every=0, reward_threads=1
    )
    parts = RunParts(
        engine=engine,
        gate=UniformGate(pool, 2),
        controller=NoopController(),
        scoring=ScoringService(SimAnswerScorer(), 5.0, 1),
        learner=FrozenLearner(model),
        clock=WallClock(),
        episodes=service,
        lifecycle=Episodes(service.settings),
    )
    buffer = Collect()
    summary = anyio.run(Orchestrator(parts, cfg, RunOutputs(buffer=buffer), seed=7).run)
    b = summary.budget
    assert summary.steps == 2 and b.rollouts_failed == 0
    rollouts = [r for t in buffer.batches for g in t.groups for r in g.rollouts]
    assert rollouts and all(r.turns.truncated for r in rollouts)
    assert all(3 + len(r.token_ids) + 4 + 6 > 32 for r in rollouts)  # no room for another turn
    assert b.episodes_truncated_context >= len(rollouts)
