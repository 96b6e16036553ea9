"""A prompt's pass rate before any rollout: the policy's likelihood of the reference response.

Sampling at temperature 1 and top_p 1, a fresh rollout writes the task's reference response
``r`` with probability ``q = exp(sum of log pi(r_t | prompt, r_<t))``, the policy's
teacher-forced likelihood of ``r``. Any rollout that writes ``r`` earns the reward, so the
prompt's pass rate is at least ``q``; where ``r`` is the only response that earns it (an
exact-match answer: ``Task.unique_response``) the pass rate *is* ``q``. One forward pass over
prompt and reference, about the price of scoring one rollout, says what a probe of several
rollouts only estimates.

``ReferenceScreen`` holds those likelihoods for the prompts next in line: after each learner
step the orchestrator asks it which prompts to score (``wanted``: of the gate's selector's
next ``ahead`` prompts, ``peek``, those with a reference and no score yet), the learner scores
them with the weights it just made (the ones the engine samples with next), and ``update``
stores them. A prompt is scored once while it waits in line, so its score is from weights a
step or two older than its first rollouts'. SARA asks
``opening`` for a group's prior and its chance of turning out mixed before any rollout, and
skips a prompt whose chance is at most its ``reference_skip``:

* exact: the prior is ``Beta(n q, n (1 - q))``, ``n`` = ``strength`` pseudo-rollouts, in
  place of the gate's own: its mean is ``q``, and the probe still counts for something (the
  score comes from weights up to a couple of steps older than the rollouts'); the chance is
  ``effective_probability`` under it, close to ``1 - q^G - (1 - q)^G``;
* a lower bound: the gate's own prior, and the chance is at most ``mixed_bound`` of ``q``
  (``1 - q^G``: every rollout writing the reference), which vouches only for near-sure successes;
  that bound, not the prior, is what a skip is judged by;
* calibrated (``calibration``, ``controller.reference_fit``): the run fits how the likelihood
  maps to the pass rates its scored groups show (``observe``), and once the fit has enough
  groups and the likelihood ranks those pass rates (``ReferenceCalibration.informative``: a
  one-sided rank-correlation test) a prompt gets ``Beta(kappa q^gamma, kappa (1 - q^gamma))``
  and its chance under it, as an exact reference would; until then, and whenever the test
  fails, the likelihood counts as a lower bound (the gate's own prior; a skip only where the
  bound vouches for a near-sure success), and an opening judged while the test fails is
  counted (``gate/reference_uninformative``).

A prompt with no score (reached before it was scored, or with no reference) gets the gate's
prior unchanged, and its chance under that prior; ``metrics`` counts both, and the tokens scored.

>>> from pipeline.types import Prompt
>>> upcoming = [Prompt(0, "", (1, 5)), Prompt(2, "", (1,)), Prompt(1, "", (1, 6))]
>>> screen = ReferenceScreen({0: (7, 2), 1: (8, 2)}, lambda n: upcoming[:n], exact=True, strength=64, ahead=4)
>>> [p.prompt_id for p in screen.wanted()]
[0, 1]
>>> screen.update({0: math.log(0.95), 1: math.log(0.5)}, tokens=8)
>>> (a, b), mixed, _, _ = screen.opening(0, (1.0, 1.0), group_size=8)   # q = 0.95: rarely mixed
>>> round(a, 1), round(b, 1), round(mixed, 2), round(1 - 0.95**8 - 0.05**8, 2)   # exact: 0.34
(60.8, 3.2, 0.32, 0.34)
>>> (a, b), mixed, _, _ = screen.opening(1, (1.0, 1.0), group_size=8); (a, b), round(mixed, 2)
((32.0, 32.0), 0.99)
>>> screen.opening(2, (1.0, 1.0), group_size=8)[0]                # never scored: the gate's prior
(1.0, 1.0)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from controller.posterior import effective_probability, mixed_bound
from controller.reference_fit import ReferenceCalibration
from pipeline.types import Prompt

# Smallest Beta parameter an exact prior gets: a prompt the policy answers right with
# likelihood 1 (or 0) still has a proper prior.
MIN_PSEUDO = 1e-3
# Openings whose mixed chances the skip share's quantile is taken over (the latest), and how
# many it needs before it lowers the skip bar.
SKIP_WINDOW = 256
SKIP_MIN_OPENINGS = 32


def reference_tokens(text_ids: Sequence[int], eos: int, exact: bool) -> tuple[int, ...]:
    """The tokens a reference is scored as: an exact reference is a whole completion, so its
    text ends with the end-of-sequence token; any other only has to be written first, so its
    likelihood is of the text alone. The end token matters: on SmolLM2, whose completions
    rarely stop after the number, the likelihood with it ranks nothing (Spearman -0.14 to 0.02
    against the pass rate over 256 prompts), without it 0.18 to 0.38 (docs/benchmarks/replay.md); railgate's CPU task is exact.

    >>> reference_tokens([5, 6], eos=0, exact=True), reference_tokens([5, 6], eos=0, exact=False)
    ((5, 6, 0), (5, 6))
    """
    return tuple(text_ids) + ((eos,) if exact else ())


class Opening(NamedTuple):
    """What ``ReferenceScreen.opening`` says of a group before any rollout: the Beta ``prior`` it
    starts from, its ``mixed`` chance, the reference ``logprob`` it was judged by (None: no
    score), and how the chance was read (``reading``: ``unscored``, ``bound`` -- the most a lower
    bound allows --, ``calibrated`` or ``exact``): ``skips`` compares a chance only with chances
    read the same way."""

    prior: tuple[float, float]
    mixed: float
    logprob: float | None
    reading: str = "exact"


class ReferenceScreen:
    """Reference likelihoods of the prompts next in line, as SARA priors; see the module docstring.

    Parameters
    ----------
    references
        prompt id -> the reference response's token ids, end-of-sequence token included (what a
        rollout that writes the reference would hold); prompts without one are never scored.
    peek
        ``peek(n)``: the next ``n`` prompts the gate's selector will hand out (``PromptPool.peek``).
    exact
        The reference is the only response that earns the reward, so its likelihood is the pass
        rate; False: a lower bound on it.
    strength
        Pseudo-rollouts the likelihood counts for in an exact prior.
    ahead
        Prompts to score after each learner step.
    calibration
        With ``exact=False``: fit the likelihood's map to the observed pass rates and use it once
        fitted (``controller.reference_fit``); None: a lower bound throughout.
    """

    def __init__(
        self,
        references: Mapping[int, Sequence[int]],
        peek: Callable[[int], Sequence[Prompt]],
        *,
        exact: bool,
        strength: float,
        ahead: int,
        calibration: ReferenceCalibration | None = None,
    ):
        if strength <= 0:
            raise ValueError(f"strength={strength} must be > 0 (pseudo-rollouts)")
        if ahead < 1:
            raise ValueError(f"ahead={ahead} must be >= 1 (prompts scored per learner step)")
        self.references = {int(k): tuple(v) for k, v in references.items()}
        self.peek = peek
        self.exact = exact
        self.strength = float(strength)
        self.ahead = ahead
        self.calibration = None if exact else calibration
        self._logprob: dict[int, float] = {}
        self._counts = {
            "reference_scored": 0,
            "reference_scored_tokens": 0,
            "reference_unscored": 0,
            "reference_uninformative": 0,
        }
        self._chances: deque[float] = deque(maxlen=SKIP_WINDOW)
        self._chances_reading = "exact"  # how the window's chances were read (``Opening.reading``)

    def wanted(self) -> list[Prompt]:
        """The selector's next ``ahead`` prompts that have a reference and no score yet, each once
        (a prompt waiting in line keeps the score it got when it entered the window: scoring it
        again every step would cost as much as the generation it saves)."""
        seen: set[int] = set()
        out = []
        for prompt in self.peek(self.ahead):
            pid = prompt.prompt_id
            if pid in self.references and pid not in seen and pid not in self._logprob:
                seen.add(pid)
                out.append(prompt)
        return out

    def update(self, logprobs: Mapping[int, float], tokens: int) -> None:
        """New scores (prompt id -> summed log-prob of its reference) replace those prompts' old
        ones; ``tokens`` is what scoring them cost (prompt and reference tokens). A score is used
        once: ``opening`` drops it, so a prompt's next group waits for a score of newer weights."""
        bad = {k: v for k, v in logprobs.items() if math.isnan(v) or v > 1e-6}
        if bad:
            k, v = next(iter(bad.items()))
            raise ValueError(
                f"reference log-prob {v} of prompt {k} is not the log of a probability; the learner's scoring is broken"
            )
        self._logprob.update((int(k), min(0.0, float(v))) for k, v in logprobs.items())
        self._counts["reference_scored"] += len(logprobs)
        self._counts["reference_scored_tokens"] += int(tokens)

    def logprob(self, prompt_id: int) -> float | None:
        """The prompt's latest score, None if it has none (or it was used)."""
        return self._logprob.get(prompt_id)

    def opening(self, prompt_id: int, base: tuple[float, float], group_size: int) -> Opening:
        """The Beta prior a group of ``prompt_id`` starts from (``base`` where there is no score or
        the score is only a lower bound) and the chance, before any rollout, that a group of
        ``group_size`` turns out mixed: under that prior, or, for a lower bound, ``mixed_bound`` of
        the score (the most it can be)."""
        lp = self._logprob.pop(prompt_id, None)
        if lp is None:
            self._counts["reference_unscored"] += 1
            return Opening(base, effective_probability(0, 0, group_size, base), None, "unscored")
        if self.calibration is not None and self.calibration.fitted and not self.calibration.informative():
            # The likelihood does not rank the pass rates the run observes: its map is not acted
            # on; the score still counts as the lower bound it is (skips only near-sure successes).
            self._counts["reference_uninformative"] += 1
            return Opening(base, mixed_bound(lp, group_size), lp, "bound")
        if self.calibration is not None and self.calibration.fitted:
            a, b = self.calibration.prior(lp)
            prior = (max(a, MIN_PSEUDO), max(b, MIN_PSEUDO))
            return Opening(prior, effective_probability(0, 0, group_size, prior), lp, "calibrated")
        if not self.exact:
            return Opening(base, mixed_bound(lp, group_size), lp, "bound")
        q = math.exp(lp)
        prior = (max(self.strength * q, MIN_PSEUDO), max(self.strength * (1.0 - q), MIN_PSEUDO))
        return Opening(prior, effective_probability(0, 0, group_size, prior), lp)

    def skips(self, opening: Opening, limit: float, share: float = 1.0) -> bool:
        """Whether the prompt of ``opening`` is skipped: its mixed chance is at most ``limit`` and,
        with ``share`` below 1, under the ``share``-quantile of the chances of the latest
        ``SKIP_WINDOW`` openings read the same way (``Opening.reading``; once there are
        ``SKIP_MIN_OPENINGS``), so at most about that share of the prompts is skipped: the bound a
        score allows before the calibration is trusted says nothing of where the calibrated chances
        fall. A run where every prompt looks alike -- a hard start, where each
        group's chance is low -- then skips almost none instead of nearly all; where the chances
        spread, the bar is ``limit``. Every opening asked about joins the window.

        >>> screen = ReferenceScreen({}, lambda n: [], exact=True, strength=64, ahead=1)
        >>> alike = Opening((1.0, 9.0), 0.3, -2.3)
        >>> [screen.skips(alike, 0.8) for _ in range(40)][-1]          # no share: the limit alone
        True
        >>> [screen.skips(alike, 0.8, share=0.5) for _ in range(40)][-1]  # all alike: none skipped
        False
        >>> screen.skips(Opening((1.0, 99.0), 0.1, -4.6), 0.8, share=0.5)  # below the pool's median
        True
        """
        chance = opening.mixed
        if opening.reading != self._chances_reading:
            self._chances.clear()
            self._chances_reading = opening.reading
        below_share = True
        if share < 1.0 and len(self._chances) >= SKIP_MIN_OPENINGS:
            ordered = sorted(self._chances)
            below_share = chance < ordered[min(len(ordered) - 1, int(share * len(ordered)))]
        self._chances.append(chance)
        return chance <= limit and below_share

    def observe(self, logprob: float, successes: int, rollouts: int) -> None:
        """A group that opened with score ``logprob`` earned ``successes`` of ``rollouts``: what
        the calibration fits (nothing without one)."""
        if self.calibration is not None:
            self.calibration.observe(logprob, successes, rollouts)

    def state_dict(self) -> dict[str, Any]:
        """The counters and the calibration's groups (scores are not kept: a resumed run scores
        afresh before its first step)."""
        state: dict[str, Any] = dict(self._counts)
        state["chances"] = list(self._chances)
        state["chances_reading"] = self._chances_reading
        if self.calibration is not None:
            state["calibration"] = self.calibration.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._counts.update({k: int(state.get(k, 0)) for k in self._counts})
        self._chances.clear()
        self._chances.extend(float(c) for c in state.get("chances", []))
        self._chances_reading = str(state.get("chances_reading", "exact"))
        if self.calibration is not None:
            self.calibration.load_state_dict(state.get("calibration", {}))

    def metrics(self) -> dict[str, float]:
        """``gate/reference_scored`` (prompts), ``gate/reference_scored_tokens``, ``gate/reference_unscored``,
        ``gate/reference_uninformative`` (openings whose calibrated map failed its test), and the calibration's (``gate/reference_gamma``, ``gate/reference_kappa``) where there is one."""
        out = {f"gate/{k}": float(v) for k, v in self._counts.items()}
        if self.calibration is not None:
            out.update(self.calibration.metrics())
        return out
