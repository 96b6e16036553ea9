"""Settings of the controller package's gates: one section per gate, under ``gate:``.

``configs/*.yaml`` mirror these classes; ``pipeline.config.build.build`` turns YAML into them
and rejects unknown keys. Each gate takes its section's dataclass (``SaraGate(pool, 8, SaraConfig())``),
so a rule lives once: a section's own ranges in its ``__post_init__``, the rules that tie it to
the group and batch sizes (a probe larger than the group, a HORA budget below one probe round) in
its ``check_sizes``, which ``RunConfig`` runs when a config is loaded and the gate runs when it is
built.

>>> from pipeline.config.build import build
>>> build(GateConfig, {"kind": "sara", "sara": {"tau_abandon": 0.4}}).sara.tau_abandon
0.4
>>> build(GateConfig, {"kind": "sara", "sara": {"tau_abandon": 0.9, "tau_commit": 0.8}})
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: gate.sara.tau_abandon=0.9 must be below gate.sara.tau_commit=0.8; lower tau_abandon or raise tau_commit
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from controller.rail.config import RailConfig
from pipeline.config.build import require

GateKind = Literal["uniform", "ds", "pilot_commit", "hora", "sara", "dps", "sara_dps", "oracle"]


def _prior_ok(prior: tuple[float, float], key: str) -> None:
    require(
        len(prior) == 2 and all(x > 0 for x in prior),
        f"{key}={tuple(prior)} must be two positive Beta pseudo-counts (a0, b0), e.g. [1.0, 1.0]",
    )


def _fits_group(key: str, size: int, group_size: int) -> None:
    """The part of a group that setting ``key`` sizes (a pilot, a probe) fits in the group.

    >>> _fits_group("gate.sara.probe_size", 10, group_size=8)
    Traceback (most recent call last):
    ...
    pipeline.config.build.ConfigError: gate.sara.probe_size=10 is above orchestrator.group_size=8; lower gate.sara.probe_size or raise orchestrator.group_size
    """
    require(
        size <= group_size,
        f"{key}={size} is above orchestrator.group_size={group_size}; lower {key} or raise orchestrator.group_size",
    )


def _round_cap_ok(max_rounds: int, factor: float, on_round_cap: str, key: str, factor_name: str) -> None:
    require(max_rounds >= 1, f"{key}.max_rounds={max_rounds} must be >= 1")
    require(on_round_cap in ("fill", "error"), f"{key}.on_round_cap={on_round_cap!r} must be 'fill' or 'error'")
    require(factor >= 1.0, f"{key}.{factor_name}={factor} must be >= 1 (prompts per round / batch_groups)")


@dataclass(frozen=True)
class DsConfig:
    """DAPO dynamic sampling (``gate.kind: ds``)."""

    oversample: float = 3.0
    """Prompts per round as a multiple of batch_groups (DAPO: 3)."""
    max_rounds: int = 10
    """Rounds per learner step before ``on_round_cap`` applies (never an endless loop)."""
    keep_surplus: bool = False
    """False: surplus effective groups of a full step are discarded, as DAPO does. True: up to
    batch_groups of them are held and committed for the next step."""
    on_round_cap: Literal["fill", "error"] = "fill"
    """At the round cap: 'fill' the batch with the last round's all-same groups (then plain
    groups); 'error' raises RoundCapError, as DAPO does."""

    def __post_init__(self) -> None:
        _round_cap_ok(self.max_rounds, self.oversample, self.on_round_cap, "gate.ds", "oversample")

    def check_sizes(self, group_size: int, batch_groups: int) -> None:
        """DS takes any group and batch size."""


@dataclass(frozen=True)
class PilotCommitConfig:
    """Pilot-Commit (``gate.kind: pilot_commit``). Paper values: pilot_size = group_size / 4,
    evict_after = 1; ours (for groups of 8) keep the pool alive: pilot_size 4, evict_after 2."""

    pilot_size: int = 4
    """Pilot rollouts per prompt (n_p); the commit adds group_size - n_p."""
    p_low: float = 0.125
    """Keep a pilot iff p_low <= p_hat; below: deferred (too hard for now)."""
    p_up: float = 0.25
    """Keep a pilot iff p_hat <= 1 - p_up; above: skipped (too easy)."""
    p_solve: float = 1.0
    """A pilot with p_hat >= p_solve counts toward eviction."""
    evict_after: int = 2
    """Evict a prompt after this many consecutive pilots at p_hat >= p_solve (0 = never evict;
    the paper evicts after 1)."""
    max_buffer_age: int = 4
    """Kept pilots waiting more than this many steps are dropped (paper: S = 4)."""
    pilot_factor: float = 3.0
    """Pilots per round as a multiple of batch_groups (paper: 3)."""
    max_rounds: int = 10
    """Pilot rounds per learner step before ``on_round_cap`` applies."""
    on_round_cap: Literal["fill", "error"] = "fill"
    """At the round cap: 'fill' with the out-of-band pilots closest to p_hat = 0.5, then keep
    every pilot; 'error' raises RoundCapError."""

    def __post_init__(self) -> None:
        key = "gate.pilot_commit"
        require(self.pilot_size >= 1, f"{key}.pilot_size={self.pilot_size} must be >= 1")
        require(
            0 <= self.p_low and 0 <= self.p_up and self.p_low <= 1 - self.p_up,
            f"{key}: the keep band p_low={self.p_low} <= p_hat <= 1 - p_up={1 - self.p_up} is empty; "
            "lower p_low or p_up",
        )
        require(
            1 - self.p_up < self.p_solve <= 1,
            f"{key}.p_solve={self.p_solve} must lie above the keep band (> 1 - p_up = {1 - self.p_up}) and be <= 1",
        )
        require(self.evict_after >= 0, f"{key}.evict_after={self.evict_after} must be >= 0 (0 = never evict)")
        require(self.max_buffer_age >= 0, f"{key}.max_buffer_age={self.max_buffer_age} must be >= 0")
        _round_cap_ok(self.max_rounds, self.pilot_factor, self.on_round_cap, key, "pilot_factor")

    def check_sizes(self, group_size: int, batch_groups: int) -> None:
        """A pilot fits in its group."""
        _fits_group("gate.pilot_commit.pilot_size", self.pilot_size, group_size)


@dataclass(frozen=True)
class HoraConfig:
    """HORA (``gate.kind: hora``)."""

    probe_size: int = 4
    """Probe rollouts per prompt (G0), >= 2."""
    budget: int = 0
    """Rollouts per allocation batch of batch_groups prompts, probes included; 0 = compute-
    matched to GRPO (batch_groups * group_size). The extra budget is budget - B * G0."""
    prior: tuple[float, float] = (1.0, 1.0)
    """Beta prior of every prompt's success rate (the paper: uniform is as good as learned)."""
    max_group_size: int = 0
    """0 (the paper's rule): a group may take any share of the extra budget. N > 0: no group grows
    past N rollouts, probe included (a trainer whose groups have N fixed slots, such as TRL's
    ``num_generations``); what the caps leave of the budget is not spent."""

    def __post_init__(self) -> None:
        require(self.probe_size >= 2, f"gate.hora.probe_size={self.probe_size} must be >= 2")
        require(self.budget >= 0, f"gate.hora.budget={self.budget} must be >= 0 (0 = compute-matched)")
        require(
            self.max_group_size == 0 or self.max_group_size >= self.probe_size,
            f"gate.hora.max_group_size={self.max_group_size} is below gate.hora.probe_size={self.probe_size}; "
            "raise it, or set 0 for no limit",
        )
        _prior_ok(self.prior, "gate.hora.prior")

    def total_budget(self, group_size: int, batch_groups: int) -> int:
        """Rollouts per allocation batch: ``budget``, or ``batch_groups * group_size`` when it is 0."""
        return self.budget or batch_groups * group_size

    def check_sizes(self, group_size: int, batch_groups: int) -> None:
        """The batch budget covers one probe round (the extra budget R is not negative)."""
        total = self.total_budget(group_size, batch_groups)
        probes = batch_groups * self.probe_size
        source = (
            f"gate.hora.budget={self.budget}"
            if self.budget
            else f"the compute-matched budget batch_groups*group_size={total}"
        )
        require(
            total >= probes,
            f"{source} is below one probe round batch_groups*probe_size={probes} "
            f"(extra budget R={total - probes} < 0); lower gate.hora.probe_size or raise gate.hora.budget",
        )


