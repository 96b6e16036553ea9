"""The stream side of the group tracker: what each running sample's stream costs.

``SampleLedger`` finds each stream's sample in the tracker's sample table (``pipeline.core.samples``,
which it moves along: ended, or dropped as an abort) and counts what its stream brings --
token deltas, the final event, the tokens an aborted sample produced while it was being
aborted -- into the run's ``Budget`` and the sample's group. It is the hot path of a run (a call
per token delta), so it does only that: it does not decide anything. What it returns is what
the tracker returns for the stream's events: a ``Score`` for each finished sample (an
``EnvStep`` for each finished turn of an episode), a ``Post``
for the controller's token-hook actions and for the wake-up of its queued decision points.

Counting rules (the same for a task per sample and for a multiplexer):

* a delta of a live sample counts against the run and its group, and goes to the controller's
  token hook when it wants them; a delta of a cancelled sample counts against the run only;
* a live sample's final event counts as finished, aborted or failed by its reason, plus the
  tokens it adds beyond the deltas (a branch's prefix was paid for by its source);
* a cancelled sample's final event: one that completed (it ended in the engine before the abort
  reached it) is a finished straggler, scored and then dropped by the tracker; anything else, or
  a stream cut without one, counts as aborted and frees its engine slot. A cancelled episode's
  turn always counts as aborted: the episode was abandoned, whatever its turn did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipeline.core.actions import Post
from pipeline.core.lifecycles import Lifecycle
from pipeline.core.messages import ControllerActions, EngineEvents, StreamCut, StreamFailed, StreamsClosed
from pipeline.core.samples import Sample, Samples
from pipeline.metrics import Budget
from pipeline.protocols import Controller
from pipeline.types import FinishReason, SampleFinished, SampleRequest, TokenDelta


def failed_final(request: SampleRequest, error: str, policy_version: int) -> SampleFinished:
    """The final event of a sample the engine failed on."""
    return SampleFinished(
        request_id=request.request_id,
        token_ids=(),
        logprobs=(),
        finish_reason=FinishReason.ERROR,
        policy_version=policy_version,
        error=error,
    )


STREAM_MESSAGES = frozenset({TokenDelta, SampleFinished, EngineEvents, StreamFailed, StreamCut, StreamsClosed})
"""The messages of the stream side, which ``SampleLedger.handle`` takes."""


class SampleLedger:
    """The stream-side counting rules (module docstring) over the samples of ``samples``."""

    def __init__(
        self,
        samples: Samples,
        budget: Budget,
        controller: Controller,
        policy_version: Callable[[], int],
        lifecycle: Lifecycle,
    ):
        self.samples = samples
        self.budget = budget
        self.lifecycle = lifecycle
        self._answer = lifecycle.answer  # a Score, or an episode turn's EnvStep
        self._count_stream_end = lifecycle.count_stream_end
        self.controller = controller
        self.policy_version = policy_version
        self._token_hooks = controller.wants_tokens

    # --- events -------------------------------------------------------------------------

    def handle(self, msg: Any, out: list) -> None:
        """One message of ``STREAM_MESSAGES``: counted, its sample scored or its actions posted."""
        kind = type(msg)
        if kind is TokenDelta:
            self.tokens(msg, out)
        elif kind is SampleFinished:
            self.finished(msg, out)
        elif kind is EngineEvents:
            self.events(msg.events, out)
        elif kind is StreamFailed:
            self.failed(msg.request_id, msg.error, out, msg.tokens_after, msg.final_after)
        elif kind is StreamCut:
            self.cut(msg.request_id, msg.tokens, msg.final)
        elif kind is StreamsClosed:
            for final in msg.finals:
                self.cut(final.request_id, 0, final)
        else:
            raise TypeError(
                f"SampleLedger.handle got a {kind.__name__}; it takes {sorted(t.__name__ for t in STREAM_MESSAGES)}"
            )

    def tokens(self, delta: TokenDelta, out: list) -> None:
        """A streamed delta (``out`` takes a ``Post`` of the token hook's actions)."""
        run = self.samples.streaming(delta.request_id)
        if run is None:
            return
        n = len(delta.token_ids)
        self.samples.streamed_tokens(run, n)
        if run.cancelled:
            self.budget.tokens_generated += n
            return
        group = run.group
        group.count_tokens(n)
        self.budget.tokens_generated += n
        if self._token_hooks and not group.closed:
            snapshot = group.snapshot(self.policy_version(), self.samples.in_flight(group.group_id))
            actions = self.controller.on_tokens(snapshot, run.request.sample_index, delta)
            if actions:
                out.append(Post(ControllerActions(tuple(actions))))

    def finished(self, final: SampleFinished, out: list) -> None:
        """A sample's final event (``out`` takes its ``Score``, unless it was aborted)."""
        run = self.samples.streaming(final.request_id)
        if run is None:
            return
        if run.cancelled and not (self.lifecycle.scores_cancelled and final.finish_reason.is_success):
            self._count_abort(run, final)  # an abandoned episode ends here, whatever its turn did
            return
        self._ended(run, final)
        out.append(self._answer(run.request, final))

    def events(self, events: Sequence[tuple[str, Any]], out: list) -> None:
        """Events a multiplexer returned at once, in order (an exception: that request failed)."""
        for request_id, event in events:
            if type(event) is TokenDelta:
                self.tokens(event, out)
            elif isinstance(event, SampleFinished):
                self.finished(event, out)
            else:
                self.failed(request_id, f"{type(event).__name__}: {event}", out)

    def failed(
        self, request_id: str, error: str, out: list, tokens_after: int = 0, final_after: SampleFinished | None = None
    ) -> None:
        """The engine raised on a stream; what was drained while aborting it counts against the run."""
        run = self.samples.streaming(request_id)
        if run is None:
            return
        self.samples.streamed_tokens(run, tokens_after)
        self.budget.tokens_generated += tokens_after
        if final_after is not None:
            self._abort_tokens(run, final_after)
        if run.cancelled:
            self._count_abort(run, None)
            return
        final = failed_final(run.request, error, self.policy_version())
        self._ended(run, final)
        out.append(self._answer(run.request, final))

    def cut(self, request_id: str, tokens: int, final: SampleFinished | None) -> None:
        """A stream that ended by an abort (its group abandoned, or the run over)."""
        run = self.samples.streaming(request_id)
        if run is None:
            return
        self.samples.streamed_tokens(run, tokens)
        self.budget.tokens_generated += tokens
        self._count_abort(run, final)

    # --- counting ------------------------------------------------------------------------

    def _ended(self, run: Sample, final: SampleFinished) -> None:
        """Count a sample's end by its reason (an episode's turn: a turn; the tracker counts the
        episode's end), and the tokens its final event adds; its answer is on the way."""
        self.samples.end(run)
        b = self.budget
        self._count_stream_end(b, final.finish_reason)  # a rollout's end, or an episode's turn
        extra = _unstreamed(run, final)
        b.tokens_generated += extra
        run.group.count_tokens(extra)

    def _abort_tokens(self, run: Sample, final: SampleFinished) -> None:
        self.budget.tokens_generated += _unstreamed(run, final)

    def _count_abort(self, run: Sample, final: SampleFinished | None) -> None:
        if final is not None:
            self._abort_tokens(run, final)
        self.budget.rollouts_aborted += 1
        run.group.count_abort()
        self.samples.drop(run)  # its engine slot is free


def _unstreamed(run: Sample, final: SampleFinished) -> int:
    """Tokens the final event adds beyond its request's branch prefix and the deltas streamed."""
    return max(0, run.request.beyond_prefix(final.num_tokens) - run.streamed)
