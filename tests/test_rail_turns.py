"""RAIL at an episode's turn boundaries: the turn decision point, its features and its branch arm."""

from __future__ import annotations

import pytest

from controller.rail.config import RailConfig
from controller.rail.controller import RailController
from controller.rail.features import group_features
from controller.rail.turns import turn_due
from pipeline.config.sections import EpisodeSettings, OrchestratorConfig
from pipeline.core.actions import INLINE, ForkEpisode, ShellSettings, Start
from pipeline.core.lifecycles import Episodes
from pipeline.core.messages import Started, Tick, TurnDone
from pipeline.core.tracker import GroupTracker
from pipeline.types import ActionKind, BranchSpec, FinishReason, Prompt, SampleFinished, SamplingParams, TurnPoint
from tests.rail_fakes import ListSink, committed, snapshot

FAILED = TurnPoint("g1-s2", turns=1, prefix_len=6, reward=0.0, observation_tokens=3, rewards=(0.0,))
RIGHT = TurnPoint("g1-s2", turns=1, prefix_len=6, reward=1.0, observation_tokens=3, rewards=(1.0,))


def rail(**overrides) -> tuple[RailController, ListSink]:
    """Shadow mode, the ARPO behaviour without exploration: it branches at every turn point."""
    settings = {
        "mode": "shadow",
        "backend": "river",
        "behaviour": "arpo",
        "behaviour_epsilon": 0.0,
        "branch_sizes": (2,),
        "branch_temperatures": (1.0,),
        "resample_sizes": (2,),
        "resample_temperatures": (1.0,),
        **overrides,
    }
    sink = ListSink()
    return RailController(RailConfig(**settings), sink, SamplingParams(max_tokens=8), seed=0), sink


def test_a_failed_turn_is_a_logged_decision_with_the_turn_features_and_its_branch_names_the_boundary():
    controller, sink = rail()
    snap = snapshot(group_id=1, rewards=(1.0, 0.0), in_flight=2, launched=4, tokens=80)
    actions = controller.on_turn(snap, 2, FAILED)
    [record] = sink.by_point("turn")
    assert record.mode == "shadow" and (record.group_id, record.sample_index, record.token_position) == (1, 2, 6)
    f = record.features
    assert f["point_turn"] == 1.0 and f["point_token"] == f["point_rescue"] == f["point_extend"] == 0.0
    assert f["turn_index"] == pytest.approx(0.1) and f["turn_reward"] == 0.0 and f["turn_failed"] == 1.0
    assert f["turn_reward_mean"] == 0.0 and f["observation_tokens"] > 0 and f["episode_tokens"] > 0
    assert f["successes"] == pytest.approx(1 / 8) and f["failures"] == pytest.approx(1 / 8)  # the group's so far
    assert set(record.actions) == {"noop", "branch_b2_t1", "resample_n2_t1"} and record.chosen == "branch_b2_t1"
    [launch] = actions
    assert launch.kind is ActionKind.LAUNCH and launch.n == 2 and launch.origin == record.decision_id
    assert launch.branch == BranchSpec("g1-s2", 6, turns=1)  # the episode after its first turn and the feedback
    assert controller.counts["decisions_turn"] == 1 and controller.counts["interventions_branch"] == 1


