"""The Arrow buffer: exact round trips, column layout, segments, torn tails, crashes."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from crash_child import kill_after

from pipeline.store.arrowio import SegmentKind, SegmentWriter, TornSegmentWarning
from pipeline.store.buffer import STEPS, ArrowBuffer, BufferFormatError, read_all, to_record_batch, to_train_batch
from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch, Turns


def make_batch(step: int, groups: int = 4, size: int = 3, seed: int = 0, float32_logprobs: bool = True) -> TrainBatch:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(50_000) for _ in range(rng.randint(1, 12)))
        rollouts = []
        for s in range(size):
            n = rng.randint(0, 20)  # an aborted sample may have no tokens
            lp = np.array([rng.gauss(-1.0, 0.5) for _ in range(n)])
            lp = lp.astype(np.float32) if float32_logprobs else lp
            rollouts.append(
                Rollout(
                    request_id=f"s{step}.g{g}.{s}",
                    sample_index=s,
                    prompt_token_ids=prompt,
                    token_ids=tuple(rng.randrange(50_000) for _ in range(n)),
                    logprobs=tuple(float(x) for x in lp),
                    reward=rng.choice([0.0, 1.0, 0.1, 1 / 3]),
                    finish_reason=rng.choice(list(FinishReason)),
                    policy_version=step - rng.randint(0, 2),
                )
            )
        out.append(CommittedGroup(100 * step + g, rng.randrange(1000), tuple(rollouts), size + g, 17 * g + 5))
    return TrainBatch(step, tuple(out))


def test_round_trip_is_exact_for_float32_logprobs():
    batch = make_batch(3, seed=1)
    assert to_train_batch(to_record_batch(batch)) == batch


def test_round_trip_rounds_float64_logprobs_to_float32_only():
    batch = make_batch(3, seed=2, float32_logprobs=False)
    back = to_train_batch(to_record_batch(batch))
    assert back != batch  # float64 log-probs lose precision ...

    def strip(b):
        return [[(r.request_id, r.token_ids, r.reward, r.finish_reason) for r in g.rollouts] for g in b.groups]

    assert strip(back) == strip(batch)  # ... and nothing else does (rewards are float64)
    for g, h in zip(batch.groups, back.groups):
        for r, s in zip(g.rollouts, h.rollouts):
            np.testing.assert_allclose(s.logprobs, r.logprobs, rtol=1e-7, atol=0)


def test_columns_hold_one_row_per_rollout_with_group_columns_repeated():
    batch = make_batch(5, groups=2, size=3, seed=3)
    rb = to_record_batch(batch, advantages=[[0.5, -0.5, 0.0], [1.0, 2.0, 3.0]])
    assert rb.schema.equals(STEPS.schema) and rb.num_rows == 6
    assert rb.column("step").to_pylist() == [5] * 6
    assert rb.column("group_id").to_pylist() == [500] * 3 + [501] * 3
    assert rb.column("group_launched").to_pylist() == [3] * 3 + [4] * 3
    assert rb.column("group_tokens").to_pylist() == [5] * 3 + [22] * 3
    assert rb.column("advantage").to_pylist() == [0.5, -0.5, 0.0, 1.0, 2.0, 3.0]
    first = batch.groups[0].rollouts[0]
    assert rb.column("token_ids")[0].as_py() == list(first.token_ids)
    assert rb.column("finish_reason")[0].as_py() == int(first.finish_reason)
    assert to_record_batch(batch).column("advantage").null_count == 6


def test_persisted_steps_read_back_in_order_and_each_step_round_trips(tmp_path):
    batches = [make_batch(s, seed=s) for s in range(4)]
    with ArrowBuffer(tmp_path, run_id="r") as buf:
        returned = [buf.put(b) for b in batches]
    assert buf.steps_written == 4 and buf.segment_path == tmp_path / "steps-00000.arrows"
    table = read_all(tmp_path)
    assert table.num_rows == sum(b.num_rollouts for b in batches)
    assert pa.Table.from_batches(returned).to_pylist() == table.to_pylist()
    for b in batches:
        rows = table.filter(pc.equal(table.column("step"), b.step))
        assert to_train_batch(rows) == b
    with pytest.raises(ValueError, match="steps"):
        to_train_batch(table)


def test_reopening_appends_a_new_segment(tmp_path):
    with ArrowBuffer(tmp_path) as buf:
        buf.put(make_batch(0))
    with ArrowBuffer(tmp_path) as buf:
        assert buf.segment_path == tmp_path / "steps-00001.arrows"
        buf.put(make_batch(1))
    assert sorted(set(read_all(tmp_path).column("step").to_pylist())) == [0, 1]


def test_without_persist_nothing_is_written(tmp_path):
    buf = ArrowBuffer(tmp_path / "buf", persist=False)
    assert to_train_batch(buf.put(make_batch(0))) == make_batch(0)
    assert not (tmp_path / "buf").exists() and buf.segment_path is None
    ArrowBuffer(None, persist=False).close()
    with pytest.raises(ValueError, match="directory=None"):
        ArrowBuffer(None)


def test_torn_tail_warns_and_keeps_every_complete_step(tmp_path):
    buf = ArrowBuffer(tmp_path)
    sizes = []
    for s in range(3):
        buf.put(make_batch(s, seed=s))
        sizes.append(buf.segment_path.stat().st_size)
    buf.close()
    path = buf.segment_path
    path.write_bytes(path.read_bytes()[: (sizes[1] + sizes[2]) // 2])
    with pytest.warns(TornSegmentWarning, match="steps-00000.arrows"):
        table = read_all(tmp_path)
    assert sorted(set(table.column("step").to_pylist())) == [0, 1]
    assert to_train_batch(table.slice(make_batch(0).num_rollouts)) == make_batch(1, seed=1)


def test_other_version_missing_directory_and_non_arrow_file_raise(tmp_path):
    SegmentWriter(tmp_path, SegmentKind("steps", STEPS.schema, 99), number=0).close()
    with pytest.raises(
        BufferFormatError, match="steps-00000.arrows has steps schema version 99; this reader supports versions 1, 2, 3"
    ):
        read_all(tmp_path)
    with pytest.raises(BufferFormatError, match="missing"):
        read_all(tmp_path / "missing")
    (tmp_path / "steps-00000.arrows").write_bytes(b"PAR1 not arrow")
    with pytest.raises(BufferFormatError, match="not an Arrow IPC stream"):
        read_all(tmp_path)


def test_an_episode_round_trips_with_its_turns_beside_single_responses():
    """Turn columns are null for single responses and hold an episode's structure exactly."""
    batch = make_batch(2, groups=1, size=2, seed=4)
    episode = Rollout(
        "s2.g0.e",
        2,
        (1, 2),
        (7, 8, 3, 9),
        (-0.5, -0.25, 0.0, -1.0),
        1.0,
        FinishReason.STOP,
        2,
        turns=Turns(ends=(2, 4), rewards=(0.0, 1.0), policy_mask=(True, True, False, True)),
    )
    group = batch.groups[0]
    batch = TrainBatch(2, (CommittedGroup(group.group_id, group.prompt_id, (*group.rollouts, episode), 3, 20),))
    table = to_record_batch(batch)
    assert table.column("turn_ends").to_pylist() == [None, None, [2, 4]]
    assert to_train_batch(table) == batch


