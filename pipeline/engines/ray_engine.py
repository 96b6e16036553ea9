"""The ``ray`` engine: a pool of engine replicas (torch or vllm inside) as Ray actors.

**Placement.** A new request goes to the live replica with the fewest open requests (least
outstanding requests); a branch goes to the replica that ran its source when that one is
alive, where the source's cache (torch rows, vLLM prefix blocks) is.

**Streaming: multiplexed polling, not a Ray generator per request.** Measured here (2 loaded
cores), a Ray streaming generator costs ~1.7 ms per yielded item and an actor call ~2.5 ms per
round trip, so one object per token delta would cap the pool at a few hundred events a
second. Instead each replica has one RPC, ``exchange(starts, aborts, wait_s)`` (see
``ray_replica``): it carries every new request and abort for that replica and returns every
event produced since the last call, merged per request. As in the torch engine, a consumer
that needs its next event and finds nobody collecting for its replica becomes the collector:
it makes the call (shielded, at most ``poll_wait_s`` plus a round trip), hands every event to
its request and wakes that request's consumer. Every await belongs to a consumer's task; a
replica polls only while somebody reads from it. Requests are sent on the next exchange.

**Aborts** take effect at once on this side (the stream's next event is the ``ABORTED`` final
with the tokens received so far; later events of that request are dropped) and reach the
replica with the next exchange, or a call of their own when nobody is collecting there.
Closing a stream early does the same.

**Weights.** ``update_weights`` puts the weights in the object store once (``ray.put``) and
sends the reference to every live replica; the returned version is the pool's, and each
replica maps its engine's versions onto the pool's, so samples carry pool versions.

**Failures.** When a replica dies (or its RPC fails), every open request on it ends with
``FinishReason.ERROR`` holding the tokens received so far: one final per request, nothing
counted twice, and the gate's failure rule decides what to relaunch. The replica is dropped
at once and, with ``restart=True``, replaced on the next ``stream`` or ``update_weights``
call by a new actor that installs the latest weights before its first request.

**Cluster.** ``address=None`` starts a local Ray instance (``num_cpus`` = the replicas'
CPUs; ~3 s idle, 15 s loaded) unless Ray is already initialised; otherwise the address is
checked with a TCP connection first (``connect_timeout_s``), because ``ray.init`` waits
without end for an address that does not answer. The engine shuts Ray down on ``aclose``
only if it started it. Two replicas of a saved model (``tests/test_ray_engine.py`` runs it)::

    engine = RayEngine(TorchEngineFactory("runs/x/base_model", eos_id=2), replicas=2)
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel

from pipeline.engines.base import EngineBase, EngineError
from pipeline.engines.ray_cluster import connect, import_ray
from pipeline.engines.ray_replica import ReplicaServer
from pipeline.engines.request import RequestStream, TurnCollector
from pipeline.types import FinishReason, RolloutEvent, SampleFinished, SampleRequest, TokenDelta

_PLACEMENT_MEMORY = 16384


class _Replica:
    __slots__ = ("index", "actor", "alive", "requests", "starts", "aborts", "turns")

    def __init__(self, index: int, actor: Any, exchange: Callable[[_Replica], Awaitable[bool]]):
        self.index, self.actor, self.alive = index, actor, True
        self.requests: dict[int, _Req] = {}  # by wire serial: open on this side
        self.starts: list[tuple[int, SampleRequest]] = []
        self.aborts: list[int] = []
        self.turns = TurnCollector(functools.partial(exchange, self))  # its consumers take turns calling it


class _Req:
    __slots__ = (
        "request",
        "wire",
        "replica",
        "version",
        "prefix",
        "tokens",
        "logprobs",
        "events",
        "final",
        "sent",
        "done",
        "wakeup",
    )

    def __init__(self, request: SampleRequest, wire: int, replica: _Replica, version: int):
        self.request, self.wire, self.replica, self.version = request, wire, replica, version
        b = request.branch
        self.prefix = tuple(b.prefix_token_ids) if b is not None else ()
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.events: collections.deque[RolloutEvent] = collections.deque()
        self.final: SampleFinished | None = None  # the replica's final, or one made here (abort, failure)
        self.sent = False  # handed to the replica
        self.done = False  # no more events from the replica are wanted
        self.wakeup: Any = None  # set by its TurnCollector while its consumer waits

    def local_final(self, reason: FinishReason, error: str = "") -> SampleFinished:
        b = self.request.branch
        plps = (
            tuple(b.prefix_logprobs)
            if b is not None and len(b.prefix_logprobs) == len(self.prefix)
            else (0.0,) * len(self.prefix)
        )
        return SampleFinished(
            request_id=self.request.request_id,
            token_ids=self.prefix + tuple(self.tokens),
            logprobs=plps + tuple(self.logprobs),
            finish_reason=reason,
            policy_version=self.version,
            error=error,
        )

    def wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()


class RayEngine(EngineBase):
    """Engine replicas as Ray actors behind the Engine protocol; see the module docstring.

    Parameters
    ----------
    engine_factory : a picklable callable that builds one engine in a replica's process
        (``TorchEngineFactory``, ``VllmEngineFactory``, or a top-level function).
    replicas : number of replicas.
    address : Ray cluster address (``"host:6379"``, ``"ray://host:10001"``, ``"auto"``);
        None: the current Ray instance, or a new local one.
    connect_timeout_s : how long an address may take to answer.
    num_cpus : CPUs each replica reserves (Ray scheduling).
    num_gpus : GPUs each replica reserves (1 for a vLLM replica on a GPU node).
    torch_threads : torch threads in each replica (1 on a 2-core machine).
    restart : replace dead replicas (else they stay dropped).
    poll_wait_s : how long an exchange waits on the replica for its first event.
    start_timeout_s : how long the replicas may take to build their engines.
    ray_init_kwargs : further ``ray.init`` arguments (``runtime_env``, ``namespace``, ...).
    """

    name = "ray"

    def __init__(
        self,
        engine_factory: Callable[[], Any],
        replicas: int = 1,
        *,
        address: str | None = None,
        connect_timeout_s: float = 10.0,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        torch_threads: int = 1,
        restart: bool = True,
        poll_wait_s: float = 0.02,
        start_timeout_s: float = 600.0,
        ray_init_kwargs: dict[str, Any] | None = None,
    ):
        if replicas < 1:
            raise ValueError(f"replicas={replicas} must be >= 1")
        super().__init__()  # self._open: request id -> _Req, until its stream closes
        self._ray = ray = import_ray()
        self._factory = engine_factory
        self.torch_threads = torch_threads
        self.restart = restart
        self.poll_wait_s = poll_wait_s
        self.restarts = 0
        self._owns_ray = connect(
            ray, address, connect_timeout_s, math.ceil(replicas * num_cpus), dict(ray_init_kwargs or {})
        )
        self._actor_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(
            ReplicaServer
        )
        self._latest: Any = None  # object ref of the latest weights (for replacements)
        self._replicas = [_Replica(i, self._new_actor(), self._exchange) for i in range(replicas)]
        self._placed: collections.OrderedDict[str, int] = collections.OrderedDict()  # request id -> replica index
        self._serials = itertools.count()
        try:
            names = ray.get([r.actor.ready.remote() for r in self._replicas], timeout=start_timeout_s)
        except Exception as exc:
            self._kill_all()
            raise EngineError(f"Ray replicas failed to start their engines: {type(exc).__name__}: {exc}") from exc
        self.inner_engine = names[0]

    # --- Engine protocol (policy_version, open_requests, aclose: EngineBase) ---------------

    @property
    def replicas_alive(self) -> int:
        return sum(r.alive for r in self._replicas)

    def replica_of(self, request_id: str) -> int | None:
        """Index of the replica an open request runs on."""
        req = self._open.get(request_id)
        return None if req is None else req.replica.index

    def outstanding(self) -> list[int]:
        """Open requests per replica (dead replicas count 0)."""
        return [len(r.requests) if r.alive else 0 for r in self._replicas]

    def stream(self, request: SampleRequest) -> RequestStream:
        rid = self._admit(request)
        self._replace_dead()
        live = [r for r in self._replicas if r.alive]
        if not live:
            raise EngineError(
                f"all {len(self._replicas)} Ray replicas have died and restart=False; create a new engine"
            )
        replica = min(live, key=lambda r: (len(r.requests), r.index))
        if request.branch is not None:
            src = self._placed.get(request.branch.source_request_id)
            if src is not None and self._replicas[src].alive:
                replica = self._replicas[src]
        req = _Req(request, next(self._serials), replica, self._version)
        replica.requests[req.wire] = req
        replica.starts.append((req.wire, request))
        self._open[rid] = req
        self._placed[rid] = replica.index
        if len(self._placed) > _PLACEMENT_MEMORY:
            self._placed.popitem(last=False)
        return RequestStream(self, req)

    async def abort(self, request_id: str) -> None:
        req = self._open.get(request_id)
        if req is not None and req.final is None:
            self._finish_here(req, FinishReason.ABORTED)
        await anyio.lowlevel.checkpoint()

    async def update_weights(self, weights: Any) -> int:
        ray = self._ray
        self._replace_dead()
        version = self._version + 1
        ref = ray.put(weights)  # once, whatever the number of replicas
        ok = 0

        async def send(replica: _Replica) -> None:
            nonlocal ok
            try:
                await replica.actor.update_weights.remote(ref, version)
                ok += 1
            except Exception as exc:
                self._replica_failed(replica, exc)

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for replica in self._replicas:
                    if replica.alive:
                        tg.start_soon(send, replica)
        if not ok:
            raise EngineError(f"update_weights reached none of the {len(self._replicas)} Ray replicas (all failed)")
        self._version, self._latest = version, ref
        return version

    def _abort_on_close(self, req: _Req) -> None:
        if req.final is None:
            self._finish_here(req, FinishReason.ABORTED, send_abort=False)

    async def _close_resources(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            for replica in self._replicas:
                if replica.alive:
                    try:
                        await replica.actor.close.remote()
                    except Exception:  # a dead or failing replica is killed below anyway
                        pass
        self._kill_all()
        if self._owns_ray:
            self._ray.shutdown()

    async def replica_stats(self) -> list[dict[str, int] | None]:
        """Each live replica's own counts (open requests of its engine, running pumps)."""
        out: list[dict[str, int] | None] = []
        for r in self._replicas:
            out.append(await r.actor.stats.remote() if r.alive else None)
        return out

    def kill_replica(self, index: int) -> None:
        """Kill replica ``index``'s actor (fault-injection for tests and drills)."""
        self._ray.kill(self._replicas[index].actor, no_restart=True)

    # --- replicas -----------------------------------------------------------------------------

    def _new_actor(self):
        return self._actor_cls.remote(self._factory, self._latest, self._version, self.torch_threads)

    def _replace_dead(self) -> None:
        if not self.restart or self._closed:
            return
        for i, r in enumerate(self._replicas):
            if not r.alive:
                self._replicas[i] = _Replica(i, self._new_actor(), self._exchange)
                self.restarts += 1

    def _replica_failed(self, replica: _Replica, exc: BaseException) -> None:
        if not replica.alive:
            return
        replica.alive = False
        msg = (
            f"Ray replica {replica.index} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        for req in list(replica.requests.values()):
            if req.final is None:
                self._finish_here(req, FinishReason.ERROR, msg, send_abort=False)
        try:
            self._ray.kill(replica.actor, no_restart=True)
        except Exception:  # already gone
            pass

    def _kill_all(self) -> None:
        for r in self._replicas:
            try:
                self._ray.kill(r.actor, no_restart=True)
            except Exception:
                pass
            r.alive = False

    # --- requests -------------------------------------------------------------------------------

    def _finish_here(self, req: _Req, reason: FinishReason, error: str = "", send_abort: bool = True) -> None:
        """End a request on this side; tell its replica to stop it."""
        req.final = req.local_final(reason, error)
        req.events.clear()  # its tokens are in the final
        req.done = True
        replica = req.replica
        if not req.sent:
            replica.starts = [(w, r) for w, r in replica.starts if w != req.wire]
        elif send_abort and replica.alive:
            if replica.turns.collecting:
                replica.aborts.append(req.wire)
            else:  # nobody will call soon: a call of its own, not awaited
                replica.actor.abort.remote([req.wire])
        req.wake()

    def _release(self, req: _Req) -> None:
        self._forget(req.request.request_id, req)
        if req.final is None:
            self._finish_here(req, FinishReason.ABORTED)
        req.replica.requests.pop(req.wire, None)

    def _pop_event(self, req: _Req) -> RolloutEvent | None:
        if req.events:
            return req.events.popleft()
        return req.final

    async def _next_event(self, req: _Req) -> RolloutEvent:
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await req.replica.turns.next_event(req, self._pop_event)

    async def _exchange(self, replica: _Replica) -> bool:
        """One ``exchange`` call to ``replica`` (the collector's turn, ``TurnCollector``): send
        its queued starts and aborts, hand out the events it returns; whether there were any."""
        starts, aborts = replica.starts, replica.aborts
        replica.starts, replica.aborts = [], []
        for wire, _ in starts:
            req = replica.requests.get(wire)
            if req is not None:
                req.sent = True
        try:
            with anyio.CancelScope(shield=True):  # a batch once taken from the replica must be handed out
                batch = await replica.actor.exchange.remote(starts, aborts, self.poll_wait_s)
        except Exception as exc:
            self._replica_failed(replica, exc)
            batch = []
        for wire, ev in batch:
            req = replica.requests.get(wire)
            if req is None or req.done:
                continue
            if isinstance(ev, TokenDelta):
                req.tokens.extend(ev.token_ids)
                req.logprobs.extend(ev.logprobs)
                req.events.append(ev)
            else:
                req.final, req.done = ev, True
            req.wake()
        return bool(batch)
