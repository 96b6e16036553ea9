"""``bench replay``'s fast path: a gate replayed on recorded groups, synchronously, in one pass.

A gate's choices are a function of the samples it sees, so a log of full groups
(``pipeline.store.grouplog``) lets any gate that asks only for fresh samples be replayed on
exactly those samples. ``replay`` drives the real ``GroupTracker`` with the real gate, built as
``railgate.build`` builds it, and plays the world around it as a discrete-event loop with no
engine, no learner and no event loop of its own:

* the gate, its one-pass prompt pool (``order.prompts`` in order, each once), the oracle's
  success probability and SARA's reference screen are built by
  ``railgate.replay.gate_parts.build_replay_gate``, as the pipeline's replay builds them, and the
  run's limits by its ``replay_orchestrator``; the gate is watched by
  ``pipeline.replay.watch.WatchedGate``, as in the pipeline's replay;
* the k-th request of replayed prompt p's group is served the recorded sample
  ``order.sample(p, k)``: launched at t, it finishes at ``finish_time(t, n, rate)``
  (``pipeline.replay.timing``) with its recorded reward; a request past the group's K raises
  ``NotReplayable``;
* an aborted sample (its group abandoned) pays the tokens it had out (``tokens_out``);
* the learner is none: a step is the batch shipped, answered at once (the gate's ``on_step``
  still runs; no weights change);
* samples finishing at one engine time are handed over in launch order, each followed by a
  tick, before time moves on (what the pipeline's orchestrator does over the replay engine).

It ends as the tracker says: every replayed prompt was offered and nothing runs any more
("prompts exhausted"), or ``orchestrator.max_rollouts``; what it did with each prompt is one
``PromptOutcome`` (``pipeline.replay.outcome``) per replayed prompt, skipped ones included: the
outcomes ``railgate.replay.pipeline_run.replay_through_pipeline`` gives for the same config and
order (``tests/test_replay_paths.py``). A gate that needs new text (guidance, RAIL's branches
and resamples), what a log does not keep (log-probabilities), DPS or an uncapped HORA cannot be
replayed: ``not_replayable`` says why.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> from railgate.config import load_config
>>> log = GroupLog(tuple(RecordedGroup.of(g, g, r) for g, r in enumerate([(1, 0, 1, 1), (0, 0, 0, 0), (1, 1, 0, 0)])), ("demo",))
>>> cfg = load_config(None, ["gate.kind=uniform", "orchestrator.group_size=4", "orchestrator.batch_groups=2"])
>>> [(o.verdict, o.samples, o.tokens) for o in replay_gate(cfg, ReplayOrder(log), group_size=4, batch_groups=2)]
[('committed', 4, 32), ('committed', 4, 32), ('committed', 4, 32)]
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.noop import NoopController
from pipeline.config.build import ConfigError
from pipeline.core.actions import INLINE, Cancel, Post, Record, Score, ShellSettings, Start, Stop, Train
from pipeline.core.messages import Started, StepDone, StreamCut, Tick
from pipeline.core.tracker import GroupTracker
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.replay.outcome import PromptOutcome
from pipeline.replay.timing import DEFAULT_RATE, finish_time, tokens_out
from pipeline.replay.watch import WatchedGate
from pipeline.shells.handlers import ASKED_BY_SETTINGS, EPISODES, HandlerTable, Refuse, Skip
from pipeline.types import SampleFinished, StepResult
from railgate.config import RunConfig
from railgate.replay.gate_parts import build_replay_gate, not_replayable, replay_orchestrator, with_sizes

__all__ = ["ReplayRun", "not_replayable", "replay", "replay_gate"]


@dataclass
class ReplayRun:
    """One gate's replay: an outcome per replayed prompt (sorted by prompt id), the prompts in the
    order the gate opened groups for them (a selector of its own, DPS, opens them out of replay
    order), the gate's own metrics at the end, the tracker's budget counters, learner steps
    shipped and why it ended."""

    outcomes: list[PromptOutcome]
    opened_order: list[int] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    budget: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    end: str = ""


def replay_gate(
    cfg: RunConfig,
    order: ReplayOrder,
    group_size: int,
    batch_groups: int,
    rate: float = DEFAULT_RATE,
) -> list[PromptOutcome]:
    """The outcomes of replaying ``cfg``'s gate on ``order`` (``replay`` has the details)."""
    return replay(cfg, order, group_size, batch_groups, rate).outcomes


def replay(
    cfg: RunConfig,
    order: ReplayOrder,
    group_size: int,
    batch_groups: int,
    rate: float = DEFAULT_RATE,
) -> ReplayRun:
    """Replay ``cfg``'s gate (``cfg.gate``; ``cfg.orchestrator``'s limits, with ``group_size`` and
    ``batch_groups`` in place of its own) on ``order``; see the module docstring. SARA's reference
    prior takes the log's likelihoods as exact or as lower bounds as ``cfg.replay.reference_exact``
    says. Raises ``NotReplayable`` for a gate that cannot be replayed or a group larger than the
    log's K."""
    log = order.log
    k = log.group_size
    why = not_replayable(cfg, k)
    if why:
        raise NotReplayable(why)
    if not log.groups:
        raise NotReplayable(f"the log ({', '.join(log.sources) or 'no source'}) holds no groups")
    if group_size > k:
        raise NotReplayable(
            f"group size {group_size} is above the log's {k} recorded samples per group; replay with "
            f"--group-size {k} or less, or record more samples per prompt (run.py record --samples)"
        )
    try:
        return _Replay(with_sizes(cfg, group_size, batch_groups), order, rate).run()
    except ConfigError as exc:  # the log cannot serve this gate (its reference scores)
        raise NotReplayable(str(exc)) from exc


