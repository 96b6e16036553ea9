"""Guidance (issue 45, first slice): the rest of an all-wrong group continues from a prefix of the
prompt's reference response; the prefix stays out of the loss; the trace and the buffer record it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gate_units import admit, checkpoint_roundtrip, closing, kinds, on_step, pool_of, snap, update

from controller.config import SaraConfig
from controller.gates.sara import SaraGate
from controller.guidance import GUIDE_LEVELS, Guidance, guide_len
from learner.packing import BatchError, pack
from pipeline.advantages import grpo_advantages
from pipeline.config.build import ConfigError
from pipeline.core.decisions import gate_decision
from pipeline.store.buffer import read_all, to_record_batch, to_train_batch
from pipeline.store.tracelog import TraceLog, read_trace
from pipeline.types import (
    ActionKind,
    BranchSpec,
    CommittedGroup,
    FinishReason,
    GroupAction,
    Prompt,
    Rollout,
    SampleRequest,
    SamplingParams,
    TrainBatch,
)

REFERENCE = (11, 12, 13, 14, 15)  # 5 tokens: levels 0.25, 0.5, 0.75 give 2, 3, 4


def guided_gate(level: float = 0.5, references: dict | None = None, **sara) -> SaraGate:
    """A SARA gate (G = 8, k = 4) over prompts 0..3 that guides from ``references`` (default:
    prompts 0 and 1 have one, 2 and 3 none)."""
    gate = SaraGate(pool_of(4), group_size=8, config=SaraConfig(guidance=level, **sara))
    gate.attach_guidance(Guidance(references if references is not None else {0: REFERENCE, 1: REFERENCE}, level))
    return gate


def opened(gate: SaraGate, prompt_id: int) -> int:
    """Admit until a group of ``prompt_id`` opens; its group id."""
    for _ in range(8):
        for plan in admit(gate, 1):
            if plan.prompt.prompt_id == prompt_id:
                return plan.group_id
            gate.on_closed(closing(plan.group_id), committed=False)
    raise AssertionError(f"prompt {prompt_id} never opened")


# --- the prefix ------------------------------------------------------------------------------


def test_the_prefix_is_the_ceiling_of_the_level_times_the_reference_and_leaves_the_end_to_the_policy():
    assert [guide_len(5, level) for level in GUIDE_LEVELS] == [2, 3, 4]
    assert [guide_len(4, level) for level in GUIDE_LEVELS] == [1, 2, 3]  # no float rounding up
    assert guide_len(1, 0.25) == 1
    guide = Guidance({0: REFERENCE, 9: ()}, level=0.75)
    b = guide.branch(0)
    assert b is not None and b.guided and b.prefix_token_ids == (11, 12, 13, 14) and b.prefix_logprobs == ()
    assert guide.branch(9) is None  # an empty reference is no reference
    with pytest.raises(ValueError, match=r"level=0.3 must be one of \(0.25, 0.5, 0.75\)"):
        Guidance({}, level=0.3)


def test_a_guided_request_knows_its_reference_tokens_and_an_ordinary_branch_has_none():
    p = Prompt(0, "", (1,))
    guided = SampleRequest("g0-s4", 0, 4, p, SamplingParams(), branch=Guidance({0: REFERENCE}, 0.5).branch(0))
    branched = SampleRequest("g0-s5", 0, 5, p, SamplingParams(), branch=BranchSpec("g0-s0", 2, (5, 6), (-0.1, -0.2)))
    assert (guided.guide_len, guided.guide_level, guided.prefix_len) == (3, 0.5, 3)
    assert (branched.guide_len, branched.guide_level, branched.prefix_len) == (0, 0.0, 2)


# --- the gate's fixed rule -----------------------------------------------------------------


def test_an_all_wrong_probe_with_a_reference_gets_the_rest_of_its_group_guided_and_commits_once_mixed():
    gate = guided_gate()
    gid = opened(gate, 0)
    actions = update(gate, snap(gid, 0, (0, 0, 0, 0)))
    assert kinds(actions) == [("launch", gid, 4)]
    branch = actions[0].branch
    assert branch is not None and branch.guide_level == 0.5 and branch.prefix_token_ids == REFERENCE[:3]
    assert update(gate, snap(gid, 0, (0, 0, 0, 0, 0), in_flight=3)) == []  # waits for the guided ones
    assert kinds(update(gate, snap(gid, 0, (0, 0, 0, 0, 0, 1), in_flight=2))) == [("commit", gid, 0)]
    m = gate.metrics()
    assert (m["gate/guide"], m["gate/commit_guided"], m["gate/guide_groups"], m["gate/guide_rollouts"]) == (1, 1, 1, 4)
    assert "gate/abandon" not in m


def test_an_annealed_guidance_halves_its_prefix_from_the_anneal_step_on():
    """QuestA's schedule: 50% of the reference before learner step 3, 25% from it on."""
    gate = SaraGate(pool_of(4), group_size=8, config=SaraConfig(guidance=0.5, guidance_anneal_step=3))
    gate.attach_guidance(Guidance({p: REFERENCE for p in range(4)}, 0.5, anneal_step=3))
    levels = []
    for step in (0, 2, 3, 9):
        [plan] = gate.admit(range(step, step + 1), step)
        [launch] = update(gate, last := snap(plan.group_id, plan.prompt.prompt_id, (0, 0, 0, 0)))
        levels.append((launch.branch.guide_level, len(launch.branch.prefix_token_ids)))
        gate.on_closed(closing(last), committed=False)
    assert levels == [(0.5, 3), (0.5, 3), (0.25, 2), (0.25, 2)]
    assert gate.metrics()["gate/guide_level"] == 0.25


