"""Engine time: the wall clock for real engines, a discrete-event clock for the simulator.

The simulator must reproduce what a real engine's timing does to a streaming gate: samples
started together finish in order of their lengths, a gate's verdict arrives while siblings
are still generating, an aborted sibling has spent the tokens it produced until then. Sleeping
through that in real time is slow; running the sim flat out loses the order. ``VirtualClock``
does neither: simulated streams ``await clock.sleep_until(t)`` and the clock jumps to the
earliest waiting time once the whole pipeline is *quiescent*:

* every registered stream is waiting on the clock, and
* nobody holds the clock. The orchestrator takes a hold when a sample finishes and releases it
  once the tracker has acted on it (reward, gate, launches, aborts), so that decisions take
  zero engine time and happen before anything later in engine time.

``WallClock`` is the same interface over ``time.monotonic``: holds are no-ops.

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

    def hold(self) -> None:
        return None

    def release(self) -> None:
        return None


class VirtualClock:
    """Discrete-event engine time; see the module docstring."""

    def __init__(self) -> None:
        self._now = 0.0
        self._tokens = itertools.count(1)
        self._active: set[int] = set()
        self._heap: list[tuple[float, int]] = []
        self._waiting: dict[int, anyio.Event] = {}
        self._holds = 0
        self._event_type = None

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
        event = self._waiting.pop(token, None)
        if event is not None:
            event.set()
        self._maybe_advance()

    async def sleep_until(self, token: int, t: float) -> None:
        if token not in self._active:
            raise RuntimeError("sleep_until on an unregistered clock token; call register() first")
        if t <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = self._new_event()
        self._waiting[token] = event
        heapq.heappush(self._heap, (t, token))
        self._maybe_advance()
        if event.is_set():
            await anyio.lowlevel.checkpoint()  # woken at once: still a cancellation point
        else:
            await event.wait()

    def _new_event(self):
        # anyio.Event looks up the running backend on every construction; on asyncio, whose
        # Event has the same wait()/set() surface, that lookup is a measurable share of a
        # simulated rollout's cost, so it is done once.
        if self._event_type is None:
            self._event_type = running_event_type()
        return self._event_type()

    def wake(self, token: int) -> None:
        """Wake a waiting stream now (an abort); its sleep returns at the current time."""
        event = self._waiting.pop(token, None)
        if event is not None:
            event.set()

    def hold(self) -> None:
        """Keep time still until ``release`` (the pipeline is acting on a finished sample)."""
        self._holds += 1

    def release(self) -> None:
        if self._holds <= 0:
            raise RuntimeError("VirtualClock.release() without a matching hold()")
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
            event = self._waiting.pop(token, None)
            if event is not None:
                event.set()
