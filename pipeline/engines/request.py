"""What every model engine does with one request, whatever runs the model.

``check_request`` turns a request the model cannot serve into a ``ValueError`` that names
the value, the limit and the fix, before anything is queued (the torch and vLLM engines
call it; the Ray engine's replicas run the torch engine, which does).

``TurnCollector`` is the loop of the engines whose consumers take turns collecting results for
everybody (the torch engine, each Ray replica): no background task; a consumer that needs its
next event and finds nobody collecting fetches everybody's results and wakes their readers, and
``wake_next_collector`` hands the job on.

``RequestStream`` is the async iterator the torch, vLLM and Ray engines' ``stream(request)``
returns (contract points 1 and 3 of ``pipeline.engines.base``): it reads events until the one
``SampleFinished`` and then closes itself; reading that raises (a cancelled consumer
included) also closes it; closing releases the request in the engine exactly once.

>>> from pipeline.types import BranchSpec, Prompt, SampleRequest, SamplingParams
>>> prompt = Prompt(prompt_id=0, text="", token_ids=(5, 6))
>>> check_request(SampleRequest("r0", 0, 0, prompt, SamplingParams(max_tokens=4)),
...               vocab_size=64, max_context=64, eos_id=2)
()
>>> branch = BranchSpec("r0", prefix_len=1, prefix_token_ids=(9,), prefix_logprobs=(-0.1,))
>>> check_request(SampleRequest("r1", 0, 1, prompt, SamplingParams(max_tokens=4), branch=branch),
...               vocab_size=64, max_context=None, eos_id=2)
(9,)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

import anyio
import anyio.lowlevel

from pipeline.clock import running_event_type
from pipeline.types import FinishReason, RolloutEvent, SampleFinished, SampleRequest


class Waiter(Protocol):
    """An engine's record of a request, as its consumer waits on it."""

    wakeup: Any  # the event its consumer waits on (None before its first wait)


W = TypeVar("W", bound=Waiter)


class Sampled(Protocol):
    """An engine's record of a request it has finished sampling."""

    request: SampleRequest
    prefix: tuple[int, ...]
    tokens: list[int]
    logprobs: list[float]
    finish: FinishReason | None
    version: int
    error: str
    end_time: float


def final_event(req: Sampled, prefix_logprobs: tuple[float, ...]) -> SampleFinished:
    """The ``SampleFinished`` of ``req``: its branch prefix (scored with ``prefix_logprobs``) and
    the tokens it sampled, how and on which weights it ended."""
    assert req.finish is not None, f"request {req.request.request_id!r} has not finished"
    return SampleFinished(
        request_id=req.request.request_id,
        token_ids=req.prefix + tuple(req.tokens),
        logprobs=prefix_logprobs + tuple(req.logprobs),
        finish_reason=req.finish,
        policy_version=req.version,
        error=req.error,
        engine_time=req.end_time,
    )


def check_request(
    request: SampleRequest, *, vocab_size: int, max_context: int | None, eos_id: int | None
) -> tuple[int, ...]:
    """Validate ``request`` for a model; return its branch prefix (``()`` without a branch).

    Parameters
    ----------
    request
        The request about to be queued.
    vocab_size
        Token ids must lie in ``[0, vocab_size)``.
    max_context
        Longest prompt + response the model takes (``None``: no limit known).
    eos_id
        The end-of-sequence token, which a branch prefix must not hold (``None``: unchecked).
    """
    n_prompt = len(request.prompt.token_ids)
    params = request.params
    rid = request.request_id
    if not n_prompt:
        raise ValueError(f"request {rid!r} has an empty prompt; the engine needs >= 1 prompt token")
    b = request.branch
    prefix = tuple(b.prefix_token_ids) if b is not None else ()
    for name, ids in (("prompt", request.prompt.token_ids), ("branch prefix", prefix)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"request {rid!r}: {name} token ids {bad[:5]} are outside the model's vocabulary [0, {vocab_size}); "
                "tokenize with the model's own tokenizer"
            )
    total = n_prompt + params.max_tokens
    if max_context is not None and total > max_context:
        raise ValueError(
            f"request {rid!r}: prompt of {n_prompt} tokens + max_tokens={params.max_tokens} = {total} exceeds "
            f"the model's context of {max_context} tokens; lower max_tokens to at most {max_context - n_prompt} "
            "or shorten the prompt"
        )
    if b is None:
        return ()
    if len(prefix) != b.prefix_len:
        raise ValueError(
            f"branch of {rid!r}: prefix_len={b.prefix_len} but {len(prefix)} prefix_token_ids were sent; "
            "send the prefix tokens with the request"
        )
    if b.prefix_len >= params.max_tokens:
        raise ValueError(
            f"branch of {rid!r}: prefix_len={b.prefix_len} leaves no room under max_tokens={params.max_tokens} "
            "(max_tokens counts the prefix); branch earlier or raise max_tokens"
        )
    if eos_id is not None and eos_id in prefix:
        raise ValueError(
            f"branch of {rid!r}: the prefix holds the end-of-sequence token {eos_id}; branch before the end"
        )
    return prefix


