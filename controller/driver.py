"""A gate (SARA by default) driven from your own sampling loop, without railgate's orchestrator.

You choose each prompt, sample and score; the gate says after every batch of rewards whether
to sample more of the group, train on it or drop it::

    driver = GateDriver.sara(group_size=8, probe_size=4)
    group = driver.open("12+30=", prompt_id=0)      # the caller's prompt
    verdict = group.start()                          # Verdict("sample", 4): the probe
    while verdict.kind == "sample":
        verdict = group.report(rewards_of(sample(verdict.n)))
    # verdict.kind: "train" (the group is effective enough: train on group.rewards) or "drop"
    driver.step_done(trained_groups)                 # after your optimizer step

The rules are the orchestrator's (``pipeline.protocols``): each group's state is the tracker's
own group record (``pipeline.core.group.GroupRun``), the gate sees that record's ``GroupSnapshot``
after every ended sample and its closing snapshot when it ends, every gate action passes the
tracker's own checks (``pipeline.core.group.checked``: ``GateProtocolError``); once it commits a
group it is not asked again, and the group only takes the rewards of the samples it asked for.
Reporting more rewards than were asked for, or reporting to a group that ended, raises
``LifecycleError`` instead of counting a sample twice. A reward of ``None`` is "no reward":
counted as a failed sample, not as a success or failure.

>>> driver = GateDriver.sara(group_size=4, probe_size=2)
>>> group = driver.open("2+2=", prompt_id=1)
>>> group.start()
Verdict(kind='sample', n=2)
>>> group.report([1.0, 0.0])          # mixed probe: sample the rest, then train
Verdict(kind='sample', n=2)
>>> group.report([1.0, 1.0])
Verdict(kind='train', n=0)
>>> group.report([0.0])
Traceback (most recent call last):
...
controller.driver.LifecycleError: group 0 (prompt 1) ended ('train') after 4 rewards; open a new group for more samples of this prompt

The reference prior (SARA's default in railgate's own run, ``controller.reference``): pass
``reference_prior=True`` and, at ``open``, the policy's log-likelihood of the prompt's reference
response (teacher-forced, at temperature 1). The group starts from the prior it gives, and a
prompt whose group that prior says will be mixed with chance at most ``reference_skip`` is
skipped before any sample (verdict ``skip``). ``reference_exact``: the reference is the only
response that earns the reward (an exact-match answer), so its likelihood is the pass rate;
otherwise it is a lower bound, which only skips near-sure successes.

>>> import math
>>> driver = GateDriver.sara(group_size=8, probe_size=4, reference_prior=True, reference_exact=True,
...                          reference_skip=0.8)
>>> driver.open("2+2=", prompt_id=1, reference_logprob=math.log(0.98)).start()   # nearly always right
Verdict(kind='skip', n=0)
>>> driver.open("12+30=", prompt_id=2, reference_logprob=math.log(0.5)).start()  # a coin: worth a group
Verdict(kind='sample', n=4)
>>> driver.metrics()["gate/skip_reference"]
1.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controller.config import SaraConfig
from controller.reference import ReferenceScreen
from controller.selectors import PromptSelector
from pipeline.core.group import GroupRun, SnapshotView, checked
from pipeline.types import (
    NO_REWARD,
    ActionKind,
    CommittedGroup,
    GroupAction,
    Prompt,
    ScoredSample,
    TrainBatch,
)


class LifecycleError(RuntimeError):
    """A group was used against its lifecycle (a report after it ended, more rewards than asked for)."""


@dataclass(frozen=True)
class Verdict:
    """What to do next with a group: ``sample`` ``n`` more, ``wait`` for samples still out,
    ``train`` on it, or ``drop`` it; ``skip``: the reference prior passed over the prompt before
    any sample."""

    kind: Literal["sample", "wait", "train", "drop", "skip"]
    n: int = 0


class _CallerChoice(PromptSelector):
    """A prompt selector that hands the gate exactly the prompt the caller opened."""

    def __init__(self) -> None:
        self.offered: list[Prompt] = []

    @property
    def active(self) -> int:
        return len(self.offered)

    def take(self, n: int) -> list[Prompt]:
        out, self.offered = self.offered[:n], self.offered[n:]
        return out

    def evict(self, prompt_id: int) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass
class DrivenGroup:
    """One group of the caller's prompt: ``start``, then ``report`` rewards until the verdict is
    ``train`` or ``drop``. Its state is the tracker's own group record (``pipeline.core.group.GroupRun``:
    what was launched, every ended sample, the rewards, the commit), changed only through that
    record's methods; the group adds only how many samples the caller was told to draw."""

    driver: GateDriver
    run: GroupRun
    initial: int
    handed: int = 0  # of the samples the gate launched, those the caller was told to draw
    ended: str = ""  # "train", "drop" or "skip" once the group is over

    @property
    def group_id(self) -> int:
        return self.run.group_id

    @property
    def prompt(self) -> Prompt:
        return self.run.prompt

    @property
    def launched(self) -> int:
        """Samples the gate asked for so far."""
        return self.run.launched

    @property
    def rewards(self) -> list[float]:
        """The rewards reported so far (samples reported with no reward left out)."""
        return list(self.run.rewards)

    def start(self) -> Verdict:
        """The first samples to draw (the probe); ``skip`` when the gate passed over the prompt."""
        if self.ended == "skip":
            return Verdict("skip")
        if self.run.launched:
            raise LifecycleError(f"group {self.group_id} was started already; report its rewards")
        for _ in range(self.initial):
            self.run.launch()
        self.handed = self.initial
        return Verdict("sample", self.initial)

    def report(self, rewards: Sequence[float | None], tokens: int = 0) -> Verdict:
        """Rewards of samples the gate asked for (any number of them, in any order; ``tokens``:
        what they generated); the next step."""
        run = self.run
        if self.ended:
            raise LifecycleError(
                f"group {self.group_id} (prompt {self.prompt.prompt_id}) ended ({self.ended!r}) after "
                f"{len(run.samples)} rewards; open a new group for more samples of this prompt"
            )
        outstanding = self.handed - len(run.samples)
        if len(rewards) > outstanding:
            raise LifecycleError(
                f"group {self.group_id} got {len(rewards)} rewards but only {outstanding} samples are out "
                f"({self.handed} asked for); report only the samples the gate asked for"
            )
        run.count_tokens(tokens)
        gate = self.driver.gate
        for reward in rewards:
            run.add(self._scored(reward))
            if run.sealed:
                continue  # a committed group is not asked again; it collects its samples
            snapshot = self.driver.open_groups[self.group_id]
            if any(self._apply(action) for action in gate.update(snapshot, self.driver.open_groups)):
                return self._end("drop")  # the rest of this report belongs to a dropped group: unread
        return self._next()

    def _scored(self, reward: float | None) -> ScoredSample:
        """The next reported sample as the record keeps it; a reward of None or NaN is "no
        reward", which the record counts as a failed sample."""
        value = NO_REWARD if reward is None else float(reward)
        return ScoredSample.reward_only(self.group_id, len(self.run.samples), self.prompt, value, self.driver.step)

    def _apply(self, action: GroupAction) -> bool:
        """Apply one gate action, past the tracker's checks (``pipeline.core.group.checked``: an action
        on another group, which is not open here, or a LAUNCH after the COMMIT raises
        ``GateProtocolError``); True when it abandons the group."""
        checked(self.run if action.group_id == self.group_id else None, action, "gate", self.driver.gate)
        if action.kind is ActionKind.LAUNCH:
            for _ in range(action.n):
                self.run.launch()
        elif action.kind is ActionKind.COMMIT:
            self.run.seal()
        elif action.kind is ActionKind.ABANDON:
            return True
        return False

    def _next(self) -> Verdict:
        new = self.run.launched - self.handed
        if new > 0:  # the gate asked for more: the caller draws them
            self.handed += new
            return Verdict("sample", new)
        if self.handed > len(self.run.samples):
            return Verdict("wait")  # the caller still holds drawn samples to report
        if self.run.sealed:
            return self._end("train")
        return Verdict("wait")  # the gate holds the group (SARA never does)

    def _end(self, how: str) -> Verdict:
        self.ended = how
        closing = self.driver.open_groups[self.group_id]
        self.driver.close(self.run)
        self.driver.gate.on_closed(closing, how == "train")
        return Verdict(how)  # type: ignore[arg-type]

    def as_committed(self) -> CommittedGroup:
        """The group as the gate's ``on_step`` reads it (rewards only; no tokens)."""
        return self.run.committed()


