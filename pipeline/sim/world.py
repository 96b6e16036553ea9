"""The simulated policy: who solves what, how a trajectory unfolds, and how training moves it.

Everything the ``sim`` engine and the sim learner do follows from the rules below. They are
the same for every allocation policy: nothing here knows which gate or controller runs.

**Prompts.** Prompt i has a latent difficulty d_i drawn from a mixture of normals
(``sim.difficulty``). Held-out prompts are drawn from the same mixture.

**Success probability.** p_i = sigmoid(theta + u_i - d_i), with theta the global skill and
u_i a prompt-specific skill (zero for held-out prompts).

**A trajectory** is a latent progress path z(f) over its fraction f in [0, 1] of tokens:
z(0) = 0, Brownian increments with variance T^2 per unit fraction at temperature T. The
answer is correct iff z(1) > c_i with c_i = Phi^-1(1 - p_i), so a fresh sample at T = 1
succeeds with probability exactly p_i; at temperature T with probability 1 - Phi(c_i / T)
(hot sampling helps hard prompts and hurts easy ones). A *branch* from the first f of an
earlier trajectory keeps its z(f) and resamples the rest: it succeeds with probability
1 - Phi((c_i - z(f)) / (T sqrt(1 - f))) -- a promising prefix is worth branching from.
The path is kept at ``KNOTS`` points; z between them is linear.

**Tokens.** A response's length is log-normal around ``length_success`` or
``length_failure``; its last token is 1 (correct) or 2 (wrong), the rest are drawn from
[3, vocab). Per-token entropy is a small base value with a spike at each knot proportional
to the size of the coming move of z: forks in the path look like uncertain tokens.

**Training.** A committed group g of prompt i with n_g valid samples and success rate m_g
carries the signal s_g = 4 m_g (1 - m_g) n_g / G (zero for a saturated group; G is the
nominal group size). One learner step over a batch of groups applies

    theta += learning_rate * mean_{g effective}(s_g) * (n_eff / reference_batch) ** progress_exponent
    u_i   += prompt_learning_rate * s_g          for every group of prompt i in the batch

With progress_exponent = 1 a step's progress is the sum of its groups' signals (every
effective group counts); near 0 a step's progress barely depends on how many of its groups
are effective ("normalised steps"). Optionally every d_i takes a random-walk step
(``drift_std``) per learner step.

**Evaluation** is exact: the expected accuracy of sampling once at T = 1, mean_j p_j.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, ndtr, ndtri

from pipeline.config.sections import SimConfig
from pipeline.intervals import prompt_mean

KNOTS = 8
CORRECT_TOKEN = 1
WRONG_TOKEN = 2


@dataclass
class SimPolicyState:
    """The simulated policy's weights: a global skill and a skill offset per training prompt."""

    theta: float
    offsets: np.ndarray

    def copy(self) -> SimPolicyState:
        return SimPolicyState(float(self.theta), self.offsets.copy())


@dataclass(frozen=True)
class Trajectory:
    """A sampled latent trajectory: progress at knot positions (in tokens) and its length."""

    positions: tuple[float, ...]  # token positions of the knots, increasing
    z: tuple[float, ...]  # progress at those positions
    length: int
    correct: bool
    truncated: bool = False  # hit max_tokens before writing an answer

    def progress_at(self, position: float) -> float:
        """z at ``position``, linear between knots."""
        pos, z = self.positions, self.z
        i = bisect.bisect_right(pos, position)
        if i <= 0:
            return z[0]
        if i >= len(pos):
            return z[-1]
        x0, x1 = pos[i - 1], pos[i]
        return z[i - 1] + (z[i] - z[i - 1]) * (position - x0) / (x1 - x0) if x1 > x0 else z[i]