@dataclass(frozen=True)
class SaraConfig:
    """SARA (``gate.kind: sara`` and ``sara_dps``)."""

    probe_size: int = 4
    """Rollouts that must finish before the thresholds apply (k)."""
    tau_commit: float = 0.5
    """Commit when P_eff >= tau_commit (not published; 0.5 commits exactly the mixed probes at G=8, k=4)."""
    tau_abandon: float = 0.45
    """Abandon when P_eff <= tau_abandon (the paper's 0.45)."""
    prior: tuple[float, float] = (1.0, 1.0)
    """Beta prior (a0, b0) of a prompt's success rate."""
    history_discount: float = 0.0
    """Our extension: carry each prompt's posterior between its groups, shrunk toward the prior
    by this factor per carry (0 = off, the paper's setting)."""
    launch: Literal["probe_first", "eager", "streaming"] = "probe_first"
    """probe_first: launch k, the rest on commit. eager: launch all G, abort siblings on abandon.
    streaming: launch k, commit (and launch the rest) as soon as the group is mixed."""
    level_prior: bool = False
    """Our extension: each group starts from a Beta prior fitted to the recent groups of its
    prompt's difficulty level (``controller.level_prior``) instead of ``prior``, which stays the
    prior of a level with too few groups. Pair it with a shorter probe (``probe_size: 2``): a
    level whose prompts all fail (or all pass) is then abandoned after two rollouts, not four."""
    level_window: int = 64
    """level_prior: groups per difficulty level the fit keeps."""
    level_min_groups: int = 16
    """level_prior: groups of a level needed before its fitted prior is used."""
    confident_pilot: bool = False
    """Our extension: the probe starts with one rollout (the pilot), the rest of it after the pilot
    ends; while every finished fresh rollout of a group agrees, the group is also abandoned once
    ``controller.posterior.mixed_bound`` of the likeliest of them (1 - q^(G - t), q the chance the
    policy writes that response) is at most ``confident_max_mixed``: a prompt whose pilot the
    policy answers right (or wrong) with near certainty costs one rollout, not k. Needs sampling
    at temperature 1 and top_p 1, where the engines' log-probs are the sampling probabilities."""
    confident_max_mixed: float = 0.45
    """confident_pilot: abandon when the bound on P(the group turns out mixed) is at most this
    (0.45 = ``tau_abandon``'s default; at G = 8 a pilot written with q >= 0.918 settles its group,
    at 0.1 one with q >= 0.985)."""

    whole_when_certain: bool = False
    """Our extension: a group whose prior already settles the verdict -- even an all-same probe would
    leave ``P_eff >= tau_commit`` (a strong reference prior near one half, say) -- is launched whole at
    admission instead of probe first. The same samples, the same commit once its probe is in: a
    caller that generates in batches (``railgate.trl``) makes one generation call for it instead of
    two. ``probe_first`` and ``streaming`` only (``eager`` launches whole anyway)."""

    probe_when: Literal["always", "pays"] = "always"
    """always: every group is probed first (SARA as published). pays: our extension
    (``controller.probing``): the gate fits how the run's pass rates spread across prompts from
    its own ended groups and, per prompt, launches the whole group and trains on it (GRPO) where
    that yields more mixed groups per generated rollout than probe-then-decide -- equal, middling
    pass rates -- and probes where rates pile near 0 and 1."""
    probe_fit_window: int = 256
    """probe_when=pays: ended groups the fit of the run's pass rates keeps."""
    probe_fit_min_groups: int = 16
    """probe_when=pays: ended groups needed before the fit decides, and groups launched whole before
    probing may be licensed; until then every group is launched whole (as GRPO)."""
    probe_max_lost: float = 0.1
    """probe_when=pays: probing is licensed only while the latest whole groups show that a probe
    would abandon at most this share of the mixed groups (and would yield more mixed groups per
    rollout); 1: no cap. Past the cap the gate launches whole groups: an abandoned mixed group is a
    lost gradient and leans training toward the prompts whose probes succeed."""
    probe_noise_groups: float = 0.0
    """probe_when=pays: the gradient noise scale in mixed groups per step, which prices optimiser
    steps as well as rollouts (a step of m mixed groups counts m / (m + this)); 0: rollouts only."""

    reference_prior: bool = False
    """Our extension: before a prompt gets any rollout, score the policy's log-likelihood of the
    task's reference response (teacher-forced, by the learner, right after each of its steps,
    for the prompts next in line). Where the reference is the only response that earns the
    reward (``Task.unique_response``: exact-match arithmetic) its likelihood is the prompt's pass
    rate, and the group starts from a Beta prior of that mean and ``reference_strength``
    pseudo-rollouts (in place of ``prior``); elsewhere it is a lower bound on the pass rate and only screens out near-sure
    successes. A prompt whose prior chance of an effective group is at most ``reference_skip`` is
    skipped before any rollout (``controller.reference``). Needs sampling at temperature 1 and
    top_p 1 and a learner that scores log-probs (the torch learner); gate kinds other than ``sara``
    ignore it, except ``sara_dps``, which refuses it."""
    reference_calibrate: bool = False
    """reference_prior, where the reference is not exact (``Task.unique_response`` false): fit online
    how its likelihood maps to the pass rates the run's scored groups show
    (``controller.reference_fit``: p = q^gamma, a Beta-Binomial of strength kappa) and, once fitted,
    start each group from that calibrated prior instead of treating the likelihood as a lower bound."""
    reference_strength: float = 64.0
    """reference_prior: weight of the reference likelihood in the prior, in rollouts."""
    reference_skip: float = 0.45
    """reference_prior: skip a prompt, before any rollout, when its chance of an effective group is
    at most this: under its reference prior, or under ``prior`` if it has no score (``tau_abandon``'s
    default: a group the probe's test would give up on). Skipping spends no rollouts, only the
    scoring, so it may sit above ``tau_abandon``. At 0.8 and G = 8 the gate opens only prompts
    whose exact prior puts the pass rate between about 0.2 and 0.8, and no prompt without a score
    (the uniform prior gives any group 0.778) but those ``MAX_SKIPS`` forces open. Where the
    likelihood is only a lower bound q, a scored prompt is skipped when 1 - q^G is at most this
    (at 0.8: q >= 0.818)."""
    reference_skip_share: float = 1.0
    """reference_prior: the largest share of prompts the screen skips: a prompt is skipped only if its
    chance is also under this quantile of the latest openings' chances (``ReferenceScreen.skips``),
    so a run where every prompt looks alike (a hard start: all chances low) skips almost none
    instead of nearly all. 1: no cap, ``reference_skip`` alone decides."""
    reference_ahead: int = 0
    """reference_prior: prompts scored after each learner step, the next ones in the selector's
    order; 0: 4 x ``orchestrator.batch_groups`` (a step takes about two prompts a group, and
    admission runs up to a step ahead of the learner), 8 x when ``reference_skip`` is above 0.5
    (about half the prompts are skipped). A prompt reached before it was scored starts from
    ``prior`` (``gate/reference_unscored`` counts them)."""

    guidance: float = 0.0
    """Guidance at a fixed level (``controller.guidance``): a group whose probe comes out all-wrong,
    which the test would abandon, instead gets the rest of its group launched from the first
    ``ceil(level x n)`` tokens of the prompt's reference response of ``n`` tokens (one of 0.25, 0.5,
    0.75), kept if that makes it mixed; the guidance tokens never enter the loss. A prompt without
    a reference is abandoned as before (``gate/guide_no_reference``). 0: off. Needs a model
    engine (torch, vllm, ray) and a task with reference solutions; ``probe_first`` or
    ``streaming``."""
    guidance_anneal_step: int = 0
    """A QuestA-style schedule: from this learner step on, guidance is one level lower (0.75 -> 0.5,
    0.5 -> 0.25; 0.25 stays), so the policy writes more of a hard answer itself once it has
    learned from the longer prefixes. 0: the level stays ``guidance`` for the whole run."""

    def __post_init__(self) -> None:
        key = "gate.sara"
        require(self.level_window >= 2, f"{key}.level_window={self.level_window} must be >= 2")
        require(
            2 <= self.level_min_groups <= self.level_window,
            f"{key}.level_min_groups={self.level_min_groups} must be in [2, {key}.level_window={self.level_window}]",
        )
        require(self.probe_size >= 1, f"{key}.probe_size={self.probe_size} must be >= 1")
        require(0 <= self.tau_abandon <= 1, f"{key}.tau_abandon={self.tau_abandon} must be in [0, 1]")
        require(0 <= self.tau_commit <= 1, f"{key}.tau_commit={self.tau_commit} must be in [0, 1]")
        require(
            self.tau_abandon < self.tau_commit,
            f"{key}.tau_abandon={self.tau_abandon} must be below {key}.tau_commit={self.tau_commit}; "
            "lower tau_abandon or raise tau_commit",
        )
        _prior_ok(self.prior, f"{key}.prior")
        require(
            0 <= self.history_discount <= 1,
            f"{key}.history_discount={self.history_discount} must be in [0, 1] (0 = no carried prior)",
        )
        require(
            self.launch in ("probe_first", "eager", "streaming"),
            f"{key}.launch={self.launch!r} must be 'probe_first', 'eager' or 'streaming'",
        )
        require(
            0 <= self.confident_max_mixed < 1,
            f"{key}.confident_max_mixed={self.confident_max_mixed} must be in [0, 1) (a bound on a probability)",
        )
        require(
            self.reference_strength > 0, f"{key}.reference_strength={self.reference_strength} must be > 0 (rollouts)"
        )
        require(
            0 <= self.reference_skip < 1,
            f"{key}.reference_skip={self.reference_skip} must be in [0, 1) (a chance; 1 would skip every prompt)",
        )
        require(
            0 < self.reference_skip_share <= 1,
            f"{key}.reference_skip_share={self.reference_skip_share} must be in (0, 1] (a share of prompts; 1: no cap)",
        )
        require(
            self.reference_ahead >= 0,
            f"{key}.reference_ahead={self.reference_ahead} must be >= 0 (prompts per step; 0: auto)",
        )
        require(
            self.probe_when in ("always", "pays"),
            f"{key}.probe_when={self.probe_when!r} must be 'always' or 'pays'",
        )
        require(
            2 <= self.probe_fit_min_groups <= self.probe_fit_window,
            f"{key}.probe_fit_min_groups={self.probe_fit_min_groups} must be in [2, "
            f"{key}.probe_fit_window={self.probe_fit_window}]",
        )
        require(
            self.probe_noise_groups >= 0,
            f"{key}.probe_noise_groups={self.probe_noise_groups} must be >= 0 (mixed groups; 0: price rollouts only)",
        )
        require(
            0.0 <= self.probe_max_lost <= 1.0,
            f"{key}.probe_max_lost={self.probe_max_lost} must be in [0, 1] (a share of the mixed groups; 1: no cap)",
        )
        require(
            self.guidance in (0.0, 0.25, 0.5, 0.75),
            f"{key}.guidance={self.guidance} must be 0 (off) or a share of the reference: 0.25, 0.5 or 0.75",
        )
        require(
            self.guidance_anneal_step >= 0 and (self.guidance > 0 or self.guidance_anneal_step == 0),
            f"{key}.guidance_anneal_step={self.guidance_anneal_step} must be >= 0, and 0 while {key}.guidance is 0 "
            f"(there is no level to lower); set {key}.guidance to 0.25, 0.5 or 0.75",
        )
        require(
            not (self.guidance and self.launch == "eager"),
            f"{key}.guidance={self.guidance} launches the rest of an all-wrong probe guided, which {key}.launch='eager' "
            "(all G at once) has already launched unguided; use launch 'probe_first' or 'streaming', or guidance=0",
        )
        require(
            not (self.confident_pilot and self.launch == "eager"),
            f"{key}.confident_pilot=true launches a pilot before the probe, which {key}.launch='eager' (all G at once) "
            "does not; use launch 'probe_first' or 'streaming', or confident_pilot=false",
        )

    def scored_ahead(self, batch_groups: int) -> int:
        """``reference_ahead``, or its automatic value for a step of ``batch_groups`` groups.

        >>> SaraConfig().scored_ahead(8), SaraConfig(reference_skip=0.8).scored_ahead(8), SaraConfig(reference_ahead=5).scored_ahead(8)
        (32, 64, 5)
        """
        return self.reference_ahead or (8 if self.reference_skip > 0.5 else 4) * batch_groups

    def check_sizes(self, group_size: int, batch_groups: int) -> None:
        """A probe fits in its group."""
        _fits_group("gate.sara.probe_size", self.probe_size, group_size)

    def check_sampling(self, temperature: float, top_p: float) -> None:
        """``confident_pilot`` and ``reference_prior`` read a group's odds from the policy's own
        probabilities, which are the sampling probabilities only at temperature 1 and top_p 1."""
        for name, on in (("confident_pilot", self.confident_pilot), ("reference_prior", self.reference_prior)):
            require(
                not on or (temperature == 1.0 and top_p == 1.0),
                f"gate.sara.{name}=true reads a group's odds from the policy's own probabilities, which are the "
                f"sampling probabilities only at temperature 1 and top_p 1, not orchestrator.temperature={temperature} "
                f"and top_p={top_p}; sample at temperature 1 and top_p 1 or set gate.sara.{name}=false",
            )


