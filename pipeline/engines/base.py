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
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, runtime_checkable

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