def wake_next_collector(waiting: Iterable[Any]) -> None:
    """A collector is done: wake one waiting consumer whose event is not set yet (it got nothing
    this time), so that somebody collects the next results. Waiters have a ``wakeup`` event
    (``None`` before their first wait).

    >>> import asyncio
    >>> class Waiter:
    ...     def __init__(self, woken):
    ...         self.wakeup = asyncio.Event()
    ...         if woken:
    ...             self.wakeup.set()
    >>> waiters = [Waiter(True), Waiter(False), Waiter(False)]
    >>> wake_next_collector(waiters)
    >>> [w.wakeup.is_set() for w in waiters]
    [True, True, False]
    """
    for waiter in waiting:
        if waiter.wakeup is not None and not waiter.wakeup.is_set():
            waiter.wakeup.set()
            return


class TurnCollector:
    """Consumers of one source of results (the torch engine's decode thread, one Ray replica)
    taking turns collecting for everybody.

    A consumer asks ``next_event(record, pop)`` for its request's next event. When ``pop(record)``
    has none and nobody is collecting, the consumer becomes the collector: it awaits ``collect()``,
    which fetches every result not read yet, hands each to its request and wakes that request's
    consumer (and shields the fetch itself, where a result once taken must be handed out), then
    wakes one waiting consumer that got nothing, so that somebody collects next. Other consumers
    wait on their own event. Every await belongs to a consumer's task, and results are fetched
    only while somebody reads.

    Parameters
    ----------
    collect
        Fetches and hands out the results not read yet; returns whether there were any.
    idle_s
        After a collection that found nothing, wait this long before looking again (the torch
        engine: its decode thread had nothing to do); 0: look again at once (a Ray exchange
        already waits on the replica for its first event).

    Examples
    --------
    >>> import collections, anyio
    >>> from pipeline.types import FinishReason, SampleFinished, TokenDelta
    >>> class Rec:
    ...     def __init__(self, rid):
    ...         self.rid, self.events, self.wakeup = rid, collections.deque(), None
    >>> recs = [Rec("a"), Rec("b")]
    >>> script = [[("a", TokenDelta("a", (1,), (-0.1,)))],
    ...           [("b", SampleFinished("b", (2,), (-0.2,), FinishReason.STOP, 0)),
    ...            ("a", SampleFinished("a", (1, 2), (-0.1, -0.2), FinishReason.STOP, 0))]]
    >>> async def collect():                 # what an engine's collector fetches, round by round
    ...     batch = script.pop(0) if script else []
    ...     for rid, event in batch:
    ...         rec = recs[ord(rid) - ord("a")]
    ...         rec.events.append(event)
    ...         if rec.wakeup is not None:
    ...             rec.wakeup.set()
    ...     return bool(batch)
    >>> turns = TurnCollector(collect)
    >>> pop = lambda rec: rec.events.popleft() if rec.events else None
    >>> async def read(rec, out):
    ...     while not out or not isinstance(out[-1], SampleFinished):
    ...         out.append(await turns.next_event(rec, pop))
    >>> async def main():
    ...     got = {"a": [], "b": []}
    ...     async with anyio.create_task_group() as tg:
    ...         for rec in recs:
    ...             tg.start_soon(read, rec, got[rec.rid])
    ...     return {rid: [type(e).__name__ for e in events] for rid, events in got.items()}
    >>> anyio.run(main)
    {'a': ['TokenDelta', 'SampleFinished'], 'b': ['SampleFinished']}
    """

    def __init__(self, collect: Callable[[], Awaitable[bool]], idle_s: float = 0.0):
        self._collect = collect
        self._idle_s = idle_s
        self.collecting = False
        self._waiting: dict[Any, None] = {}  # records whose consumers wait, in the order they began
        self._event_type: type | None = None

    async def next_event(self, record: W, pop: Callable[[W], RolloutEvent | None]) -> RolloutEvent:
        """``record``'s next event: ``pop(record)``, collecting (or waiting for the collector)
        until it has one."""
        while True:
            event = pop(record)
            if event is not None:
                return event
            if not self.collecting:
                await self._take_turn()
                # The collection was shielded: deliver a cancellation that arrived meanwhile.
                await anyio.lowlevel.checkpoint_if_cancelled()
                continue
            wakeup = record.wakeup = self._new_event()
            self._waiting[record] = None
            try:
                await wakeup.wait()
            finally:
                self._waiting.pop(record, None)

    async def _take_turn(self) -> None:
        self.collecting = True
        try:
            found = await self._collect()
        finally:
            self.collecting = False
            wake_next_collector(self._waiting)
        if not found and self._idle_s:
            await anyio.sleep(self._idle_s)

    def _new_event(self) -> Any:
        # One event per wait per token: anyio.Event looks up the running backend on every
        # construction (3 us against 0.5 us); asyncio's Event has the same wait()/set().
        if self._event_type is None:
            self._event_type = running_event_type()
        return self._event_type()


