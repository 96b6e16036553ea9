"""One request's life on the torch engine's event-loop side: validation, state, events, stream.

``check_request`` turns a bad request into a ``ValueError`` that names the value, the limit
and the fix, before anything is queued. ``RequestState`` accumulates the tokens the decode
thread produced for one request and turns them into events: one ``TokenDelta`` of every
token not read yet (at least ``delta_tokens`` of them unless the sample has ended), then one
``SampleFinished``. ``TorchStream`` is the async iterator ``TorchEngine.stream`` returns.

>>> from pipeline.types import FinishReason, Prompt, SampleRequest, SamplingParams
>>> req = SampleRequest("r0", group_id=0, sample_index=0, params=SamplingParams(max_tokens=4),
...                     prompt=Prompt(prompt_id=0, text="", token_ids=(5, 6)))
>>> check_request(req, vocab_size=64, max_context=64, eos_id=2)
()
>>> state = RequestState(req, key=0, prefix=(), version=0)
>>> state.append(7, -0.5, 1.0); state.append(8, -0.25, 0.5)
>>> state.pop_event(delta_tokens=1).token_ids, state.pop_event(delta_tokens=1)
((7, 8), None)
>>> state.finish = FinishReason.LENGTH
>>> state.pop_event(delta_tokens=1).logprobs
(-0.5, -0.25)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.types import FinishReason, RolloutEvent, SampleFinished, SampleRequest, TokenDelta

if TYPE_CHECKING:
    from pipeline.engines.torch_engine import TorchEngine


def check_request(request: SampleRequest, *, vocab_size: int, max_context: int | None, eos_id: int | None) -> tuple[int, ...]:
    """Validate ``request`` for a model; return its branch prefix (``()`` without a branch)."""
    n_prompt = len(request.prompt.token_ids)
    params = request.params
    rid = request.request_id
    if not n_prompt:
        raise ValueError(f"request {rid!r} has an empty prompt; the torch engine needs >= 1 prompt token")
    b = request.branch
    for name, ids in (("prompt", request.prompt.token_ids), ("branch prefix", b.prefix_token_ids if b else ())):
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
    prefix = tuple(b.prefix_token_ids)
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
        raise ValueError(f"branch of {rid!r}: the prefix holds the end-of-sequence token {eos_id}; branch before the end")
    return prefix


class RequestState:
    """Engine-side state of one open request (touched on the event loop only)."""

    __slots__ = ("request", "key", "prompt", "prefix", "tokens", "logprobs", "entropies", "prefix_logprobs",
                 "delivered", "finish", "error", "version", "end_time", "wakeup", "final_sent")

    def __init__(self, request: SampleRequest, key: int, prefix: tuple[int, ...], version: int):
        self.request = request
        self.key = key  # serial number: the decode thread's name for this row (request ids may be reused)
        self.prompt = tuple(request.prompt.token_ids)
        self.prefix = prefix
        self.tokens: list[int] = []  # generated tokens (after the branch prefix)
        self.logprobs: list[float] = []
        self.entropies: list[float] = []
        self.prefix_logprobs: tuple[float, ...] | None = None  # the batch's, set when the row reaches it
        self.delivered = 0  # tokens already sent in deltas
        self.finish: FinishReason | None = None
        self.error = ""
        self.version = version
        self.end_time = 0.0
        self.wakeup = None  # the event its consumer waits on, if it waits
        self.final_sent = False

    def append(self, token: int, logprob: float, entropy: float) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.entropies.append(entropy)

    def wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()

    def pop_event(self, delta_tokens: int) -> RolloutEvent | None:
        """The next event for the consumer, or None while there is nothing to send."""
        new = len(self.tokens) - self.delivered
        if new and (new >= delta_tokens or self.finish is not None):
            i = self.delivered
            self.delivered = len(self.tokens)
            return TokenDelta(
                request_id=self.request.request_id, token_ids=tuple(self.tokens[i:]),
                logprobs=tuple(self.logprobs[i:]), entropies=tuple(self.entropies[i:]),
                position=len(self.prefix) + i,
            )
        if self.finish is None or self.final_sent:
            return None
        self.final_sent = True
        b = self.request.branch
        k = len(self.prefix)
        if b is not None and len(b.prefix_logprobs) == k:
            # The caller's values are those of the weights that sampled the prefix; the batch's
            # are the current weights', which differ after an update (vLLM keeps the caller's too).
            prefix_lps = tuple(b.prefix_logprobs)
        elif self.prefix_logprobs is not None:
            prefix_lps = self.prefix_logprobs
        else:  # sent without log-probs and never reached the batch
            prefix_lps = (0.0,) * k
        return SampleFinished(
            request_id=self.request.request_id, token_ids=self.prefix + tuple(self.tokens),
            logprobs=prefix_lps + tuple(self.logprobs), finish_reason=self.finish,
            policy_version=self.version, error=self.error, engine_time=self.end_time,
        )


class TorchStream:
    """One request's event stream: ``TokenDelta``\\ s, then one ``SampleFinished``.

    Cancelling a consumer inside ``__anext__`` closes the stream; a consumer that stops
    reading for another reason closes it with ``aclose()`` (or holds it in
    ``contextlib.aclosing``).
    """

    def __init__(self, engine: "TorchEngine", state: RequestState):
        self._engine = engine
        self._state = state
        self._done = False

    def __aiter__(self) -> "TorchStream":
        return self

    async def __anext__(self) -> RolloutEvent:
        if self._done:
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
        if not self._done:
            self._done = True
            self._engine._release(self._state)