class SimWorld:
    """Prompt difficulties and the probabilities that follow from a policy state.

    >>> from pipeline.config.sections import SimConfig
    >>> w = SimWorld(SimConfig(num_prompts=4, num_eval_prompts=3, seed=1))
    >>> s = w.initial_state()
    >>> 0.0 < w.success_probability(s, 0) < 1.0
    True
    >>> round(w.success_probability(s, 0), 6) == round(w.success_probability(s, 0, temperature=1.0), 6)
    True
    """

    def __init__(self, config: SimConfig):
        self.config = config
        rng = np.random.default_rng([config.seed, 7919])
        self.difficulty = self._draw(rng, config.num_prompts)
        self.eval_difficulty = self._draw(rng, config.num_eval_prompts)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        comps = self.config.difficulty
        w = np.array([c.weight for c in comps], dtype=float)
        which = rng.choice(len(comps), size=n, p=w / w.sum())
        means = np.array([c.mean for c in comps])[which]
        stds = np.array([c.std for c in comps])[which]
        return means + stds * rng.standard_normal(n)

    def initial_state(self) -> SimPolicyState:
        return SimPolicyState(self.config.initial_skill, np.zeros(self.config.num_prompts))

    # --- probabilities ---------------------------------------------------------------

    def logit(self, state: SimPolicyState, prompt_id: int) -> float:
        return state.theta + state.offsets[prompt_id] - self.difficulty[prompt_id]

    def success_probability(self, state: SimPolicyState, prompt_id: int, temperature: float = 1.0) -> float:
        """P(correct) of a fresh sample of a training prompt at ``temperature``."""
        p = float(expit(self.logit(state, prompt_id)))
        if temperature == 1.0:
            return p
        return float(1.0 - ndtr(self.threshold(p) / temperature))

    def success_probabilities(self, state: SimPolicyState) -> np.ndarray:
        """P(correct) at T = 1 of every training prompt."""
        return expit(state.theta + state.offsets - self.difficulty)

    def eval_accuracy(self, state: SimPolicyState) -> float:
        """Exact expected held-out accuracy of one sample at T = 1."""
        return float(np.mean(expit(state.theta - self.eval_difficulty)))

    def eval_accuracy_hardest(self, state: SimPolicyState, fraction: float = 0.2) -> float:
        """Exact held-out accuracy on the hardest ``fraction`` of the held-out prompts."""
        hardest = np.sort(self.eval_difficulty)[-max(1, int(round(fraction * len(self.eval_difficulty)))) :]
        return float(np.mean(expit(state.theta - hardest)))

    @staticmethod
    def threshold(p: float) -> float:
        """c with 1 - Phi(c) = p, clipped so that p = 0 or 1 stays finite."""
        p = min(max(p, 1e-12), 1 - 1e-12)
        return float(ndtri(1.0 - p))

    # --- trajectories ----------------------------------------------------------------

    def sample_trajectory(
        self,
        rng: random.Random,
        p: float,
        temperature: float,
        max_tokens: int,
        prefix: Trajectory | None = None,
        prefix_len: int = 0,
    ) -> Trajectory:
        """Sample a trajectory of a prompt with success probability ``p`` (at T = 1),
        optionally continuing the first ``prefix_len`` tokens of ``prefix``.

        Pure Python on purpose: with 8 knots, numpy's per-call overhead dominates."""
        cfg = self.config
        c = self.threshold(p)
        if prefix is not None and prefix_len > 0:
            prefix_len = min(prefix_len, prefix.length)
            f0 = prefix_len / max(prefix.length, 1)
            z0 = prefix.progress_at(prefix_len)
        else:
            prefix_len, f0, z0 = 0, 0.0, 0.0
        rest = 1.0 - f0
        step_sd = temperature * math.sqrt(rest / KNOTS)
        z_rest, z = [], z0
        for _ in range(KNOTS):
            z += rng.gauss(0.0, step_sd)
            z_rest.append(z)
        correct = z > c
        mean_len = cfg.length_success if correct else cfg.length_failure
        sigma = cfg.length_spread
        total = mean_len * math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2)
        new_tokens = max(1, int(round(total * rest)))
        length = prefix_len + new_tokens
        pos_rest = [prefix_len + new_tokens * k / KNOTS for k in range(1, KNOTS + 1)]
        if prefix is not None and prefix_len > 0:
            keep = [i for i, x in enumerate(prefix.positions) if 0 < x < prefix_len]
            positions = (0.0, *(prefix.positions[i] for i in keep), float(prefix_len), *pos_rest)
            zs = (0.0, *(prefix.z[i] for i in keep), z0, *z_rest)
        else:
            positions = (0.0, *pos_rest)
            zs = (0.0, *z_rest)
        if length > max_tokens:
            # Truncated: the answer was never written, so it cannot be correct.
            return Trajectory(positions, zs, max_tokens, False, truncated=True)
        return Trajectory(positions, zs, length, correct)

    def knot_entropy(self, traj: Trajectory, start: int) -> list[tuple[int, float]]:
        """(offset from ``start``, extra entropy) at each knot inside the rendered range:
        a fork of the path (a large coming move of z) shows as an uncertain token."""
        out = []
        n = traj.length - start
        for i in range(len(traj.z) - 1):
            k = int(traj.positions[i]) - start
            if 0 <= k < n:
                out.append((k, 2.0 * abs(traj.z[i + 1] - traj.z[i])))
        return out

    # --- training ----------------------------------------------------------------------

    def learn(
        self,
        state: SimPolicyState,
        groups: list[tuple[int, list[float]]],
        group_size: int,
        rng: np.random.Generator,
    ) -> SimPolicyState:
        """One learner step over ``(prompt_id, rewards)`` groups; returns the new state."""
        cfg = self.config
        new = state.copy()
        signals = []
        for prompt_id, rewards in groups:
            n = len(rewards)
            if n < 2:
                continue
            m = float(np.mean(np.asarray(rewards) > 0.5))
            s = 4.0 * m * (1.0 - m) * n / group_size
            if s > 0:
                signals.append(s)
                if 0 <= prompt_id < len(new.offsets):
                    new.offsets[prompt_id] += cfg.prompt_learning_rate * s
        if signals:
            n_eff = len(signals)
            new.theta += (
                cfg.learning_rate * float(np.mean(signals)) * (n_eff / cfg.reference_batch) ** cfg.progress_exponent
            )
        if cfg.drift_std > 0:
            self.difficulty += cfg.drift_std * rng.standard_normal(len(self.difficulty))
        return new


