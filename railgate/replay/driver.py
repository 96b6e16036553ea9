"""``bench replay``'s fast path: a gate replayed on recorded groups, synchronously, in one pass.

A gate's choices are a function of the samples it sees, so a log of full groups
(``pipeline.store.grouplog``) lets any gate that asks only for fresh samples be replayed on
exactly those samples. ``replay`` drives the real ``GroupTracker`` with the real gate, built as
``railgate.build`` builds it, and plays the world around it as a discrete-event loop with no
engine, no learner and no event loop of its own:

* the gate's prompt pool presents ``order.prompts`` in order, once (``railgate.replay.pool``);
* the k-th request of replayed prompt p's group is served the recorded sample
  ``order.sample(p, k)``: launched at t, it finishes at ``finish_time(t, n, rate)``
  (``pipeline.replay.timing``) with its recorded reward; a request past the group's K raises
  ``NotReplayable``;
* an aborted sample (its group abandoned) pays the tokens it had out (``tokens_out``);
* the learner is none: a step is the batch shipped, answered at once (the gate's ``on_step``
  still runs; no weights change);
* the oracle's ``success_probability`` is the recorded group's success fraction; SARA's
  reference prior reads each recorded group's ``reference_logprob``, all scored up front.

It ends when every replayed prompt was offered once and nothing runs any more; what it did
with each prompt is one ``PromptOutcome`` (``pipeline.replay.outcome``) per replayed prompt,
skipped ones included. A gate that needs new text (guidance, RAIL's branches and resamples)
or what a log does not keep (log-probabilities) cannot be replayed: ``not_replayable`` says why.

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> from railgate.config import load_config
>>> log = GroupLog(tuple(RecordedGroup.of(g, g, r) for g, r in enumerate([(1, 0, 1, 1), (0, 0, 0, 0), (1, 1, 0, 0)])), ("demo",))
>>> cfg = load_config(None, ["gate.kind=uniform"])
>>> [(o.verdict, o.samples, o.tokens) for o in replay_gate(cfg, ReplayOrder(log), group_size=4, batch_groups=2)]
[('committed', 4, 32), ('committed', 4, 32), ('committed', 4, 32)]
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.gates.registry import build_gate
from controller.noop import NoopController
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration
from controller.selectors import CursorSelector
from pipeline.actions import INLINE, Cancel, Record, Score, ShellSettings, Start, Stop, Train, cannot_carry_out
from pipeline.messages import SampleDone, Started, StepDone, StreamCut, Tick
from pipeline.protocols import Gate, GateStalled
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.replay.outcome import PromptOutcome
from pipeline.replay.timing import DEFAULT_RATE, finish_time, tokens_out
from pipeline.seeding import derive_seed
from pipeline.tracker import GroupTracker
from pipeline.types import ActionKind, GroupAction, GroupPlan, GroupSnapshot, SampleFinished, ScoredSample, StepResult
from railgate.config import RunConfig
from railgate.replay.pool import OncePerReplay, OnePassPool

_COMMIT, _ABANDON = ActionKind.COMMIT, ActionKind.ABANDON


def not_replayable(cfg: RunConfig) -> str:
    """Why ``cfg``'s gate cannot be replayed on a group log ("" when it can)."""
    sara = cfg.gate.sara
    if cfg.controller.kind != "none":
        return (
            f"controller.kind={cfg.controller.kind} intervenes with new text (branches, resamples, guidance) "
            "that no log holds"
        )
    if cfg.gate.kind in ("sara", "sara_dps") and sara.guidance:
        return f"gate.sara.guidance={sara.guidance} continues groups from reference prefixes: new text no log holds"
    if cfg.gate.kind in ("sara", "sara_dps") and sara.confident_pilot:
        return "gate.sara.confident_pilot reads each sample's log-probability, which a group log does not keep"
    return ""


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
    reference_exact: bool = True,
) -> list[PromptOutcome]:
    """The outcomes of replaying ``cfg``'s gate on ``order`` (``replay`` has the details)."""
    return replay(cfg, order, group_size, batch_groups, rate, reference_exact).outcomes


def replay(
    cfg: RunConfig,
    order: ReplayOrder,
    group_size: int,
    batch_groups: int,
    rate: float = DEFAULT_RATE,
    reference_exact: bool = True,
) -> ReplayRun:
    """Replay ``cfg``'s gate (``cfg.gate``; ``cfg.orchestrator``'s limits, with ``group_size`` and
    ``batch_groups`` in place of its own) on ``order``; see the module docstring.
    ``reference_exact``: the log's reference likelihoods are pass rates (the reference is the only
    response that earns the reward), not lower bounds. Raises ``NotReplayable`` for a gate that
    cannot be replayed, a group larger than the log's K, or a request past K."""
    why = not_replayable(cfg)
    if why:
        raise NotReplayable(why)
    log = order.log
    k = log.group_size
    if not log.groups:
        raise NotReplayable(f"the log ({', '.join(log.sources) or 'no source'}) holds no groups")
    if group_size > k:
        raise NotReplayable(
            f"group size {group_size} is above the log's {k} recorded samples per group; replay with "
            f"--group-size {k} or less, or record more samples per prompt (run.py record --samples)"
        )
    return _Replay(cfg, order, group_size, batch_groups, rate, reference_exact).run()


