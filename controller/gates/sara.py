"""SARA (arXiv 2607.26253, docs/methods.md): a sequential test on each partial group.

After every ended rollout of a group, once its probe of ``probe_size`` (k) rollouts has
finished, SARA computes the chance that the finished group of ``group_size`` (G) will be
effective (hold a success and a failure) under the Beta posterior of the prompt's success
rate, ``controller.posterior.effective_probability``, and decides

* ``P_eff >= tau_commit``  -> COMMIT (probe-first mode launches the rest of the group first);
* ``P_eff <= tau_abandon`` -> ABANDON (eager mode: the orchestrator aborts running siblings);
* otherwise                -> continue: one more rollout (probe-first) or wait for the next
  running sibling (eager).

A mixed group has ``P_eff = 1`` and always commits; a full all-same group has ``P_eff = 0`` and
always ends abandoned, so every group ends. With the uniform prior, G = 8 and k = 4 an
all-same probe gives 4/9 = 0.444 <= 0.45: the rule "abandon iff the probe is all-same".
The budget an abandoned group frees goes to fresh prompts: ``admit`` opens a group for every
slot the orchestrator offers.

Launch modes (``launch``): ``probe_first`` starts k rollouts and the rest on commit;
``eager`` starts all G at once and pays for the aborted siblings' tokens, buying latency;
``streaming`` (ours) starts k like probe-first but commits the moment the group is mixed,
even before the probe is in -- a mixed group's ``P_eff`` is 1 whatever comes next -- so the
rest of the group starts while the probe's stragglers are still generating. It spends exactly
what probe-first spends (the same groups are abandoned, after the same k) and cuts the time a
committed group waits for its probe's slowest sample.

Prior: uniform ``prior = (1, 1)`` by default. Our extensions, off by default: with
``level_prior`` each group starts from a Beta prior fitted to the recent groups of its prompt's
difficulty level (``controller.level_prior``), so with a short probe a level that all fails
is abandoned after two rollouts; with
``history_discount = gamma > 0`` each prompt carries its posterior between groups, shrunk
toward the prior by gamma each time (``controller.posterior.discount_posterior``), so a prompt
seen all-wrong before needs less evidence to be abandoned. With ``confident_pilot`` the probe
starts with one rollout, and a group whose finished rollouts all agree is abandoned as soon as
``mixed_bound`` (1 - q^(G - t), q the policy's probability of its likeliest fresh rollout) is at
most ``confident_max_mixed``: a response the policy writes with probability q is written again by a
fresh rollout with probability at least q, so a near-certain pilot settles the group after one
rollout. With ``reference_prior`` (``attach_reference``, ``controller.reference``) a group starts
from the policy's likelihood of the prompt's reference response, scored before any rollout, and
``admit`` skips prompts whose group that prior says will be effective with chance at most
``reference_skip``. With ``whole_when_certain`` a group whose prior commits it whatever its probe
shows (``certain``) is launched whole at once: the same samples and verdict, one launch.
With ``probe_when: pays`` (``controller.probing``) the gate fits how the run's pass rates spread
from its ended groups, starts each group's test from that fit (empirical Bayes) and launches a
prompt's whole group, trained on whatever it holds (GRPO), wherever that yields more mixed groups
per generated rollout than probing it would.
With ``guidance`` (``attach_guidance``, ``controller.guidance``) a group whose probe is all-wrong,
which the test would abandon, gets the rest of its group launched from a prefix of the prompt's
reference response instead; it commits if the guided rollouts make it mixed and is abandoned
once they all end otherwise.
``tau_commit`` is not published;
0.5 is our default (with G = 8, k = 4 it commits exactly the mixed probes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from controller.config import SaraConfig
from controller.gates.base import BaseGate
from controller.gates.common import GroupRecord, abandon, commit, launch, too_many_failures
from controller.guidance import Guidance
from controller.level_prior import LevelPrior
from controller.posterior import discount_posterior, effective_probability, mixed_bound
from controller.probing import ProbingRule
from controller.prompts import PromptPool
from controller.reference import ReferenceScreen
from controller.selectors import PromptSelector
from pipeline.protocols import OpenGroups
from pipeline.types import ActionKind, GroupAction, GroupPlan, GroupSnapshot, Prompt

# Most prompts the reference screen skips for one group before it opens one anyway.
MAX_SKIPS = 64


@dataclass(kw_only=True)
class SaraRecord(GroupRecord):
    """A SARA group: the Beta prior (a, b) its prompt had when it opened."""

    a: float
    b: float
    whole: bool = False
    """Launched whole because probing does not pay (``probe_when: pays``): committed as it starts."""
    reference_logprob: float | None = None
    """The reference score the group opened with (``reference_prior``), None without one."""
    guided: int = 0
    """With ``guidance``: the probe's rollouts (all wrong) when the rest of the group was launched
    guided; 0: not guided. What the group says of the prompt's own pass rate is that probe."""


