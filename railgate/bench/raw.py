"""The raw engine of ``bench overhead``: what the pipeline asked of its engine, streamed again
with no pipeline.

``Recorder`` wraps an engine and keeps every request the pipeline streamed through it (through
``stream`` or the engine's multiplexer) and, timed, each stream's span: when it was open and how
many tokens it delivered before it finished or was cut. ``raw_pass`` then streams the same
requests through a fresh engine under the same concurrency limit, driven the same way, each
request the pipeline stopped early aborted after the same tokens, so that the two do the same
work and the difference is what the pipeline costs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import anyio

from pipeline.engines.mux import multiplexer_of
from pipeline.sim.engine import SimEngine
from pipeline.types import SampleFinished, SampleRequest, TokenDelta
from railgate.build import build_components
from railgate.config import RunConfig


@dataclasses.dataclass(slots=True)
class Span:
    """One recorded stream: when it was open (engine-clock seconds) and what it delivered."""

    opened: float
    closed: float = math.nan
    tokens: int = 0
    finished: bool = False  # the stream reached its SampleFinished (not cut by an abort or the run's end)


class Recorder:
    """Wraps an engine and keeps every request it was asked to stream; with ``timed``, also each
    stream's span (that wrapping costs a little per event, so timed recorders are used in untimed
    setup passes only)."""

    def __init__(self, engine: Any, timed: bool = True):
        self._engine = engine
        self._timed = timed
        self.requests: list[SampleRequest] = []
        self.spans: list[Span] = []
        self.name = engine.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, request: SampleRequest):
        self.requests.append(request)
        if not self._timed:
            return self._engine.stream(request)
        span = Span(self._engine.clock.now())
        self.spans.append(span)
        return TimedStream(self._engine.stream(request), self._engine.clock, span)

    def multiplexer(self) -> RecordingMux | None:
        """The engine's multiplexer, recording what is started through it (None without one)."""
        inner = multiplexer_of(self._engine)
        return None if inner is None else RecordingMux(self, inner)

    def mean_in_flight(self) -> float:
        """Samples streaming at once, averaged over the engine-clock time from the first stream
        opened to the last one closed (a stream never closed counts until then)."""
        closed = [s.closed for s in self.spans if not math.isnan(s.closed)]
        if not closed:
            return 0.0
        start, end = min(s.opened for s in self.spans), max(closed)
        busy = sum((end if math.isnan(s.closed) else s.closed) - s.opened for s in self.spans)
        return busy / (end - start) if end > start else 0.0

    def cut_after(self) -> list[int | None]:
        """Per request: the tokens after which the pipeline stopped it, or None if it ran to the end."""
        return [None if s.finished else s.tokens for s in self.spans]


class TimedStream:
    """An engine stream that fills in its ``Span``."""

    def __init__(self, inner: Any, clock: Any, span: Span):
        self._inner, self._clock, self._span = inner, clock, span

    def __aiter__(self) -> TimedStream:
        return self

    async def __anext__(self) -> Any:
        event = await self._inner.__anext__()
        if type(event) is TokenDelta:
            self._span.tokens += len(event.token_ids)
        elif event.finish_reason.is_success:
            self._span.finished = True
        return event

    async def aclose(self) -> None:
        if math.isnan(self._span.closed):
            self._span.closed = self._clock.now()
        await self._inner.aclose()


class RecordingMux:
    """A multiplexer that fills in its recorder's requests (and, timed, their spans)."""

    def __init__(self, recorder: Recorder, inner: Any):
        self._recorder, self._inner, self._clock = recorder, inner, recorder._engine.clock
        self._spans: dict[str, Span] = {}
        self.abort = inner.abort

    def start(self, request: SampleRequest) -> None:
        self._recorder.requests.append(request)
        if self._recorder._timed:
            span = self._spans[request.request_id] = Span(self._clock.now())
            self._recorder.spans.append(span)
        self._inner.start(request)

    async def next_events(self) -> list:
        events = await self._inner.next_events()
        if self._recorder._timed:
            for request_id, event in events:
                span = self._spans[request_id]
                if type(event) is TokenDelta:
                    span.tokens += len(event.token_ids)
                else:
                    span.finished = isinstance(event, SampleFinished) and event.finish_reason.is_success
                    span.closed = self._clock.now()
        return events

    def close(self) -> list:
        finals = self._inner.close()
        for final in finals:
            span = self._spans.get(final.request_id)
            if span is not None and math.isnan(span.closed):
                span.closed = self._clock.now()
        return finals


def raw_pass(cfg: RunConfig, requests: list[SampleRequest], cut_after: list[int | None] | None = None) -> float:
    """Stream ``requests`` through a fresh engine with no pipeline, under the same concurrency
    limit and driven the way the pipeline drives it (``orchestrator.multiplex_streams``): all
    from one consumer of the engine's multiplexer, or one task per request. With
    ``cut_after``, a request the pipeline stopped early (an abandoned group, the run's end) is
    aborted after the same number of tokens, so both do the same work."""
    comps = build_components(cfg)
    engine: SimEngine = comps.engine
    cuts = cut_after or [None] * len(requests)
    main = _raw_multiplexed if cfg.orchestrator.multiplex_streams and multiplexer_of(engine) is not None else _raw_tasks
    started = time.perf_counter()
    anyio.run(main, engine, requests, cuts, cfg.orchestrator.max_concurrent_samples)
    return time.perf_counter() - started


async def _raw_tasks(engine: SimEngine, requests: list[SampleRequest], cuts: list[int | None], limit: int) -> None:
    limiter = anyio.Semaphore(limit)

    async def consume(request: SampleRequest, stream, cut: int | None) -> None:
        streamed = 0
        try:
            if cut == 0:  # the pipeline stopped it before its first tokens
                await engine.abort(request.request_id)
                return
            async for event in stream:
                if type(event) is TokenDelta:
                    streamed += len(event.token_ids)
                    if cut is not None and streamed >= cut:
                        await engine.abort(request.request_id)
                        break
        finally:
            await stream.aclose()
            limiter.release()

    async with anyio.create_task_group() as tg:
        for request, cut in zip(requests, cuts):
            await limiter.acquire()
            request = dataclasses.replace(request, launch_time=engine.clock.now())
            tg.start_soon(consume, request, engine.stream(request), cut)


async def _raw_multiplexed(
    engine: SimEngine, requests: list[SampleRequest], cuts: list[int | None], limit: int
) -> None:
    mux = engine.multiplexer()
    todo = list(zip(requests, cuts))[::-1]
    left: dict[str, int | None] = {}  # running request id -> tokens still to stream before its cut (None: no cut)
    try:
        while todo or left:
            while todo and len(left) < limit:
                request, cut = todo.pop()
                request = dataclasses.replace(request, launch_time=engine.clock.now())
                mux.start(request)
                left[request.request_id] = cut
                if cut == 0:
                    mux.abort(request.request_id)
            for request_id, event in await mux.next_events():
                if type(event) is TokenDelta:
                    cut = left[request_id]
                    if cut is not None:
                        left[request_id] = cut = cut - len(event.token_ids)
                        if cut <= 0:
                            mux.abort(request_id)
                else:
                    del left[request_id]
    finally:
        mux.close()