def test_a_guided_group_that_stays_all_wrong_is_abandoned_once_its_guided_rollouts_end():
    gate = guided_gate()
    gid = opened(gate, 1)
    assert kinds(update(gate, snap(gid, 1, (0,) * 4))) == [("launch", gid, 4)]
    assert kinds(update(gate, snap(gid, 1, (0,) * 8))) == [("abandon", gid, 0)]
    assert gate.metrics()["gate/abandon_guided"] == 1.0


def test_a_prompt_without_a_reference_is_never_guided_and_is_counted():
    gate = guided_gate()
    gid = opened(gate, 2)
    assert kinds(update(gate, snap(gid, 2, (0,) * 4))) == [("abandon", gid, 0)]
    m = gate.metrics()
    assert m["gate/guide_no_reference"] == 1.0 and m["gate/guide_groups"] == 0.0 and m["gate/abandon"] == 1.0


def test_an_all_right_probe_is_abandoned_as_before_and_a_mixed_one_commits_as_before():
    gate = guided_gate()
    gid = opened(gate, 0)
    assert kinds(update(gate, snap(gid, 0, (1,) * 4))) == [("abandon", gid, 0)]
    gid = opened(gate, 0)
    assert kinds(update(gate, snap(gid, 0, (1, 0, 0, 0)))) == [("launch", gid, 4), ("commit", gid, 0)]
    assert gate.metrics()["gate/guide_groups"] == 0.0


def test_without_guidance_the_gate_decides_exactly_as_before():
    plain, guided = SaraGate(pool_of(4), group_size=8), guided_gate(references={})
    for gate in (plain, guided):
        gid = opened(gate, 0)
        assert kinds(update(gate, snap(gid, 0, (0,) * 4))) == [("abandon", gid, 0)]
    assert "gate/guide_groups" not in plain.metrics()
    assert plain.state_dict().keys() == {"source", "groups", "verdicts", "carried"}


def test_the_guided_rollouts_do_not_count_as_draws_of_the_prompts_own_pass_rate():
    gate = guided_gate(history_discount=1.0)
    gid = opened(gate, 0)
    update(gate, snap(gid, 0, (0,) * 4))
    update(gate, last := snap(gid, 0, (0, 0, 0, 0, 1, 1, 1, 0)))
    gate.on_closed(closing(last, committed=True), committed=True)
    unguided = [Rollout(f"g{gid}-s{i}", i, (1,), (3, 2), (0.0, 0.0), 0.0, FinishReason.STOP, 0) for i in range(4)]
    guided = [
        Rollout(
            f"g{gid}-s{i}",
            i,
            (1,),
            (11, 12, 13, 9, 2),
            (0.0,) * 5,
            float(i < 7),
            FinishReason.STOP,
            0,
            guide_len=3,
            guide_level=0.5,
        )
        for i in range(4, 8)
    ]
    group = CommittedGroup(gid, 0, tuple(unguided + guided), launched=8, tokens=20)
    assert group.unguided == (0, 4) and group.successes == 3
    on_step(gate, 0, TrainBatch(0, (group,)))
    assert gate._carried[0] == (1.0, 5.0)  # the uniform prior plus the probe's four failures


