"""How a reference's likelihood maps to the pass rate the run observes, fitted online.

``controller.reference`` reads the policy's likelihood ``q`` of a prompt's reference response as
its pass rate where the reference is the only rewarded answer, and as a mere lower bound where
other responses earn the reward too ("The answer is 42" as well as "42"). Which of the two holds
is a fact about the task a user may not know, and the truth is often in between. So the run
measures it: every group that opened with a score reports what its rollouts earned, and
``ReferenceCalibration`` fits

    pass rate  p = q^gamma,    successes ~ Beta-Binomial(n, kappa p, kappa (1 - p))

by maximum likelihood over a moving window of such groups. ``gamma = 1`` is an exact reference;
``gamma < 1`` lifts small likelihoods (a lower bound: other responses pay too); ``kappa`` is how
many rollouts' worth the calibrated likelihood is (small where the likelihood predicts little).
A fitted calibration gives a group the prior ``Beta(kappa q^gamma, kappa (1 - q^gamma))``.

>>> import math, numpy as np
>>> rng = np.random.default_rng(0)
>>> fit = ReferenceCalibration(min_groups=16)
>>> for lp in rng.uniform(-6.0, 0.0, size=200):     # pass rate = sqrt(likelihood): not exact
...     fit.observe(float(lp), int(rng.binomial(4, math.exp(lp / 2))), 4)
>>> round(fit.gamma(), 1)
0.5
>>> a, b = fit.prior(math.log(0.25)); round(a / (a + b), 2)   # q = 0.25 passes about half the time
0.5

The map is fitted whatever the data, so a likelihood that says nothing about the pass rates
still gets one (a small ``kappa``, and a ``gamma`` that puts every prompt at the run's mean), and
a screen reading it skips prompts at random or worse. So the fit is also *tested*:
``informative`` is True only where the likelihood ranks the observed pass rates, Spearman's rank
correlation ``rho`` between the groups' log-likelihoods and their success shares ``s / n`` being
significantly above 0. Under independence the permutation distribution of a rank correlation
over ``m`` groups has mean 0 and variance exactly ``1 / (m - 1)`` (ties included: it is a
Pearson correlation of mid-ranks), so ``z = rho sqrt(m - 1)`` is about standard normal. The
test is asked again after every group, and a screen that acts on a false positive stops
opening (and so observing) the prompts it skips, which keeps the error; so the bar is one for
repeated looks, ``z >= 3`` (``RANK_Z``), not a single look's 1.645: with independent likelihoods
and pass rates, ``z`` crossed 1.645 at some look between 32 and 512 groups in 22% of simulated
runs and 3 in under 1% (Siegmund's approximation for the maximum of a normalised sum agrees).
A window whose likelihoods or success shares are all equal is uninformative.

>>> flat = ReferenceCalibration(min_groups=16)
>>> for lp in rng.uniform(-6.0, 0.0, size=200):     # pass rate 0.1 whatever the likelihood
...     flat.observe(float(lp), int(rng.binomial(4, 0.1)), 4)
>>> flat.informative(), fit.informative()
(False, True)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
from scipy.special import betaln

# Pass rates are kept inside (EPS, 1 - EPS) so that the Beta parameters stay proper.
EPS = 1e-6
# Bounds on log gamma and log kappa.
_LOG_GAMMA = (-5.0, 0.7)
_LOG_KAPPA = (-1.0, 10.0)
# The bar the rank correlation's z must reach, a test repeated after every group (module docstring).
RANK_Z = 3.0


class ReferenceCalibration:
    """The fitted map from reference log-likelihood to pass rate; see the module docstring.

    Parameters
    ----------
    window
        Scored groups the fit keeps (the oldest forgotten first), so it follows the policy.
    min_groups
        Scored groups needed before ``prior`` answers; until then ``fitted`` is False.
    """

    def __init__(self, window: int = 512, min_groups: int = 32):
        if not 2 <= min_groups <= window:
            raise ValueError(f"min_groups={min_groups} must be in [2, window={window}]")
        self.window = window
        self.min_groups = min_groups
        self._groups: deque[tuple[float, int, int]] = deque(maxlen=window)
        self._params: tuple[float, float] | None = None  # (gamma, kappa); None: refit before use
        self._rho: float | None = None  # the window's rank correlation; None: recompute before use

    def observe(self, logprob: float, successes: int, rollouts: int) -> None:
        """A group that opened with reference log-likelihood ``logprob`` earned ``successes`` of
        ``rollouts`` (none: ignored)."""
        if rollouts <= 0:
            return
        if not 0 <= successes <= rollouts:
            raise ValueError(f"successes={successes} must be in [0, rollouts={rollouts}]")
        if math.isnan(logprob) or logprob > 1e-6:
            raise ValueError(f"logprob={logprob} is not the log of a probability")
        self._groups.append((min(0.0, float(logprob)), int(successes), int(rollouts)))
        self._params = None
        self._rho = None

    @property
    def fitted(self) -> bool:
        """Enough scored groups have ended for ``prior`` to answer."""
        return len(self._groups) >= self.min_groups

    def rank_correlation(self) -> float:
        """Spearman's rho between the kept groups' log-likelihoods and success shares (0 where
        either is constant or fewer than 3 groups are kept)."""
        if self._rho is None:
            self._rho = rank_correlation(np.array(self._groups, dtype=float).reshape(-1, 3))
        return self._rho

    def informative(self) -> bool:
        """Fitted, and the likelihood ranks the observed pass rates: ``rho sqrt(m - 1) >= RANK_Z``
        over the ``m`` kept groups (module docstring). False: a screen must not act on the map."""
        m = len(self._groups)
        return self.fitted and self.rank_correlation() * math.sqrt(m - 1) >= RANK_Z

    def gamma(self) -> float:
        """The fitted exponent: 1 for an exact reference, below 1 where other answers pay too."""
        return self._fit()[0]

    def kappa(self) -> float:
        """The fitted strength: rollouts' worth of one calibrated likelihood."""
        return self._fit()[1]

    def prior(self, logprob: float) -> tuple[float, float]:
        """The Beta prior of a prompt whose reference has ``logprob``."""
        gamma, kappa = self._fit()
        p = min(max(math.exp(gamma * logprob), EPS), 1.0 - EPS)
        return kappa * p, kappa * (1.0 - p)

    def _fit(self) -> tuple[float, float]:
        if not self.fitted:
            raise ValueError(
                f"the reference calibration has {len(self._groups)} scored groups, fewer than "
                f"min_groups={self.min_groups}; check .fitted before asking for a prior"
            )
        if self._params is None:
            self._params = _maximum_likelihood(np.array(self._groups, dtype=float))
        return self._params

    def metrics(self) -> dict[str, float]:
        """``gate/reference_gamma``, ``gate/reference_kappa`` and ``gate/reference_rank_correlation``
        once fitted, and the groups kept."""
        out = {"gate/reference_calibration_groups": float(len(self._groups))}
        if self.fitted:
            gamma, kappa = self._fit()
            out.update(
                {
                    "gate/reference_gamma": gamma,
                    "gate/reference_kappa": kappa,
                    "gate/reference_rank_correlation": self.rank_correlation(),
                }
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [list(g) for g in self._groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups.clear()
        self._groups.extend((float(lp), int(s), int(n)) for lp, s, n in state.get("groups", []))
        self._params = None
        self._rho = None


def rank_correlation(data: np.ndarray) -> float:
    """Spearman's rho (Pearson's correlation of mid-ranks) between ``data``'s log-likelihoods and
    success shares, rows (logprob, s, n); 0 where either column is constant or under 3 rows.

    >>> rank_correlation(np.array([[-3.0, 0, 4], [-2.0, 1, 4], [-1.0, 4, 4]]))
    1.0
    >>> rank_correlation(np.array([[-3.0, 0, 4], [-2.0, 0, 4], [-1.0, 0, 4]]))
    0.0
    """
    if len(data) < 3:
        return 0.0
    # Imported here: scipy.stats and scipy.optimize cost ~0.5 s at start-up, and most runs never fit.
    from scipy.stats import rankdata

    x, y = rankdata(data[:, 0]), rankdata(data[:, 1] / data[:, 2])
    x, y = x - x.mean(), y - y.mean()
    scale = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / scale if scale > 0 else 0.0


def _maximum_likelihood(data: np.ndarray) -> tuple[float, float]:
    """(gamma, kappa) maximising the Beta-Binomial likelihood of ``data`` rows (logprob, s, n)."""
    from scipy.optimize import minimize  # here: see rank_correlation

    lp, s, n = data[:, 0], data[:, 1], data[:, 2]

    def loss(x: np.ndarray) -> float:
        gamma, kappa = np.exp(x)
        p = np.clip(np.exp(gamma * lp), EPS, 1.0 - EPS)
        a, b = kappa * p, kappa * (1.0 - p)
        return -float(np.sum(betaln(a + s, b + n - s) - betaln(a, b)))

    starts = [np.array([g, math.log(8.0)]) for g in (0.0, -1.0, -3.0)]  # exact, and two lower bounds
    best = min(
        (minimize(loss, x0, method="L-BFGS-B", bounds=[_LOG_GAMMA, _LOG_KAPPA]) for x0 in starts),
        key=lambda r: float(r.fun),
    )
    gamma, kappa = np.exp(best.x)
    return float(gamma), float(kappa)
