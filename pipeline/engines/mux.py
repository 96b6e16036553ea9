"""One consumer for many streams: the optional multiplexed interface of an engine.

``Engine.stream`` gives every request an async iterator of its own, so a consumer needs a task
per running sample: at thousands of concurrent groups that is tens of thousands of live
coroutines, each switched into for every token delta, and the young generation of the garbage
collector fills with their frames. An engine that can drive all its requests itself offers
``multiplexer()``: a ``StreamMux`` that starts and aborts requests synchronously and hands their
events out in batches, all the events that are ready at once, to one consumer task
(``pipeline.shells.orchestrator`` uses it when ``orchestrator.multiplex_streams`` is on and the engine
has one; ``sim`` has one, the other engines stream per request).

Contract (``tests/test_engine_mux.py``), the same as ``Engine.stream``'s per request:

1. ``start(request)`` registers the request at once (``open_requests`` counts it) and never
   raises for one bad request: an engine failure on it comes out of ``next_events`` as an
   ``Exception`` in place of its ``SampleFinished``.
2. ``next_events()`` waits until something is ready and returns ``(request_id, event)`` pairs in
   order: each request's ``TokenDelta``\\ s, then exactly one ``SampleFinished`` (or exception),
   after which the request is forgotten.
3. ``abort(request_id)`` ends that request: its next event is a ``SampleFinished`` with
   ``FinishReason.ABORTED`` holding what it produced. Unknown or ended ids are a no-op.
4. ``close()`` ends every open request without events and returns their ``ABORTED`` finals, so
   the caller can count what they produced; the mux is unusable afterwards.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pipeline.types import RolloutEvent, SampleFinished, SampleRequest

MuxEvent = tuple[str, "RolloutEvent | Exception"]
"""One event of a multiplexed batch: the request id, and its delta, final event or failure."""


@runtime_checkable
class StreamMux(Protocol):
    """Many requests' streams through one consumer; see the module docstring."""

    def start(self, request: SampleRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    async def next_events(self) -> list[MuxEvent]: ...

    def close(self) -> list[SampleFinished]: ...


def multiplexer_of(engine: Any) -> StreamMux | None:
    """A new ``StreamMux`` of ``engine``, or None when it streams per request only.

    >>> multiplexer_of(object()) is None
    True
    """
    factory = getattr(engine, "multiplexer", None)
    return factory() if callable(factory) else None
