"""``bench replay``'s calibration table: does a log's reference likelihood predict its pass rates?

SARA's reference screen (``controller.reference``) reads the policy's likelihood ``q`` of a
prompt's reference response as its pass rate (exact) or maps it through a fitted calibration
(``controller.reference_fit``), and skips prompts whose group it expects to come out all-same.
Whether that can pay is a fact about the log, measured here on every group with a recorded
``reference_logprob``:

* the rank correlation (Spearman) between the log-likelihood and the group's recorded pass rate
  (its K samples), with ``z = rho sqrt(n - 1)``, the statistic of the calibration's test
  (``ReferenceCalibration.informative``; ``RANK_Z`` is its bar);
* the AUC of the log-likelihood for "the group holds a success" (0.5: no information);
* per quintile of the log-likelihood: the range of ``q``, the groups, the observed pass rate and
  share of mixed groups among the first ``group_size`` samples (as recorded), against what the
  screen predicts: the exact reading (mean ``q``; the mixed chance under ``Beta(s q, s (1 - q))``,
  ``s`` = ``reference_strength``) and the calibrated map fitted to all the log's scored groups
  (their first ``group_size`` samples; mean ``q^gamma`` and the mixed chance under its prior).

>>> from pipeline.store.grouplog import GroupLog, RecordedGroup
>>> from pipeline.replay.order import ReplayOrder
>>> import math
>>> groups = [RecordedGroup.of(g, g, (1,) * (g % 5) + (0,) * (8 - g % 5), reference_logprob=math.log((g % 5 + 0.5) / 8)) for g in range(40)]
>>> report = calibration(ReplayOrder(GroupLog(tuple(groups), ("demo",))), group_size=8)
>>> report["groups"], round(report["rank_correlation"], 2), round(report["auc_any_success"], 2), report["informative"]
(40, 1.0, 1.0, True)
>>> [round(b["observed_pass_rate"], 2) for b in report["bins"]]
[0.0, 0.12, 0.25, 0.38, 0.5]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from controller.posterior import effective_probability
from controller.reference import MIN_PSEUDO
from controller.reference_fit import RANK_Z, ReferenceCalibration, rank_correlation
from pipeline.replay.order import ReplayOrder

QUANTILES = 5
"""Bins of the log-likelihood: quintiles."""


def calibration(order: ReplayOrder, group_size: int, strength: float = 64.0) -> dict[str, Any] | None:
    """The calibration figures (module docstring) of ``order``'s log, its groups as ``order``
    serves them (seed 0: as recorded); None where no group has a reference score."""
    rows = []
    for p in order.prompts:
        lp = order.reference_logprob(p.prompt_id)
        if lp is None or math.isnan(lp):
            continue
        group = order.group(p.prompt_id)
        first = sum(s.reward > group.success_threshold for s in order.sample_order(p.prompt_id)[:group_size])
        rows.append((min(0.0, lp), group.successes, group.size, first))
    if not rows:
        return None
    data = np.array(rows, dtype=float)
    lp, succ, size, first = data.T
    n = len(data)
    rho = rank_correlation(np.stack([lp, succ, size], axis=1))
    fit = ReferenceCalibration(window=max(n, 2), min_groups=2)
    for x, s in zip(lp, first):
        fit.observe(float(x), int(s), group_size)
    gamma, kappa = (fit.gamma(), fit.kappa()) if n >= 2 else (math.nan, math.nan)
    edges = np.quantile(lp, np.linspace(0.0, 1.0, QUANTILES + 1))
    which = np.clip(np.searchsorted(edges, lp, side="right") - 1, 0, QUANTILES - 1)
    bins = []
    for b in range(QUANTILES):
        m = which == b
        if not m.any():
            continue
        q = np.exp(lp[m])
        bins.append(
            {
                "q_low": float(q.min()),
                "q_high": float(q.max()),
                "groups": int(m.sum()),
                "observed_pass_rate": float((succ[m] / size[m]).mean()),
                "observed_mixed": float(((first[m] > 0) & (first[m] < group_size)).mean()),
                "exact_pass_rate": float(q.mean()),
                "exact_mixed": float(np.mean([_mixed((strength * x, strength * (1 - x)), group_size) for x in q])),
                "calibrated_pass_rate": float(np.mean(np.exp(gamma * lp[m]))) if n >= 2 else math.nan,
                "calibrated_mixed": float(np.mean([_mixed(fit.prior(float(x)), group_size) for x in lp[m]]))
                if n >= 2
                else math.nan,
            }
        )
    return {
        "groups": n,
        "rank_correlation": rho,
        "rank_z": rho * math.sqrt(n - 1) if n > 1 else math.nan,
        "rank_z_bar": RANK_Z,
        "informative": bool(n >= 2 and rho * math.sqrt(n - 1) >= RANK_Z),
        "auc_any_success": _auc(lp, succ > 0),
        "gamma": gamma,
        "kappa": kappa,
        "bins": bins,
    }


def _mixed(prior: tuple[float, float], group_size: int) -> float:
    a, b = prior
    return effective_probability(0, 0, group_size, (max(a, MIN_PSEUDO), max(b, MIN_PSEUDO)))


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    """The chance a labelled group scores above an unlabelled one (ties half): the Mann-Whitney AUC."""
    pos, neg = int(label.sum()), int((~label).sum())
    if not pos or not neg:
        return math.nan
    # Imported here: scipy.stats takes ~0.8 s, and every command line builds the parser that imports this module.
    from scipy.stats import rankdata

    ranks = rankdata(score)
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))
