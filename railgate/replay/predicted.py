"""What a gate expects to yield, beside what its replay yielded.

SARA's sequential test has a closed-form expected cost and yield for a group whose pass rate
has a Beta prior (``controller.probing.probe_yield``: rollouts generated, chance of ending a
committed mixed group). Each group the gate opened starts from a prior it knows before any
rollout -- ``gate.sara.prior``, or with ``reference_prior`` the Beta its recorded reference
likelihood makes (``controller.reference``: ``strength * q``, ``strength * (1 - q)``) -- so the
gate's own forecast of its yield on the prompts it opened is the sum of those expectations.
Set beside the replayed yield it says how well the gate's model of the pass rates fits the
log: a uniform prior over a run whose rates pile near 0 and 1 forecasts too few abandons.

Only the settings whose priors are fixed when a group opens are forecast; a prior that learns
during the run (``level_prior``, ``history_discount``, ``probe_when: pays``, a calibrated
reference), eager launches and gates without a sequential test get none (None).

>>> from railgate.config import load_config
>>> from pipeline.replay.outcome import PromptOutcome
>>> cfg = load_config(None, ["gate.kind=sara"])
>>> f = forecast(cfg, [None, None], [PromptOutcome(0, True, "committed", 8, 80, 4)] * 2, group_size=8)
>>> round(f["rollouts"], 2), round(f["mixed"], 2), round(f["per_1k_rollouts"], 1)   # (1, 1): 0.6 of 6.4
(12.8, 1.2, 93.7)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    if s.level_prior or s.history_discount > 0 or s.probe_when == "pays" or s.reference_calibrate:
        return "its priors are learned during the run"
    return ""


def forecast(
    cfg: RunConfig,
    reference_logprobs: Sequence[float | None],
    outcomes: Sequence[PromptOutcome],
    group_size: int,
) -> dict[str, Any] | None:
    """The gate's expected rollouts and mixed committed groups over the groups it opened (see the
    module docstring), and mixed groups per 1,000 expected rollouts; None where it has none.
    ``reference_logprobs[p]``: replayed prompt p's recorded score (None: unscored)."""
    if forecastable(cfg):
        return None
    s = cfg.gate.sara
    base = (float(s.prior[0]), float(s.prior[1]))
    cache: dict[tuple[float, float], Any] = {}
    rollouts = mixed = 0.0
    for o in outcomes:
        if not o.opened:
            continue
        prior = base
        lp = reference_logprobs[o.prompt_id] if s.reference_prior else None
        if lp is not None and not math.isnan(lp):
            q = math.exp(min(0.0, lp))
            prior = (max(s.reference_strength * q, MIN_PSEUDO), max(s.reference_strength * (1 - q), MIN_PSEUDO))
        key = (round(prior[0], 4), round(prior[1], 4))
        y = cache.get(key)
        if y is None:
            y = cache[key] = probe_yield(prior, group_size, s.probe_size, s.tau_commit, s.tau_abandon)
        rollouts += y.rollouts
        mixed += y.mixed
    return {
        "rollouts": rollouts,
        "mixed": mixed,
        "per_1k_rollouts": 1000.0 * mixed / rollouts if rollouts else math.nan,
    }
