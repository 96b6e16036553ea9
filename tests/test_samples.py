"""The sample table: one record per sample, its transitions, and the counts derived from it."""

import pytest
from stub_gates import AbandonAtFirstEnd

from controller.noop import NoopController
from controller.prompts import PromptPool
from pipeline.config.sections import OrchestratorConfig
from pipeline.core.group import GroupRun
from pipeline.core.messages import SampleDone, Started, StreamCut, Tick
from pipeline.core.samples import Samples, SampleState, SampleTransitionError
from pipeline.core.tracker import GroupTracker
from pipeline.types import (
    FinishReason,
    Prompt,
    SampleFinished,
    SampleRequest,
    SamplingParams,
    ScoredSample,
)


def group(group_id=0):
    return GroupRun(group_id, Prompt(group_id, "", (1,)), target_size=4, opened_step=0)


def request(g, index):
    return SampleRequest(f"g{g.group_id}-s{index}", g.group_id, index, g.prompt, SamplingParams())


def started(table, g, index):
    sample = table.next_queued()
    table.start(sample, request(g, index))
    return sample


def test_a_sample_goes_queued_running_ended_done_and_the_counts_follow():
    table, g = Samples(capacity=8), group()
    table.queue(g, 2)
    assert (len(table), table.started, table.in_flight(0), table.started_in(0)) == (2, 0, 2, 0)
    a = started(table, g, 0)
    assert a.state is SampleState.RUNNING and table.streaming("g0-s0") is a
    assert (len(table), table.started, table.in_flight(0), table.started_of(0)) == (1, 1, 2, [a])
    table.end(a)
    assert a.state is SampleState.ENDED and table.streaming("g0-s0") is None
    assert table.started == 1 and table.in_flight(0) == 2  # counted until its answer is seen
    assert table.finish("g0-s0") is a
    assert (table.started, table.in_flight(0), table.get("g0-s0")) == (0, 1, None)


def test_capacity_caps_the_started_samples_and_a_closed_groups_queue_is_dropped():
    table, g, h = Samples(capacity=1), group(0), group(1)
    table.queue(g, 2)
    table.queue(h, 1)
    a = started(table, g, 0)
    assert table.next_queued() is None  # the one slot is taken
    g.close()
    table.end(a)
    table.finish("g0-s0")
    sample = table.next_queued()  # g's second sample is dropped on the way
    assert sample.group is h and len(table) == 0 and table.in_flight(0) == 0


def test_cancel_marks_an_open_stream_and_a_drop_frees_its_slot():
    table, g = Samples(capacity=8), group()
    table.queue(g, 2)
    a, b = started(table, g, 0), started(table, g, 1)
    table.end(b)
    table.cancel("g0-s0")
    table.cancel("g0-s1")  # an ended sample is left as it is: its answer is on the way
    table.cancel("g0-s9")  # one already gone too
    assert a.cancelled and b.state is SampleState.ENDED
    assert table.streaming_ids() == {"g0-s0"}
    table.drop(a)
    assert table.started == 1 and table.started_of(0) == [b]


def test_an_episode_record_moves_from_turn_to_turn():
    table, g = Samples(capacity=8), group()
    table.queue(g, 1)
    episode = started(table, g, 0)
    table.streamed_tokens(episode, 3)
    table.end(episode)
    following = SampleRequest("g0-s0-t1", 0, 0, g.prompt, SamplingParams())
    table.next_turn("g0-s0", following)
    assert table.get("g0-s0") is None and table.streaming("g0-s0-t1") is episode
    assert episode.streamed == 0 and table.started == 1 and table.in_flight(0) == 1


@pytest.mark.parametrize(
    "move, match",
    [
        (lambda t, s: t.start(s, request(s.group, 0)), "sample g0-s0 of group 0 is running: it cannot start"),
        (lambda t, s: t.next_turn("g0-s0", request(s.group, 1)), "is running: it cannot take another turn"),
        (lambda t, s: t.finish("g0-s0"), "sample g0-s0 of group 0 is running: it cannot finish"),
        (lambda t, s: t.finish("g0-s7"), "sample g0-s7 is not in the table"),
    ],
)
def test_impossible_transitions_are_refused_naming_the_sample(move, match):
    table, g = Samples(capacity=8), group()
    table.queue(g, 1)
    sample = started(table, g, 0)
    with pytest.raises(SampleTransitionError, match=match):
        move(table, sample)


def test_a_dropped_sample_cannot_end_or_be_dropped_again():
    table, g = Samples(capacity=8), group()
    table.queue(g, 1)
    sample = started(table, g, 0)
    table.drop(sample)
    with pytest.raises(SampleTransitionError, match="sample g0-s0 of group 0 .* cannot be dropped"):
        table.drop(sample)
    table.queue(g, 1)
    queued = table.next_queued()
    with pytest.raises(SampleTransitionError, match=r"sample \(queued\) of group 0 is queued: it cannot end"):
        table.end(queued)


def test_the_tracker_counts_from_the_table_through_an_abandonment():
    """Group 0 is abandoned at its first score: its running sibling is cancelled, its cut frees
    the slot, and the snapshots, the admission room and the budget all read the same records."""
    pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
    cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=1, max_concurrent_samples=2, max_open_groups=1)
    tracker = GroupTracker(AbandonAtFirstEnd(pool, 2), NoopController(), cfg)
    starts = [*tracker.handle(Started()), *tracker.handle(Tick())]
    assert [s.request.request_id for s in starts] == ["g0-s0", "g0-s1"] and tracker.samples.started == 2
    [score] = tracker.handle(SampleFinished("g0-s0", (7,), (0.0,), FinishReason.STOP, 0))
    actions = tracker.handle(SampleDone(ScoredSample(score.request, score.finished, 1.0)))
    assert [type(a).__name__ for a in actions] == ["Cancel"]
    assert tracker.samples.started == 1 and tracker.samples.streaming("g0-s1").cancelled
    tracker.handle(StreamCut("g0-s1", 2, None))
    assert tracker.samples.started == 0 and tracker.budget.rollouts_aborted == 1
    restarted = tracker.handle(Tick())
    assert [s.request.request_id for s in restarted] == ["g1-s0", "g1-s1"]