class RequestStream:
    """One request's event stream: ``TokenDelta``\\ s, then one ``SampleFinished``.

    Parameters
    ----------
    engine
        The engine serving the request. It provides ``async _next_event(state)``, which waits
        for the request's next event, and ``_release(state)``: the consumer is done (final
        event read, closed, or cancelled), so the engine forgets the request and aborts it if
        it still runs. ``_release`` may return an awaitable, which closing then awaits (vLLM
        waits for its engine core to abort).
    state
        The engine's own record of the request, passed back to those two methods.

    Cancelling a consumer inside ``__anext__`` closes the stream; a consumer that stops
    reading for another reason closes it with ``aclose()`` (or holds it in
    ``contextlib.aclosing``). Closing twice releases the request once.

    Examples
    --------
    >>> import anyio
    >>> from pipeline.types import FinishReason, SampleFinished, TokenDelta
    >>> class Scripted:                              # an engine that replays a fixed script
    ...     def __init__(self, events):
    ...         self.events, self.released = list(events), []
    ...     async def _next_event(self, state):
    ...         return self.events.pop(0)
    ...     def _release(self, state):
    ...         self.released.append(state)
    >>> engine = Scripted([TokenDelta("r", (7,), (-0.5,)),
    ...                    SampleFinished("r", (7, 2), (-0.5, -0.1), FinishReason.STOP, 0)])
    >>> stream = RequestStream(engine, state="r")
    >>> async def read_all():
    ...     return [type(event).__name__ async for event in stream]
    >>> anyio.run(read_all), engine.released
    (['TokenDelta', 'SampleFinished'], ['r'])
    >>> anyio.run(stream.aclose); engine.released    # already closed by the final event
    ['r']
    >>> class Failing(Scripted):                     # reading raises: the stream closes too
    ...     async def _next_event(self, state):
    ...         raise RuntimeError("engine died")
    >>> failing = Failing([])
    >>> anyio.run(RequestStream(failing, state="q").__anext__)
    Traceback (most recent call last):
    ...
    RuntimeError: engine died
    >>> failing.released
    ['q']
    """

    def __init__(self, engine: Any, state: Any):
        self._engine = engine
        self._state = state
        self._closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RolloutEvent:
        if self._closed:
            raise StopAsyncIteration
        try:
            event = await self._engine._next_event(self._state)
        except BaseException:
            await self.aclose()
            raise
        if isinstance(event, SampleFinished):
            await self.aclose()
        return event

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            released = self._engine._release(self._state)
            if released is not None:
                await released