# A response of n tokens as the tracker sees it: shared tuples (their content is never read).
_TOKENS: dict[int, tuple[int, ...]] = {}


def _tokens(n: int) -> tuple[int, ...]:
    got = _TOKENS.get(n)
    if got is None:
        got = _TOKENS[n] = (0,) * n
    return got


class _Replay:
    """One replay: the tracker, the gate, the clock, the running samples and the bookkeeping."""

    def __init__(
        self, cfg: RunConfig, order: ReplayOrder, group_size: int, batch_groups: int, rate: float, exact: bool
    ):
        if not rate > 0:
            raise ValueError(f"rate={rate} must be > 0 (tokens a second)")
        self.order, self.rate = order, rate
        n = len(order.prompts)
        o = cfg.orchestrator
        orchestrator = dataclasses.replace(
            o,
            group_size=group_size,
            batch_groups=batch_groups,
            batch_rollouts=o.batch_rollouts and max(o.batch_rollouts, group_size),
            steps=min(10**8, n * group_size + 2),  # never the end: the pool is
            max_rollouts=0,
            target_accuracy=0.0,
        )
        k = order.log.group_size
        rates = [order.group(p).successes / k for p in range(n)]
        pool = OnePassPool(order.prompts)
        gate = build_gate(
            cfg.gate,
            pool,
            group_size=group_size,
            batch_groups=batch_groups,
            seed=derive_seed(cfg.seed, "gate"),
            success_probability=rates.__getitem__,
        )
        source = getattr(gate, "source", None)
        if source is not None and not isinstance(source, CursorSelector):
            gate.source = OncePerReplay(source)  # a selector of its own (DPS): each prompt picked once
        if cfg.gate.kind == "sara" and cfg.gate.sara.reference_prior:
            gate.attach_reference(_reference_screen(cfg, order, gate, batch_groups, exact))
        self.gate = gate
        self.watched = _Watched(gate, self)
        self.now = 0.0
        self.tracker = GroupTracker(
            self.watched,
            NoopController(),
            orchestrator,
            seed=cfg.seed,
            now=self._clock,
            shell=ShellSettings(learner=INLINE),
        )
        self.events: list[tuple[float, int, str]] = []
        self._seq = 0
        # request id -> (launch time, tokens, reward, finish reason) of a running sample
        self.running: dict[str, tuple[float, int, float, Any, Any]] = {}
        self.prompt_of: dict[int, int] = {}  # group id -> replayed prompt id
        self.launched: dict[int, int] = {}
        self.ended: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.decided: dict[int, int] = {}  # group id -> samples ended at the gate's first verdict
        self.abandoned: set[int] = set()  # groups the gate abandoned
        self.verdict: dict[int, str] = {}
        self.steps = 0
        self.end = ""

    def _clock(self) -> float:
        return self.now

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> ReplayRun:
        tracker, events, running = self.tracker, self.events, self.running
        self._act(tracker.handle(Started()))
        self._tick()
        pop, handle, act = heapq.heappop, tracker.handle, self._act
        while events and not self.end:
            self.now, _, request_id = pop(events)
            entry = running.pop(request_id, None)
            if entry is None:
                continue  # aborted with its group
            _, n, reward, reason, request = entry
            final = SampleFinished(request_id, _tokens(n), (), reason, 0, engine_time=self.now)
            for action in handle(final):
                if type(action) is Score:
                    gid = request.group_id
                    self.ended[gid] += 1
                    act(handle(SampleDone(ScoredSample(action.request, action.finished, reward))))
                else:
                    act((action,))
            self._tick()
        if not self.end:
            self.end = "pool replayed"
        return ReplayRun(
            self._outcomes(),
            opened_order=list(self.prompt_of.values()),
            metrics=dict(self.gate.metrics()),
            budget=self.tracker.budget.as_metrics(),
            steps=self.steps,
            end=self.end,
        )

    def _tick(self) -> None:
        try:
            self._act(self.tracker.handle(Tick()))
        except GateStalled:
            if self.running:  # samples still run: a real stall, not the pool's end
                raise
            self.end = "pool replayed"

    def _act(self, actions: Sequence[Any]) -> None:
        for action in actions:
            kind = type(action)
            if kind is Start:
                self._start(action.request)
            elif kind is Cancel:
                launched_at, n, _, _, request = self.running.pop(action.request_id)
                paid = tokens_out(launched_at, n, self.rate, self.now)
                self.tokens[request.group_id] += paid - n  # it was booked in full at its start
                self._act(self.tracker.handle(StreamCut(action.request_id, paid)))
            elif kind is Score:
                self.ended[action.request.group_id] += 1
                reward = self.order.sample(action.request.prompt.prompt_id, action.request.sample_index).reward
                self._act(self.tracker.handle(SampleDone(ScoredSample(action.request, action.finished, reward))))
            elif kind is Train:  # no learner: the step is the batch, trained at once
                batch = action.batch
                self.steps += 1
                done = StepDone(batch, StepResult(batch.step + 1, {}), policy_version=batch.step + 1)
                self._act(self.tracker.handle(done))
            elif kind is Stop:
                self.end = action.reason
            elif kind is not Record:
                raise cannot_carry_out("bench replay's driver", action)

    def _start(self, request: Any) -> None:
        gid = request.group_id
        sample = self.order.sample(request.prompt.prompt_id, request.sample_index)
        n = sample.num_tokens
        self.launched[gid] += 1
        self.tokens[gid] += n  # paid in full unless it is aborted (then corrected at its Cancel)
        self.running[request.request_id] = (self.now, n, sample.reward, sample.finish_reason, request)
        heapq.heappush(self.events, (finish_time(self.now, n, self.rate), self._seq, request.request_id))
        self._seq += 1

    # --- what the gate did ---------------------------------------------------------------

    def opened(self, plans: Sequence[GroupPlan]) -> None:
        for plan in plans:
            gid = plan.group_id
            self.prompt_of[gid] = plan.prompt.prompt_id
            self.launched[gid] = self.ended[gid] = self.tokens[gid] = 0

    def saw(self, actions: Sequence[GroupAction]) -> None:
        for a in actions:
            kind = a.kind
            if kind is _ABANDON or kind is _COMMIT:
                gid = a.group_id
                if gid not in self.decided and gid in self.ended:
                    self.decided[gid] = self.ended[gid]
                if kind is _ABANDON:
                    self.abandoned.add(gid)

    def closed(self, group_id: int, committed: bool) -> None:
        if committed:
            self.verdict[group_id] = "committed"
        elif group_id in self.abandoned or group_id not in self.decided:
            self.verdict[group_id] = "abandoned"
        else:
            self.verdict[group_id] = "dropped"  # committed with fewer than two valid samples

    def _outcomes(self) -> list[PromptOutcome]:
        n = len(self.order.prompts)
        out: list[PromptOutcome | None] = [None] * n
        for gid, pid in self.prompt_of.items():
            out[pid] = PromptOutcome(
                prompt_id=pid,
                opened=True,
                verdict=self.verdict.get(gid, "open"),  # type: ignore[arg-type]
                samples=self.launched[gid],
                tokens=self.tokens[gid],
                decided_at=self.decided.get(gid, 0),
            )
        return [o if o is not None else PromptOutcome(p, False, "skipped", 0, 0, 0) for p, o in enumerate(out)]