def test_the_turn_decision_is_settled_like_the_others_when_its_group_closes():
    controller, sink = rail()
    [launch] = controller.on_turn(snapshot(group_id=1, rewards=(0.0,), in_flight=3, launched=4, tokens=60), 2, FAILED)
    d = launch.origin
    rewards = (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    final = snapshot(group_id=1, rewards=rewards, origins=(-1,) * 4 + (d, d), tokens=120)
    controller.on_closed(committed(1, rewards, length=20), final)
    [(decision_id, reward, tokens)] = sink.outcomes
    assert decision_id == d and tokens > 0 and reward < 0.1389  # the variance gain (5/36) less the price


def test_which_turns_are_decision_points():
    controller, sink = rail()
    snap = snapshot(group_id=1, rewards=(), in_flight=4, launched=4)
    assert controller.on_turn(snap, 0, RIGHT) == [] and not sink.decisions  # a right turn: not by default
    everything, sink = rail(turn_decisions="all")
    everything.on_turn(snap, 0, RIGHT)
    assert [d.decision_point for d in sink.decisions] == ["turn"]
    off, sink = rail(turn_decisions="off")
    assert off.on_turn(snap, 0, FAILED) == [] and not sink.decisions
    # two interventions (the default cap) and the group's turn points are over
    capped, sink = rail()
    for _ in range(3):
        capped.on_turn(snap, 0, FAILED)
    assert len(sink.decisions) == 2 and not turn_due(FAILED, capped._groups[1], capped.config)


def test_single_turn_contexts_have_no_turn_features():
    from controller.rail.features import PrefixInfo

    f = group_features(snapshot(), "token", PrefixInfo(), 40.0, 0, 0)
    assert not [k for k in f if k.startswith("turn") or k in ("point_turn", "episode_tokens", "observation_tokens")]


def test_a_logged_turn_decision_replays_to_the_same_context():
    from controller.rail.arms import parse_arm
    from controller.rail.features import Context
    from controller.rail.replay import _POINTS

    controller, sink = rail()
    controller.on_turn(snapshot(group_id=1, rewards=(0.0,), in_flight=3, launched=4), 2, FAILED)
    [record] = sink.decisions
    features = {k: v for k, v in record.features.items() if not k.startswith("shadow.")}  # as replay reads them
    replayed = Context.build(_POINTS[record.decision_point], features, tuple(map(parse_arm, record.actions)))
    original = controller._groups[1].decisions[0].context
    assert replayed.point == "turn" and replayed.costs == original.costs and replayed.features == original.features


class _Once:
    """A controller that branches once, from sample 0's first turn boundary (as RAIL's arm does)."""

    wants_tokens = False

    def __init__(self):
        self.rail, _ = rail()

    def __getattr__(self, name):
        return getattr(self.rail, name)

    def on_turn(self, snapshot, sample_index, point):
        return self.rail.on_turn(snapshot, sample_index, point) if sample_index == 0 else []


def test_a_branch_waiting_for_capacity_whose_source_ended_starts_as_a_fresh_episode():
    from controller.gates.uniform import UniformGate
    from controller.prompts import PromptPool

    pool = PromptPool([Prompt(i, "", (1, 2)) for i in range(4)], seed=0)
    cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=1, max_open_groups=1, max_concurrent_samples=2)
    settings = EpisodeSettings(max_turns=3, max_episode_tokens=64, turn_tokens=4)
    tracker = GroupTracker(
        UniformGate(pool, 2), _Once(), cfg, shell=ShellSettings(INLINE), lifecycle=Episodes(settings)
    )
    out = [*tracker.handle(Started()), *tracker.handle(Tick())]
    a = [s for s in out if isinstance(s, Start)][0]

    def turn(request, done, reward):
        [step] = tracker.handle(SampleFinished(request.request_id, (7,), (-0.1,), FinishReason.STOP, 0))
        return [*tracker.handle(TurnDone(step.request, step.finished, (5,), reward, done)), *tracker.handle(Tick())]

    after = turn(a.request, done=False, reward=0.0)  # a failed turn: RAIL branches, no capacity left
    following = next(s for s in after if isinstance(s, Start))
    assert following.request.request_id == "g0-s0-t1" and len(tracker.samples) == 2
    ended = turn(following.request, done=True, reward=0.0)  # the source ends before its branches start
    [fresh] = [s for s in ended if isinstance(s, Start)]
    assert fresh.request.request_id == "g0-s2" and fresh.request.branch is None
    assert fresh.request.prompt.token_ids == (1, 2) and not [x for x in ended if isinstance(x, ForkEpisode)]


def test_a_short_agent_run_with_rail_live_forks_branch_episodes_at_failed_turns_and_trains_them(tmp_path):
    import json

    from run_helpers import AGENT_SHORT_RUN, tiny_agent_model

    from configs import CONFIG_DIR
    from pipeline.store.buffer import read_all
    from pipeline.store.tracelog import read_trace
    from railgate.config import load_config
    from railgate.train import train

    path = tiny_agent_model(tmp_path / "model")
    run = tmp_path / "run"
    settings = [
        f"model.path={path}",
        f"run_dir={run}",
        *AGENT_SHORT_RUN,
        "torch_engine.threads=1",
        "controller.kind=rail",
        "controller.rail.mode=live",
        "controller.rail.backend=river",
        "controller.rail.gain_threshold=-1.0",  # a fresh learner intervenes freely
        "controller.rail.token_decisions=false",
        "controller.rail.rescue_on_abandon=false",
        "controller.rail.extend_on_commit=false",
        "controller.rail.branch_sizes=[2]",
        "controller.rail.branch_temperatures=[1.0]",
        "controller.rail.resample_sizes=[]",
        "log.tensorboard=false",
    ]
    train(load_config(CONFIG_DIR / "agent.yaml", settings), progress=False)
    rows = read_trace(run / "trace").joined().to_pylist()
    turns = [r for r in rows if r["decision_point"] == "turn"]
    assert turns and all(r["mode"] == "live" and r["reward"] is not None for r in turns)
    from controller.rail.replay import load_logged

    replayed = load_logged(run / "trace").records  # offline replay and OPE read them
    assert sorted(r.decision_id for r in replayed) == sorted(r["decision_id"] for r in turns)
    assert {r.context.point for r in replayed} == {"turn"}
    trained = read_all(run / "buffer").to_pylist()
    forked = set()  # branch episodes, each once: two decisions of a group can share a prefix
    for d in (r for r in turns if r["chosen"] == "branch_b2_t1"):
        group = [r for r in trained if r["group_id"] == d["group_id"]]
        [source] = [r for r in group if r["sample_index"] == d["sample_index"]]
        keep = d["token_position"]  # the source's turns and the environment's feedback so far
        turns_kept = sum(1 for end in source["turn_ends"] if end <= keep)
        for branch in (r for r in group if r["sample_index"] >= 4):
            if branch["token_ids"][:keep] == source["token_ids"][:keep]:
                forked.add((branch["group_id"], branch["sample_index"]))
                assert branch["turn_rewards"][:turns_kept] == source["turn_rewards"][:turns_kept]
                assert len(branch["turn_ends"]) > turns_kept  # it played on in the forked environment
    assert len(forked) >= 2  # every branch decision launches two episodes; each trained with its group
    budget = json.loads((run / "summary.json").read_text())["budget"]
    assert budget["pipeline/env_failures"] == 0 and budget["pipeline/rollouts_intervention"] >= len(forked)
