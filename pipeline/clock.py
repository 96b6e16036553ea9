"""Engine time: the wall clock for real engines, a discrete-event clock for the simulator.

The simulator must reproduce what a real engine's timing does to a streaming gate: samples
started together finish in order of their lengths, a gate's verdict arrives while siblings
are still generating, an aborted sibling has spent the tokens it produced until then. Sleeping
through that in real time is slow; running the sim flat out loses the order. ``VirtualClock``
does neither: simulated streams ``await clock.sleep_until(t)`` and the clock jumps to the
earliest waiting time once the whole pipeline is *quiescent*:

* every registered stream is waiting on the clock, and
* nobody holds the clock. The orchestrator takes a hold when a sample finishes and ends it
  once the tracker has acted on it (reward, gate, launches, aborts), so that decisions take
  zero engine time and happen before anything later in engine time. It also holds the clock
  from the run's stop until its tasks are over, so the samples still running are all cut at
  the stop's time, whatever order they are cancelled in.

A hold is a token (``Hold``) that ends once: at the end of a ``with`` block over it (an error
included), or, handed on with a message (``Hold.hand_on``, which sends a ``Held``), at the end
of its receiver's ``with`` block. No caller pairs a hold with a release by hand.

``WallClock`` is the same interface over ``time.monotonic``: its holds are inert tokens.

>>> import anyio
>>> clock = VirtualClock()
>>> order = []
>>> async def stream(name, t, token):
...     await clock.sleep_until(token, t)
...     order.append((name, clock.now()))
...     clock.unregister(token)
>>> async def main():
...     async with anyio.create_task_group() as tg:
...         # Register before starting: the clock may not pass a stream that has not waited yet.
...         tg.start_soon(stream, "slow", 2.0, clock.register())
...         tg.start_soon(stream, "fast", 0.5, clock.register())
>>> anyio.run(main)
>>> order
[('fast', 0.5), ('slow', 2.0)]
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, NamedTuple

import anyio


def running_event_type() -> type:
    """The cheapest Event class for the running async backend: ``asyncio.Event`` under asyncio
    (same ``wait``/``set`` surface, no backend lookup per construction), ``anyio.Event`` otherwise.

    >>> async def probe():
    ...     return running_event_type()
    >>> asyncio.run(probe()) is asyncio.Event
    True
    >>> running_event_type() is anyio.Event  # no asyncio loop running (e.g. trio)
    True
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.Event
    return asyncio.Event