@dataclass(frozen=True)
class DpsConfig:
    """The DPS prompt selector (``gate.kind: dps`` and ``sara_dps``); see controller/selectors/dps.py."""

    success_rates: tuple[float, float, float] = (0.02, 0.5, 0.98)
    """Per-rollout success rate in the unsolved, partly solved and solved states (emission)."""
    unsolved_to_partly: float = 0.02
    """Per learner step probability an unsolved prompt becomes partly solved."""
    partly_to_solved: float = 0.04
    """Per learner step probability a partly solved prompt becomes solved."""
    partly_to_unsolved: float = 0.01
    """Per learner step probability a partly solved prompt falls back to unsolved."""
    solved_to_partly: float = 0.01
    """Per learner step probability a solved prompt falls back to partly solved."""
    prior: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    """Belief over (unsolved, partly, solved) of a never-seen prompt at step 0."""
    explore: float = 0.0
    """Share of picks taken from the plain pool cursor instead."""
    candidate_ratio: int = 8
    """Random free prompts ranked per pick; the likeliest partly solved of them is taken (the
    authors' released configs rank a random candidate batch 8x the training batch). 0 ranks
    the whole free pool, which concentrates training on a few prompts."""

    def __post_init__(self) -> None:
        key = "gate.dps"
        q = self.success_rates
        require(
            len(q) == 3 and all(0 < x < 1 for x in q) and q[0] < q[1] < q[2],
            f"{key}.success_rates={tuple(q)} must be three increasing rates strictly between 0 and 1",
        )
        for name in ("unsolved_to_partly", "partly_to_solved", "partly_to_unsolved", "solved_to_partly"):
            value = getattr(self, name)
            require(0 <= value <= 1, f"{key}.{name}={value} must be a probability in [0, 1]")
        require(
            self.partly_to_solved + self.partly_to_unsolved <= 1,
            f"{key}.partly_to_solved + partly_to_unsolved = {self.partly_to_solved + self.partly_to_unsolved} "
            "exceeds 1; lower one of them",
        )
        require(
            len(self.prior) == 3 and all(x >= 0 for x in self.prior) and abs(sum(self.prior) - 1) < 1e-6,
            f"{key}.prior={tuple(self.prior)} must be three non-negative probabilities summing to 1",
        )
        require(0 <= self.explore <= 1, f"{key}.explore={self.explore} must be in [0, 1]")
        require(
            self.candidate_ratio >= 0,
            f"{key}.candidate_ratio={self.candidate_ratio} must be >= 0 (0 = rank the whole free pool; 8 = the authors' setting)",
        )


