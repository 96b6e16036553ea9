"""The stream side of the group tracker: every running sample and what its stream costs.

``SampleLedger`` registers each sample the tracker starts and counts what its stream brings --
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

from pipeline.actions import EnvStep, Post, Score
from pipeline.group import GroupRun
from pipeline.messages import ControllerActions, EngineEvents, StreamCut, StreamFailed, StreamsClosed
from pipeline.metrics import Budget
from pipeline.protocols import Controller
from pipeline.types import FinishReason, SampleFinished, SampleRequest, TokenDelta


class Running:
    """One running sample: its group, its request, the tokens its deltas carried, and whether
    its group was abandoned (its remaining events then count as its abort's)."""

    __slots__ = ("group", "request", "streamed", "cancelled")

    def __init__(self, group: GroupRun, request: SampleRequest):
        self.group, self.request = group, request
        self.streamed = 0
        self.cancelled = False


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
    """Running samples by request id, and the stream-side counting rules (module docstring).

    ``on_gone`` is called when a cancelled sample's engine slot is free again.
    """

    def __init__(
        self,
        budget: Budget,
        controller: Controller,
        policy_version: Callable[[], int],
        on_gone: Callable[[], None],
        episodic: bool = False,
    ):
        self.budget = budget
        self.episodic = episodic
        self._answer = EnvStep if episodic else Score  # an episode's turn goes to its environment
        self.controller = controller
        self.policy_version = policy_version
        self.on_gone = on_gone
        self.running: dict[str, Running] = {}
        self._token_hooks = controller.wants_tokens

    def started(self, group: GroupRun, request: SampleRequest) -> None:
        self.running[request.request_id] = Running(group, request)

    def cancel_all(self) -> None:
        """The run is over: what any stream still brings counts as its cut."""
        for run in self.running.values():
            run.cancelled = True

    def cancelled(self, request_id: str) -> None:
        run = self.running.get(request_id)
        if run is not None:
            run.cancelled = True

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
        run = self.running.get(delta.request_id)
        if run is None:
            return
        n = len(delta.token_ids)
        run.streamed += n
        if run.cancelled:
            self.budget.tokens_generated += n
            return
        group = run.group
        group.tokens += n
        self.budget.tokens_generated += n
        if self._token_hooks and not group.closed:
            actions = self.controller.on_tokens(group.snapshot(self.policy_version()), run.request.sample_index, delta)
            if actions:
                out.append(Post(ControllerActions(tuple(actions))))

    def finished(self, final: SampleFinished, out: list) -> None:
        """A sample's final event (``out`` takes its ``Score``, unless it was aborted)."""
        run = self.running.pop(final.request_id, None)
        if run is None:
            return
        if run.cancelled and (self.episodic or not final.finish_reason.is_success):
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
        run = self.running.pop(request_id, None)
        if run is None:
            return
        run.streamed += tokens_after
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
        run = self.running.pop(request_id, None)
        if run is None:
            return
        run.streamed += tokens
        self.budget.tokens_generated += tokens
        self._count_abort(run, final)

    # --- counting ------------------------------------------------------------------------

    def _ended(self, run: Running, final: SampleFinished) -> None:
        """Count a sample's end by its reason (an episode's turn: a turn; the tracker counts the
        episode's end), and the tokens its final event adds."""
        b = self.budget
        if self.episodic:
            b.turns += 1
        else:
            b.count_rollout_end(final.finish_reason)
        extra = _unstreamed(run, final)
        b.tokens_generated += extra
        run.group.tokens += extra

    def _abort_tokens(self, run: Running, final: SampleFinished) -> None:
        self.budget.tokens_generated += _unstreamed(run, final)

    def _count_abort(self, run: Running, final: SampleFinished | None) -> None:
        if final is not None:
            self._abort_tokens(run, final)
        self.budget.rollouts_aborted += 1
        run.group.aborted += 1
        self.on_gone()


def _unstreamed(run: Running, final: SampleFinished) -> int:
    """Tokens the final event adds beyond its request's branch prefix and the deltas streamed."""
    return max(0, final.num_tokens - run.request.prefix_len - run.streamed)
