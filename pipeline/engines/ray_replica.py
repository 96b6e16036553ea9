"""The replica side of the ``ray`` engine: one engine inside a Ray actor, and engine factories.

``ReplicaServer`` is a plain class; ``RayEngine`` wraps it with ``ray.remote`` (this module
does not import Ray). It runs on the actor's asyncio loop: a *pump* task per request reads
the inner engine's stream into an outbox, and the client's single RPC, ``exchange(starts,
aborts, wait_s)``, starts requests, aborts requests and takes every event produced since
its last call (waiting up to ``wait_s`` for the first one). Consecutive deltas of a request
are merged in the outbox, so one round trip carries many tokens of many requests.

Requests travel with a client-side serial number (``wire``). The inner engine sees the
request id ``"<id>#<serial>"``: a client may reuse an id as soon as its stream is closed,
while the replica is still winding the old request down.

Pump tasks are the only tasks here: each catches its engine's errors and turns them into an
``ERROR`` final, removes itself when done, and ``close`` cancels any left.

>>> factory = TorchEngineFactory("runs/x/base_model", eos_id=2)
>>> factory.threads
1
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.types import FinishReason, RolloutEvent, SampleFinished, SampleRequest, TokenDelta

_EARLY_ABORTS = 4096  # aborts that arrived before their request (bounded memory)
_WIRE_MEMORY = 16384  # request id -> inner id, for branches whose source ran here


class ReplicaServer:
    """One engine replica (runs inside a Ray actor); see the module docstring.

    Parameters
    ----------
    factory : builds the engine, in the actor's process.
    weights, version : weights to install before the first request (a replacement replica
        catching up with the pool) and the pool's policy version they are.
    torch_threads : ``torch.set_num_threads`` in the actor (1 on a small machine).
    """

    def __init__(self, factory: Callable[[], Any], weights: Any = None, version: int = 0, torch_threads: int = 1):
        import torch

        torch.set_num_threads(torch_threads)
        self._engine = factory()
        self._catch_up = (weights, version) if weights is not None else None
        self._versions = {self._engine.policy_version: 0}  # inner policy version -> the pool's
        self._outbox: dict[int, list[RolloutEvent]] = {}
        self._ready = asyncio.Event()
        self._pumps: dict[int, asyncio.Task] = {}
        self._inner_ids: dict[int, str] = {}
        self._wires: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._early: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._lock = asyncio.Lock()

    async def ready(self) -> str:
        await self._install_catch_up()
        return type(self._engine).__name__

    async def exchange(
        self, starts: list[tuple[int, SampleRequest]], aborts: list[int], wait_s: float
    ) -> list[tuple[int, RolloutEvent]]:
        await self._install_catch_up()
        for wire in aborts:
            await self._abort(wire)
        for wire, request in starts:
            self._start(wire, request)
        if not self._outbox and wait_s > 0:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except TimeoutError:
                pass
        out = [(wire, ev) for wire, events in self._outbox.items() for ev in events]
        self._outbox.clear()
        return out

    async def abort(self, wires: list[int]) -> None:
        """Abort without taking events (a separate call: nobody reads its reply)."""
        for wire in wires:
            await self._abort(wire)

    async def update_weights(self, weights: Any, version: int) -> int:
        await self._install_catch_up()
        async with self._lock:
            inner = await self._engine.update_weights(weights)
            self._versions[inner] = version
        return version

    def stats(self) -> dict[str, int]:
        return {"open_requests": self._engine.open_requests, "pumps": len(self._pumps), "outbox": len(self._outbox)}

    async def close(self) -> None:
        for task in list(self._pumps.values()):
            task.cancel()
        await asyncio.gather(*self._pumps.values(), return_exceptions=True)
        await self._engine.aclose()

    # --- internals ---------------------------------------------------------------------------

    async def _install_catch_up(self) -> None:
        if self._catch_up is None:
            return
        async with self._lock:
            if self._catch_up is not None:
                weights, version = self._catch_up
                inner = await self._engine.update_weights(weights)
                self._versions[inner] = version
                self._catch_up = None

    def _start(self, wire: int, request: SampleRequest) -> None:
        if wire in self._early:
            del self._early[wire]
            self._emit(wire, _final(request, FinishReason.ABORTED, self._versions.get(self._engine.policy_version, 0)))
            return
        inner_id = f"{request.request_id}#{wire}"
        self._wires[request.request_id] = inner_id
        if len(self._wires) > _WIRE_MEMORY:
            self._wires.popitem(last=False)
        inner = dataclasses.replace(request, request_id=inner_id)
        if request.branch is not None:
            src = self._wires.get(request.branch.source_request_id, request.branch.source_request_id)
            inner = dataclasses.replace(inner, branch=dataclasses.replace(request.branch, source_request_id=src))
        self._inner_ids[wire] = inner_id
        self._pumps[wire] = asyncio.get_running_loop().create_task(self._pump(wire, request, inner))

    async def _abort(self, wire: int) -> None:
        inner_id = self._inner_ids.get(wire)
        if inner_id is not None:
            await self._engine.abort(inner_id)
            return
        if wire not in self._pumps:  # not started yet (or long finished: harmless)
            self._early[wire] = None
            if len(self._early) > _EARLY_ABORTS:
                self._early.popitem(last=False)

    async def _pump(self, wire: int, request: SampleRequest, inner: SampleRequest) -> None:
        rid = request.request_id
        tokens: list[int] = []
        logprobs: list[float] = []
        try:
            stream = self._engine.stream(inner)
        except Exception as exc:
            self._emit(wire, _final(request, FinishReason.ERROR, 0, error=f"{type(exc).__name__}: {exc}"))
            self._forget(wire)
            return
        try:
            async for ev in stream:
                if isinstance(ev, TokenDelta):
                    tokens.extend(ev.token_ids)
                    logprobs.extend(ev.logprobs)
                    self._emit(wire, dataclasses.replace(ev, request_id=rid))
                else:
                    version = self._versions.get(ev.policy_version, ev.policy_version)
                    self._emit(wire, dataclasses.replace(ev, request_id=rid, policy_version=version))
        except Exception as exc:  # the engine failed this sample: an ERROR final with what it produced
            version = self._versions.get(self._engine.policy_version, 0)
            self._emit(
                wire, _final(request, FinishReason.ERROR, version, tokens, logprobs, f"{type(exc).__name__}: {exc}")
            )
        finally:
            await stream.aclose()
            self._forget(wire)

    def _forget(self, wire: int) -> None:
        self._pumps.pop(wire, None)
        self._inner_ids.pop(wire, None)

    def _emit(self, wire: int, event: RolloutEvent) -> None:
        box = self._outbox.setdefault(wire, [])
        last = box[-1] if box else None
        if (
            isinstance(event, TokenDelta)
            and isinstance(last, TokenDelta)
            and last.position + len(last.token_ids) == event.position
        ):
            box[-1] = TokenDelta(
                request_id=last.request_id,
                token_ids=last.token_ids + event.token_ids,
                logprobs=last.logprobs + event.logprobs,
                entropies=last.entropies + event.entropies
                if last.entropies is not None and event.entropies is not None
                else None,
                position=last.position,
            )
        else:
            box.append(event)
        self._ready.set()


def _final(
    request: SampleRequest, reason: FinishReason, version: int, tokens=(), logprobs=(), error: str = ""
) -> SampleFinished:
    """A final event the replica makes itself (aborted before start, or failed), prefix included."""
    b = request.branch
    prefix = tuple(b.prefix_token_ids) if b is not None else ()
    prefix_lps = (
        tuple(b.prefix_logprobs) if b is not None and len(b.prefix_logprobs) == len(prefix) else (0.0,) * len(prefix)
    )
    return SampleFinished(
        request_id=request.request_id,
        token_ids=prefix + tuple(tokens),
        logprobs=prefix_lps + tuple(logprobs),
        finish_reason=reason,
        policy_version=version,
        error=error,
    )


@dataclass(frozen=True)
class TorchEngineFactory:
    """Builds a ``TorchEngine`` over a ``save_pretrained`` model directory, in the replica's process."""

    model_dir: str
    eos_id: int | None
    threads: int = 1
    engine_kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self):
        import torch
        from transformers import AutoModelForCausalLM

        from pipeline.engines.torch_engine import TorchEngine

        torch.set_num_threads(self.threads)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir)
        return TorchEngine(model, self.eos_id, **dict(self.engine_kwargs))


@dataclass(frozen=True)
class VllmEngineFactory:
    """Builds a ``VllmEngine`` in the replica's process, caching under ``cache_dir/replica-<pid>``
    (replicas on one node must not share the weight file that ``update_weights`` writes)."""

    model_dir: str
    cache_dir: str
    engine_kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self):
        import os
        from pathlib import Path

        from pipeline.engines.vllm_engine import VllmEngine

        return VllmEngine(self.model_dir, Path(self.cache_dir) / f"replica-{os.getpid()}", **dict(self.engine_kwargs))