class SaraGate(BaseGate[SaraRecord]):
    """Commit / abandon / continue partial groups by their odds of ending effective.

    Parameters
    ----------
    source
        Where prompts come from: a ``PromptPool``, or a ``DpsSelector`` for SARA + DPS.
    group_size
        G, the size of a committed group.
    config
        ``SaraConfig``: the probe size k, the thresholds on ``P_eff``, the Beta prior, the
        carried-history discount and the launch mode.

    Examples
    --------
    >>> from pipeline.types import GroupSnapshot, Prompt
    >>> from controller.prompts import PromptPool
    >>> gate = SaraGate(PromptPool([Prompt(0, "", (1,))], seed=0), group_size=8)
    >>> [(p.group_id, p.target_size, p.initial) for p in gate.admit(range(7, 8), step=0)]
    [(7, 8, 4)]
    >>> probe = GroupSnapshot(group_id=7, prompt=Prompt(0, "", (1,)), target_size=8, rewards=(1.0, 0.0, 0.0, 0.0),
    ...                      in_flight=0, launched=4, failed=0, tokens=100, policy_version=0)
    >>> [(a.kind.value, a.n) for a in gate.update(probe, {7: probe})]
    [('launch', 4), ('commit', 0)]
    """

    name = "sara"
    Record = SaraRecord

    def __init__(self, source: PromptPool | PromptSelector, group_size: int, config: SaraConfig = SaraConfig()):
        super().__init__(source, group_size)
        config.check_sizes(group_size, batch_groups=1)
        self.config = config  # every setting is read from here, nowhere copied
        # prompt_id -> carried posterior (a, b); only kept when history_discount > 0.
        self._carried: dict[int, tuple[float, float]] = {}
        self.levels = (
            LevelPrior(config.level_window, config.level_min_groups, fallback=self.prior)
            if config.level_prior
            else None
        )
        self._level_of: dict[int, float] = {}  # prompt_id -> difficulty: the level a group's outcome counts for
        # reference_prior: the scores of the prompts next in line, attached by the run's builder,
        # which has the task's references and a learner to score them (``attach_reference``).
        self.reference: ReferenceScreen | None = None
        # guidance: the references and level the rest of an all-wrong probe is launched from,
        # attached by the run's builder, which has the task's references (``attach_guidance``).
        self.guidance: Guidance | None = None
        self._step = 0  # the learner step of the latest admission
        # probe_when: pays: prompt id -> the reference scores (None: unscored) of its groups launched
        # whole, committed and not yet shipped: the probing rule and the reference calibration
        # count them when shipped, with their full group (``_closed``, ``_shipped``)
        self._whole_unshipped: dict[int, list[float | None]] = {}
        self.probing = (
            ProbingRule(
                group_size,
                config.probe_size,
                config.tau_commit,
                config.tau_abandon,
                window=config.probe_fit_window,
                min_groups=config.probe_fit_min_groups,
                noise_groups=config.probe_noise_groups or math.inf,
                max_lost=config.probe_max_lost,
            )
            if config.probe_when == "pays"
            else None
        )

    @property
    def prior(self) -> tuple[float, float]:
        """The gate's Beta prior, ``config.prior``, as floats."""
        a, b = self.config.prior
        return float(a), float(b)

    @property
    def reference_strength(self) -> float | None:  # type: ignore[override]
        """``gate.sara.reference_strength`` when the prior reads a reference screen (``reference_prior``)."""
        return self.config.reference_strength if self.config.reference_prior else None

    def attach_reference(self, screen: ReferenceScreen) -> None:
        """Use ``screen``'s reference likelihoods for priors and skips (``gate.sara.reference_prior``)."""
        if not self.config.reference_prior:
            raise ValueError(
                "a reference screen was attached to a SARA gate with gate.sara.reference_prior=false; "
                "set it to true or do not attach one"
            )
        self.reference = screen

    def attach_guidance(self, guidance: Guidance) -> None:
        """Launch the rest of all-wrong probes from ``guidance``'s reference prefixes (``gate.sara.guidance``)."""
        if guidance.level != self.config.guidance:
            raise ValueError(
                f"a guidance of level {guidance.level} was attached to a SARA gate with gate.sara.guidance="
                f"{self.config.guidance}; set gate.sara.guidance={guidance.level} or attach one of that level"
            )
        self.guidance = guidance

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        if self.guidance is not None:
            out.update(self.guidance.metrics())
        if self.reference is not None:
            out.update(self.reference.metrics())
        if self.probing is not None:
            out.update(self.probing.metrics())
        return out

    # --- admission ----------------------------------------------------------------------

    def admit(self, group_ids: range, step: int) -> list[GroupPlan]:
        self._step = step  # the learner step guidance's schedule reads
        initial = (
            self.group_size
            if self.config.launch == "eager"
            else 1
            if self.config.confident_pilot
            else self.config.probe_size
        )
        chosen: list[tuple[Prompt, tuple[float, float], float | None]]
        if self.reference is None:
            chosen = [
                (p, self._prior_of(p.prompt_id, self._base_prior(p)), None) for p in self.source.take(len(group_ids))
            ]
        else:
            chosen = [c for c in (self._screened_prompt() for _ in group_ids) if c is not None]
        plans = []
        for group_id, (prompt, (a, b), logprob) in zip(group_ids, chosen):
            probed = initial == self.config.probe_size
            certain = probed and self.config.whole_when_certain and self.certain((a, b))
            unpaid = probed and not certain and self.probing is not None and self.probing.choose((a, b)) == "whole"
            self._open(group_id, prompt, a=a, b=b, whole=unpaid, reference_logprob=logprob)
            if certain:
                self._verdicts.add("launched_whole")
            plans.append(
                GroupPlan(group_id, prompt, self.group_size, self.group_size if certain or unpaid else initial)
            )
        return plans

    def certain(self, prior: tuple[float, float]) -> bool:
        """Whether every probe outcome commits a group that starts from ``prior``: a mixed probe
        has ``P_eff = 1``, so the all-success and the all-failure probes decide (``whole_when_certain``)."""
        k = self.config.probe_size
        return min(self.predict(k, 0, prior), self.predict(0, k, prior)) >= self.config.tau_commit

    def _base_prior(self, prompt: Prompt) -> tuple[float, float]:
        """The gate's prior; with ``level_prior`` the prompt's level's (noting the level); with
        ``probe_when: pays`` the fit of the run's pass rates once it has one (empirical Bayes: a
        run of equal, middling rates gets a strong prior, whose test rarely abandons)."""
        if self.levels is not None:
            self._level_of[prompt.prompt_id] = prompt.difficulty
            return self.levels.prior(prompt.difficulty)
        fitted = self.probing.run_prior() if self.probing is not None else None
        return fitted or self.prior

    def _screened_prompt(self) -> tuple[Prompt, tuple[float, float], float | None] | None:
        """The next prompt the reference screen lets through, its prior and score: prompts whose group
        would be effective with chance at most ``reference_skip`` (and under the ``reference_skip_share``
        quantile of the latest openings) are skipped, but for hard ones that guidance will take
        (``_guides_instead``), at most ``MAX_SKIPS``
        in a row (then the last one opens anyway, so a pool of solved prompts cannot stall
        admission); None when the selector has no prompt left."""
        assert self.reference is not None
        for skips in range(MAX_SKIPS + 1):
            taken = self.source.take(1)
            if not taken:
                return None
            prompt = taken[0]
            base = self._prior_of(prompt.prompt_id, self._base_prior(prompt))
            opening = self.reference.opening(prompt.prompt_id, base, self.group_size)
            skipped = self.reference.skips(opening, self.config.reference_skip, self.config.reference_skip_share)
            if skipped and self._guides_instead(prompt.prompt_id, opening.prior):
                self._verdicts.add("open_to_guide")
                skipped = False
            if not skipped or skips == MAX_SKIPS:
                return prompt, opening.prior, opening.logprob
            self._verdicts.add("skip_reference")
            self.source.release(prompt.prompt_id)
        raise AssertionError("unreachable: the last pass returns")

    def _guides_instead(self, prompt_id: int, prior: tuple[float, float]) -> bool:
        """With guidance: a prompt the screen would skip as too hard (its prior's mean pass rate
        below 1/2) and that has a reference opens anyway, so that its all-wrong probe is guided;
        the screen still skips the prompts it expects the policy to pass."""
        a, b = prior
        return self.guidance is not None and a / (a + b) < 0.5 and self.guidance.has_reference(prompt_id)

    def _prior_of(self, prompt_id: int, base: tuple[float, float] | None = None) -> tuple[float, float]:
        """The prompt's prior: ``base`` (the gate's prior or its level's), or its carried
        posterior shrunk toward ``base``."""
        base = base or self.prior
        carried = self._carried.get(prompt_id)
        if carried is None:
            return base
        return discount_posterior(carried[0], carried[1], self.config.history_discount, base)

    # --- the sequential test ------------------------------------------------------------

    def predict(self, successes: int, failures: int, prior: tuple[float, float] | None = None) -> float:
        """``P_eff`` of a partial group with these counts (the number the thresholds see)."""
        size = max(self.group_size, successes + failures)
        return effective_probability(successes, failures, size, prior or self.prior)

    def _update(self, snapshot: GroupSnapshot, rec: SaraRecord, groups: OpenGroups) -> list[GroupAction]:
        gid, t, running = snapshot.group_id, snapshot.finished, snapshot.in_flight
        if too_many_failures(snapshot):
            return self._abandon_failed(gid)
        if rec.whole:
            self._verdicts.add("commit_whole")
            return [commit(gid, "sara whole: probing does not pay")]
        if rec.guided:
            return self._guided_update(snapshot, rec)
        if self.config.confident_pilot and t and not snapshot.is_mixed:
            bound = self.confident_bound(snapshot)
            if bound <= self.config.confident_max_mixed:
                self._verdicts.add("abandon_confident")
                return [abandon(gid, f"sara confident, P(mixed) <= {bound:.3f}")]
        if t < self.config.probe_size and self.config.launch == "streaming" and snapshot.is_mixed:
            self._verdicts.add("commit_early")
            rest = self.group_size - t - running
            return ([launch(gid, rest, "sara rest")] if rest > 0 else []) + [
                commit(gid, "sara mixed before the probe is in")
            ]
        if t < self.config.probe_size:
            # The probe is not in yet: launch the rest of it after a pilot, replace samples the
            # engine failed on.
            wanted = self.group_size if self.config.launch == "eager" else self.config.probe_size
            missing = wanted - t - running
            reason = "sara probe after the pilot" if snapshot.launched < wanted else "replace failed"
            return [launch(gid, missing, reason)] if running == 0 and missing > 0 else []
        p_eff = self.predict(snapshot.successes, snapshot.failures, (rec.a, rec.b))
        if p_eff >= self.config.tau_commit:
            self._verdicts.add("commit")
            rest = self.group_size - t - running
            return ([launch(gid, rest, "sara rest")] if rest > 0 else []) + [commit(gid, f"sara p_eff={p_eff:.3f}")]
        if p_eff <= self.config.tau_abandon:
            guided = self._guide(snapshot, rec)
            if guided:
                return guided
            self._verdicts.add("abandon")
            return [abandon(gid, f"sara p_eff={p_eff:.3f}")]
        self._verdicts.add("continue")
        if running > 0:
            return []
        more = self.group_size - t if self.config.launch == "eager" else 1
        return [launch(gid, more, f"sara continue p_eff={p_eff:.3f}")]

    def _guide(self, snapshot: GroupSnapshot, rec: SaraRecord) -> list[GroupAction]:
        """With ``guidance``: the rest of an all-wrong probe, launched from the prompt's reference
        prefix (nothing when guidance is off, the probe holds a success, rollouts still run, the
        group is full or the prompt has no reference, counted)."""
        rest = self.group_size - snapshot.finished
        if self.guidance is None or snapshot.successes or snapshot.in_flight or rest <= 0:
            return []
        branch = self.guidance.branch(snapshot.prompt.prompt_id, self._step)
        if branch is None:
            return []
        self.guidance.launched(rest)
        self._verdicts.add("guide")
        rec.guided = snapshot.finished
        return [
            GroupAction(
                ActionKind.LAUNCH,
                snapshot.group_id,
                n=rest,
                branch=branch,
                reason=f"sara guide level={branch.guide_level} after {snapshot.finished} wrong",
            )
        ]

    def _guided_update(self, snapshot: GroupSnapshot, rec: SaraRecord) -> list[GroupAction]:
        """A guided group: committed once mixed, abandoned once its guided rollouts all ended
        without making it so. Its record keeps the probe (all wrong) as the prompt's outcome: a
        guided rollout's reward is not a draw of the prompt's own pass rate (``_closed``)."""
        if snapshot.is_mixed:
            self._verdicts.add("commit_guided")
            return [commit(snapshot.group_id, "sara guided group is mixed")]
        if snapshot.in_flight:
            return []
        self._verdicts.add("abandon_guided")
        return [abandon(snapshot.group_id, "sara guided group is still all-same")]

    def confident_bound(self, snapshot: GroupSnapshot) -> float:
        """``confident_pilot``'s bound on P(the group turns out mixed) when its finished
        rollouts all agree: ``mixed_bound`` of the likeliest fresh one (an intervention's rollout,
        branched or at another temperature, says nothing about a fresh sample), 1 if none."""
        fresh = [lp for lp, origin in zip(snapshot.logprob_sums, snapshot.origins) if origin < 0 and not math.isnan(lp)]
        if not fresh:
            return 1.0
        return mixed_bound(max(fresh), max(0, self.group_size - snapshot.finished))

    # --- history ------------------------------------------------------------------------

    def _closed(self, closing: GroupSnapshot, rec: SaraRecord, committed: bool) -> None:
        # The rollouts seen when the verdict came (a probe, or more): an unbiased draw of the rate.
        successes, samples = self._outcome(closing, rec)
        whole_shipping = committed and rec.whole and self.probing is not None
        if self.reference is not None and rec.reference_logprob is not None and not whole_shipping:
            self.reference.observe(rec.reference_logprob, successes, samples)
        if not committed and samples > 0:
            self._carry(rec.prompt_id, successes, samples - successes)
            self._observe_level(rec.prompt_id, successes, samples)
        if self.probing is None:
            return
        if whole_shipping:
            # Launched whole (chosen by its prior, not its outcome): it commits at its first sample,
            # so its full group counts when shipped, for the rule and the reference calibration.
            self._whole_unshipped.setdefault(rec.prompt_id, []).append(rec.reference_logprob)
        elif samples > 0:
            # A probed group counts at its verdict, committed or abandoned: a committed group waits
            # for its step to ship while an abandoned one is known at once, so counting committed
            # groups at shipping would fill the fit with all-same probes first (on a hard run, a
            # window of abandons before the first step ships) and make probing look better than it is.
            self.probing.observe(successes, samples)

    def _outcome(self, closing: GroupSnapshot, rec: SaraRecord) -> tuple[int, int]:
        """A guided group's say of the prompt's own pass rate is its probe, all wrong."""
        return (0, rec.guided) if rec.guided else closing.verdict_counts

    def _shipped(self, prompt_id: int, successes: int, samples: int) -> None:
        self._carry(prompt_id, successes, samples - successes)
        self._observe_level(prompt_id, successes, samples)
        waiting = self._whole_unshipped.get(prompt_id)
        if self.probing is not None and waiting:
            logprob = waiting.pop(0)
            if not waiting:
                del self._whole_unshipped[prompt_id]
            self.probing.observe(successes, samples, whole=True)
            if self.reference is not None and logprob is not None:
                self.reference.observe(logprob, successes, samples)

    def _observe_level(self, prompt_id: int, successes: int, samples: int) -> None:
        """A group of the prompt ended: its outcome counts for the prompt's level (a prompt
        admitted before a resume from a state without the level prior has none)."""
        if self.levels is not None and prompt_id in self._level_of:
            self.levels.observe(self._level_of[prompt_id], successes, samples)

    def _carry(self, prompt_id: int, successes: int, failures: int) -> None:
        if self.config.history_discount <= 0.0:
            return
        a, b = self._prior_of(prompt_id)
        self._carried[prompt_id] = (a + successes, b + failures)

    def _extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"carried": {str(k): list(v) for k, v in self._carried.items()}}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        if self.probing is not None:
            state["probing"] = self.probing.state_dict()
        if self.guidance is not None:
            state["guidance"] = self.guidance.state_dict()
        if self.levels is not None:
            state["levels"] = self.levels.state_dict()
            state["level_of"] = {str(k): v for k, v in self._level_of.items()}
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._carried = {int(k): (float(v[0]), float(v[1])) for k, v in state["carried"].items()}
        if self.reference is not None:
            self.reference.load_state_dict(state.get("reference", {}))
        if self.probing is not None:
            self.probing.load_state_dict(state.get("probing", {}))
        if self.guidance is not None:
            self.guidance.load_state_dict(state.get("guidance", {}))
        if self.levels is not None:
            # A state saved without the level prior starts its fit afresh.
            self.levels.load_state_dict(state.get("levels", {"levels": []}))
            self._level_of = {int(k): float(v) for k, v in state.get("level_of", {}).items()}
