"""What a gate expects to yield, beside what its replay yielded.

SARA's sequential test has a closed-form expected cost and yield for a group whose pass rate
has a Beta prior (``controller.probing.probe_yield``: rollouts generated, chance of ending a
committed mixed group). Two forecasts are set beside the replayed yield:

* the probing rule's own (``probe_when: pays``): what ``controller.probing.ProbingRule``
  expected of the choices it made, under the priors it made them with and the run prior it
  fitted (``ProbingRule.forecast``, the gate's ``gate/probing_forecast_per_1k`` at the end of
  the replay); it says whether the rule's model of the run's pass rates holds;
* for a gate with fixed priors, the closed form on the groups it opened: each group's test
  starts from the prior the gate gives it (``gate.sara.prior``, or with ``reference_prior`` the
  Beta its recorded likelihood makes, ``strength * q``, ``strength * (1 - q)``, which is then
  also the belief: an exact reference is the pass rate), and, without a reference score, the
  pass rate is drawn from ``belief``: the Beta-Binomial fitted to the log's groups (their first
  G samples in the replay order), what the run's rates are -- not the gate's opening prior,
  under which every log would get the same forecast (93.7 per 1,000 for the uniform prior).

A prior that learns during the run otherwise (``level_prior``, ``history_discount``, a
calibrated reference without the probing rule), eager launches and gates without a sequential
test get none (None).

>>> from railgate.config import load_config
>>> from pipeline.replay.outcome import PromptOutcome
>>> cfg = load_config(None, ["gate.kind=sara"])
>>> opened = [PromptOutcome(0, True, "committed", 8, 80, 4)] * 2
>>> round(forecast(cfg, [None, None], opened, group_size=8)["per_1k_rollouts"], 1)   # the prior (1, 1): 0.6 of 6.4
93.7
>>> round(forecast(cfg, [None, None], opened, group_size=8, belief=(0.4, 10.0))["per_1k_rollouts"], 1)  # a hard run
28.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from controller.probing import probe_yield
from controller.reference import MIN_PSEUDO
from pipeline.replay.outcome import PromptOutcome
from railgate.config import RunConfig


def forecastable(cfg: RunConfig) -> str:
    """Why the gate of ``cfg`` gets no forecast ("" when it gets one)."""
    if cfg.gate.kind not in ("sara", "sara_dps"):
        return f"gate.kind={cfg.gate.kind} has no sequential test to forecast"
    s = cfg.gate.sara
    if s.launch == "eager":
        return "eager launches cost what the closed form does not follow"
    if s.level_prior or s.history_discount > 0:
        return "its priors are learned during the run"
    if s.reference_prior and s.reference_calibrate and s.probe_when != "pays":
        return "its reference prior is calibrated during the run"
    return ""


def forecast(
    cfg: RunConfig,
    reference_logprobs: Sequence[float | None],
    outcomes: Sequence[PromptOutcome],
    group_size: int,
    metrics: Mapping[str, float] | None = None,
    belief: tuple[float, float] | None = None,
) -> dict[str, Any] | None:
    """The gate's forecast (see the module docstring): with ``probe_when: pays`` the probing
    rule's, read from the replay's gate ``metrics`` (None if the rule never fitted); otherwise
    the expected rollouts and mixed committed groups over the groups it opened, pass rates
    without a reference score drawn from ``belief`` (None: the gate's prior), and mixed groups
    per 1,000 expected rollouts. ``reference_logprobs[p]``: replayed prompt p's recorded score
    (None: unscored). None where the gate has no forecast."""
    if forecastable(cfg):
        return None
    s = cfg.gate.sara
    if s.probe_when == "pays":
        value = (metrics or {}).get("gate/probing_forecast_per_1k")
        return None if value is None else {"per_1k_rollouts": float(value)}
    base = (float(s.prior[0]), float(s.prior[1]))
    cache: dict[tuple[float, ...], Any] = {}
    rollouts = mixed = 0.0
    for o in outcomes:
        if not o.opened:
            continue
        prior, rates = base, belief or base
        lp = reference_logprobs[o.prompt_id] if s.reference_prior else None
        if lp is not None and not math.isnan(lp):
            q = math.exp(min(0.0, lp))
            prior = rates = (
                max(s.reference_strength * q, MIN_PSEUDO),
                max(s.reference_strength * (1 - q), MIN_PSEUDO),
            )
        key = (round(prior[0], 4), round(prior[1], 4), round(rates[0], 4), round(rates[1], 4))
        y = cache.get(key)
        if y is None:
            y = cache[key] = probe_yield(rates, group_size, s.probe_size, s.tau_commit, s.tau_abandon, test_prior=prior)
        rollouts += y.rollouts
        mixed += y.mixed
    return {
        "rollouts": rollouts,
        "mixed": mixed,
        "per_1k_rollouts": 1000.0 * mixed / rollouts if rollouts else math.nan,
    }