def test_guidance_settings_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"gate.sara.guidance=0.4 must be 0 \(off\) or a share"):
        SaraConfig(guidance=0.4)
    with pytest.raises(ConfigError, match="use launch 'probe_first' or 'streaming', or guidance=0"):
        SaraConfig(guidance=0.5, launch="eager")
    with pytest.raises(ConfigError, match="guidance_anneal_step=5 must be >= 0, and 0 while gate.sara.guidance is 0"):
        SaraConfig(guidance_anneal_step=5)
    gate = SaraGate(pool_of(2), group_size=8, config=SaraConfig(guidance=0.25))
    with pytest.raises(ValueError, match="set gate.sara.guidance=0.5 or attach one of that level"):
        gate.attach_guidance(Guidance({}, 0.5))


def test_the_guidance_counters_and_a_guided_group_survive_a_checkpoint():
    gate = guided_gate()
    gid = opened(gate, 0)
    update(gate, snap(gid, 0, (0,) * 4))
    restored = checkpoint_roundtrip(gate, guided_gate)
    assert restored.metrics()["gate/guide_rollouts"] == 4.0
    assert kinds(update(restored, snap(gid, 0, (0,) * 8))) == [("abandon", gid, 0)]  # still known as guided


# --- the loss and the advantages -------------------------------------------------------------


def mixed_group() -> CommittedGroup:
    """Four unguided failures (the probe), then four rollouts guided at 0.5 (3 reference tokens),
    two of them right."""
    probe = [Rollout(f"g0-s{i}", i, (1, 4), (7, 2), (-1.0, -1.0), 0.0, FinishReason.STOP, 0) for i in range(4)]
    guided = [
        Rollout(
            f"g0-s{i}",
            i,
            (1, 4),
            REFERENCE[:3] + (8, 2),
            (-0.5,) * 5,
            float(i % 2),
            FinishReason.STOP,
            0,
            guide_len=3,
            guide_level=0.5,
        )
        for i in range(4, 8)
    ]
    return CommittedGroup(0, 0, tuple(probe + guided), launched=8, tokens=16)


def test_guidance_tokens_never_enter_the_loss_while_the_continuation_does():
    group = mixed_group()
    for share in (True, False):
        chunk = pack(group.rollouts, [0.0] * 8, pad_id=0, micro_batch=16, share_prompts=share)[0]
        mask = chunk.loss_mask.numpy()
        for row, i in enumerate(chunk.index):
            r = group.rollouts[i]
            n, g = len(r.token_ids), r.guide_len
            assert not mask[row, :g].any() and mask[row, g:n].all() and not mask[row, n:].any()
            assert chunk.token_mask.numpy()[row, :n].all()  # the reference prefix is in the context
        assert chunk.num_tokens == 4 * 2 + 4 * 2  # the probe's two tokens, the guided ones' own two
    bad = Rollout("g0-s9", 9, (1,), (11, 12), (0.0, 0.0), 1.0, FinishReason.STOP, 0, guide_len=2, guide_level=0.5)
    with pytest.raises(BatchError, match="guide_len=2 for 2 tokens"):
        pack([bad], [0.0], pad_id=0, micro_batch=1)


def test_a_mixed_group_of_guided_and_unguided_members_is_normalised_over_the_whole_group():
    (adv,) = grpo_advantages([mixed_group()])
    rewards = np.array([0, 0, 0, 0, 0, 1, 0, 1], dtype=float)
    expected = (rewards - rewards.mean()) / rewards.std(ddof=1)  # GRPO: the sample std of the whole group
    assert np.allclose(adv, expected, atol=1e-5)
    # The probe's failures are pushed down relative to the whole group, guided successes included.
    assert all(a < 0 for a in adv[:4]) and adv[5] > 0 and adv[7] > 0
    assert math.isclose(sum(adv), 0.0, abs_tol=1e-9)


