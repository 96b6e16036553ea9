"""A numpy copy of vowpalwabbit's cost model, so a decision is a matrix product, not a VW call.

With ``--cb_explore_adf -q sa`` the cost VW predicts for an arm line is linear in the shared
features for fixed arm features, and linear in the arm's one varying feature (``cost_k``) for
fixed shared features: for arm ``k``, shared features ``x`` and expected cost ``c`` tokens,

    cost_k(x, c) = base[k] + slope[k] . x + (c / 1000) * (cbase[k] + cslope[k] . x)

(the constant, the arm's fixed features and their crosses with ``x`` fold into ``base`` and
``slope``). ``LinearSnapshot.probe`` reads those arrays out of a live VW workspace by asking it
for the costs at ``x = 0`` and at every unit vector, each at ``c = 0`` and ``c = 1000``, with no
knowledge of VW's hashing. The probes go to VW as one multi-line example whose action lines carry
their own ``s`` features (VW copies a shared line into each action line, so this scores the same
as separate examples), 1.3-1.5 ms for 21 features and 12 arms. Scoring a decision is then one
matrix-vector product; scoring N decisions at once is one matrix product (``gains_many``).

A snapshot is a fixed policy: ``VWLearner`` takes a new one every ``snapshot_every`` learned
examples, and the propensities it logs are those of the snapshot that acted, so off-policy
estimates stay exact. The snapshot is part of the learner's state, so a resumed run decides
exactly as the uninterrupted one would.

>>> import numpy as np
>>> from controller.rail.arms import build_arms
>>> from controller.rail.config import RailConfig
>>> from controller.rail.features import Context
>>> arms = build_arms(RailConfig(branch_sizes=(), resample_sizes=(2,), resample_temperatures=(1.0,)))
>>> def costs(probes):  # a toy linear model standing in for VW
...     return [0.5 - 2.0 * x.get("x", 0.0) + (0.0 if a.is_noop else 0.1 + t / 1000.0) for x, a, t in probes]
>>> snap = LinearSnapshot.probe(costs, ("x",), arms, learned=3)
>>> ctx = Context("token", {"x": 0.1}, arms, (0.0, 200.0))
>>> [round(g, 6) for g in snap.gains(ctx)]
[-0.3, -0.6]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from controller.rail.arms import Arm, ArmsCache, blocks_by_arms, parse_arm
from controller.rail.features import Context

CostFn = Callable[[Sequence[tuple[Mapping[str, float], Arm, float]]], Sequence[float]]
"""``[(shared features, arm, expected token cost), ...] -> predicted cost of each`` (VW's scores)."""

PROBE_TOKENS = 1000.0  # cost_k = tokens / 1000 = 1 on the second probe of every arm


class LinearSnapshot:
    """VW's cost model over ``keys`` (shared features) and ``arm_names`` at ``learned`` examples.

    Parameters
    ----------
    keys, arm_names
        The shared features and arms the arrays cover, in array order.
    base, slope, cbase, cslope
        The model's arrays (see the module docstring): ``base``/``cbase`` of shape ``(arms,)``,
        ``slope``/``cslope`` of shape ``(arms, keys)``.
    learned
        Examples the learner had learned when the snapshot was taken (SquareCB's ``t``).
    """

    def __init__(
        self,
        keys: Sequence[str],
        arm_names: Sequence[str],
        base: np.ndarray,
        slope: np.ndarray,
        cbase: np.ndarray,
        cslope: np.ndarray,
        learned: int,
    ):
        self.keys = tuple(keys)
        self.arm_names = tuple(arm_names)
        k, d = len(self.arm_names), len(self.keys)
        self.base = np.asarray(base, dtype=np.float64).reshape(k)
        self.slope = np.asarray(slope, dtype=np.float64).reshape(k, d)
        self.cbase = np.asarray(cbase, dtype=np.float64).reshape(k)
        self.cslope = np.asarray(cslope, dtype=np.float64).reshape(k, d)
        self.learned = int(learned)
        self._key_index = {key: i for i, key in enumerate(self.keys)}
        self._arm_index = {name: i for i, name in enumerate(self.arm_names)}
        # One matrix-vector product gives every arm's fixed part (rows :k) and per-1000-token part (k:).
        # C order whatever the inputs' layout: a product's rounding depends on the layout, and a
        # snapshot restored from a state must score bit for bit as the one it was saved from.
        self._weights = np.ascontiguousarray(np.concatenate([self.slope, self.cslope]))
        self._bias = np.ascontiguousarray(np.concatenate([self.base, self.cbase]))
        self._rows = ArmsCache()

    @classmethod
    def probe(cls, costs: CostFn, keys: Sequence[str], arms: Sequence[Arm], learned: int) -> LinearSnapshot:
        """Read the model out of ``costs`` (the live learner's scorer) for ``keys`` x ``arms``:
        every arm at ``x = 0`` and at every unit vector, interventions at two costs, in one call."""
        keys, arms = tuple(keys), tuple(arms)
        k, d = len(arms), len(keys)
        probes: list[tuple[Mapping[str, float], Arm, float]] = []
        points: list[Mapping[str, float]] = [{}] + [{key: 1.0} for key in keys]
        for x in points:
            probes += [(x, a, 0.0) for a in arms]
            probes += [(x, a, PROBE_TOKENS) for a in arms]
        out = np.asarray(costs(probes), dtype=np.float64).reshape(d + 1, 2, k)
        interventions = np.array([not a.is_noop for a in arms])
        at0 = out[:, 0, :]  # (1 + keys, arms)
        per_k = np.where(interventions, out[:, 1, :] - at0, 0.0)  # the no-op has no cost feature
        return cls(
            keys, [a.name for a in arms], at0[0], (at0[1:] - at0[0]).T, per_k[0], (per_k[1:] - per_k[0]).T, learned
        )

    def covers(self, context: Context) -> bool:
        """Whether every feature and arm of ``context`` is in the snapshot."""
        features = context.features
        if not (len(features) == len(self.keys) and tuple(features) == self.keys):
            if any(k not in self._key_index for k in features):
                return False
        return self._rows.get(context.arms, self._knows, "known")

    def _knows(self, arms: tuple[Arm, ...]) -> bool:
        return all(a.name in self._arm_index for a in arms)

    def _vector(self, features: Mapping[str, float]) -> np.ndarray:
        if len(features) == len(self.keys) and tuple(features) == self.keys:
            return np.fromiter(features.values(), dtype=np.float64, count=len(self.keys))
        x = np.zeros(len(self.keys))
        for key, value in features.items():
            x[self._key_index[key]] = value
        return x

    def _arm_rows(self, arms: tuple[Arm, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the arms' fixed parts and of their per-1000-token parts in ``_weights``."""
        rows = np.array([self._arm_index[a.name] for a in arms], dtype=np.intp)
        return rows, rows + len(self.arm_names)

    @staticmethod
    def _combine(parts: np.ndarray, rows: tuple[np.ndarray, np.ndarray], costs: np.ndarray) -> np.ndarray:
        """Gains (negated costs) from the product's parts, for one context or a stack of them."""
        fixed, per_k = rows
        return -(parts[..., fixed] + costs * (1.0 / PROBE_TOKENS) * parts[..., per_k])

    def _arm_weights(self, arms: tuple[Arm, ...]) -> tuple[np.ndarray, list[float], int]:
        """The rows of ``_weights`` that score ``arms`` (their fixed parts, then their
        per-1000-token parts) and the matching entries of ``_bias`` as floats, gathered once per
        arms tuple."""
        fixed, per_k = self._arm_rows(arms)
        rows = np.concatenate([fixed, per_k])
        return np.ascontiguousarray(self._weights[rows]), self._bias[rows].tolist(), len(arms)

    def gains(self, context: Context) -> list[float]:
        """Predicted gain (negated cost) of each of the context's arms, in its order.

        One context is scored with one matrix-vector product over its own arms' rows and the
        rest in Python: on arrays of one row numpy's per-call cost is most of the work, the more
        so on a cold cache (a lone decision after the engine's work), so the bias is added to the
        product's floats here rather than by another array operation (the same IEEE additions),
        and ``ndarray.dot`` calls the BLAS routine of ``@`` with less dispatch around it."""
        weights, bias, k = self._rows.get(context.arms, self._arm_weights, "weights")
        parts = weights.dot(self._vector(context.features)).tolist()
        scale = 1.0 / PROBE_TOKENS
        return [
            -((parts[i] + bias[i]) + cost * scale * (parts[k + i] + bias[k + i]))
            for i, cost in enumerate(context.costs)
        ]

    def gains_many(self, contexts: Sequence[Context]) -> list[list[float]]:
        """``gains`` of every context, from one matrix product over all of them and one
        vectorised step per distinct arms tuple."""
        out: list[list[float]] = [[] for _ in contexts]
        for idx, block in self.gain_blocks(contexts):
            for i, row in zip(idx, block.tolist()):
                out[i] = row
        return out

    def gain_blocks(self, contexts: Sequence[Context]) -> list[tuple[list[int], np.ndarray]]:
        """The gains of ``gains_many`` as one ``(indices, gains)`` per distinct arms tuple, the
        array (len(indices) x arms) in the order of ``indices`` into ``contexts``."""
        if not contexts:
            return []
        keys = self.keys
        if all(len(c.features) == len(keys) and tuple(c.features) == keys for c in contexts):
            x = np.array([list(c.features.values()) for c in contexts], dtype=np.float64)
        else:
            x = np.stack([self._vector(c.features) for c in contexts])
        parts = x.dot(self._weights.T) + self._bias  # (contexts, 2 x arms); ``dot`` as in ``gains``
        blocks = []
        for idx in blocks_by_arms(c.arms for c in contexts):
            rows = self._rows.get(contexts[idx[0]].arms, self._arm_rows)
            costs = np.array([contexts[i].costs for i in idx], dtype=np.float64)
            blocks.append((idx, self._combine(parts if len(idx) == len(contexts) else parts[idx], rows, costs)))
        return blocks

    def state(self) -> dict[str, Any]:
        """JSON-able arrays (floats survive JSON exactly)."""
        return {
            "keys": list(self.keys),
            "arms": list(self.arm_names),
            "base": self.base.tolist(),
            "slope": self.slope.tolist(),
            "cbase": self.cbase.tolist(),
            "cslope": self.cslope.tolist(),
            "learned": self.learned,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LinearSnapshot:
        """Inverse of ``state``; ``KeyError``/``ValueError`` on a malformed one."""
        arms = [str(a) for a in state["arms"]]
        for name in arms:
            parse_arm(name)  # an unknown arm name is a corrupt state
        return cls(
            state["keys"],
            arms,
            np.array(state["base"]),
            np.array(state["slope"]),
            np.array(state["cbase"]),
            np.array(state["cslope"]),
            int(state["learned"]),
        )

    def arms(self) -> tuple[Arm, ...]:
        """The arms the snapshot covers (for widening it to a new context's)."""
        return tuple(parse_arm(name) for name in self.arm_names)
