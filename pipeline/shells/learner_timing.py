"""The learner's timing on the async shell's side: two parts, chosen when the run is built.

The clock a run is built with picks one (``pipeline.clock``), as ``LEARNING_BY_CLOCK`` declares
once: ``InlineLearning`` on a virtual or lockstep clock, ``ConcurrentLearning`` on the wall; the
clocks themselves, shared with the engines, know nothing of the shell. Each part carries the tracker's side of the
same choice (``timing``: ``pipeline.core.actions.INLINE`` or ``CONCURRENT``), so the shell and the
tracker cannot disagree, and neither branches on a flag. A part says where the learner's
computations run (``run``: on the event loop, or in a worker thread), whether a learner task
runs beside generation (``start``), and what handing it a ``Train`` means (``hand_over``).

>>> import anyio
>>> anyio.run(InlineLearning().run, sum, [1, 2])
3
>>> InlineLearning.timing.slots, ConcurrentLearning.timing.slots
(1, 2)
>>> from pipeline.clock import LockstepClock
>>> type(learning_for(LockstepClock())).__name__
'InlineLearning'
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.clock import LockstepClock, VirtualClock, WallClock
from pipeline.core.actions import CONCURRENT, INLINE, LEARNER_SLOTS, LearnerTiming, Train

Learn = Callable[[Train], Awaitable[Any]]
"""One learner step on a ``Train``, answered with its ``StepDone`` (``pipeline.shells.learning.LearnerStep``)."""
Answer = Callable[[Any], Awaitable[None]]
"""Hand the tracker a message and carry out what it returns (the tracking loop's)."""


class InlineLearning:
    """Each batch is trained on the event loop the moment it is handed out, inside the tick
    that handed it out: no learner task, no thread."""

    timing: LearnerTiming = INLINE

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A learner computation, here and now."""
        return fn(*args)

    def start(self, tg: TaskGroup, learn: Learn, inbox: MemoryObjectSendStream) -> None:
        """Nothing trains beside generation."""

    async def hand_over(self, train: Train, learn: Learn, answer: Answer) -> None:
        """Train now, and answer with its ``StepDone`` before anything else happens."""
        await answer(await learn(train))

    def close(self) -> None:
        """Nothing to close."""


class ConcurrentLearning:
    """A learner task trains each batch in a worker thread while generation goes on, and posts
    its ``StepDone`` to the tracking loop."""

    timing: LearnerTiming = CONCURRENT

    def __init__(self) -> None:
        self._batches: MemoryObjectSendStream | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A learner computation, in a worker thread (the event loop goes on)."""
        return await anyio.to_thread.run_sync(fn, *args)

    def start(self, tg: TaskGroup, learn: Learn, inbox: MemoryObjectSendStream) -> None:
        """The learner task, fed by a stream that never blocks the tracking loop: the tracker
        hands the learner at most ``LEARNER_SLOTS`` batches, the one training and the one this
        stream holds."""
        self._batches, batches = anyio.create_memory_object_stream[Train](LEARNER_SLOTS - 1)
        tg.start_soon(self._learner_loop, batches, learn, inbox.clone())

    async def hand_over(self, train: Train, learn: Learn, answer: Answer) -> None:
        """To the learner task (room: the tracker counts the learner's batches)."""
        self._batches.send_nowait(train)

    def close(self) -> None:
        """No more batches (the tracking loop has ended)."""
        if self._batches is not None:
            self._batches.close()

    async def _learner_loop(
        self, batches: MemoryObjectReceiveStream, learn: Learn, inbox: MemoryObjectSendStream
    ) -> None:
        async with batches, inbox:
            async for train in batches:
                done = await learn(train)
                await inbox.send(done)


LEARNING_BY_CLOCK: dict[type, type[InlineLearning] | type[ConcurrentLearning]] = {
    VirtualClock: InlineLearning,  # learning takes no engine time: same results, reproducible runs
    LockstepClock: InlineLearning,  # orchestrator.deterministic: each batch at the same point every time
    WallClock: ConcurrentLearning,  # learning takes real time: a learner task trains beside generation
}
"""The learner's timing a run on each clock has, declared once (a clock of a class not named here
takes its nearest base class's)."""


def learning_for(clock: object) -> InlineLearning | ConcurrentLearning:
    """A fresh learner-timing part for a run on ``clock`` (``LEARNING_BY_CLOCK``)."""
    for cls in type(clock).__mro__:
        part = LEARNING_BY_CLOCK.get(cls)
        if part is not None:
            return part()
    raise TypeError(
        f"no learner timing is declared for a {type(clock).__name__}; use a clock of pipeline.clock "
        "(VirtualClock, LockstepClock, WallClock) or a subclass of one"
    )
