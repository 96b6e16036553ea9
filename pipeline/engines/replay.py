"""The ``replay`` engine: serves the samples of a recorded group log, in engine time.

Each request of replayed prompt ``p`` (``request.prompt.prompt_id``, a position in the
``ReplayOrder``) is served the recorded sample ``order.sample(p, k)``, ``k`` being the
request's ``sample_index`` (the tracker numbers a group's samples 0, 1, 2, ... in launch order,
``pipeline.core.group.GroupRun.launch``), so a group's k-th launch gets the k-th sample of its
replay order whatever else runs. Nothing is generated or invented:

* Tokens: the recorded ``completion_ids``, streamed in ``TokenDelta`` chunks at the recorded
  length by ``pipeline.replay.timing``'s rule: launched at engine time ``t`` (the request's
  ``launch_time``, or now if later), token ``j`` is out at ``t + (j + 1) / rate`` and the
  ``SampleFinished`` comes at ``t + n / rate`` with the recorded finish reason (``STOP`` or
  ``LENGTH``). A log kept as text only (no ids: an import) streams ``num_tokens`` copies of
  ``PLACEHOLDER_TOKEN``: its token ids are then counts, nothing more.
* Aborts: an abort at engine time ``u`` ends the sample with ``tokens_out(t, n, rate, u)``
  tokens, exactly those in its aborted ``SampleFinished``. The multiplexer (``multiplexer()``,
  what the orchestrator drives by default) takes the abort the moment the tracker cancels; a
  per-request ``stream`` hears of it when the orchestrator drains the cancelled stream, which
  on a ``VirtualClock`` may be a later engine time, so exact abort accounting wants the
  multiplexer (``orchestrator.multiplex_streams``, on by default).
* Log-probs are zeros (the log keeps none; the learner is off), entropies none.
* ``policy_version`` is the engine's own version when the request started (0, plus one for
  every ``update_weights``), as the contract wants and the tracker's staleness counts expect;
  the version the log recorded is ``order.sample(p, k).policy_version``.
* Rewards: every completed sample is noted in the engine's ``ServedRewards`` with its recorded
  reward, for ``pipeline.replay.reward.RecordedReward`` to score it exactly.
* Sampling parameters (temperature, ``max_tokens``, seed) are ignored: the recording used its own.

A request past the group's recorded K, a branch or a guided request (``request.branch``: RAIL's
interventions, SARA's guidance) would need a sample the log does not have: its stream raises
``NotReplayable`` (the orchestrator turns it into a failed sample) and it is counted
(``replay/not_replayable`` in ``metrics()``). ``update_weights`` takes anything and bumps the version.

>>> import anyio
>>> from pipeline.replay.order import ReplayOrder
>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.types import SampleRequest, SamplingParams, SampleFinished
>>> log = GroupLog((RecordedGroup.of(0, prompt_id=9, rewards=[1, 0], num_tokens=40),), ("demo",))
>>> engine = ReplayEngine(ReplayOrder(log), rate=100.0)
>>> req = SampleRequest("g0-s1", group_id=0, sample_index=1, prompt=engine.order.prompts[0], params=SamplingParams())
>>> async def main():
...     return [ev async for ev in engine.stream(req)]
>>> events = anyio.run(main)
>>> [len(e.token_ids) for e in events[:-1]], events[-1].finish_reason.name, engine.clock.now()
([32, 8], 'STOP', 0.4)
>>> engine.served.take(0, events[-1].token_ids), engine.usage(0)
(0.0, (1, 40))
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from pipeline.clock import VirtualClock, WallClock, running_event_type
from pipeline.engines.base import EngineBase
from pipeline.engines.mux import MuxEvent
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.replay.reward import ServedRewards
from pipeline.replay.timing import DEFAULT_RATE, finish_time, tokens_out
from pipeline.store.grouplog import GroupLogError
from pipeline.types import FinishReason, RolloutEvent, SampleFinished, SampleRequest, TokenDelta

__all__ = ["ReplayEngine", "NotReplayable", "PLACEHOLDER_TOKEN", "CHUNK_TOKENS"]

PLACEHOLDER_TOKEN = 0
"""The token id streamed for every token of a sample the log kept as text only."""

CHUNK_TOKENS = 32
"""Tokens per streamed delta (what a token hook sees at once; no effect on timing or cost)."""


class _Replayed:
    """One request being served: the recorded sample it gets and how far it is."""

    __slots__ = (
        "request",
        "token_ids",
        "reward",
        "reason",
        "start",
        "version",
        "refusal",
        "pos",
        "aborted_at",
        "done",
        "order",
        "stream",
    )

    def __init__(self, request: SampleRequest, start: float, version: int, order: int):
        self.request = request
        self.token_ids: tuple[int, ...] = ()
        self.reward = 0.0
        self.reason = FinishReason.STOP
        self.start = start
        self.version = version
        self.refusal: NotReplayable | None = None  # raised instead of any event
        self.pos = 0  # tokens released in deltas
        self.aborted_at: float | None = None  # engine time of the abort
        self.done = False
        self.order = order  # start order: breaks ties between events due at one time
        self.stream: _ReplayStream | None = None

    @property
    def n(self) -> int:
        return len(self.token_ids)

    def next_due(self, chunk: int, rate: float) -> float:
        """When the next delta (or, with everything out, the final event) is due."""
        return finish_time(self.start, min(self.pos + chunk, self.n), rate)

    def delta(self, chunk: int) -> TokenDelta:
        i = self.pos
        j = min(i + chunk, self.n)
        self.pos = j
        return TokenDelta(self.request.request_id, self.token_ids[i:j], (0.0,) * (j - i), None, i)


class ReplayEngine(EngineBase):
    """Serves recorded samples of ``order``'s replayed prompts; see the module docstring.

    ``clock``: engine time (a ``VirtualClock`` by default); ``rate``: tokens a second;
    ``served``: where completed samples' recorded rewards go (a new ledger by default).
    """

    name = "replay"

    def __init__(
        self,
        order: ReplayOrder,
        clock: VirtualClock | WallClock | None = None,
        rate: float = DEFAULT_RATE,
        served: ServedRewards | None = None,
        chunk_tokens: int = CHUNK_TOKENS,
    ):
        super().__init__()
        if rate <= 0:
            raise ValueError(f"rate={rate} must be > 0 tokens a second")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
        for group in order.log.groups:  # the one check the log reader leaves to the server of its tokens
            for s in group.samples:
                if s.token_ids and len(s.token_ids) != s.num_tokens:
                    raise GroupLogError(
                        f"group {group.group_id} sample {s.index} has {len(s.token_ids)} completion_ids but "
                        f"num_tokens={s.num_tokens}; write num_tokens as the number of completion ids (or leave "
                        "completion_ids empty to replay counts only)"
                    )
        self.order = order
        self.clock = clock if clock is not None else VirtualClock()
        self.rate = float(rate)
        self.chunk = chunk_tokens
        self.served = served if served is not None else ServedRewards()
        self._starts = itertools.count()
        self._usage: dict[int, list[int]] = {}  # prompt id -> [requests, tokens generated]
        self._counts = {"served": 0, "completed": 0, "aborted": 0, "not_replayable": 0, "placeholder_samples": 0}

    # --- Engine protocol (policy_version, open_requests, aclose: EngineBase) ---------------

    def stream(self, request: SampleRequest) -> _ReplayStream:
        rec = self._begin(request)
        s = rec.stream = _ReplayStream(self, rec)
        return s

    async def abort(self, request_id: str) -> None:
        rec = self._open.get(request_id)
        if rec is not None and rec.stream is not None:
            rec.stream.abort()

    def multiplexer(self) -> ReplayMux | None:
        """Every request started through it driven by one consumer (``pipeline.engines.mux``);
        None on a wall clock (requests then stream one by one)."""
        return ReplayMux(self) if isinstance(self.clock, VirtualClock) else None

    async def update_weights(self, weights: Any) -> int:
        """Accepted and counted (nothing served changes): the new policy version."""
        self._version += 1
        return self._version

    def _abort_on_close(self, record: Any) -> None:
        if record.stream is not None:
            record.stream.close()
        else:
            self._end(record)

    # --- what a replay reads back ---------------------------------------------------------

    def usage(self, prompt_id: int) -> tuple[int, int]:
        """Requests served for replayed prompt ``prompt_id`` (failed ones included) and the tokens
        they generated (aborted samples' partial tokens included; a request still running: none yet)."""
        requests, tokens = self._usage.get(prompt_id, (0, 0))
        return requests, tokens

    def metrics(self) -> dict[str, float]:
        """``replay/served`` (requests), ``replay/completed``, ``replay/aborted``,
        ``replay/not_replayable`` (refused: past K, branch or guidance) and
        ``replay/placeholder_samples`` (served from a log without token ids)."""
        return {f"replay/{k}": float(v) for k, v in self._counts.items()}

    # --- shared by the streams and the multiplexer ----------------------------------------

    def _begin(self, request: SampleRequest) -> _Replayed:
        """Admit ``request`` and find the recorded sample it is served (or why it cannot be)."""
        rid = self._admit(request)
        rec = _Replayed(request, max(self.clock.now(), request.launch_time), self._version, next(self._starts))
        self._open[rid] = rec
        prompt_id = request.prompt.prompt_id
        usage = self._usage.setdefault(prompt_id, [0, 0])
        usage[0] += 1
        self._counts["served"] += 1
        try:
            rec.refusal = self._refusal(request)
            if rec.refusal is None:
                sample = self.order.sample(prompt_id, request.sample_index)
                if sample.token_ids:
                    rec.token_ids = sample.token_ids
                else:
                    rec.token_ids = (PLACEHOLDER_TOKEN,) * sample.num_tokens
                    self._counts["placeholder_samples"] += 1
                rec.reward, rec.reason = sample.reward, sample.finish_reason
        except NotReplayable as exc:
            rec.refusal = exc
        if rec.refusal is not None:
            self._counts["not_replayable"] += 1
        return rec

    def _refusal(self, request: SampleRequest) -> NotReplayable | None:
        rid, b = request.request_id, request.branch
        if b is not None:
            what = (
                f"is guided (guide_level={b.guide_level}: the first {b.prefix_len} tokens of a reference)"
                if b.guided
                else f"branches from {b.source_request_id} after {b.prefix_len} tokens"
            )
            return NotReplayable(
                f"request {rid} {what}; a replay has only the recorded samples and cannot write a continuation: "
                "replay with controller.kind=none and gate.sara.guidance=0, or record those interventions"
            )
        prompt_id, count = request.prompt.prompt_id, len(self.order.prompts)
        if not 0 <= prompt_id < count:
            return NotReplayable(
                f"request {rid} is for prompt {prompt_id}, which is not one of the {count} replayed prompts "
                "(0 .. N-1, the positions of the log's groups); draw prompts from ReplayOrder.prompts"
            )
        return None

    def _complete(self, rec: _Replayed, now: float) -> SampleFinished:
        """The final event of a sample served whole; its recorded reward is noted for scoring."""
        tokens = tuple(list(rec.token_ids))  # its own tuple: RecordedReward finds this sample by identity
        self.served.note(rec.request.prompt.prompt_id, tokens, rec.reward)
        self._counts["completed"] += 1
        self._end(rec, rec.n)
        return SampleFinished(rec.request.request_id, tokens, (0.0,) * rec.n, rec.reason, rec.version, engine_time=now)

    def _aborted(self, rec: _Replayed, at: float) -> SampleFinished:
        """The final event of a sample aborted at engine time ``at``: the tokens out by then."""
        k = max(rec.pos, tokens_out(rec.start, rec.n, self.rate, at))
        self._counts["aborted"] += 1
        self._end(rec, k)
        return SampleFinished(
            rec.request.request_id, rec.token_ids[:k], (0.0,) * k, FinishReason.ABORTED, rec.version, engine_time=at
        )

    def _end(self, rec: _Replayed, tokens: int | None = None) -> None:
        """The request is over (``tokens`` generated; None: what its deltas released)."""
        if rec.done:
            return
        rec.done = True
        self._usage[rec.request.prompt.prompt_id][1] += rec.pos if tokens is None else tokens
        self._forget(rec.request.request_id, rec)


class _ReplayStream:
    """One request's events through ``ReplayEngine.stream``; registered with the clock from
    creation until closed. Its state lives outside any generator, so a consumer cancelled in a
    sleep leaves it intact and the abort that follows ends it with the tokens out by then."""

    def __init__(self, engine: ReplayEngine, rec: _Replayed):
        self._engine = engine
        self._rec = rec
        self._clock = engine.clock
        self._token = self._clock.register()
        self._closed = False

    def __aiter__(self) -> _ReplayStream:
        return self

    async def __anext__(self) -> RolloutEvent:
        rec, eng = self._rec, self._engine
        if self._closed or rec.done:
            self.close()
            raise StopAsyncIteration
        if rec.refusal is not None:
            self.close()
            raise rec.refusal
        if rec.aborted_at is None and rec.pos < rec.n:
            await self._clock.sleep_until(self._token, rec.next_due(eng.chunk, eng.rate))
        if rec.aborted_at is not None:
            final = eng._aborted(rec, rec.aborted_at)
            self.close()
            return final
        if rec.pos < rec.n:
            return rec.delta(eng.chunk)
        final = eng._complete(rec, self._clock.now())
        self.close()
        return final

    def abort(self) -> None:
        rec = self._rec
        if rec.done or rec.aborted_at is not None:
            return
        rec.aborted_at = self._clock.now()
        self._clock.wake(self._token)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._clock.unregister(self._token)
            self._engine._end(self._rec)


class ReplayMux:
    """``StreamMux`` of a ``ReplayEngine`` on a ``VirtualClock`` (``engine.multiplexer()``): every
    running request on one heap ordered by due time, then start order (as the clock wakes
    streams), one clock token while it has requests. Same events as ``stream`` gives; an abort
    is timed the moment ``abort`` is called."""

    def __init__(self, engine: ReplayEngine):
        self._engine = engine
        self._clock = engine.clock
        self._heap: list[tuple[float, int, _Replayed]] = []
        self._entries: dict[str, _Replayed] = {}
        self._aborted: list[_Replayed] = []
        self._token = 0
        self._sleeping_until = float("-inf")  # while the consumer waits on the clock
        self._wakeup: Any = None  # while the consumer waits with nothing running
        self._closed = False

    def start(self, request: SampleRequest) -> None:
        if self._closed:
            raise RuntimeError(
                f"start({request.request_id!r}) on a closed multiplexer; take a new one from engine.multiplexer()"
            )
        rec = self._engine._begin(request)
        self._entries[rec.request.request_id] = rec
        if not self._token:
            self._token = self._clock.register()
        due = rec.start if rec.refusal is not None else rec.next_due(self._engine.chunk, self._engine.rate)
        heapq.heappush(self._heap, (due, rec.order, rec))
        self._poke(due)

    def abort(self, request_id: str) -> None:
        rec = self._entries.get(request_id)
        if rec is None or rec.done or rec.aborted_at is not None:
            return
        rec.aborted_at = self._clock.now()
        self._aborted.append(rec)
        self._poke(rec.aborted_at)

    async def next_events(self) -> list[MuxEvent]:
        eng = self._engine
        while True:
            if self._closed:
                raise RuntimeError("next_events() on a closed multiplexer")
            out: list[MuxEvent] = []
            if self._aborted:
                aborted, self._aborted = self._aborted, []
                for rec in aborted:
                    if not rec.done:
                        out.append((rec.request.request_id, self._finish(eng._aborted(rec, rec.aborted_at), rec)))
            heap, now = self._heap, self._clock.now()
            while heap and heap[0][0] <= now:
                rec = heapq.heappop(heap)[2]
                if rec.done or rec.aborted_at is not None:
                    continue
                rid = rec.request.request_id
                if rec.refusal is not None:
                    eng._end(rec, 0)
                    self._entries.pop(rid, None)
                    out.append((rid, rec.refusal))
                    continue
                if rec.pos < rec.n:
                    out.append((rid, rec.delta(eng.chunk)))
                if rec.pos >= rec.n:
                    out.append((rid, self._finish(eng._complete(rec, now), rec)))
                else:
                    heapq.heappush(heap, (rec.next_due(eng.chunk, eng.rate), rec.order, rec))
            if out:
                return out
            await self._wait()

    def close(self) -> list[SampleFinished]:
        now = self._clock.now()
        finals = [self._engine._aborted(rec, now) for rec in list(self._entries.values()) if not rec.done]
        self._entries.clear()
        self._closed = True
        self._heap.clear()
        self._aborted.clear()
        if self._token:
            self._clock.unregister(self._token)
            self._token = 0
        if self._wakeup is not None:
            self._wakeup.set()
        return finals

    def _finish(self, final: SampleFinished, rec: _Replayed) -> SampleFinished:
        self._entries.pop(rec.request.request_id, None)
        return final

    def _poke(self, t: float) -> None:
        """Something is due at ``t``: wake the consumer if it sleeps past that."""
        if self._wakeup is not None:
            self._wakeup.set()
        if t < self._sleeping_until:
            self._sleeping_until = float("-inf")
            self._clock.wake(self._token)

    async def _wait(self) -> None:
        """Sleep until the earliest due request, or until a start or an abort needs us sooner."""
        heap = self._heap
        while heap and (heap[0][2].done or heap[0][2].aborted_at is not None):
            heapq.heappop(heap)
        if heap:
            if not self._token:
                self._token = self._clock.register()
            self._sleeping_until = heap[0][0]
            try:
                await self._clock.sleep_until(self._token, heap[0][0])
            finally:
                self._sleeping_until = float("-inf")
            return
        if self._token:  # idle: the clock must not wait for us
            self._clock.unregister(self._token)
            self._token = 0
        self._wakeup = running_event_type()()
        try:
            await self._wakeup.wait()
        finally:
            self._wakeup = None
