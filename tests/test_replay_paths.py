"""The two replay paths make the same decisions: ``bench replay``'s direct driver
(``railgate.replay.driver.replay_gate``) and the pipeline over the replay engine
(``railgate.replay.pipeline_run.replay_through_pipeline``), given one config, one log and one
order, give equal outcomes, prompt for prompt: verdict, samples, tokens and ``decided_at``.

The logs are synthetic: a few hundred groups of K samples with pass rates from all-wrong to
all-right, lengths that vary within a group and repeat (so samples of one group, and of groups
launched together, finish at the same engine time and ties must break by launch order), and a
reference log-likelihood near each pass rate. The gates run at batch sizes that leave a partial
last batch, and some abandon while siblings stream (abort costs)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config.build import ConfigError
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.store.grouplog import GroupLogWriter, RecordedGroup, RecordedSample, read_group_log
from railgate.build import build_components
from railgate.config import load_config
from railgate.replay.driver import replay, replay_gate
from railgate.replay.pipeline_run import run_replay

pytestmark = pytest.mark.timeout(120)

GATES = {
    "uniform": ["gate.kind=uniform"],
    "ds": ["gate.kind=ds"],
    "pilot_commit": ["gate.kind=pilot_commit"],
    "hora": ["gate.kind=hora"],  # capped at the group size by `logged`
    "sara": ["gate.kind=sara"],
    "sara_eager": ["gate.kind=sara", "gate.sara.launch=eager"],
    "sara_ref": ["gate.kind=sara", "gate.sara.reference_prior=true", "replay.reference_exact=true"],
    "sara_ref_skip": [
        "gate.kind=sara",
        "gate.sara.reference_prior=true",
        "gate.sara.reference_skip=0.8",
        "replay.reference_exact=true",
    ],
    "sara_ref_bound_skip": ["gate.kind=sara", "gate.sara.reference_prior=true", "gate.sara.reference_skip=0.8"],
    "oracle": ["gate.kind=oracle"],
}


def synthetic_groups(n: int, k: int, seed: int) -> list[RecordedGroup]:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n):
        p = (0.0, 1.0, *rng.uniform(0.05, 0.95, size=4))[g % 6]
        rewards = (rng.random(k) < p).astype(float)
        # a few lengths shared across the log (ties within and across groups) and some drawn freely
        lengths = rng.choice([8, 16, 24, *rng.integers(5, 200, size=5)], size=k)
        order = np.argsort(lengths, kind="stable")
        finish = np.empty(k, dtype=int)
        finish[order] = np.arange(k)
        samples = tuple(
            RecordedSample(index=i, reward=float(rewards[i]), num_tokens=int(lengths[i]), finish_order=int(finish[i]))
            for i in range(k)
        )
        q = max(p * rng.uniform(0.5, 1.0), 0.01)
        groups.append(RecordedGroup(g, prompt_id=1000 + g, samples=samples, reference_logprob=float(np.log(q))))
    return groups


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[int, str]:
    """Two logs: 240 groups of K=16 and 200 groups of K=8."""
    out = {}
    for k, n in ((16, 240), (8, 200)):
        d = tmp_path_factory.mktemp(f"log{k}")
        with GroupLogWriter(d, fsync=False) as w:
            w.write(synthetic_groups(n, k, seed=k))
        out[k] = str(d)
    return out


def logged(log: str, order_seed: int, group_size: int, batch: int, *overrides: str):
    return load_config(
        None,
        [
            "engine.kind=replay",
            f"replay.log={log}",
            f"replay.order_seed={order_seed}",
            f"orchestrator.group_size={group_size}",
            f"orchestrator.batch_groups={batch}",
            f"gate.hora.max_group_size={group_size}",
            *overrides,
        ],
    )


def both_paths(cfg):
    order = ReplayOrder(read_group_log(cfg.replay.log), cfg.replay.order_seed)
    o = cfg.orchestrator
    fast = replay_gate(cfg, order, o.group_size, o.batch_groups, cfg.replay.rate)
    return fast, run_replay(cfg)


def assert_same(fast, pipeline) -> None:
    assert len(fast) == len(pipeline.outcomes)
    diffs = [(a, b) for a, b in zip(fast, pipeline.outcomes) if a != b]
    assert not diffs, f"{len(diffs)} prompts differ; first: driver {diffs[0][0]} vs pipeline {diffs[0][1]}"


@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("order_seed", [0, 3])
def test_both_paths_decide_alike_at_k16_g8(logs, gate, order_seed):
    """A group of 8 from 16 recorded samples, steps of 3 groups (the last one partial)."""
    cfg = logged(logs[16], order_seed, 8, 3, *GATES[gate])
    fast, pipeline = both_paths(cfg)
    assert_same(fast, pipeline)
    assert pipeline.summary.stop_reason == "prompts exhausted"
    assert pipeline.engine_metrics["replay/not_replayable"] == 0
    # the outcomes are not trivially alike: a gate that decides early leaves some groups short
    if gate in ("sara", "sara_eager", "sara_ref"):
        assert any(o.verdict == "abandoned" for o in fast)
    if gate in ("sara", "sara_ref"):  # a probe of 4 abandoned: the rest never launched
        assert any(o.verdict == "abandoned" and o.samples < 8 for o in fast)
    if gate == "sara_ref_skip":
        assert any(o.verdict == "skipped" for o in fast)


@pytest.mark.parametrize("gate", ["uniform", "ds", "hora", "sara_eager", "sara_ref_skip", "oracle"])
@pytest.mark.parametrize("order_seed", [0, 5])
def test_both_paths_decide_alike_at_full_groups(logs, gate, order_seed):
    """Groups of all K=8 recorded samples, steps of 4 groups, fewer samples at once (launches
    wait for room freed by finishing samples)."""
    cfg = logged(logs[8], order_seed, 8, 4, *GATES[gate], "orchestrator.max_concurrent_samples=40")
    assert_same(*both_paths(cfg))


def test_abort_costs_agree(logs):
    """Eager SARA abandons all-wrong probes while their siblings stream: both paths pay each
    aborted sample the tokens out by then, and the tokens add up to the run's."""
    cfg = logged(logs[16], 1, 8, 2, "gate.kind=sara", "gate.sara.launch=eager")
    fast, pipeline = both_paths(cfg)
    assert_same(fast, pipeline)
    assert pipeline.engine_metrics["replay/aborted"] > 0
    assert sum(o.tokens for o in fast) == pipeline.summary.budget.tokens_generated