class GateDriver:
    """Holds a gate and numbers the groups the caller opens; see the module docstring.

    Parameters
    ----------
    gate_factory
        Called with the prompt source to build the gate, e.g. ``lambda source: SaraGate(source, 8)``.
    success_threshold
        A reward above it is a success (set it for shaped or summed rewards).
    reference_exact
        With a gate that uses the reference prior: the reference is the only response that earns
        the reward, so its likelihood is the pass rate (False: a lower bound on it).
    """

    def __init__(self, gate_factory: Any, success_threshold: float = 0.5, reference_exact: bool = False) -> None:
        self._source = _CallerChoice()
        self.gate = gate_factory(self._source)
        self.success_threshold = success_threshold
        self.step = 0
        self._next_id = 0
        self._open: dict[int, GroupRun] = {}  # the groups started and not ended, by id
        # What the gate reads them from (``pipeline.protocols.OpenGroups``): a sample is in flight
        # from the moment the gate launched it until the caller reports it.
        self.open_groups = SnapshotView(
            self._open, lambda run: run.snapshot(self.step, run.launched - len(run.samples))
        )
        self.reference: ReferenceScreen | None = None
        strength = self.gate.reference_strength  # a declared capability (pipeline.protocols.Gate)
        if strength is not None:
            # The caller scores each prompt it opens; the screen holds that one score until ``open``.
            self.reference = ReferenceScreen({}, lambda n: [], exact=reference_exact, strength=strength, ahead=1)
            self.gate.attach_reference(self.reference)

    @classmethod
    def sara(
        cls,
        group_size: int = 8,
        probe_size: int = 4,
        success_threshold: float = 0.5,
        reference_exact: bool = False,
        **options: Any,
    ) -> GateDriver:
        """A driver of ``controller.gates.sara.SaraGate`` (``options``: the other fields of ``SaraConfig``,
        e.g. ``reference_prior=True, reference_skip=0.8``)."""
        from controller.gates.sara import SaraGate

        config = SaraConfig(probe_size=probe_size, **options)
        return cls(lambda source: SaraGate(source, group_size, config=config), success_threshold, reference_exact)

    def open(
        self,
        text: str,
        prompt_id: int | None = None,
        token_ids: Sequence[int] = (),
        reference_logprob: float | None = None,
        reference_tokens: int = 0,
    ) -> DrivenGroup:
        """A new group for the caller's prompt (``prompt_id``: a stable id of it, for the gate's per-prompt memory).

        ``reference_logprob``: with the reference prior, the policy's summed log-probability of the
        prompt's reference response (``reference_tokens``: what scoring it cost, for the metrics);
        None: the prompt is unscored and starts from the gate's own prior. A prompt the prior skips
        comes back as a group whose ``start`` says ``skip``."""
        pid = self._next_id if prompt_id is None else int(prompt_id)
        if reference_logprob is not None:
            if self.reference is None:
                raise ValueError(
                    "reference_logprob was given to a driver whose gate has no reference prior; build it with "
                    "GateDriver.sara(..., reference_prior=True) or drop reference_logprob"
                )
            self.reference.update({pid: float(reference_logprob)}, tokens=reference_tokens)
        prompt = Prompt(pid, text, tuple(token_ids), success_threshold=self.success_threshold)
        self._source.offered.append(prompt)
        group_id = self._next_id
        plans = self.gate.admit(range(group_id, group_id + 1), self.step)
        self._next_id += 1
        if not plans and self.reference is not None and not self._source.offered:
            return DrivenGroup(self, GroupRun(group_id, prompt, 0, self.step), 0, ended="skip")  # screened out
        if len(plans) != 1:
            raise LifecycleError(
                f"{type(self.gate).__name__} opened {len(plans)} groups for one prompt; it needs a "
                "prompt source of its own, not the caller's choice"
            )
        plan = plans[0]
        run = self._open[plan.group_id] = GroupRun(plan.group_id, plan.prompt, plan.target_size, self.step)
        return DrivenGroup(self, run, plan.initial)

    def close(self, run: GroupRun) -> None:
        """The group ``run`` ended: it is no longer open."""
        run.close()
        del self._open[run.group_id]

    def metrics(self) -> dict[str, float]:
        """The gate's counters (``gate/<reason>``, ``gate/reference_*``)."""
        return self.gate.metrics()

    def step_done(self, trained: Sequence[DrivenGroup]) -> None:
        """Your optimizer step trained on ``trained`` (groups whose verdict was ``train``)."""
        late = [g.group_id for g in trained if g.ended != "train"]
        if late:
            raise LifecycleError(f"groups {late} were not committed; train only on groups whose verdict was 'train'")
        self.gate.on_step(self.step, TrainBatch(self.step, tuple(g.as_committed() for g in trained)), self.open_groups)
        self.step += 1
