"""RAIL: a learned intervention controller behind the orchestrator's ``Controller`` protocol.

``on_group`` (rescue, extend) and ``on_tokens`` (token) find the decision points
(``controller.rail.points`` says what each is and how they are batched), ``on_turn`` an
episode's turn boundaries (turn, decided at once: ``controller.rail.turns``), and ``flush_decisions``
decides the queued ones in one scoring call. Every decision is logged (``DecisionRecord``, its features, the arms, the chosen arm and its
propensity; ``controller.rail.decider`` says what each field holds in live and shadow mode);
its reward is logged and learned from when the group closes, and shadow <-> live switches on
doubly-robust evidence (``controller.rail.outcomes``).

While an intervention's samples are still running, a gate's ABANDON of that group is held
back (dropped, to be proposed again at the next update): otherwise they would be aborted
before they count, and a token-level LAUNCH still on its way to the tracker would name a
group that no longer exists.

>>> from pipeline.core.decisions import NullSink
>>> from pipeline.types import ActionKind, GroupAction, GroupSnapshot, Prompt, SamplingParams
>>> from controller.rail.config import RailConfig
>>> rail = RailController(RailConfig(mode="live", backend="river", token_decisions=False, branch_sizes=(),
...                                  batch_group_decisions=False), NullSink(), SamplingParams(max_tokens=64), seed=0)
>>> snap = GroupSnapshot(group_id=1, prompt=Prompt(0, "", (1,)), target_size=8, rewards=(0.0,) * 4,
...                      in_flight=0, launched=4, failed=0, tokens=200, policy_version=0, origins=(-1,) * 4)
>>> out = rail.on_group(snap, [GroupAction(ActionKind.ABANDON, 1)])   # a rescue point: decided
>>> [a.kind.value for a in out], rail.counts["decisions_rescue"]     # (a fresh learner: the no-op)
(['abandon'], 1)
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from controller.gates.common import hold
from controller.guidance import Guidance
from controller.rail import state as state_io
from controller.rail.arms import Arm, build_arms
from controller.rail.bandit import BanditLearner
from controller.rail.behaviour import build_behaviour
from controller.rail.buffers import PrefixBuffers, RequestBuffer
from controller.rail.config import RailConfig
from controller.rail.decider import Choice, Decider
from controller.rail.features import Context, PrefixInfo, group_features
from controller.rail.guide_history import GuideHistory
from controller.rail.learners import build_learner
from controller.rail.outcomes import Outcomes, PendingDecision
from controller.rail.points import DECISIONS_AT, INTERVENTIONS_OF, QUEUED, GroupState, Point, QueuedPoint, group_point
from controller.rail.records import controller_metrics, decision_record
from controller.rail.turns import TURN, turn_branch, turn_context, turn_due
from pipeline.protocols import DecisionSink
from pipeline.seeding import derive_seed
from pipeline.types import (
    ActionKind,
    BranchSpec,
    CommittedGroup,
    GroupAction,
    GroupSnapshot,
    SamplingParams,
    TokenDelta,
    TurnPoint,
)

__all__ = ["QUEUED", "RailController"]


class RailController:
    """The RAIL controller; see the module docstring.

    Parameters
    ----------
    config
        ``RailConfig``.
    sink
        Where decisions and outcomes go (``pipeline.store.tracelog.TraceLog`` in a run).
    default_params
        The run's sampling settings: interventions take its ``top_p`` and ``max_tokens``.
    seed
        Run seed; the learner, behaviour policy and sampling derive theirs from it.
    run_id, clock
        Stamped on logged records (``clock`` defaults to wall time; pass the engine clock's ``now``).
    """

    LATENCY_WINDOW = 20_000
    """Decisions whose durations ``latency_ns`` keeps for the latency metrics."""

    def __init__(
        self,
        config: RailConfig,
        sink: DecisionSink,
        default_params: SamplingParams,
        seed: int,
        run_id: str = "",
        clock: Callable[[], float] | None = None,
    ):
        self.config = config
        self.sink = sink
        self.default_params = default_params
        self.seed = seed
        self.run_id = run_id
        self._clock = clock or time.time
        self.arms = build_arms(config)
        self._branch_arms = tuple(a for a in self.arms if a.kind == "branch")
        # Guidance arms are offered only at a rescue of an all-failed group whose prompt has a
        # reference (``_guided_arms``); every other point chooses among the rest.
        self._unguided_arms = tuple(a for a in self.arms if a.kind != "guide")
        self._other_arms = tuple(a for a in self._unguided_arms if a.kind != "branch")
        self._guided_arms = tuple(a for a in self.arms if a.kind != "branch")
        self.guidance: Guidance | None = None
        """The references guidance arms continue from (``attach_guidance``); None: none offered."""
        self.guide_history = GuideHistory()
        """The prompts' guidance outcomes and the run's pass rate, features of guidance points."""
        self.learner: BanditLearner = build_learner(config, derive_seed(seed, "rail", "learner"))
        self.behaviour = build_behaviour(config, derive_seed(seed, "rail", "behaviour"))
        self.decider = Decider(config, self.learner, self.behaviour, derive_seed(seed, "rail", "decider"))
        self.counts: Counter[str] = Counter()
        self.outcomes = Outcomes(
            config,
            sink,
            self.learner,
            self.counts,
            frozen_seed=derive_seed(seed, "rail", "frozen"),
            run_id=run_id,
            clock=self._clock,
        )
        """Rewards, learning, the frozen copy and promotion (``controller.rail.outcomes``)."""
        # Token hooks are needed for token decisions, and to know prefixes for group-level branches.
        self.wants_tokens = bool(config.token_decisions or self._branch_arms)
        self.buffers = PrefixBuffers(config.buffer_max_tokens, config.buffer_max_requests)
        self._groups: dict[int, GroupState] = {}
        self.length_estimate = config.initial_length or default_params.max_tokens / 2.0
        """Running mean response length (tokens), for the arms' expected costs."""
        self.latency_ns: deque[int] = deque(maxlen=self.LATENCY_WINDOW)
        """Durations of the last decisions (features, choice, logging), in nanoseconds."""
        self._queue: list[QueuedPoint] = []

    @property
    def mode(self) -> str:
        return self.outcomes.mode

    def attach_guidance(self, guidance: Guidance) -> None:
        """Offer the guidance arms (``controller.rail.guide_levels``) from ``guidance``'s references."""
        if len(self._guided_arms) == len(self._other_arms):
            raise ValueError(
                "guidance was attached to a RAIL controller without guidance arms; set controller.rail.guide_levels "
                "(e.g. [0.25, 0.5, 0.75])"
            )
        self.guidance = guidance

    @property
    def promoter(self) -> Any:
        """The promotion window and mode (``controller.rail.promotion.Promoter``)."""
        return self.outcomes.promoter

    @property
    def frozen(self) -> BanditLearner | None:
        """The frozen copy of the learner, once it has learned ``warmup_decisions`` decisions."""
        return self.outcomes.frozen

    # --- Controller protocol -------------------------------------------------------------

    def on_group(self, snapshot: GroupSnapshot, proposed: list[GroupAction]) -> list[GroupAction]:
        gid = snapshot.group_id
        mine = [a.kind for a in proposed if a.group_id == gid]
        if not mine:
            return proposed
        group = self._group(snapshot)
        cfg = self.config
        if ActionKind.ABANDON in mine:
            rest = [a for a in proposed if not (a.group_id == gid and a.kind is ActionKind.ABANDON)]
            if snapshot.in_flight > 0 and group.outstanding(snapshot):
                self.counts["abandons_deferred"] += 1
                return rest
            if group.may_rescue(snapshot, cfg):
                held = tuple(a for a in proposed if a.group_id == gid and a.kind is ActionKind.ABANDON)
                if self._queue_group_point(snapshot, group, "rescue", held):
                    return rest + [hold(gid, QUEUED)]
                actions = group.rescued(snapshot, self._group_decision(snapshot, group, "rescue"), (), self.counts)
                return rest + actions if actions else proposed
            return proposed
        if ActionKind.COMMIT in mine and group.may_extend(cfg):
            held = tuple(a for a in proposed if a.group_id == gid)
            if self._queue_group_point(snapshot, group, "extend", held):
                return [a for a in proposed if a.group_id != gid] + [hold(gid, QUEUED)]
            return proposed + self._group_decision(snapshot, group, "extend")
        return proposed

    def on_tokens(self, snapshot: GroupSnapshot, sample_index: int, delta: TokenDelta) -> list[GroupAction]:
        gid = snapshot.group_id
        buf = self.buffers.observe(gid, sample_index, delta)
        cfg = self.config
        entropies = delta.entropies
        if not cfg.token_decisions or not entropies:
            return []
        peak = max(entropies)
        if not peak >= cfg.entropy_threshold:  # also false for NaN
            return []
        group = self._group(snapshot)
        if not group.may_decide_token(cfg):
            return []
        position = delta.position + entropies.index(peak)
        if position < 1 or position - buf.last_decision < cfg.min_tokens_between_decisions:
            return []
        buf.last_decision = position
        group.token_decisions += 1
        can_branch = buf.known and position <= buf.length and position < self.default_params.max_tokens - 1
        prefix = PrefixInfo(
            position_fraction=min(position / max(self.length_estimate, 1.0), 0.95),
            token_entropy=peak,
            entropy_known=True,
            prefix_mean_logprob=buf.mean_logprob(position),
        )
        arms = self._arms(can_branch)
        source = buf if can_branch else None
        if not cfg.batch_token_decisions:
            return self._decide("token", snapshot, group, prefix, arms, source, position)
        started = time.perf_counter_ns()
        context = self._context("token", snapshot, group, prefix, arms)
        self._queue.append(
            QueuedPoint("token", snapshot, group, context, source, position, time.perf_counter_ns() - started)
        )
        return []

    def on_turn(self, snapshot: GroupSnapshot, sample_index: int, point: TurnPoint) -> list[GroupAction]:
        """An episode's turn boundary: a ``turn`` decision point, decided at once, when
        ``controller.rail.turns`` says it is one (its arms: the no-op, branches from this
        boundary, fresh episodes)."""
        cfg = self.config
        if not turn_due(point, self._groups.get(snapshot.group_id), cfg):
            return []
        started = time.perf_counter_ns()
        group = self._group(snapshot)
        group.turn_decisions += 1
        context = turn_context(snapshot, group, point, self.arms, self.length_estimate, cfg.turn_fail_reward)
        choice = self.decider.choose(context, self.mode)
        actions = self._act(
            TURN, snapshot, group, context, choice, None, point.prefix_len, turn_branch(point), sample_index
        )
        self.latency_ns.append(time.perf_counter_ns() - started)
        return actions

    @property
    def queued_decisions(self) -> int:
        """Decision points waiting for ``flush_decisions``."""
        return len(self._queue)

    def flush_decisions(self) -> list[GroupAction]:
        """Decide the queued decision points in one batch (one scoring call), in the order they
        arose. A point whose group closed meanwhile is dropped undecided and unlogged, as is a
        token-level one whose group reached ``max_interventions_per_group`` earlier in the batch.
        A group-level point's actions include its held proposal when that still runs (module
        docstring). Each decision's latency is its context's cost plus an equal share of the batch's.
        More than ``decision_batch_max`` points are decided in consecutive batches of at most that
        many, so that a pause inside one (a garbage collection, a trace write) delays few decisions."""
        queue, self._queue = self._queue, []
        queue = [q for q in queue if self._groups.get(q.snapshot.group_id) is q.group]
        size = self.config.decision_batch_max
        actions: list[GroupAction] = []
        for k in range(0, len(queue), size):
            actions += self._decide_batch(queue[k : k + size])
        return actions

    def _decide_batch(self, queue: list[QueuedPoint]) -> list[GroupAction]:
        started = time.perf_counter_ns()
        choices = self.decider.choose_many([q.context for q in queue], self.mode)
        actions: list[GroupAction] = []
        cap = self.config.max_interventions_per_group
        decided = []
        for q, choice in zip(queue, choices):
            if q.point == "token" and q.group.interventions >= cap:
                self.counts["token_decisions_dropped"] += 1
                continue
            chosen = self._act(q.point, q.snapshot, q.group, q.context, choice, q.source, q.position)
            if q.point == "rescue":
                chosen = q.group.rescued(q.snapshot, chosen, q.held, self.counts)
            elif q.point == "extend":
                chosen = list(q.held) + chosen
            actions += chosen
            decided.append(q)
        self.counts["decision_batches"] += 1
        share = (time.perf_counter_ns() - started) // max(1, len(decided))
        self.latency_ns.extend(q.cost_ns + share for q in decided)
        return actions

    def on_closed(self, group: CommittedGroup | None, snapshot: GroupSnapshot) -> None:
        gid = snapshot.group_id
        self.buffers.drop_group(gid)
        if group is not None and group.rollouts:
            a = self.config.length_ema
            for r in group.rollouts:
                self.length_estimate = (1 - a) * self.length_estimate + a * len(r.token_ids)
        state = self._groups.pop(gid, None)
        if state is None:
            return
        committed = group is not None
        if committed and state.rescued_from and snapshot.is_mixed:
            # A saturated probe (all fail / all pass) the gate would have abandoned, made mixed.
            self.counts[f"recovered_{state.rescued_from}"] += 1
        if self.guidance is not None:
            done = len(snapshot.rewards)
            self.guide_history.closed(
                snapshot.prompt.prompt_id,
                guided=any(d.context.arms[d.acted.action].kind == "guide" for d in state.decisions),
                mixed=committed and snapshot.is_mixed,
                success_share=snapshot.successes / done if done else 0.0,
            )
        self.outcomes.settle(state.decisions, snapshot, committed, self.length_estimate)

    # --- decisions -----------------------------------------------------------------------

    def _group(self, snapshot: GroupSnapshot) -> GroupState:
        group = self._groups.get(snapshot.group_id)
        if group is None:
            group = self._groups[snapshot.group_id] = GroupState(first_version=snapshot.policy_version)
        return group

    def _arms(self, can_branch: bool) -> tuple[Arm, ...]:
        return self.arms if can_branch else self._other_arms

    def _group_point(self, snapshot: GroupSnapshot, point: str) -> Point | None:
        guidance = self.guidance
        if (
            point == "rescue"
            and guidance is not None
            and snapshot.successes == 0
            and guidance.has_reference(snapshot.prompt.prompt_id)
        ):  # guidance arms, and no branches (the config refuses both at once)
            return group_point(snapshot, self.buffers, self._guided_arms, self._guided_arms, 0)
        return group_point(
            snapshot, self.buffers, self._unguided_arms, self._other_arms, self.default_params.max_tokens
        )

    def _group_decision(self, snapshot: GroupSnapshot, group: GroupState, point: str) -> list[GroupAction]:
        found = self._group_point(snapshot, point)
        if found is None:
            return []
        return self._decide(point, snapshot, group, found.prefix, found.arms, found.source, found.position)

    def _queue_group_point(
        self, snapshot: GroupSnapshot, group: GroupState, point: str, held: tuple[GroupAction, ...]
    ) -> bool:
        """Queue a group-level point for the next batch, holding ``held`` (the gate's proposal
        for the group) until it is decided; False when it is to be decided now instead (batching
        off, samples of the group still running) or there is nothing to decide."""
        if not self.config.batch_group_decisions or snapshot.in_flight > 0:
            return False
        started = time.perf_counter_ns()
        found = self._group_point(snapshot, point)
        if found is None:
            return False
        context = self._context(point, snapshot, group, found.prefix, found.arms)
        self._queue.append(
            QueuedPoint(
                point, snapshot, group, context, found.source, found.position, time.perf_counter_ns() - started, held
            )
        )
        return True

    def _context(
        self, point: str, snapshot: GroupSnapshot, group: GroupState, prefix: PrefixInfo, arms: tuple[Arm, ...]
    ) -> Context:
        features = group_features(
            snapshot,
            point,
            prefix,
            self.length_estimate,
            snapshot.policy_version - group.first_version,
            group.interventions,
        )
        if any(a.kind == "guide" for a in arms):  # a guidance point: the prompt's history, the run's progress
            features.update(self.guide_history.features(snapshot.prompt.prompt_id))
        return Context.build(point, features, arms, checked=True)  # group_features and GuideHistory checked them

    def _decide(
        self,
        point: str,
        snapshot: GroupSnapshot,
        group: GroupState,
        prefix: PrefixInfo,
        arms: tuple[Arm, ...],
        source: RequestBuffer | None,
        position: int,
    ) -> list[GroupAction]:
        started = time.perf_counter_ns()
        context = self._context(point, snapshot, group, prefix, arms)
        actions = self._act(point, snapshot, group, context, self.decider.choose(context, self.mode), source, position)
        self.latency_ns.append(time.perf_counter_ns() - started)
        return actions

    def _act(
        self,
        point: str,
        snapshot: GroupSnapshot,
        group: GroupState,
        context: Context,
        choice: Choice,
        source: RequestBuffer | None,
        position: int,
        branch: BranchSpec | None = None,
        sample: int = -1,
    ) -> list[GroupAction]:
        """Log the decision, keep it for its reward, and turn the chosen arm into actions (a
        branch continues ``branch``, else ``source``'s prefix up to ``position``)."""
        i = choice.acted.action
        arm = context.arms[i]
        decision_id = self.sink.next_decision_id()
        sample = source.sample_index if source is not None else sample
        self.sink.log_decision(
            decision_record(
                decision_id,
                float(self._clock()),
                self.run_id,
                self.mode,
                point,
                snapshot,
                sample,
                position,
                context,
                choice,
            )
        )
        group.decisions.append(
            PendingDecision(
                decision_id,
                point,
                context,
                choice.acted,
                choice.other_prob,
                choice.q_other,
                choice.predicted_gain,
                self.frozen is not None,
                context.costs[i],
                snapshot.tokens,
            )
        )
        counts = self.counts
        counts["decisions"] += 1
        counts[DECISIONS_AT[point]] += 1
        if arm.is_noop:
            return []
        group.interventions += 1
        counts["interventions"] += 1
        counts[INTERVENTIONS_OF[arm.kind]] += 1
        if arm.kind == "branch" and branch is None:
            assert source is not None  # branch arms are only offered with a known prefix
            tokens, logprobs = source.prefix(position)
            branch = BranchSpec(source.request_id, position, tokens, logprobs)
            self.buffers.expect_branch(snapshot.group_id, source, position, arm.n)
        elif arm.kind == "guide":
            assert self.guidance is not None  # guidance arms are only offered with a reference
            branch = self.guidance.branch(snapshot.prompt.prompt_id, level=arm.level)
            self.guidance.launched(arm.n)
            counts[f"guide_level_{arm.level:g}"] += 1  # which level the controller chose
        return arm.actions(snapshot.group_id, decision_id, self.default_params, branch)

    def set_mode(self, mode: str, policy_version: int = 0) -> None:
        """Switch by hand; logged like an automatic switch, with the current evidence if any."""
        self.outcomes.set_mode(mode, policy_version)

    # --- reporting and state ---------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """``controller/...`` metrics for the step log: the counters, the mode and the switches,
        the length estimate, the prefix buffers, open groups, the mean recent reward, decision
        latency percentiles, the latest promotion evidence and the gain-prediction errors."""
        return controller_metrics(
            self.counts, self.length_estimate, self.buffers, len(self._groups), self.latency_ns, self.outcomes
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state; ``controller.rail.state`` says what is kept (not the open groups: a
        resumed run starts them afresh)."""
        return state_io.controller_state(self)

    def load_state_dict(self, state: dict[str, Any], where: str = "controller state") -> None:
        """Restore ``state_dict()``'s output. ``ControllerStateError`` naming ``where`` for a state
        of another format, version or backend (nothing loaded) or a corrupt one."""
        state_io.load_controller_state(self, state, where)

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to ``path`` as JSON, atomically."""
        state_io.save_file(self.state_dict(), path)

    def load(self, path: str) -> None:
        """Load a file written by ``save``; ``ControllerStateError`` names a corrupt file."""
        self.load_state_dict(state_io.load_file(path))
