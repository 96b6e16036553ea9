"""Whether probing a prompt pays: SARA's probe-then-decide against launching the whole group.

A probe buys information at a price. Probing ``k`` of a group's ``G`` rollouts and abandoning
the groups whose probe looks saturated saves the ``G - k`` rollouts of every group that would
have ended all-same -- and throws away the ``k`` rollouts of each abandoned group, some of which
would have turned out mixed had they been finished. Which side wins depends on how the run's
pass rates spread across prompts: piled near 0 and 1, most groups are saturated and the probe
finds them cheaply; equal and middling, almost every group is mixed and the probe only wastes
rollouts. docs/methods.md ("Does probing pay?") derives the rule; this module is its code.

For a prompt whose pass rate has the Beta(a, b) prior, ``whole_yield`` and ``probe_yield`` give
the expected rollouts a group costs and the expected mixed groups it yields (a mixed group is the
only kind with a gradient): launching whole costs ``G`` and is mixed with chance
``1 - E[p^G] - E[(1-p)^G]``; probing follows SARA's sequential test exactly (commit when
``P_eff >= tau_commit``, abandon when ``P_eff <= tau_abandon``, else one more rollout), where a
group that turns mixed always commits, so only the all-success and the all-failure runs need
following -- ``O(G)`` Beta moments, no simulation.

``ProbingRule`` fits the spread of pass rates from the run's own ended groups (an empirical-Bayes
Beta prior: ``fit_beta_binomial``, the maximum-likelihood Beta-Binomial over a moving window of
groups, so it follows the policy) and chooses per prompt. Maximum likelihood, not the method of
moments: a run where half the prompts are never solved has an atom at 0 that the moments smear
into a middling Beta, under which probing looks barely better than whole groups; the likelihood
of the all-failure groups keeps the fitted ``a`` small. Over many prompts the run
maximises mixed groups per generated rollout, a ratio of sums; the ratio ``eta`` that the better
option reaches on the run's own prior is the exchange rate, and each prompt takes the option with
the larger ``mixed - eta * rollouts`` under its own prior (the Dinkelbach form of a ratio
objective: it separates over prompts). A prompt whose own prior is the run's picks the option
with the better ratio; a reference prior or a carried history moves single prompts across.

With ``noise_groups`` (the gradient noise scale, in mixed groups), the rule also prices optimiser
steps: a step of ``m`` mixed groups makes progress in proportion to ``m / (m + noise_groups)``
(McCandlish et al. 2018), so when ``noise_groups`` is small against a step's mixed groups (a
step-limited run) every step counts about the same and the cheaper step -- whole groups, which
abandon nothing -- wins even where probing finds more mixed groups per rollout.

Before the rule probes at all it needs a licence read off whole groups, not off the fit
(``licence``): a single Beta misreads a run whose rates form clusters (on recorded SmolLM2 and
CPU-model groups it forecast probing 3-14% ahead where it was 4-6% behind), and a probed group
that was abandoned hides how it would have ended. A group launched whole is an unbiased draw of
its prompt's rate, and from its G outcomes the chance that a random probe of ``k`` of them would
have looked all-same is exact (hypergeometric: ``C(G - s, k) + C(s, k)`` over ``C(G, k)``). Over the
latest whole groups that gives, with no model, what a one-shot probe would have cost, the mixed
groups it would have kept, and the share of mixed groups it would have abandoned
(``empirical_probe``). The rule probes only while that estimate yields more mixed groups per
rollout than whole groups and abandons at most ``max_lost`` of the mixed ones. Until
``min_groups`` whole groups are in, every prompt is launched whole (GRPO's cost, nothing
abandoned); while licensed, one prompt in ``EXPLORE_EVERY`` is still launched whole so the licence
follows the policy.

>>> rule = ProbingRule(group_size=8, probe_size=4, tau_commit=0.5, tau_abandon=0.45, min_groups=4)
>>> rule.choose((1.0, 1.0))            # nothing seen yet: the whole group, as GRPO does
'whole'
>>> for _ in range(16):                # every prompt passes about half the time
...     rule.observe(successes=4, rollouts=8, whole=True)
>>> rule.choose(rule.run_prior())
'whole'
>>> rule = ProbingRule(group_size=8, probe_size=4, tau_commit=0.5, tau_abandon=0.45, min_groups=4)
>>> for _ in range(8):                 # half the prompts never solved, half at one half
...     rule.observe(successes=0, rollouts=8, whole=True)
...     rule.observe(successes=4, rollouts=8, whole=True)
>>> rule.choose(rule.run_prior()), round(rule.licence().lost, 3)
('probe', 0.029)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.special import betaln

from controller.posterior import all_success_probability, effective_probability, miss_probability

Choice = Literal["probe", "whole"]

# Chain mass below which the rest of an all-same run is dropped from the sums.
_NEGLIGIBLE = 1e-12
# Bounds on the fitted Beta's log-parameters: a + b up to about 4.4e4 reads equal rates as
# equal; below e^-7 a parameter would make one rollout decide everything.
_LOG_BOUNDS = (-7.0, 10.0)
# How much more per rollout probing must yield to be chosen: a probed group is launched twice
# and waits for its probe, so where the two options tie (a strong prior, whose test rarely
# abandons) the whole group is the better buy.
PROBE_MARGIN = 0.01
# While probing is licensed, every this many-th prompt is still launched whole: the licence is
# read off whole groups only, and a policy that moved must be able to take it back.
EXPLORE_EVERY = 8


@dataclass(frozen=True)
class Yield:
    """What one group costs and gives, in expectation: ``rollouts`` generated, ``mixed`` (the
    chance it is committed holding a success and a failure), ``committed`` (the chance it is
    trained on at all)."""

    rollouts: float
    mixed: float
    committed: float

    @property
    def per_rollout(self) -> float:
        """Mixed groups per generated rollout."""
        return self.mixed / self.rollouts if self.rollouts > 0 else 0.0


def whole_yield(prior: tuple[float, float], group_size: int) -> Yield:
    """A group launched whole and trained on whatever it holds (GRPO).

    >>> y = whole_yield((1.0, 1.0), 8)     # uniform: 1 - 2 / (G + 1)
    >>> y.rollouts, round(y.mixed, 4), y.committed
    (8, 0.7778, 1.0)
    """
    return Yield(group_size, effective_probability(0, 0, group_size, prior), 1.0)


def probe_yield(
    prior: tuple[float, float],
    group_size: int,
    probe_size: int,
    tau_commit: float,
    tau_abandon: float,
    test_prior: tuple[float, float] | None = None,
) -> Yield:
    """A group under SARA's test: probe ``probe_size``, then commit, abandon or draw one more.

    ``prior`` is what the prompt's pass rate is believed to be; ``test_prior`` the Beta the
    gate's test starts from (default: the same). A group that is mixed when a verdict is due has
    ``P_eff = 1`` and commits, so its cost is ``group_size``; what remains to follow are the runs
    that stay all-success or all-failure, whose chance of lasting ``t`` rollouts is ``E[p^t]`` or
    ``E[(1-p)^t]`` under ``prior``.

    >>> y = probe_yield((1.0, 1.0), 8, 4, 0.5, 0.45)   # the closed form: k + (G-k) P(mixed probe)
    >>> round(y.rollouts, 4), round(4 + 4 * (1 - 2 / 5), 4), round(y.mixed, 4)
    (6.4, 6.4, 0.6)
    """
    if not 1 <= probe_size <= group_size:
        raise ValueError(f"probe_size={probe_size} must be in [1, group_size={group_size}]")
    a, b = prior
    mixed_after_probe = 1.0 - all_success_probability(a, b, probe_size) - miss_probability(a, b, probe_size)
    rollouts = mixed_after_probe * group_size
    mixed = committed = mixed_after_probe
    for run_lasts, side in ((lambda t: all_success_probability(a, b, t), 0), (lambda t: miss_probability(a, b, t), 1)):
        t, alive = probe_size, run_lasts(probe_size)
        while alive > _NEGLIGIBLE:
            counts = (t, 0) if side == 0 else (0, t)
            p_eff = effective_probability(*counts, max(group_size, t), test_prior or prior)
            if p_eff >= tau_commit:  # the whole group is generated and trained on
                rollouts += alive * group_size
                mixed += alive * p_eff
                committed += alive
                break
            if p_eff <= tau_abandon or t >= group_size:
                rollouts += alive * t
                break
            nxt = run_lasts(t + 1)  # one more rollout: the mass that breaks the run turns mixed, commits
            broke = alive - nxt
            rollouts += broke * group_size
            mixed += broke
            committed += broke
            alive, t = nxt, t + 1
    return Yield(rollouts, mixed, committed)


def fit_beta_binomial(groups: Iterable[tuple[int, int]]) -> tuple[float, float]:
    """The Beta(a, b) of pass rates that makes ``groups`` (successes, rollouts) likeliest, each
    group's successes Binomial given its prompt's rate (the Beta-Binomial likelihood).

    >>> a, b = fit_beta_binomial([(0, 8), (8, 8)] * 20)          # piled at 0 and 1: a, b < 1
    >>> a < 0.3 and b < 0.3
    True
    >>> a, b = fit_beta_binomial([(3, 8), (4, 8), (5, 8)] * 20)  # binomial noise around 1/2: strong
    >>> round(a / (a + b), 2), a + b > 1000
    (0.5, True)
    """
    data = np.array([(s, n) for s, n in groups if n > 0], dtype=float).reshape(-1, 2)
    if len(data) == 0:
        raise ValueError("no group with a rollout to fit; observe some groups first")
    # Imported here: scipy.optimize costs ~0.1 s at start-up, and a run on the default settings never fits.
    from scipy.optimize import minimize

    s, n = data[:, 0], data[:, 1]

    def loss(x: np.ndarray) -> float:
        a, b = np.exp(x)
        return -float(np.sum(betaln(a + s, b + n - s) - betaln(a, b)))

    mean = (s.sum() + 0.5) / (n.sum() + 1.0)
    start = np.log([2.0 * mean, 2.0 * (1.0 - mean)])
    found = minimize(loss, start, method="L-BFGS-B", bounds=[_LOG_BOUNDS, _LOG_BOUNDS])
    a, b = np.exp(found.x)
    return float(a), float(b)


@dataclass(frozen=True)
class ProbeEstimate:
    """What a one-shot probe of ``k`` would have done to a set of whole groups (``empirical_probe``):
    ``whole`` and ``probe`` per group, in expectation over which ``k`` samples the probe drew, and
    ``lost``: the share of the mixed groups it would have abandoned (SARA's test abandons an
    all-same probe under every prior this rule licenses)."""

    whole: Yield
    probe: Yield
    lost: float
    groups: int

    @property
    def gain(self) -> float:
        """Probing's mixed groups per rollout over whole groups' (1.0 where neither has any)."""
        w = self.whole.per_rollout
        return self.probe.per_rollout / w if w > 0 else 1.0


def empirical_probe(successes: Iterable[int], group_size: int, probe_size: int) -> ProbeEstimate:
    """The exact yield of probing ``probe_size`` of each whole group (``successes`` of
    ``group_size``) and abandoning it when the probe is all-same, against training every group
    whole; no model of the pass rates.

    >>> e = empirical_probe([0, 0, 4, 4], 8, 4)       # half never solved, half at one half
    >>> round(e.gain, 3), round(e.lost, 4)             # the four-sample probe of a 4/8 group is all-same 2 times in 70
    (1.308, 0.0286)
    """
    counts = [int(s) for s in successes]
    if not counts:
        raise ValueError("no whole group to estimate from; observe whole groups first")
    g, k = group_size, probe_size
    if not 1 <= k <= g:
        raise ValueError(f"probe_size={k} must be in [1, group_size={g}]")
    ways = math.comb(g, k)
    mixed = rollouts = kept = lost = 0.0
    for s in counts:
        if not 0 <= s <= g:
            raise ValueError(f"successes={s} must be in [0, group_size={g}]")
        same = (math.comb(g - s, k) + math.comb(s, k)) / ways  # the probe looks all-same
        is_mixed = 0 < s < g
        mixed += is_mixed
        rollouts += k + (g - k) * (1.0 - same)
        kept += is_mixed * (1.0 - same)
        lost += is_mixed * same
    n = len(counts)
    whole = Yield(float(g), mixed / n, 1.0)
    probe = Yield(rollouts / n, kept / n, kept / n)  # an all-same group's probe is all-same: never committed
    return ProbeEstimate(whole, probe, lost / mixed if mixed else 0.0, n)


def step_value(y: Yield, noise_groups: float) -> float:
    """Progress per generated rollout of steps made of groups with yield ``y``: a step of ``B``
    committed groups holds ``m = B mixed / committed`` mixed groups and costs ``B rollouts /
    committed``; its progress is ``m / (m + noise_groups)`` (per group of the step: the batch
    size in units of the gradient noise scale). ``noise_groups = inf``: mixed groups per rollout.

    >>> w, p = whole_yield((0.5, 0.5), 8), probe_yield((0.5, 0.5), 8, 4, 0.5, 0.45)
    >>> step_value(p, math.inf) > step_value(w, math.inf), step_value(p, 0.0) > step_value(w, 0.0)
    (True, False)
    """
    if y.committed <= 0:
        return 0.0
    if math.isinf(noise_groups):
        return y.per_rollout
    mixed_share = y.mixed / y.committed  # mixed groups per committed group
    return mixed_share / (mixed_share + noise_groups) / (y.rollouts / y.committed)


class ProbingRule:
    """Chooses, per prompt, probe-then-decide or the whole group; see the module docstring.

    Parameters
    ----------
    group_size, probe_size, tau_commit, tau_abandon
        SARA's G, k and thresholds (the test that a probed group goes through).
    window
        Ended groups the run-wide fit keeps (the oldest forgotten first).
    min_groups
        Ended groups needed before the fit is used, and whole groups before probing is licensed;
        until then every prompt is launched whole.
    noise_groups
        The gradient noise scale in mixed groups per step; ``inf`` (default): price rollouts only.
    max_lost
        The largest share of mixed groups the licence lets probing abandon (1: any, as SARA).
    """

    def __init__(
        self,
        group_size: int,
        probe_size: int,
        tau_commit: float,
        tau_abandon: float,
        *,
        window: int = 256,
        min_groups: int = 16,
        noise_groups: float = math.inf,
        max_lost: float = 1.0,
    ):
        if not 0.0 <= max_lost <= 1.0:
            raise ValueError(f"max_lost={max_lost} must be in [0, 1] (a share of the mixed groups)")
        if noise_groups < 0:
            raise ValueError(f"noise_groups={noise_groups} must be >= 0 (mixed groups; inf: rollouts only)")
        self.group_size = group_size
        self.probe_size = probe_size
        self.tau_commit = tau_commit
        self.tau_abandon = tau_abandon
        if not 2 <= min_groups <= window:
            raise ValueError(f"min_groups={min_groups} must be in [2, window={window}]")
        self.noise_groups = noise_groups
        self.min_groups = min_groups
        self.max_lost = max_lost
        self._groups: deque[tuple[int, int]] = deque(maxlen=window)
        self._whole: deque[int] = deque(maxlen=window)  # successes of the latest whole groups
        self._licence: ProbeEstimate | None = None  # None: re-estimate before the next use
        self._licensed_choices = 0  # choices made under the licence (every EXPLORE_EVERY-th is whole)
        self._fitted: tuple[float, float] | None = None  # None: refit before the next use
        self._choices = {"probe": 0, "whole": 0}
        self._cache: dict[tuple[float, float], Yield] = {}

    def observe(self, successes: int, rollouts: int, whole: bool = False) -> None:
        """A group of the run ended (committed or abandoned) with ``successes`` of ``rollouts``;
        ``whole``: it was launched whole (its outcome did not decide how many it got), which is
        what the licence reads."""
        if rollouts <= 0:
            return
        if not 0 <= successes <= rollouts:
            raise ValueError(f"successes={successes} must be in [0, rollouts={rollouts}]")
        self._groups.append((int(successes), int(rollouts)))
        self._fitted = None
        if whole and rollouts == self.group_size:
            self._whole.append(int(successes))
            self._licence = None

    def licence(self) -> ProbeEstimate | None:
        """The latest whole groups' exact estimate of probing (``empirical_probe``); None until
        ``min_groups`` whole groups ended."""
        if len(self._whole) < self.min_groups:
            return None
        if self._licence is None:  # asked at every admission; changes only when a whole group ends
            self._licence = empirical_probe(self._whole, self.group_size, self.probe_size)
        return self._licence

    def licensed(self) -> bool:
        """Whether the whole groups say probing yields more mixed groups per rollout and abandons
        at most ``max_lost`` of the mixed ones."""
        got = self.licence()
        return got is not None and got.gain > 1 + PROBE_MARGIN and got.lost <= self.max_lost

    def run_prior(self) -> tuple[float, float] | None:
        """The fitted Beta of the run's pass rates, None until ``min_groups`` groups ended."""
        if len(self._groups) < self.min_groups:
            return None
        if self._fitted is None:
            self._fitted = fit_beta_binomial(self._groups)
        return self._fitted

    def choose(self, prior: tuple[float, float]) -> Choice:
        """``probe`` or ``whole`` for a prompt whose pass rate has Beta ``prior``."""
        run = self.run_prior()
        if run is None or not self.licensed():
            return self._count("whole")
        self._licensed_choices += 1
        if self._licensed_choices % EXPLORE_EVERY == 0:
            return self._count("whole")
        whole_run, probe_run = whole_yield(run, self.group_size), self._probe(run)
        if step_value(probe_run, self.noise_groups) <= (1 + PROBE_MARGIN) * step_value(whole_run, self.noise_groups):
            return self._count("whole")
        # Probing is the run's better option; single prompts trade at its exchange rate.
        eta = probe_run.per_rollout
        whole, probe = whole_yield(prior, self.group_size), self._probe(prior)
        gain_whole = whole.mixed - eta * whole.rollouts
        gain_probe = probe.mixed - eta * probe.rollouts
        return self._count("whole" if gain_whole > gain_probe else "probe")

    def forecast(self) -> Yield | None:
        """What the rule expects its choices to have yielded, by its latest fit of the run's pass
        rates: every prompt it probed at ``probe_yield`` and every prompt it launched whole at
        ``whole_yield`` under the fitted run prior (a prompt's own prior, from a reference or its
        history, is not kept). None until fitted. Set beside a replay's yield it says whether the
        rule's model of the run's pass rates holds (``bench replay``'s ``forecast/1k``)."""
        run = self.run_prior()
        if run is None:
            return None
        probe, whole = self._probe(run), whole_yield(run, self.group_size)
        n_probe, n_whole = self._choices["probe"], self._choices["whole"]
        return Yield(
            n_probe * probe.rollouts + n_whole * whole.rollouts,
            n_probe * probe.mixed + n_whole * whole.mixed,
            n_probe * probe.committed + n_whole * whole.committed,
        )

    def _probe(self, prior: tuple[float, float]) -> Yield:
        key = (round(prior[0], 3), round(prior[1], 3))
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            got = self._cache[key] = probe_yield(
                prior, self.group_size, self.probe_size, self.tau_commit, self.tau_abandon
            )
        return got

    def _count(self, choice: Choice) -> Choice:
        self._choices[choice] += 1
        return choice

    def metrics(self) -> dict[str, float]:
        """``gate/probing_probe``, ``gate/probing_whole`` (prompts), the fitted run prior's
        mean and strength (``gate/probing_prior_mean``, ``gate/probing_prior_strength``) and the
        rule's forecast of its mixed groups per 1,000 rollouts (``gate/probing_forecast_per_1k``,
        ``forecast``) once fitted,
        and ``gate/probing_noise_groups`` while steps are priced; once ``min_groups`` whole groups
        are in, the licence's figures: ``gate/probing_whole_gain`` (probing's mixed groups per
        rollout over whole groups', measured on whole groups), ``gate/probing_whole_lost`` (the
        share of mixed groups a probe would abandon) and ``gate/probing_licensed`` (1 or 0)."""
        out = {f"gate/probing_{k}": float(v) for k, v in self._choices.items()}
        got = self.licence()
        if got is not None:
            out["gate/probing_whole_gain"] = got.gain
            out["gate/probing_whole_lost"] = got.lost
            out["gate/probing_licensed"] = float(self.licensed())
        if math.isfinite(self.noise_groups):
            out["gate/probing_noise_groups"] = float(self.noise_groups)
        run = self.run_prior()
        if run is not None:
            out["gate/probing_prior_mean"] = run[0] / (run[0] + run[1])
            out["gate/probing_prior_strength"] = run[0] + run[1]
            expected = self.forecast()
            if expected is not None and expected.rollouts > 0:
                out["gate/probing_forecast_per_1k"] = 1000.0 * expected.per_rollout
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": [list(g) for g in self._groups],
            "whole": list(self._whole),
            "choices": dict(self._choices),
            "licensed_choices": self._licensed_choices,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups.clear()
        self._groups.extend((int(s), int(n)) for s, n in state.get("groups", []))
        self._fitted = None
        self._whole.clear()
        self._whole.extend(int(s) for s in state.get("whole", []))
        self._licence = None
        self._licensed_choices = int(state.get("licensed_choices", 0))
        self._choices.update({k: int(v) for k, v in state.get("choices", {}).items() if k in self._choices})
