"""One record per sample, in one table: where every sample of the run stands.

A sample is queued when a gate or controller asks for it, running once the tracker starts it
on the engine, cancelled when its group is abandoned (or the run ends) while its stream is
still open, ended when its stream brought its final event and its score (an episode's turn:
its environment's answer) is on the way, and gone from the table when the tracker has seen
that answer or its stream ended as an abort. ``Samples`` holds every record and is the only
writer of them; what the run asks about samples in flight is counted from it:

* ``started``: samples holding an engine slot (running, cancelled or ended), which the
  concurrency limit ``orchestrator.max_concurrent_samples`` caps;
* ``in_flight(group_id)``: what a ``GroupSnapshot`` reports, a group's started and queued samples;
* ``started_of(group_id)``: the samples a group's abandonment cancels;
* ``streaming(request_id)``: the record whose stream events the ledger counts.

A start makes the sample's ``SampleRequest`` (``Requests.make``): request id
``g<group>-s<index>``, the group's next sample index, the sampling parameters (the run's
defaults or the action's) with a seed derived from the run seed, the group and the index
(``pipeline.seeding.sample_seed``), the engine time of the launch and the decision that caused it.

An episode (``pipeline.core.episodes``) is one sample whose record moves from turn to turn: each
turn is its own request, and ``next_turn`` files the record under the new turn's request id.
How a sample runs from its start to its end is the run mode's ``Lifecycle``
(``pipeline.core.lifecycles``), the part the tracker is built with.

>>> from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.core.group import GroupRun
>>> from pipeline.types import Prompt, SampleRequest, SamplingParams
>>> group = GroupRun(0, Prompt(0, "", (1,)), target_size=2, opened_step=0)
>>> table = Samples(capacity=1)
>>> table.queue(group, 2)
>>> sample = table.next_queued()
>>> table.start(sample, SampleRequest("g0-s0", 0, 0, group.prompt, SamplingParams()))
>>> table.next_queued() is None, table.started, table.in_flight(0)  # the one slot is taken
(True, 1, 2)
>>> Requests(OrchestratorConfig(), seed=0).make(sample, index=5).request_id
'g0-s5'
>>> table.end(sample); table.finish("g0-s0").state, table.started
(<SampleState.ENDED: 'ended'>, 0)
>>> table.end(sample)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipeline.core.samples.SampleTransitionError: sample g0-s0 of group 0 is ended: it cannot end (only a running or cancelled sample can); ...
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.config.sections import OrchestratorConfig
from pipeline.seeding import sample_seed
from pipeline.types import BranchSpec, SampleRequest, SamplingParams


class SampleState(enum.Enum):
    QUEUED = "queued"  # waiting for engine capacity
    RUNNING = "running"  # its stream is open
    CANCELLED = "cancelled"  # its stream is open, but its group was abandoned (or the run is over)
    ENDED = "ended"  # its stream ended; its score (an episode's turn: its environment's answer) is on the way


_STREAMING = (SampleState.RUNNING, SampleState.CANCELLED)


class SampleTransitionError(RuntimeError):
    """A sample was asked to move where its state does not lead (a bug in the tracker or in a
    shell that hands it messages out of order); the message names the sample and its state."""


class Sample:
    """One sample: its group, how it was asked for (sampling params, branch, origin decision),
    its request once started (an episode's: the current turn's), its state and the tokens its
    stream's deltas carried so far. Written only by ``Samples``."""

    __slots__ = ("group", "params", "branch", "origin", "request", "state", "streamed")

    def __init__(self, group: Any, params: SamplingParams | None, branch: BranchSpec | None, origin: int):
        self.group = group  # the tracker's GroupRun
        self.params, self.branch, self.origin = params, branch, origin
        self.request: SampleRequest | None = None
        self.state = SampleState.QUEUED
        self.streamed = 0

    @property
    def request_id(self) -> str:
        """Its (current turn's) request id; "" while queued."""
        return self.request.request_id if self.request is not None else ""

    @property
    def cancelled(self) -> bool:
        """Its group was abandoned (or the run ended) before its stream did."""
        return self.state is SampleState.CANCELLED

    def describe(self) -> str:
        name = self.request.request_id if self.request is not None else "(queued)"
        return f"sample {name} of group {self.group.group_id}"


