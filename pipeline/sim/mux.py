"""The sim engine's multiplexer: every running request on one timeline, driven by one task.

``SimEngine.stream`` runs a coroutine per request that sleeps on the clock between chunks.
``SimMux`` keeps the same per-request timeline (prefill, then a chunk of ``chunk_tokens`` every
``chunk_tokens / decode_tokens_per_s`` seconds; an abort ends a request with the tokens of its
current chunk produced so far) as entries of one heap ordered by due time, then start order (as the clock wakes streams), and
sleeps on the clock once per distinct due time instead of once per request. A request's
response is drawn whole at ``start`` with the same seeds as ``stream``'s, so the two paths give
the same samples; on a ``VirtualClock`` the mux holds one clock token while it has requests and
none while idle.

>>> import anyio
>>> from pipeline.config.sections import SimConfig
>>> from pipeline.sim.engine import SimEngine
>>> from pipeline.sim.world import SimWorld
>>> from pipeline.types import SampleRequest, SamplingParams, SampleFinished
>>> engine = SimEngine(SimWorld(SimConfig(num_prompts=8, num_eval_prompts=8)))
>>> mux = engine.multiplexer()
>>> for i in range(3):
...     mux.start(SampleRequest(f"r{i}", group_id=0, sample_index=i, prompt=engine.prompt(3),
...                             params=SamplingParams(max_tokens=512, seed=i)))
>>> async def main():
...     ended = []
...     while len(ended) < 3:
...         ended += [rid for rid, event in await mux.next_events() if isinstance(event, SampleFinished)]
...     return sorted(ended)
>>> anyio.run(main), engine.open_requests
(['r0', 'r1', 'r2'], 0)
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Protocol

import anyio

from pipeline.clock import VirtualClock, WallClock, running_event_type
from pipeline.engines.mux import MuxEvent
from pipeline.sim.response import Rendered, SimEngineFault
from pipeline.sim.world import SimPolicyState, SimWorld, Trajectory
from pipeline.types import FinishReason, SampleFinished, SampleRequest, TokenDelta


class SimHost(Protocol):
    """What the multiplexer uses of its ``SimEngine``, which imports this module to offer it:
    the engine's own bookkeeping of requests and its way of drawing a response, so that a request
    started here is the same sample as through ``SimEngine.stream``."""

    world: SimWorld
    clock: VirtualClock | WallClock
    _open: dict[str, Any]

    @property
    def policy_version(self) -> int: ...

    @property
    def state(self) -> SimPolicyState: ...

    def _begin(self, request: SampleRequest) -> tuple[str, bool]: ...

    def _render_request(self, req: SampleRequest, state: SimPolicyState) -> Rendered: ...

    def _remember(self, request_id: str, traj: Trajectory) -> None: ...

    def _forget(self, request_id: str, record: Any) -> None: ...


class _Entry:
    """One running request: its response, how far it is, and when its next event is due."""

    __slots__ = (
        "mux",
        "order",
        "request",
        "rendered",
        "error",
        "fail",
        "version",
        "pos",
        "chunk_start",
        "due",
        "aborted",
        "done",
    )

    def __init__(self, mux: SimMux, order: int, request: SampleRequest, version: int):
        self.mux = mux
        self.order = order  # start order: breaks ties between events due at the same time
        self.request = request
        self.rendered: Rendered | None = None
        self.error: Exception | None = None  # the engine fails this request at the end of its prefill
        self.fail = False
        self.version = version
        self.pos = -1  # new tokens released so far; -1 while in prefill
        self.chunk_start = 0.0
        self.due = 0.0
        self.aborted = False
        self.done = False

    @property
    def trajectory(self) -> Trajectory | None:
        """For branching from a running request (``SimEngine._trajectory_of``)."""
        return self.rendered.trajectory if self.rendered is not None else None

    def abort(self) -> None:
        """``SimEngine.abort`` of this request."""
        self.mux.abort(self.request.request_id)

    def close(self) -> None:
        """The engine is closing: forget the request without an event."""
        self.mux._forget(self)


class SimMux:
    """``StreamMux`` of a ``SimEngine``; see the module docstring (``engine.multiplexer()``)."""

    def __init__(self, engine: SimHost):
        self._engine = engine
        self._clock = engine.clock
        self._virtual = isinstance(engine.clock, VirtualClock)
        cfg = engine.world.config
        self._chunk, self._rate, self._prefill = cfg.chunk_tokens, cfg.decode_tokens_per_s, cfg.prefill_s
        self._heap: list[tuple[float, int, _Entry]] = []
        self._order = itertools.count()
        self._entries: dict[str, _Entry] = {}
        self._aborted: list[_Entry] = []  # ended by abort(): their final event is due now
        self._token = 0  # the clock token, held while there are entries (VirtualClock)
        self._sleeping_until = float("-inf")  # while the consumer waits: when it wakes by itself
        self._wakeup: Any = None
        self._closed = False

    # --- StreamMux ------------------------------------------------------------------------

    def start(self, request: SampleRequest) -> None:
        if self._closed:
            raise RuntimeError(
                f"start({request.request_id!r}) on a closed multiplexer; take a new one from engine.multiplexer()"
            )
        eng = self._engine
        rid, fail = eng._begin(request)
        entry = _Entry(self, next(self._order), request, eng.policy_version)
        entry.fail = fail
        try:
            entry.rendered = eng._render_request(request, eng.state)
        except Exception as exc:  # a bad branch source: a failed sample, not a failed run
            entry.error = exc
        eng._open[rid] = entry
        self._entries[rid] = entry
        if not self._token and self._virtual:
            self._token = self._clock.register()
        self._schedule(entry, max(self._clock.now(), request.launch_time) + self._prefill)

    def abort(self, request_id: str) -> None:
        entry = self._entries.get(request_id)
        if entry is None or entry.aborted:
            return
        entry.aborted = True
        self._aborted.append(entry)
        self._poke(self._clock.now())

    async def next_events(self) -> list[MuxEvent]:
        while True:
            if self._closed:
                raise RuntimeError("next_events() on a closed multiplexer")
            out: list[MuxEvent] = []
            if self._aborted:
                aborted, self._aborted = self._aborted, []
                for entry in aborted:
                    if not entry.done:
                        out.append((entry.request.request_id, self._abort_final(entry)))
            heap, now = self._heap, self._clock.now()
            while heap and heap[0][0] <= now:
                entry = heapq.heappop(heap)[2]
                if not entry.done and not entry.aborted:
                    self._advance(entry, out)
            if out:
                return out
            await self._wait()

    def close(self) -> list[SampleFinished]:
        finals = [self._abort_final(entry) for entry in list(self._entries.values())]
        self._closed = True
        self._heap.clear()
        self._aborted.clear()
        if self._token:
            self._clock.unregister(self._token)
            self._token = 0
        self._poke(self._clock.now())
        return finals

    # --- the timeline ---------------------------------------------------------------------

    def _schedule(self, entry: _Entry, t: float) -> None:
        entry.due = t
        heapq.heappush(self._heap, (t, entry.order, entry))
        self._poke(t)

    def _advance(self, entry: _Entry, out: list[MuxEvent]) -> None:
        """``entry``'s event due now: the end of its prefill, or its next chunk."""
        rid = entry.request.request_id
        if entry.pos < 0:  # the prefill is over
            if entry.fail or entry.error is not None:
                error = entry.error or SimEngineFault(f"injected engine failure on request {rid}")
                self._forget(entry)
                out.append((rid, error))
                return
            entry.pos = 0
            self._next_chunk(entry, out)
            return
        r = entry.rendered
        i = entry.pos
        j = min(i + self._chunk, len(r.tokens))
        out.append((rid, TokenDelta(rid, r.tokens[i:j], r.logprobs[i:j], r.entropies[i:j], r.start_pos + i)))
        entry.pos = j
        self._next_chunk(entry, out)

    def _next_chunk(self, entry: _Entry, out: list[MuxEvent]) -> None:
        r = entry.rendered
        i, n = entry.pos, len(r.tokens)
        if i >= n:
            self._engine._remember(entry.request.request_id, r.trajectory)
            self._forget(entry)
            out.append((entry.request.request_id, r.finished(n, r.end_reason, entry.version, self._clock.now())))
            return
        entry.chunk_start = entry.due
        self._schedule(entry, entry.due + (min(i + self._chunk, n) - i) / self._rate)

    def _abort_final(self, entry: _Entry) -> SampleFinished:
        """The final event of an aborted request: what its current chunk produced until now."""
        self._forget(entry)
        r, now = entry.rendered, self._clock.now()
        if r is None:
            return SampleFinished(
                entry.request.request_id, (), (), FinishReason.ABORTED, entry.version, engine_time=now
            )
        produced = max(entry.pos, 0)
        if entry.pos >= 0:
            step = min(self._chunk, len(r.tokens) - entry.pos)
            produced += max(0, min(step, int((now - entry.chunk_start) * self._rate)))
        return r.finished(produced, FinishReason.ABORTED, entry.version, now)

    def _forget(self, entry: _Entry) -> None:
        if entry.done:
            return
        entry.done = True
        rid = entry.request.request_id
        if self._entries.get(rid) is entry:
            del self._entries[rid]
        self._engine._forget(rid, entry)

    # --- waiting --------------------------------------------------------------------------

    def _poke(self, t: float) -> None:
        """Something is due at ``t``: wake the consumer if it sleeps past that (a consumer that
        is not waiting has ``_sleeping_until`` at minus infinity: nothing to do)."""
        if t >= self._sleeping_until:
            return
        self._sleeping_until = float("-inf")
        if self._token and self._virtual:
            self._clock.wake(self._token)
        if self._wakeup is not None:
            self._wakeup.set()

    async def _wait(self) -> None:
        """Sleep until the earliest due entry, or until a start or an abort needs us sooner."""
        heap = self._heap
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        if self._virtual and heap:
            if not self._token:
                self._token = self._clock.register()
            self._sleeping_until = heap[0][0]
            try:
                await self._clock.sleep_until(self._token, heap[0][0])
            finally:
                self._sleeping_until = float("-inf")
            return
        if self._token and not self._entries:  # idle: the clock must not wait for us
            self._clock.unregister(self._token)
            self._token = 0
        self._wakeup = running_event_type()()
        self._sleeping_until = heap[0][0] if heap else float("inf")
        try:
            if heap:
                with anyio.move_on_after(max(0.0, heap[0][0] - self._clock.now())):
                    await self._wakeup.wait()
            else:
                await self._wakeup.wait()
        finally:
            self._wakeup = None
            self._sleeping_until = float("-inf")