@pytest.mark.parametrize("gate", ["uniform", "sara_eager", "oracle"])
def test_a_rollout_budget_ends_both_alike(logs, gate):
    """``orchestrator.max_rollouts`` ends both runs at the same point, groups left open."""
    cfg = logged(logs[8], 2, 8, 3, *GATES[gate], "orchestrator.max_rollouts=333")
    order = ReplayOrder(read_group_log(cfg.replay.log), 2)
    run = replay(cfg, order, 8, 3, cfg.replay.rate)
    pipeline = run_replay(cfg)
    assert_same(run.outcomes, pipeline)
    assert run.end == pipeline.summary.stop_reason == "rollout budget of 333 spent"
    assert any(o.verdict == "skipped" for o in run.outcomes)


def test_the_gate_is_seeded_from_the_run_seed(logs):
    """The oracle draws which saturated groups it pays for: another run seed, another draw, in both paths."""
    outcomes = {}
    for seed in (0, 1):
        cfg = logged(logs[8], 0, 8, 4, "gate.kind=oracle", f"seed={seed}")
        fast, pipeline = both_paths(cfg)
        assert_same(fast, pipeline)
        outcomes[seed] = fast
    assert outcomes[0] != outcomes[1]


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["gate.kind=dps"], "DPS picks prompts again"),
        (["gate.kind=sara_dps"], "DPS picks prompts again"),
        (["gate.kind=hora", "gate.hora.max_group_size=0"], "gate.hora.max_group_size=8 or less"),
        (["gate.kind=sara", "gate.sara.confident_pilot=true"], "log-probability"),
        (["gate.kind=sara", "controller.kind=rail"], "controller.kind=none"),
    ],
)
def test_both_paths_refuse_the_same_gates(logs, overrides, says):
    cfg = logged(logs[8], 0, 8, 4, *overrides)
    if overrides[0] == "gate.kind=hora":  # `logged` caps HORA; this one is uncapped
        cfg = logged(logs[8], 0, 8, 4, "gate.kind=hora", "gate.hora.max_group_size=0")
    order = ReplayOrder(read_group_log(cfg.replay.log), 0)
    with pytest.raises(NotReplayable, match=says):
        replay_gate(cfg, order, 8, 4)
    with pytest.raises(ConfigError, match=says):
        build_components(cfg, progress=False)


def test_a_log_without_reference_scores_is_refused_by_both(tmp_path):
    d = tmp_path / "log"
    with GroupLogWriter(d, fsync=False) as w:
        w.write([RecordedGroup.of(g, g, (1.0, 0.0, 0.0, 1.0)) for g in range(4)])
    cfg = logged(str(d), 0, 4, 2, "gate.kind=sara", "gate.sara.reference_prior=true")
    with pytest.raises(NotReplayable, match="reference_logprob"):
        replay_gate(cfg, ReplayOrder(read_group_log(d)), 4, 2)
    with pytest.raises(ConfigError, match="reference_logprob"):
        build_components(cfg, progress=False)


@pytest.mark.slow
def test_calibrated_reference_prior_agrees(logs):
    """A lower-bound reference fitted online (``reference_calibrate``): slow, as the fit is refitted per group."""
    cfg = logged(
        logs[8], 0, 8, 3, "gate.kind=sara", "gate.sara.reference_prior=true", "gate.sara.reference_calibrate=true"
    )
    assert_same(*both_paths(cfg))