class Samples:
    """Every sample that is queued or started and not yet done, and the counts derived from
    them (module docstring). ``capacity``: the most samples started at once."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._queue: deque[Sample] = deque()
        self._live: dict[str, Sample] = {}  # started and not done, by (current) request id
        self._of_group: dict[int, dict[str, Sample]] = {}  # the same, by group
        self._queued_of: dict[int, int] = {}  # queued samples by group

    # --- what the run reads ----------------------------------------------------------------

    @property
    def started(self) -> int:
        """Samples holding an engine slot: started and not yet done."""
        return len(self._live)

    def __len__(self) -> int:
        """Samples queued (a closed group's are dropped when their turn comes)."""
        return len(self._queue)

    def in_flight(self, group_id: int) -> int:
        """The group's samples started and not done, plus its queued ones (as good as running)."""
        return len(self._of_group.get(group_id, ())) + self._queued_of.get(group_id, 0)

    def started_in(self, group_id: int) -> int:
        """The group's samples started and not done."""
        return len(self._of_group.get(group_id, ()))

    def started_of(self, group_id: int) -> list[Sample]:
        """The group's samples started and not done, in the order they started."""
        return list(self._of_group.get(group_id, {}).values())

    def get(self, request_id: str) -> Sample | None:
        return self._live.get(request_id)

    def streaming(self, request_id: str) -> Sample | None:
        """The sample whose stream ``request_id`` is, while that stream is open."""
        sample = self._live.get(request_id)
        return sample if sample is not None and sample.state in _STREAMING else None

    def streaming_ids(self) -> set[str]:
        """The request ids of every open stream."""
        return {rid for rid, s in self._live.items() if s.state in _STREAMING}

    def requests(self) -> Iterator[SampleRequest]:
        """The requests of every started sample."""
        return (s.request for s in self._live.values() if s.request is not None)

    # --- transitions ---------------------------------------------------------------------

    def queue(
        self,
        group: Any,
        n: int,
        params: SamplingParams | None = None,
        branch: BranchSpec | None = None,
        origin: int = -1,
    ) -> None:
        """``n`` more samples of ``group`` wait for engine capacity, in order."""
        for _ in range(n):
            self._queue.append(Sample(group, params, branch, origin))
        self._queued_of[group.group_id] = self._queued_of.get(group.group_id, 0) + n

    def next_queued(self) -> Sample | None:
        """The next queued sample to start, while a slot is free (a closed group's are dropped)."""
        while self._queue and len(self._live) < self.capacity:
            sample = self._queue.popleft()
            group_id = sample.group.group_id
            left = self._queued_of[group_id] - 1
            if left:
                self._queued_of[group_id] = left
            else:
                del self._queued_of[group_id]
            if not sample.group.closed:
                return sample
        return None

    def start(self, sample: Sample, request: SampleRequest) -> None:
        """A queued sample starts on the engine as ``request``."""
        if sample.state is not SampleState.QUEUED:
            raise _refused(sample, "start", "a queued sample")
        sample.request, sample.state = request, SampleState.RUNNING
        self._file(sample)

    def cancel(self, request_id: str) -> None:
        """The sample's group was abandoned: what its open stream still brings counts as its
        abort (an ended sample, or one already gone, is left as it is)."""
        sample = self._live.get(request_id)
        if sample is not None and sample.state is SampleState.RUNNING:
            sample.state = SampleState.CANCELLED

    def cancel_all(self) -> None:
        """The run is over: every open stream counts as cut."""
        for sample in self._live.values():
            if sample.state is SampleState.RUNNING:
                sample.state = SampleState.CANCELLED

    def streamed_tokens(self, sample: Sample, n: int) -> None:
        """The sample's stream carried ``n`` more tokens."""
        sample.streamed += n

    def end(self, sample: Sample) -> None:
        """The sample's stream brought its final event; its score is on the way."""
        if sample.state not in _STREAMING:
            raise _refused(sample, "end", "a running or cancelled sample")
        sample.state = SampleState.ENDED

    def next_turn(self, request_id: str, request: SampleRequest) -> None:
        """The episode whose turn ``request_id`` was answered starts its next turn as ``request``."""
        sample = self._take_ended(request_id, "take another turn")
        sample.request, sample.state, sample.streamed = request, SampleState.RUNNING, 0
        self._file(sample)

    def finish(self, request_id: str) -> Sample:
        """The tracker has seen the answer to the sample ``request_id``: it is done."""
        return self._take_ended(request_id, "finish")

    def drop(self, sample: Sample) -> None:
        """The sample ended as an abort (its stream cut, or its episode closed between turns):
        it is done and its engine slot free."""
        if sample.state is SampleState.QUEUED or self._live.get(sample.request.request_id) is not sample:
            raise _refused(sample, "be dropped", "a started sample")
        self._unfile(sample)

    # --- the indexes -----------------------------------------------------------------------

    def _take_ended(self, request_id: str, what: str) -> Sample:
        """The ended sample ``request_id``, out of the indexes (refused unless it is ended)."""
        sample = self._live.get(request_id)
        if sample is None:
            raise _missing(request_id)
        if sample.state is not SampleState.ENDED:
            raise _refused(sample, what, "an ended sample")
        self._unfile(sample)
        return sample

    def _file(self, sample: Sample) -> None:
        rid = sample.request.request_id
        self._live[rid] = sample
        self._of_group.setdefault(sample.group.group_id, {})[rid] = sample

    def _unfile(self, sample: Sample) -> None:
        rid = sample.request.request_id
        del self._live[rid]
        group_id = sample.group.group_id
        of_group = self._of_group[group_id]
        del of_group[rid]
        if not of_group:
            del self._of_group[group_id]


class Requests:
    """Makes the request of each sample the tracker starts (module docstring)."""

    def __init__(self, config: OrchestratorConfig, seed: int, now: Callable[[], float] = lambda: 0.0):
        self.seed, self.now = seed, now
        self._default = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens)

    def make(self, sample: Sample, index: int) -> SampleRequest:
        """The request of ``sample``, sample ``index`` of its group."""
        group = sample.group
        base = sample.params or self._default
        params = SamplingParams(
            base.temperature, base.top_p, base.max_tokens, sample_seed(self.seed, group.group_id, index)
        )
        return SampleRequest(
            request_id=f"g{group.group_id}-s{index}",
            group_id=group.group_id,
            sample_index=index,
            prompt=group.prompt,
            params=params,
            branch=sample.branch,
            launch_time=self.now(),
            origin=sample.origin,
        )


def _missing(request_id: str) -> SampleTransitionError:
    return SampleTransitionError(
        f"sample {request_id} is not in the table: it was never started or is already done; "
        "a shell hands the tracker each sample's answer once, after its final event"
    )


def _refused(sample: Sample, what: str, only: str) -> SampleTransitionError:
    return SampleTransitionError(
        f"{sample.describe()} is {sample.state.value}: it cannot {what} (only {only} can); "
        "a shell hands the tracker a sample's events in stream order and its answer once"
    )
