"""One request's life on the torch engine's event-loop side: its state and events.

``RequestState`` accumulates the tokens the decode thread produced for one request (checked
by ``pipeline.engines.request.check_request`` first) and turns them into events: one
``TokenDelta`` of every token not read yet (at least ``delta_tokens`` of them unless the
sample has ended), then one ``SampleFinished``; ``TorchEngine.stream`` returns a
``pipeline.engines.request.RequestStream`` that reads them.

>>> from pipeline.types import FinishReason, Prompt, SampleRequest, SamplingParams
>>> req = SampleRequest("r0", group_id=0, sample_index=0, params=SamplingParams(max_tokens=4),
...                     prompt=Prompt(prompt_id=0, text="", token_ids=(5, 6)))
>>> state = RequestState(req, key=0, prefix=(), version=0)
>>> state.append(7, -0.5, 1.0); state.append(8, -0.25, 0.5)
>>> state.pop_event(delta_tokens=1).token_ids, state.pop_event(delta_tokens=1)
((7, 8), None)
>>> state.finish = FinishReason.LENGTH
>>> state.pop_event(delta_tokens=1).logprobs
(-0.5, -0.25)
"""

from __future__ import annotations

from pipeline.engines.request import final_event
from pipeline.types import FinishReason, RolloutEvent, SampleRequest, TokenDelta


class RequestState:
    """Engine-side state of one open request (touched on the event loop only)."""

    __slots__ = (
        "request",
        "key",
        "prompt",
        "prefix",
        "tokens",
        "logprobs",
        "entropies",
        "prefix_logprobs",
        "delivered",
        "finish",
        "error",
        "version",
        "end_time",
        "wakeup",
        "final_sent",
    )

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
                request_id=self.request.request_id,
                token_ids=tuple(self.tokens[i:]),
                logprobs=tuple(self.logprobs[i:]),
                entropies=tuple(self.entropies[i:]),
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
        return final_event(self, prefix_lps)
