"""Dynamics-Predictive Sampling (DPS, arXiv 2603.10887): pick prompts likely to be partly solved.

Each prompt carries a belief over three hidden states, *unsolved* (U), *partly solved* (P) and
*solved* (S), filtered from the rewards of its past groups with a hidden Markov model:

* **Emission.** In state z a rollout succeeds with probability ``q_z`` (``success_rates``,
  default 0.02 / 0.5 / 0.98). A group of n valid rollouts is observed through its outcome
  class, whose probability under q_z is ``(1 - q_z)^n`` (all wrong), ``q_z^n`` (all right) or
  ``1 - q_z^n - (1 - q_z)^n`` (mixed). The class, not the exact count, because DPS predicts
  whether the next group will be mixed: under the exact binomial count a 1-of-8 group would be
  better explained by q = 0.02 than by q = 0.5 and be called unsolved, although a prompt that
  produces it yields mixed groups most of the time.
* **Transition.** After every learner step each belief is multiplied by the matrix

  ::

      U: [1 - u2p,        u2p,               0      ]
      P: [p2u,            1 - p2u - p2s,     p2s    ]
      S: [0,              s2p,               1 - s2p]

  with ``u2p`` (unsolved_to_partly), ``p2s`` (partly_to_solved) larger than the backward
  rates ``p2u``, ``s2p`` by default: training drifts prompts toward solved, and beliefs about
  prompts not seen for a while relax toward that drift.
* **Selection.** Each pick is the free prompt with the highest P(partly solved) among
  ``candidate_ratio`` free prompts drawn at random for it (so ``take(n)`` ranks ``candidate_ratio
  * n`` random candidates and keeps the top n), as the authors' released code ranks a random
  candidate batch ``candidate_ratio`` times the training batch (8 in their configs). Ranking
  the whole pool instead (``candidate_ratio: 0``) concentrates training on the few prompts
  observed mixed first: on the real model at 8 groups per step it trained on 137 distinct
  prompts in 1,280 groups and held-out accuracy fell below its start. Never-seen prompts hold
  the prior (``prior``, uniform by default) moved by the same transitions. With probability
  ``explore`` (0 by default) a pick comes from the plain ``PromptPool`` cursor instead. Ties
  break at random (seeded).

A prompt is *busy* from ``take`` until ``release`` (its group closed) and is not picked twice
at once. What the paper fixes and what we chose: the three states and the
filter-then-select loop and the top-n of a random candidate set are the paper's; the
outcome-class emission, the banded transition matrix with fixed rates (the released code learns
them) and the exploration share are our choices, all configurable (``gate.dps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from controller.prompts import PromptPool
from pipeline.types import Prompt

UNSOLVED, PARTLY, SOLVED = 0, 1, 2


def transition_matrix(
    unsolved_to_partly: float, partly_to_solved: float, partly_to_unsolved: float, solved_to_partly: float
) -> np.ndarray:
    """The per-step transition matrix (rows: from U, P, S), validated.

    >>> transition_matrix(0.1, 0.2, 0.0, 0.0)[1].tolist()
    [0.0, 0.8, 0.2]
    """
    rates = {
        "unsolved_to_partly": unsolved_to_partly,
        "partly_to_solved": partly_to_solved,
        "partly_to_unsolved": partly_to_unsolved,
        "solved_to_partly": solved_to_partly,
    }
    for name, value in rates.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"gate.dps.{name}={value} must be a probability in [0, 1]")
    if partly_to_solved + partly_to_unsolved > 1.0:
        raise ValueError(
            f"gate.dps.partly_to_solved + partly_to_unsolved = {partly_to_solved + partly_to_unsolved} exceeds 1; "
            "lower one of them"
        )
    return np.array(
        [
            [1.0 - unsolved_to_partly, unsolved_to_partly, 0.0],
            [partly_to_unsolved, 1.0 - partly_to_unsolved - partly_to_solved, partly_to_solved],
            [0.0, solved_to_partly, 1.0 - solved_to_partly],
        ]
    )


class DpsSelector:
    """Prompt selector of Dynamics-Predictive Sampling; see the module docstring.

    Parameters
    ----------
    pool
        The ``PromptPool`` to select from (its cursor serves the exploration picks).
    seed
        Seed of the exploration draws and tie-breaks.
    success_rates
        q_U < q_P < q_S, the per-rollout success rate of each state (emission).
    unsolved_to_partly, partly_to_solved, partly_to_unsolved, solved_to_partly
        Per learner step transition probabilities.
    prior
        Belief (U, P, S) of a never-seen prompt at step 0.
    explore
        Probability that a pick comes from the plain pool cursor.
    candidate_ratio
        Random free prompts ranked per pick (0: the whole free pool).

    Examples
    --------
    >>> from pipeline.types import Prompt
    >>> from controller.prompts import PromptPool
    >>> selector = DpsSelector(PromptPool([Prompt(i, "", (i,)) for i in range(4)], seed=0), seed=0, explore=0.0)
    >>> selector.observe(2, successes=3, samples=8)      # mixed: prompt 2 looks partly solved
    >>> selector.observe(1, successes=0, samples=8)      # all wrong: prompt 1 looks unsolved
    >>> [p.prompt_id for p in selector.take(1)]
    [2]
    >>> round(selector.belief(2)[1], 3), round(selector.belief(1)[0], 3)
    (0.769, 0.995)
    """

    def __init__(
        self,
        pool: PromptPool,
        seed: int,
        success_rates: Sequence[float] = (0.02, 0.5, 0.98),
        unsolved_to_partly: float = 0.02,
        partly_to_solved: float = 0.04,
        partly_to_unsolved: float = 0.01,
        solved_to_partly: float = 0.01,
        prior: Sequence[float] = (1 / 3, 1 / 3, 1 / 3),
        explore: float = 0.0,
        candidate_ratio: int = 8,
    ):
        rates = np.asarray(success_rates, dtype=float)
        if rates.shape != (3,) or not np.all((rates > 0) & (rates < 1)):
            raise ValueError(
                f"gate.dps.success_rates={tuple(success_rates)} must be three rates strictly between 0 and 1 "
                "(unsolved, partly, solved), e.g. (0.02, 0.5, 0.98)"
            )
        if not rates[0] < rates[1] < rates[2]:
            raise ValueError(f"gate.dps.success_rates={tuple(success_rates)} must increase from unsolved to solved")
        start = np.asarray(prior, dtype=float)
        if start.shape != (3,) or np.any(start < 0) or not np.isclose(start.sum(), 1.0):
            raise ValueError(f"gate.dps.prior={tuple(prior)} must be three non-negative probabilities summing to 1")
        if not 0.0 <= explore <= 1.0:
            raise ValueError(f"gate.dps.explore={explore} must be in [0, 1]")
        if candidate_ratio < 0:
            raise ValueError(f"gate.dps.candidate_ratio={candidate_ratio} must be >= 0 (0 = rank the whole free pool)")
        self.pool = pool
        self.seed = seed
        self.success_rates = tuple(float(r) for r in rates)
        self.transitions = transition_matrix(unsolved_to_partly, partly_to_solved, partly_to_unsolved, solved_to_partly)
        self.prior = tuple(float(x) for x in start)
        self.explore = float(explore)
        self.candidate_ratio = int(candidate_ratio)
        self._index = {p.prompt_id: i for i, p in enumerate(pool.prompts)}
        self._log_q = np.log(rates)
        self._log_1mq = np.log1p(-rates)
        self._beliefs = np.tile(start, (len(pool.prompts), 1))
        self._busy: set[int] = set()
        self._steps = 0
        self._rng = np.random.default_rng(seed)

    # --- what it believes ---------------------------------------------------------------

    @property
    def active(self) -> int:
        return self.pool.active

    def belief(self, prompt_id: int) -> tuple[float, float, float]:
        """P(unsolved), P(partly solved), P(solved) of ``prompt_id`` now."""
        return tuple(float(x) for x in self._beliefs[self._index[prompt_id]])  # type: ignore[return-value]

    def partly_probabilities(self) -> np.ndarray:
        """P(partly solved) of every prompt, in ``pool.prompts`` order (a copy)."""
        return self._beliefs[:, PARTLY].copy()

    # --- selection ----------------------------------------------------------------------

    def peek(self, n: int) -> list[Prompt]:
        """None: DPS chooses at ``take``, from beliefs that move with every group."""
        return []

    def take(self, n: int) -> list[Prompt]:
        """Up to ``n`` free prompts: mostly the likeliest partly solved, some from the cursor."""
        picked: list[int] = []
        explore = int((self._rng.random(max(n, 0)) < self.explore).sum()) if n > 0 else 0
        for _ in range(explore):
            index = self._from_cursor(set(picked))
            if index is None:
                break
            picked.append(index)
        picked.extend(self._best(n - len(picked), set(picked)))
        for index in picked:
            self._busy.add(self.pool.prompts[index].prompt_id)
        return [self.pool.prompts[i] for i in picked]

    def _from_cursor(self, taken: set[int]) -> int | None:
        # One pass over the pool at most: the cursor may hand out busy prompts.
        for _ in range(len(self.pool.prompts)):
            got = self.pool.take(1)
            if not got:
                return None
            index = self._index[got[0].prompt_id]
            if got[0].prompt_id not in self._busy and index not in taken:
                return index
        return None

    def _best(self, n: int, taken: set[int]) -> list[int]:
        if n <= 0:
            return []
        scores = self._beliefs[:, PARTLY] + 1e-9 * self._rng.random(len(self._beliefs))
        blocked = [self._index[pid] for pid in self._busy] + list(taken)
        blocked += [i for i, p in enumerate(self.pool.prompts) if self.pool.is_evicted(p.prompt_id)]
        scores[blocked] = -np.inf
        if self.candidate_ratio:
            free = np.flatnonzero(np.isfinite(scores))
            if len(free) > self.candidate_ratio * n:  # rank a random candidate set, not the whole pool
                drawn = self._rng.choice(free, size=self.candidate_ratio * n, replace=False)
                ranked = np.full_like(scores, -np.inf)
                ranked[drawn] = scores[drawn]
                scores = ranked
        free_count = int(np.isfinite(scores).sum())
        n = min(n, free_count)
        if n == 0:
            return []
        top = np.argpartition(-scores, n - 1)[:n]
        return [int(i) for i in top[np.argsort(-scores[top], kind="stable")]]

    def evict(self, prompt_id: int) -> None:
        self.pool.evict(prompt_id)

    # --- feedback -----------------------------------------------------------------------

    def observe(self, prompt_id: int, successes: int, samples: int) -> None:
        """Bayes-update the prompt's belief with a group of ``successes`` out of ``samples``
        valid rollouts (no effect when ``samples`` is 0)."""
        if samples <= 0:
            return
        if not 0 <= successes <= samples:
            raise ValueError(f"successes={successes} must lie in [0, samples={samples}]")
        i = self._index[prompt_id]
        all_right, all_wrong = np.exp(samples * self._log_q), np.exp(samples * self._log_1mq)
        if successes == 0:
            likelihood = all_wrong
        elif successes == samples:
            likelihood = all_right
        else:
            likelihood = np.maximum(1.0 - all_right - all_wrong, 1e-300)
        posterior = self._beliefs[i] * likelihood
        total = posterior.sum()
        # An observation impossible under every state the belief allows: start over from it.
        self._beliefs[i] = posterior / total if total > 0 else likelihood / likelihood.sum()

    def release(self, prompt_id: int) -> None:
        self._busy.discard(prompt_id)

    def advance(self, step: int) -> None:
        """One learner step happened: every belief moves one transition forward."""
        self._beliefs = self._beliefs @ self.transitions
        self._steps += 1

    # --- checkpoint ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool.state_dict(),
            "beliefs": self._beliefs.tolist(),
            "busy": sorted(self._busy),
            "steps": self._steps,
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        beliefs = np.asarray(state["beliefs"], dtype=float)
        if beliefs.shape != self._beliefs.shape:
            raise ValueError(
                f"DPS checkpoint holds beliefs for {beliefs.shape[0]} prompts but the pool has "
                f"{self._beliefs.shape[0]}; restore with the same prompt pool"
            )
        self.pool.load_state_dict(state["pool"])
        self._beliefs = beliefs
        self._busy = set(int(i) for i in state["busy"])
        self._steps = int(state["steps"])
        self._rng.bit_generator.state = state["rng"]