# --- what the run writes ---------------------------------------------------------------------


def test_the_buffer_keeps_each_rollouts_guidance_and_leaves_the_columns_null_without_any():
    batch = TrainBatch(0, (mixed_group(),))
    rb = to_record_batch(batch)
    assert rb.column("guide_len").to_pylist() == [0] * 4 + [3] * 4
    assert rb.column("guide_level").to_pylist() == [0.0] * 4 + [0.5] * 4
    assert to_train_batch(rb) == batch
    plain = TrainBatch(1, (CommittedGroup(1, 0, mixed_group().rollouts[:4], launched=4, tokens=8),))
    assert to_record_batch(plain).column("guide_len").null_count == 4
    assert to_train_batch(to_record_batch(plain)) == plain


def test_the_trace_records_each_guided_launch_with_its_level_and_rollouts(tmp_path):
    branch = Guidance({5: REFERENCE}, 0.25).branch(5)
    action = GroupAction(ActionKind.LAUNCH, 3, n=4, branch=branch, reason="sara guide")
    with TraceLog(tmp_path, run_id="guide") as log:
        for a in (action, GroupAction(ActionKind.COMMIT, 3)):
            log.log_decision(
                gate_decision(
                    log.next_decision_id(),
                    a,
                    prompt=Prompt(5, "", (1,)),
                    rewards=(0.0,) * 4,
                    in_flight=0,
                    launched=4,
                    target_size=8,
                    executed=True,
                    time=1.0,
                    run_id="guide",
                    policy_version=0,
                )
            )
    rows = read_trace(tmp_path).decisions.to_pylist()
    guided, commit = (dict(r["features"]) for r in rows)
    assert (rows[0]["chosen"], guided["guide_level"], guided["guide_tokens"], guided["guided_rollouts"]) == (
        "launch",
        0.25,
        2.0,
        4.0,
    )
    assert "guide_level" not in commit


def test_buffered_guided_rows_read_back_from_disk(tmp_path):
    from pipeline.store.buffer import ArrowBuffer

    with ArrowBuffer(tmp_path) as buf:
        buf.put(TrainBatch(0, (mixed_group(),)))
    table = read_all(tmp_path)
    assert table.column("guide_len").to_pylist() == [0] * 4 + [3] * 4


def screened_guided_gate(rates: dict[int, float], guided: tuple[int, ...]) -> SaraGate:
    """A SARA gate with the exact reference prior (its screen holds log(rate) of each prompt) and
    guidance at 0.5 from references of the prompts ``guided``."""
    from controller.reference import ReferenceScreen

    gate = SaraGate(pool_of(len(rates)), group_size=8, config=SaraConfig(reference_prior=True, guidance=0.5))
    screen = ReferenceScreen({i: (3, 2) for i in rates}, gate.source.peek, exact=True, strength=64, ahead=len(rates))
    screen.update({i: math.log(q) for i, q in rates.items()}, tokens=0)
    gate.attach_reference(screen)
    gate.attach_guidance(Guidance({p: REFERENCE for p in guided}, 0.5))
    return gate


def test_with_guidance_the_screen_opens_the_hard_prompts_it_would_skip_and_their_probe_is_guided():
    """The reference prior skips prompts both too easy and too hard to give a mixed group; with
    guidance the hard ones that have a reference open instead, and their all-wrong probe is guided."""
    gate = screened_guided_gate({0: 0.999, 1: 0.5, 2: 0.001}, guided=(0, 1, 2))
    plans = {p.prompt.prompt_id: p for p in admit(gate, 2)}
    assert sorted(plans) == [1, 2]  # 0 (solved) is skipped, 2 (hard) opens
    m = gate.metrics()
    assert (m["gate/skip_reference"], m["gate/open_to_guide"]) == (1.0, 1.0)
    [launch] = update(gate, snap(plans[2].group_id, 2, (0, 0, 0, 0)))
    assert launch.kind is ActionKind.LAUNCH and launch.n == 4 and launch.branch.guide_level == 0.5
    no_reference = screened_guided_gate({0: 0.001, 1: 0.5}, guided=(1,))
    assert [p.prompt.prompt_id for p in admit(no_reference, 1)] == [1]  # hard and nothing to guide from: skipped