class SimAnswerScorer:
    """Reward of a simulated response: 1 if its last token is the correct-answer token.

    >>> SimAnswerScorer()(None, [7, 9, CORRECT_TOKEN]), SimAnswerScorer()(None, [7, WRONG_TOKEN])
    (1.0, 0.0)
    """

    runs_inline = True  # one comparison: cheaper than any thread hop

    def __call__(self, prompt, token_ids) -> float:
        return 1.0 if len(token_ids) > 0 and token_ids[-1] == CORRECT_TOKEN else 0.0


class SimEvaluator:
    """Exact held-out accuracy of the sim engine's current policy (no sampling noise).

    Its interval (``eval/accuracy_lo``, ``eval/accuracy_hi``) is over prompts, from each
    held-out prompt's exact success probability (``pipeline.intervals.prompt_mean``): what
    another draw of held-out prompts could give, not sampling noise, which there is none of.
    ``last_rates`` holds those probabilities, for paired comparisons.
    """

    def __init__(self, world: SimWorld, engine):
        self.world = world
        self.engine = engine
        self.last_rates: tuple[float, ...] = ()

    async def evaluate(self, step: int) -> dict[str, float]:
        state = self.engine.state
        train_p = self.world.success_probabilities(state)
        self.last_rates = tuple(float(p) for p in expit(state.theta - self.world.eval_difficulty))
        interval = prompt_mean(self.last_rates)
        return {
            "eval/accuracy": self.world.eval_accuracy(state),
            "eval/accuracy_lo": interval.lo,
            "eval/accuracy_hi": interval.hi,
            "eval/accuracy_hardest": self.world.eval_accuracy_hardest(state),
            "eval/train_accuracy": float(np.mean(train_p)),
            "eval/train_solved_fraction": float(np.mean(train_p > 0.95)),
            "eval/train_unsolved_fraction": float(np.mean(train_p < 0.05)),
        }