class WallClock:
    """Real time since construction. ``sleep_until`` really sleeps; holds do nothing."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def register(self) -> int:
        return 0

    def unregister(self, token: int) -> None:
        return None

    async def sleep_until(self, token: int, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await anyio.sleep(delay)
        else:
            await anyio.lowlevel.checkpoint()

    def wake(self, token: int) -> None:
        return None

    def hold(self) -> Hold:
        """An inert token: real time does not stand still."""
        return Hold(None)


class LockstepClock(WallClock):
    """Real time, with learning inline (``orchestrator.deterministic``): each batch is trained
    on the event loop the moment it fills, at the same point of the run every time (the
    shell's ``pipeline.shells.learner_timing.LEARNING_BY_CLOCK`` says so)."""


class VirtualClock:
    """Discrete-event engine time; see the module docstring. Learning takes no engine time:
    each batch is trained the moment it fills (``pipeline.shells.learner_timing.LEARNING_BY_CLOCK``)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._tokens = itertools.count(1)
        self._active: set[int] = set()
        self._heap: list[tuple[float, int]] = []
        self._waiting: dict[int, Any] = {}  # token -> its waiter (see _new_waiter)
        self._holds = 0
        self._new: Any = None

    def now(self) -> float:
        return self._now

    def register(self) -> int:
        """A new stream that will wait on this clock; the clock cannot advance past it until it waits."""
        token = next(self._tokens)
        self._active.add(token)
        return token

    def unregister(self, token: int) -> None:
        """The stream is finished or closed (idempotent)."""
        self._active.discard(token)
        waiter = self._waiting.pop(token, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._maybe_advance()

    async def sleep_until(self, token: int, t: float) -> None:
        if token not in self._active:
            raise RuntimeError("sleep_until on an unregistered clock token; call register() first")
        if t <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        waiter = self._new_waiter()
        self._waiting[token] = waiter
        heapq.heappush(self._heap, (t, token))
        self._maybe_advance()
        if waiter.done():
            await anyio.lowlevel.checkpoint()  # woken at once: still a cancellation point
        else:
            await waiter

    def _new_waiter(self) -> Any:
        # One waiter per sleep, i.e. per simulated chunk. On asyncio a bare future of the
        # running loop (what asyncio.Event.wait creates anyway, without the Event and its
        # waiter list around it); elsewhere an anyio.Event behind the same done/set_result
        # surface. The backend is looked up once.
        if self._new is None:
            if running_event_type() is asyncio.Event:
                self._new = asyncio.get_running_loop().create_future
            else:
                self._new = _EventWaiter
        return self._new()

    def wake(self, token: int) -> None:
        """Wake a waiting stream now (an abort); its sleep returns at the current time."""
        waiter = self._waiting.pop(token, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def hold(self) -> Hold:
        """Keep time still until the returned token ends (the pipeline is acting on a finished sample)."""
        self._holds += 1
        return Hold(self)

    def _release(self) -> None:
        """A hold ended (only ``Hold.end`` calls this)."""
        if self._holds <= 0:
            raise RuntimeError("VirtualClock: a hold ended that was never taken")
        self._holds -= 1
        self._maybe_advance()

    def _maybe_advance(self) -> None:
        if self._holds or len(self._waiting) < len(self._active) or not self._waiting:
            return
        # Drop heap entries of streams that were woken early or unregistered.
        while self._heap and self._heap[0][1] not in self._waiting:
            heapq.heappop(self._heap)
        if not self._heap:
            return
        t = self._heap[0][0]
        self._now = max(self._now, t)
        while self._heap and self._heap[0][0] <= t:
            _, token = heapq.heappop(self._heap)
            waiter = self._waiting.pop(token, None)
            if waiter is not None and not waiter.done():  # a cancelled sleep's future is done
                waiter.set_result(None)


class Hold:
    """A hold on a clock: time stands still until it ends, and it ends once. Its owner ends it
    by leaving a ``with`` block over it (an error included), or hands it on with a message
    (``hand_on``); the receiver of that ``Held`` then owns it. ``end`` after the end does nothing.

    >>> clock = VirtualClock()
    >>> with clock.hold() as hold:
    ...     clock._holds
    1
    >>> clock._holds, hold.ended
    (0, True)
    """

    __slots__ = ("_clock",)

    def __init__(self, clock: VirtualClock | None):
        self._clock = clock  # None: ended, handed on, or a wall clock's inert token

    @property
    def ended(self) -> bool:
        return self._clock is None

    def end(self) -> None:
        clock, self._clock = self._clock, None
        if clock is not None:
            clock._release()

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    async def hand_on(self, send: Any, message: Any) -> None:
        """Send ``message`` with this hold (``await send(Held(message, hold))``): from then on its
        receiver ends it. Should sending fail, this token still owns the hold (and its ``with``
        block ends it)."""
        await send(Held(message, Hold(self._clock)))
        self._clock = None


class Held(NamedTuple):
    """A message that holds the clock until its receiver has acted on it (a finished sample's
    answer): the receiver owns ``hold`` and ends it."""

    message: Any
    hold: Hold


def end_holds(messages: Any) -> None:
    """The holds of messages that will never be received (a batch whose sending failed) end now."""
    for message in messages:
        if type(message) is Held:
            message.hold.end()


class _EventWaiter:
    """An ``anyio.Event`` with a future's ``done`` / ``set_result`` / ``await`` (non-asyncio backends)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, _value: Any) -> None:
        self._event.set()

    def __await__(self):
        return self._event.wait().__await__()