@dataclass(frozen=True)
class GateConfig:
    """Which allocation gate runs, and the settings of each (only the chosen one's are used).
    ``uniform`` (GRPO) and ``oracle`` (benchmarks, sim only) take no settings."""

    kind: GateKind = "uniform"
    """uniform (GRPO) | ds (DAPO dynamic sampling) | pilot_commit | hora | sara | dps (DPS
    selection + full groups) | sara_dps (SARA on DPS-selected prompts) | oracle (sim only)."""
    ds: DsConfig = field(default_factory=DsConfig)
    """Settings of ``ds``."""
    pilot_commit: PilotCommitConfig = field(default_factory=PilotCommitConfig)
    """Settings of ``pilot_commit``."""
    hora: HoraConfig = field(default_factory=HoraConfig)
    """Settings of ``hora``."""
    sara: SaraConfig = field(default_factory=SaraConfig)
    """Settings of ``sara`` and of the SARA half of ``sara_dps``."""
    dps: DpsConfig = field(default_factory=DpsConfig)
    """Settings of the DPS selector of ``dps`` and ``sara_dps``."""
    mode: Literal["live", "shadow"] = "live"
    """``live``: ``kind`` decides what is generated and trained. ``shadow``: the run trains as
    uniform GRPO (whole groups; ``kind``'s decisions are not applied), writes every step's full
    groups to ``run_dir/groups/`` and logs ``shadow/*`` per step: what ``kind`` would have generated
    and trained on that step's groups (``railgate.shadow_gate``; docs/replay.md)."""

    def __post_init__(self) -> None:
        require(
            not (self.sara.reference_prior and self.kind == "sara_dps"),
            "gate.sara.reference_prior=true scores the prompts next in the plain selector's order, which "
            "gate.kind='sara_dps' does not have (DPS picks at each admission); use gate.kind=sara or set "
            "gate.sara.reference_prior=false",
        )
        require(
            self.mode in ("live", "shadow"),
            f"gate.mode={self.mode!r} is not 'live' or 'shadow'; set gate.mode=live (the gate acts) or "
            "gate.mode=shadow (train as GRPO, log what the gate would have done)",
        )
        if self.mode == "shadow" and self.kind in ("sara", "sara_dps"):
            require(
                not self.sara.guidance and not self.sara.confident_pilot,
                "gate.mode=shadow replays the gate on the groups GRPO generated, and "
                + (
                    "gate.sara.guidance continues groups from reference prefixes (new text)"
                    if self.sara.guidance
                    else "gate.sara.confident_pilot reads log-probabilities a group log does not keep"
                )
                + "; set gate.sara.guidance=0 and gate.sara.confident_pilot=false, or gate.mode=live",
            )

    def check_sizes(self, group_size: int, batch_groups: int) -> None:
        """The rules that tie this gate's settings to the orchestrator's group and batch sizes;
        ``ConfigError`` naming both keys. ``RunConfig`` runs it when a config is loaded. The
        sizes' own ranges (``group_size >= 2``, ``batch_groups >= 1``) are
        ``OrchestratorConfig``'s, checked when it is built, as every gate relies on.

        >>> GateConfig(kind="sara", sara=SaraConfig(probe_size=10)).check_sizes(group_size=8, batch_groups=4)
        Traceback (most recent call last):
        ...
        pipeline.config.build.ConfigError: gate.sara.probe_size=10 is above orchestrator.group_size=8; lower gate.sara.probe_size or raise orchestrator.group_size
        """
        if self.section is not None:
            self.section.check_sizes(group_size, batch_groups)

    @property
    def section(self) -> DsConfig | PilotCommitConfig | HoraConfig | SaraConfig | None:
        """The settings of ``kind`` (``sara`` for ``sara_dps`` too); None for a gate without any."""
        sections: dict[str, DsConfig | PilotCommitConfig | HoraConfig | SaraConfig] = {
            "ds": self.ds,
            "pilot_commit": self.pilot_commit,
            "hora": self.hora,
            "sara": self.sara,
            "sara_dps": self.sara,
        }
        return sections.get(self.kind)

    def check_sampling(self, temperature: float, top_p: float) -> None:
        """The rules that tie this gate's settings to the orchestrator's sampling settings
        (``gate.sara.confident_pilot`` needs temperature 1 and top_p 1); ``RunConfig`` runs it."""
        if isinstance(self.section, SaraConfig):
            self.section.check_sampling(temperature, top_p)


@dataclass(frozen=True)
class ControllerConfig:
    """The intervention controller (``controller:``): none, or RAIL."""

    kind: Literal["none", "rail"] = "none"
    """``none``: never intervene (the baseline). ``rail``: the learned intervention controller."""
    rail: RailConfig = field(default_factory=RailConfig)
    """RAIL's settings (controller/rail/config.py)."""