def test_a_version_1_segment_reads_with_null_turn_columns(tmp_path):
    """Buffers written before multi-turn episodes stay readable."""
    from pipeline.store.buffer import _V1

    v1 = SegmentKind("steps", _V1, 1)
    batch = make_batch(0, seed=5)
    with SegmentWriter(tmp_path, v1, number=0) as writer:
        writer.write(to_record_batch(batch).select(_V1.names))
    table = read_all(tmp_path)
    assert table.column("policy_mask").null_count == table.num_rows == batch.num_rollouts
    assert to_train_batch(table) == batch


def test_batches_that_would_not_round_trip_are_refused():
    batch = make_batch(0, groups=2)
    g0, g1 = batch.groups
    with pytest.raises(ValueError, match="no groups"):
        to_record_batch(TrainBatch(1, ()))
    with pytest.raises(ValueError, match="group 7 of step 0 has no rollouts"):
        to_record_batch(TrainBatch(0, (CommittedGroup(7, 1, (), launched=2, tokens=0),)))
    with pytest.raises(ValueError, match="appears twice"):
        to_record_batch(TrainBatch(0, (g0, g0)))
    with pytest.raises(ValueError, match="advantages has 1 groups"):
        to_record_batch(batch, advantages=[[0.0] * 3])
    with pytest.raises(ValueError, match=f"advantages of group {g1.group_id} has 2 values for 3 rollouts"):
        to_record_batch(batch, advantages=[[0.0] * 3, [0.0] * 2])


CHILD = """
import sys
from pipeline.store.buffer import ArrowBuffer
from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch
buf = ArrowBuffer(sys.argv[1])
for step in range(10**6):
    rollouts = tuple(Rollout(f"{step}.{s}", s, (1, 2), tuple(range(50)), (-0.5,) * 50, 1.0, FinishReason.STOP, step)
                     for s in range(8))
    buf.put(TrainBatch(step, (CommittedGroup(step, 0, rollouts, 8, 400),)))
    print(step + 1, flush=True)
"""


def test_sigkill_mid_run_keeps_every_put_step(tmp_path):
    written = kill_after(CHILD, tmp_path, 20)
    table = read_all(tmp_path)  # may warn about a torn tail; the steps before it must all be there
    steps = table.column("step").to_pylist()
    assert len(steps) % 8 == 0 and len(steps) // 8 >= written
    assert steps == [s for s in range(len(steps) // 8) for _ in range(8)]