def _reference_screen(cfg: RunConfig, order: ReplayOrder, gate: Any, batch_groups: int, exact: bool) -> ReferenceScreen:
    """SARA's reference screen holding every replayed prompt's recorded ``reference_logprob`` up
    front (prompts without one get the gate's prior, as unscored prompts do in a run)."""
    sara = cfg.gate.sara
    scores = {p.prompt_id: order.reference_logprob(p.prompt_id) for p in order.prompts}
    scores = {pid: lp for pid, lp in scores.items() if lp is not None and not math.isnan(lp)}
    if not scores:
        raise NotReplayable(
            "gate.sara.reference_prior reads each group's reference_logprob, and the log has none; record the "
            "log with reference scoring or replay without the reference prior"
        )
    bad = {pid: lp for pid, lp in scores.items() if lp > 1e-6}
    if bad:
        pid, lp = next(iter(bad.items()))
        group = order.group(pid)
        raise NotReplayable(
            f"log group {group.group_id} (prompt {group.prompt_id}) has reference_logprob={lp}, not the log of a "
            "probability; fix the log's reference scores"
        )
    screen = ReferenceScreen(
        {pid: () for pid in scores},
        gate.source.peek,
        exact=exact and not sara.reference_calibrate,
        strength=sara.reference_strength,
        ahead=sara.scored_ahead(batch_groups),
        calibration=ReferenceCalibration() if sara.reference_calibrate else None,
    )
    screen.update(scores, tokens=0)
    return screen


class _Watched(Gate):
    """The gate as the tracker sees it, with the replay noting which groups it opened, its first
    verdict on each and how each closed; every call is the gate's own."""

    def __init__(self, gate: Gate, replay: _Replay):
        self.gate, self.replay = gate, replay

    @property
    def abandons(self) -> bool:  # type: ignore[override]
        return self.gate.abandons

    @property
    def uncounted_rollouts(self) -> int:
        return self.gate.uncounted_rollouts

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        plans = self.gate.admit(group_ids, step)
        self.replay.opened(plans)
        return plans

    def update(self, snapshot: GroupSnapshot) -> list[GroupAction]:
        actions = self.gate.update(snapshot)
        if actions:
            self.replay.saw(actions)
        return actions

    def on_step(self, step: int, batch: Any) -> list[GroupAction]:
        actions = self.gate.on_step(step, batch)
        if actions:
            self.replay.saw(actions)
        return actions

    def on_closed(self, group_id: int, committed: bool) -> None:
        self.gate.on_closed(group_id, committed)
        self.replay.closed(group_id, committed)

    def state_dict(self) -> dict[str, Any]:
        return self.gate.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gate.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.gate.metrics()