# A response of n tokens as the tracker sees it: shared tuples (their content is never read).
_TOKENS: dict[int, tuple[int, ...]] = {}


def _tokens(n: int) -> tuple[int, ...]:
    got = _TOKENS.get(n)
    if got is None:
        got = _TOKENS[n] = (0,) * n
    return got


class _Replay:
    """One replay: the tracker, the watched gate, the clock, the running samples and what each
    group cost."""

    def __init__(self, cfg: RunConfig, order: ReplayOrder, rate: float):
        if not rate > 0:
            raise ValueError(f"rate={rate} must be > 0 (tokens a second)")
        self.order, self.rate = order, rate
        built = build_replay_gate(cfg, order)
        self.gate = built.gate
        self.watched = WatchedGate(built.gate)
        self.now = 0.0
        pool = built.pool
        self.tracker = GroupTracker(
            self.watched,
            NoopController(),
            replay_orchestrator(cfg.orchestrator, len(order.prompts)),
            seed=cfg.seed,
            now=self._clock,
            shell=ShellSettings(learner=INLINE),
            prompts_left=lambda: pool.remaining,
        )
        # (finish time, launch order, request id) of every sample launched; a cancelled one's
        # entry stays and is skipped when it comes up
        self.events: list[tuple[float, int, str]] = []
        self._seq = 0
        # request id -> (launch time, tokens, finish reason, request) of a running sample
        self.running: dict[str, tuple[float, int, Any, Any]] = {}
        self.launched: dict[int, int] = {}  # replayed prompt id -> samples launched
        self.tokens: dict[int, int] = {}  # replayed prompt id -> tokens generated
        self.steps = 0
        self.end = ""

    def _clock(self) -> float:
        return self.now

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> ReplayRun:
        tracker, events, running = self.tracker, self.events, self.running
        act, handle, pop = self._act, tracker.handle, heapq.heappop
        act(handle(Started()))
        act(handle(Tick()))
        while events and not self.end:
            self.now, _, request_id = pop(events)
            entry = running.pop(request_id, None)
            if entry is None:
                continue  # aborted with its group
            _, n, reason, _ = entry
            act(handle(SampleFinished(request_id, _tokens(n), (), reason, 0, engine_time=self.now)))
            act(handle(Tick()))
        if not self.end:
            raise RuntimeError("the replay ran out of samples to finish without the tracker ending the run")
        return ReplayRun(
            self._outcomes(),
            opened_order=self.watched.opened_order,
            metrics=dict(self.gate.metrics()),
            budget=self.tracker.budget.as_metrics(),
            steps=self.steps,
            end=self.end,
        )

    def _act(self, actions: Sequence[Any]) -> None:
        """Carry out the tracker's actions, in order (``HANDLERS``)."""
        handlers = self.HANDLERS
        for action in actions:
            handlers[type(action)](self, action)

    def _cancel(self, cancel: Cancel) -> None:
        launched_at, n, _, request = self.running.pop(cancel.request_id)
        paid = tokens_out(launched_at, n, self.rate, self.now)
        self.tokens[request.prompt.prompt_id] += paid - n  # it was booked in full at its start
        self._act(self.tracker.handle(StreamCut(cancel.request_id, paid)))

    def _score(self, score: Score) -> None:
        request = score.request  # the recorded reward
        self._act(
            self.tracker.handle(score.answer(self.order.sample(request.prompt.prompt_id, request.sample_index).reward))
        )

    def _train(self, train: Train) -> None:
        batch = train.batch  # no learner: the step is the batch, trained at once
        self.steps += 1
        self._act(self.tracker.handle(StepDone(batch, StepResult(batch.step + 1, {}), policy_version=batch.step + 1)))

    def _stop(self, stop: Stop) -> None:
        self.end = stop.reason

    def _start(self, start: Start) -> None:
        request = start.request
        pid = request.prompt.prompt_id
        sample = self.order.sample(pid, request.sample_index)
        n = sample.num_tokens
        self.launched[pid] = self.launched.get(pid, 0) + 1
        self.tokens[pid] = (
            self.tokens.get(pid, 0) + n
        )  # paid in full unless it is aborted (then corrected at its Cancel)
        self.running[request.request_id] = (self.now, n, sample.finish_reason, request)
        heapq.heappush(self.events, (finish_time(self.now, n, self.rate), self._seq, request.request_id))
        self._seq += 1

    _NO_SETTING = "the tracker asks for it only under ShellSettings a replay does not set"
    _NOT_REPLAYABLE = "a gate whose groups need it cannot be replayed (not_replayable)"
    HANDLERS = HandlerTable(
        "bench replay's driver",
        {
            Start: _start,
            Cancel: _cancel,
            Score: _score,
            Train: _train,
            Stop: _stop,
            Record: Skip("a replay keeps no metrics lines"),
            ASKED_BY_SETTINGS: Refuse(_NO_SETTING),
            Post: Refuse(_NOT_REPLAYABLE + ": a token hook's actions"),
            EPISODES: Refuse(_NOT_REPLAYABLE + ": episodes"),
        },
    )

    def _outcomes(self) -> list[PromptOutcome]:
        outcome, launched, tokens = self.watched.outcome, self.launched, self.tokens
        return [
            outcome(p.prompt_id, launched.get(p.prompt_id, 0), tokens.get(p.prompt_id, 0)) for p in self.order.prompts
        ]
