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

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, ndtr, ndtri

from pipeline.config import SimConfig

KNOTS = 8
CORRECT_TOKEN = 1
WRONG_TOKEN = 2


@dataclass
class SimPolicyState:
    """The simulated policy's weights: a global skill and a skill offset per training prompt."""

    theta: float
    offsets: np.ndarray

    def copy(self) -> "SimPolicyState":
        return SimPolicyState(float(self.theta), self.offsets.copy())


@dataclass(frozen=True)
class Trajectory:
    """A sampled latent trajectory: progress at knot positions (in tokens) and its length."""

    positions: np.ndarray  # token positions of the knots, increasing, last == length
    z: np.ndarray  # progress at those positions
    length: int
    correct: bool
    truncated: bool = False  # hit max_tokens before writing an answer

    def progress_at(self, position: int) -> float:
        return float(np.interp(position, self.positions, self.z))


class SimWorld:
    """Prompt difficulties and the probabilities that follow from a policy state.

    >>> from pipeline.config import SimConfig
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

    @staticmethod
    def threshold(p: float) -> float:
        """c with 1 - Phi(c) = p, clipped so that p = 0 or 1 stays finite."""
        p = min(max(p, 1e-12), 1 - 1e-12)
        return float(ndtri(1.0 - p))

    # --- trajectories ----------------------------------------------------------------

    def sample_trajectory(
        self,
        rng: np.random.Generator,
        p: float,
        temperature: float,
        max_tokens: int,
        prefix: Trajectory | None = None,
        prefix_len: int = 0,
    ) -> Trajectory:
        """Sample a trajectory of a prompt with success probability ``p`` (at T = 1),
        optionally continuing the first ``prefix_len`` tokens of ``prefix``."""
        cfg = self.config
        c = self.threshold(p)
        if prefix is not None and prefix_len > 0:
            prefix_len = min(prefix_len, prefix.length)
            f0 = prefix_len / max(prefix.length, 1)
            z0 = prefix.progress_at(prefix_len)
        else:
            prefix_len, f0, z0 = 0, 0.0, 0.0
        rest = 1.0 - f0
        steps = rng.standard_normal(KNOTS) * temperature * np.sqrt(rest / KNOTS)
        z_rest = z0 + np.cumsum(steps)
        correct = bool(z_rest[-1] > c)
        mean_len = cfg.length_success if correct else cfg.length_failure
        total = float(mean_len * np.exp(cfg.length_spread * rng.standard_normal() - cfg.length_spread**2 / 2))
        new_tokens = max(1, int(round(total * rest)))
        length = prefix_len + new_tokens
        pos_rest = prefix_len + new_tokens * np.arange(1, KNOTS + 1) / KNOTS
        if prefix is not None and prefix_len > 0:
            keep = prefix.positions < prefix_len
            positions = np.concatenate([[0.0], prefix.positions[keep], [prefix_len], pos_rest])
            z = np.concatenate([[0.0], prefix.z[keep], [z0], z_rest])
        else:
            positions = np.concatenate([[0.0], pos_rest])
            z = np.concatenate([[0.0], z_rest])
        if length > max_tokens:
            # Truncated: the answer was never written, so it cannot be correct.
            return Trajectory(positions, z, max_tokens, False, truncated=True)
        return Trajectory(positions, z, length, correct)

    def render(self, rng: np.random.Generator, traj: Trajectory, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids, log-probs and entropies of ``traj``'s tokens from ``start`` on."""
        n = traj.length - start
        tokens = rng.integers(3, self.config.vocab_size, size=n)
        entropy = 0.3 * rng.exponential(size=n)
        moves = np.abs(np.diff(traj.z))
        knot_pos = traj.positions[:-1].astype(int) - start
        ok = (knot_pos >= 0) & (knot_pos < n)
        entropy[knot_pos[ok]] += 2.0 * moves[ok]
        logprobs = -entropy * rng.uniform(0.5, 1.5, size=n)
        if n > 0 and not traj.truncated:
            tokens[-1] = CORRECT_TOKEN if traj.correct else WRONG_TOKEN
        return tokens, logprobs, entropy

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
            new.theta += cfg.learning_rate * float(np.mean(signals)) * (n_eff / cfg.reference_batch) ** cfg.progress_exponent
        if cfg.drift_std > 0:
            self.difficulty += cfg.drift_std * rng.standard_normal(len(self.difficulty))
        return new
