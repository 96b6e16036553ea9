"""The engine Protocol: the one interface the orchestrator uses to generate rollouts.

An engine streams one sample per request, so every member of a group is a request of its
own and can be aborted on its own. Implementations: ``sim`` (this package), ``torch``,
``vllm`` and ``ray``.

Contract (checked by ``tests/test_engine_conformance.py`` against every implementation):

1. ``stream(request)`` is an async iterator of ``TokenDelta`` events followed by exactly one
   ``SampleFinished``. The finished event carries the whole response, the finish reason and
   the policy version that produced it. Deltas concatenate to the final token ids.
2. ``abort(request_id)`` ends that request: its stream yields a ``SampleFinished`` with
   ``FinishReason.ABORTED`` (holding the tokens produced so far) and stops. Aborting an
   unknown or finished request is a no-op.
3. Closing a stream early (the consumer was cancelled, ``aclose()``) releases the request:
   ``open_requests`` counts only requests whose streams are still open.
4. ``request.branch`` continues a response from a prefix of an earlier sample; the new
   sample's ``token_ids`` start with that prefix.
5. ``update_weights(weights)`` installs new weights between samples and returns the new
   ``policy_version`` (strictly larger than before).
6. An engine may raise from ``stream``; the orchestrator turns that into a failed sample.

``EngineBase`` holds the plumbing the four engines share (the version and open-request
counters, the checks at the start of ``stream``, the close loop); each engine adds how it
generates, aborts and loads weights.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from pipeline.types import RolloutEvent, SampleRequest


@runtime_checkable
class Engine(Protocol):
    """What every inference engine provides. See the module docstring for the contract."""

    name: str

    @property
    def policy_version(self) -> int:
        """Version of the weights new samples are generated with."""
        ...

    @property
    def open_requests(self) -> int:
        """Requests whose streams are open (for leak checks and backpressure)."""
        ...

    def stream(self, request: SampleRequest) -> AsyncIterator[RolloutEvent]:
        """Generate one sample; yields ``TokenDelta``\\ s then one ``SampleFinished``."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop one request; its stream finishes with ``FinishReason.ABORTED``."""
        ...

    async def update_weights(self, weights: Any) -> int:
        """Install new weights; returns the new policy version."""
        ...

    async def aclose(self) -> None:
        """Release the engine's resources; idempotent."""
        ...


class EngineError(RuntimeError):
    """An engine could not start or failed as a whole (not one sample)."""


def import_engine_package(module: str, kind: str, package: str, hint: str) -> Any:
    """Import the optional package engine ``kind`` runs on, or raise ``EngineError`` naming the
    extra that installs it.

    >>> import_engine_package("no_such_package", "x", "X", "pip install -e '.[x]'")
    Traceback (most recent call last):
    ...
    pipeline.engines.base.EngineError: engine.kind=x needs X, which is not importable (No module named 'no_such_package'); install it: pip install -e '.[x]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EngineError(
            f"engine.kind={kind} needs {package}, which is not importable ({exc}); install it: {hint}"
        ) from exc


class EngineBase:
    """Shared plumbing of the engines: ``policy_version``, ``open_requests``, the start of
    ``stream`` and ``aclose``.

    A subclass keeps every request whose stream is open in ``self._open`` (request id -> its
    own record of the request), raises ``self._version`` when it installs weights, calls
    ``self._admit(request)`` first thing in ``stream`` and ``self._forget(request_id, record)``
    when a stream closes, and provides ``_abort_on_close(record)`` (end one request still
    open when the engine closes; the record stays in ``_open`` until its stream closes) and,
    where it holds more than requests, ``_close_resources()`` (awaited once, after that loop).

    >>> import anyio
    >>> from pipeline.types import Prompt, SampleRequest, SamplingParams
    >>> class Idle(EngineBase):                     # an engine that never generates anything
    ...     name = "idle"
    ...     def stream(self, request):
    ...         self._open[self._admit(request)] = request  # a real engine returns its stream
    ...     def _abort_on_close(self, request):
    ...         print("aborted", request.request_id)
    >>> engine = Idle()
    >>> req = SampleRequest("r0", group_id=0, sample_index=0, prompt=Prompt(0, "", (1,)), params=SamplingParams())
    >>> engine.stream(req); engine.open_requests, engine.policy_version
    (1, 0)
    >>> engine.stream(req)
    Traceback (most recent call last):
    ...
    ValueError: request_id 'r0' is already running; request ids must be unique
    >>> anyio.run(engine.aclose); anyio.run(engine.aclose)  # the second close does nothing
    aborted r0
    >>> engine.stream(req)
    Traceback (most recent call last):
    ...
    pipeline.engines.base.EngineError: the idle engine is closed; create a new one
    """

    name = "engine"

    def __init__(self) -> None:
        self._version = 0
        self._open: dict[str, Any] = {}  # request id -> the engine's record, while its stream is open
        self._closed = False

    @property
    def policy_version(self) -> int:
        """Version of the weights new samples are generated with."""
        return self._version

    @property
    def open_requests(self) -> int:
        """Requests whose streams are open."""
        return len(self._open)

    def _admit(self, request: SampleRequest) -> str:
        """The start of ``stream``: refuse a closed engine and a request id still open; the id."""
        if self._closed:
            raise EngineError(f"the {self.name} engine is closed; create a new one")
        rid = request.request_id
        if rid in self._open:
            raise ValueError(f"request_id {rid!r} is already running; request ids must be unique")
        return rid

    def _forget(self, request_id: str, record: Any) -> None:
        """A stream closed: drop its record (not a newer request that reuses the id)."""
        if self._open.get(request_id) is record:
            del self._open[request_id]

    async def aclose(self) -> None:
        """End every open request, then release the engine's resources; idempotent."""
        if self._closed:
            return
        self._closed = True
        for record in list(self._open.values()):
            self._abort_on_close(record)
        await self._close_resources()

    def _abort_on_close(self, record: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say how a request ends when the engine closes")

    async def _close_resources(self) -> None:
        return None
