"""A simulated response drawn whole: what both ways of running the sim engine release.

``SimEngine.stream`` (a coroutine per request) and ``SimMux`` (one consumer for every request)
draw a request's whole response when it starts (``SimEngine._render_request``) and release it
chunk by chunk; this module holds what they share: the drawn response (``Rendered``), the token
tables it is cut from, and the injected fault.
"""

from __future__ import annotations

import random

import numpy as np

from pipeline.sim.world import CORRECT_TOKEN, WRONG_TOKEN, SimWorld, Trajectory
from pipeline.types import FinishReason, SampleFinished


class SimEngineFault(RuntimeError):
    """Injected failure (``engine.fail_every``), for fault-handling tests."""


class Rendered:
    """One request's response, drawn whole: its new tokens (tuples once, so that each delta is a
    slice of them) after the branch prefix, if any."""

    __slots__ = (
        "request_id",
        "trajectory",
        "tokens",
        "logprobs",
        "entropies",
        "prefix_tokens",
        "prefix_logprobs",
        "start_pos",
    )

    def __init__(
        self,
        request_id: str,
        trajectory: Trajectory,
        tokens: tuple[int, ...],
        logprobs: tuple[float, ...],
        entropies: tuple[float, ...],
        prefix_tokens: tuple[int, ...],
        prefix_logprobs: tuple[float, ...],
        start_pos: int,
    ):
        self.request_id = request_id
        self.trajectory = trajectory
        self.tokens, self.logprobs, self.entropies = tokens, logprobs, entropies
        self.prefix_tokens, self.prefix_logprobs, self.start_pos = prefix_tokens, prefix_logprobs, start_pos

    @property
    def end_reason(self) -> FinishReason:
        return FinishReason.LENGTH if self.trajectory.truncated else FinishReason.STOP

    def finished(self, produced: int, reason: FinishReason, version: int, now: float) -> SampleFinished:
        """The final event once ``produced`` of the new tokens are out."""
        return SampleFinished(
            request_id=self.request_id,
            token_ids=self.prefix_tokens + self.tokens[:produced],
            logprobs=self.prefix_logprobs + self.logprobs[:produced],
            finish_reason=reason,
            policy_version=version,
            engine_time=now,
        )


class TokenTables:
    """Pre-drawn token ids, log-probs and base entropies; a response is a slice at a random
    offset. Drawing fresh arrays per response would cost more than the rest of the engine."""

    SIZE = 1 << 16

    def __init__(self, vocab_size: int, seed: int):
        rng = np.random.default_rng([seed, 104729])
        self.tokens = rng.integers(3, vocab_size, size=self.SIZE)
        self.entropy = 0.3 * rng.exponential(size=self.SIZE)
        self.logprobs = -self.entropy * rng.uniform(0.5, 1.5, size=self.SIZE)

    def render(self, rng: random.Random, traj: Trajectory, start: int, world: SimWorld):
        """Token ids, log-probs and entropies of ``traj``'s tokens from ``start`` on."""
        n = traj.length - start
        if n <= 0:
            return [], [], []
        if n > self.SIZE:
            raise ValueError(f"sim response of {n} tokens exceeds the token table ({self.SIZE}); lower max_tokens")
        off = rng.randrange(self.SIZE - n + 1)
        tokens = self.tokens[off : off + n].tolist()
        logprobs = self.logprobs[off : off + n].tolist()
        entropy = self.entropy[off : off + n].tolist()
        for k, extra in world.knot_entropy(traj, start):
            entropy[k] += extra
            logprobs[k] -= extra / 2
        if not traj.truncated:
            tokens[-1] = CORRECT_TOKEN if traj.correct else WRONG_TOKEN
        return tokens, logprobs, entropy
