"""The vowpalwabbit learner: ``--cb_explore_adf --squarecb -q sa`` (RAIL's default backend).

Each decision is one multi-line ADF example: a ``shared |s ...`` line with the context features
and one ``|a ...`` line per available arm with the arm's features (kind, size, temperature,
expected cost); ``-q sa`` crosses the two namespaces, so the regressor learns how each arm's
gain depends on the context. VW learns costs, so a reward ``r`` is fed as cost ``-r``; the
per-arm scores VW computes (the examples' partial predictions) are the predicted costs, whose
negatives are the predicted gains. SquareCB turns them into the exploration distribution.

Tracking a drifting policy: ``power_t = 0`` (our default) keeps VW's learning rate constant
instead of decaying it, so recent decisions keep their weight as the RL policy moves.
VW's regressor has no Huber loss (the paper's choice); it uses squared loss, and the river
backend offers Huber.

This is the only module that imports vowpalwabbit. ``controller.rail.learners`` builds it from
the config, with an example of both backends.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pylibvw  # vowpalwabbit's native module; its wheel installs it next to the package
import vowpalwabbit

from controller.rail.arms import Arm
from controller.rail.bandit import (
    BanditLearner,
    ControllerStateError,
    Decision,
    inverse_gap_weighting,
    inverse_gap_weighting_rows,
)
from controller.rail.features import Context
from controller.rail.state import pack_blob, unpack_blob
from controller.rail.vw_args import VWArgsError, check_extra_args, check_model_options
from controller.rail.vw_snapshot import LinearSnapshot

_BAD = re.compile(r"[\s:|]")


class VWLearner(BanditLearner):
    """Contextual bandit over ADF examples in vowpalwabbit; see the module docstring.

    Parameters
    ----------
    learning_rate, power_t
        VW's ``-l`` and ``--power_t``.
    gamma_scale, gamma_exponent
        SquareCB's ``--gamma_scale`` / ``--gamma_exponent`` (VW keeps its own example count).
    extra_args
        Appended to the VW command line.
    snapshot_every
        0: every decision is one VW predict. N > 0: decisions are scored by a numpy copy of VW's
        model (``controller.rail.vw_snapshot``) taken anew every N learned examples, with
        SquareCB's distribution computed here exactly as VW computes it for that model.
    snapshot_growth
        With a snapshot: wait also until the examples learned since the last one reach this
        share of all learned so far (0: every ``snapshot_every``). VW's adaptive steps shrink
        as a feature's gradients add up, so a late example moves the weights less than an
        early one: with ``snapshot_every=64`` and 0.05, a copy 5% of the history behind is
        about as fresh late in a run as one 64 examples behind early, and a 100,000-example run
        reads 105 copies, not 1,562.
    seed
        VW's ``--random_seed`` and the arm sampling.
    """

    name = "vw"

    def __init__(
        self,
        learning_rate: float = 0.5,
        power_t: float = 0.0,
        gamma_scale: float = 10.0,
        gamma_exponent: float = 0.5,
        extra_args: str = "",
        seed: int = 0,
        snapshot_every: int = 0,
        snapshot_growth: float = 0.0,
    ):
        super().__init__(gamma_scale, gamma_exponent, seed)
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every={snapshot_every} must be >= 0 (0 = ask VW at every decision)")
        if not 0.0 <= snapshot_growth <= 1.0:
            raise ValueError(f"snapshot_growth={snapshot_growth} must be in [0, 1] (0 = every snapshot_every examples)")
        self.snapshot_every = snapshot_every
        self.snapshot_growth = snapshot_growth
        self.snapshot: LinearSnapshot | None = None
        self.learning_rate = learning_rate
        self.power_t = power_t
        self.extra_args = " ".join(check_extra_args(extra_args, "extra_args"))  # nothing that names a file
        self._args = (
            f"--cb_explore_adf --squarecb -q sa --quiet --random_seed {seed % (2**31)} "
            f"-l {learning_rate} --power_t {power_t} --gamma_scale {gamma_scale} "
            f"--gamma_exponent {gamma_exponent} {self.extra_args}"
        ).strip()
        self._vw = vowpalwabbit.Workspace(self._args)
        self._names: dict[str, str] = {}
        self._arm_heads: dict[str, str] = {}
        self._templates: dict[tuple[str, ...], str] = {}
        self._probe_texts: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}

    # --- examples --------------------------------------------------------------------

    def _name(self, key: str) -> str:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = _BAD.sub("_", key) or "_"
        return name

    def _shared_template(self, keys: tuple[str, ...]) -> str:
        template = self._templates.get(keys)
        if template is None:
            # '%.6g' formats a float exactly as f'{v:.6g}' does; '%' in a feature name is escaped.
            name = self._name
            template = self._templates[keys] = "shared |s " + " ".join(
                f"{name(k).replace('%', '%%')}:%.6g" for k in keys
            )
        return template

    def _lines(self, context: Context) -> list[str]:
        # A decision point's features come with the same keys in the same order every time, so
        # the shared line is one '%' over a template made once per key set.
        features = context.features
        lines = [self._shared_template(tuple(features)) % tuple(features.values())]
        lines.extend(self._arm_line(arm, cost) for arm, cost in zip(context.arms, context.costs))
        return lines

    def _arm_line(self, arm: Arm, cost: float) -> str:
        head = self._arm_heads.get(arm.name)
        if head is None:
            # Everything but the cost is fixed per arm: format it once.
            feats = arm.features(0.0)
            feats.pop("cost_k", None)
            head = self._arm_heads[arm.name] = "|a " + " ".join(f"{self._name(k)}:{v:.6g}" for k, v in feats.items())
        return f"{head} cost_k:{cost / 1000.0:.6g}" if not arm.is_noop else head

    def distribution(self, context: Context) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if not self.snapshot_every:
            return super().distribution(context)
        if not context.arms:
            raise ValueError("context has no arms; a decision needs at least one arm")
        snapshot = self.snapshot
        if snapshot is None or not snapshot.covers(context):
            snapshot = self._snapshot_for((context,))
        return self._from_gains(snapshot, snapshot.gains(context))

    def distributions(self, contexts: Sequence[Context]) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        """``distribution`` of every context; with a snapshot, scored in one matrix product."""
        if not self.snapshot_every or not contexts:
            return super().distributions(contexts)
        if not all(c.arms for c in contexts):
            raise ValueError("a context has no arms; a decision needs at least one arm")
        snapshot = self._snapshot_for(contexts)
        return [self._from_gains(snapshot, gains) for gains in snapshot.gains_many(contexts)]

    def distribution_blocks(self, contexts: Sequence[Context]) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """``distributions`` as arrays (``BanditLearner.distribution_blocks``); with a snapshot,
        SquareCB's distribution is computed for each block of contexts at once."""
        if not self.snapshot_every or not contexts:
            return super().distribution_blocks(contexts)
        if not all(c.arms for c in contexts):
            raise ValueError("a context has no arms; a decision needs at least one arm")
        snapshot = self._snapshot_for(contexts)
        gamma = self._gamma(snapshot)
        return [(idx, inverse_gap_weighting_rows(gains, gamma), gains) for idx, gains in snapshot.gain_blocks(contexts)]

    # --- the snapshot scorer ---------------------------------------------------------------

    def _snapshot_for(self, contexts: Sequence[Context]) -> LinearSnapshot:
        """The snapshot in use; a new one (over the union, from the current model) when it does
        not cover a context's features or arms, which happens in a run's first decisions."""
        snap = self.snapshot
        if snap is not None and all(map(snap.covers, contexts)):
            return snap
        keys: dict[str, None] = dict.fromkeys(snap.keys) if snap is not None else {}
        arms: dict[str, Arm] = {a.name: a for a in snap.arms()} if snap is not None else {}
        for c in contexts:
            keys.update(dict.fromkeys(c.features))
            arms.update((a.name, a) for a in c.arms)
        return self._take_snapshot(tuple(keys), tuple(arms.values()))

    def _take_snapshot(self, keys: tuple[str, ...], arms: tuple[Arm, ...]) -> LinearSnapshot:
        # The probes depend on the keys and arms only, so their text is formatted once per pair:
        # a run takes a new snapshot over the same ones many times (``_after_learn``).
        key = (keys, tuple(a.name for a in arms))
        if key not in self._probe_texts and len(self._probe_texts) >= 16:  # a run has one or two pairs
            self._probe_texts.clear()

        def costs(probes: Sequence[tuple[Mapping[str, float], Arm, float]]) -> list[float]:
            text = self._probe_texts.get(key)
            if text is None:
                text = self._probe_texts[key] = self._probe_text(probes)
            return self._predict_text(text)

        self.snapshot = LinearSnapshot.probe(costs, keys, arms, self._learned)
        return self.snapshot

    def _after_learn(self) -> None:
        # The new snapshot is taken here, when a closed group's decisions are learned, not in a
        # decision hook.
        snap = self.snapshot
        if (
            self.snapshot_every
            and snap is not None
            and self._learned - snap.learned >= max(self.snapshot_every, self.snapshot_growth * self._learned)
        ):
            self._take_snapshot(snap.keys, snap.arms())

    def _costs(self, probes: Sequence[tuple[Mapping[str, float], Arm, float]]) -> list[float]:
        """VW's predicted cost of every ``(shared features, arm, expected tokens)`` probe, as the
        action lines of one example without a shared line (each line carries its own ``s``)."""
        return self._predict_text(self._probe_text(probes))

    def _probe_text(self, probes: Sequence[tuple[Mapping[str, float], Arm, float]]) -> str:
        """The probes as one multi-line example's text (see ``_costs``)."""
        name = self._name
        shared: dict[int, str] = {}  # the probes share a few feature dicts
        lines = []
        for features, arm, cost in probes:
            head = self._arm_line(arm, cost)
            s = shared.get(id(features))
            if s is None:
                s = shared[id(features)] = " ".join(f"{name(k)}:{v:.6g}" for k, v in features.items())
            lines.append(f"{head} |s {s}" if s else head)
        return "\n".join(lines)

    def _predict_text(self, text: str) -> list[float]:
        """VW's predicted cost of every line of ``text`` (one multi-line example)."""
        vw = self._vw
        examples = vw._parse(text)
        try:
            pylibvw.vw.predict_multi(vw, examples)
            return [float(ex.get_partial_prediction()) for ex in examples]
        finally:
            pylibvw.vw._finish_example_multi_ex(vw, examples)

    def _from_gains(self, snapshot: LinearSnapshot, gains: list[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        # Every probability SquareCB gives is positive and they sum to 1, so no normalising is needed.
        as_tuple = tuple(gains)
        return tuple(inverse_gap_weighting(as_tuple, self._gamma(snapshot))), as_tuple

    def _gamma(self, snapshot: LinearSnapshot) -> float:
        """VW's SquareCB: gamma = gamma_scale * t ** gamma_exponent, t = examples learned (0: uniform)."""
        return self.gamma_scale * float(snapshot.learned) ** self.gamma_exponent

    # --- VW itself (without a snapshot, and the snapshot's probes) --------------------------

    # pyvw's Example wrappers cost about 25 us per line; the native calls below do the same
    # work (parse, predict/learn, finish) in a third of the time, which matters at 12 lines a
    # decision. ``get_action_scores`` returns the probabilities in action order.
    def _distribution(self, context: Context) -> tuple[Sequence[float], Sequence[float]]:
        vw = self._vw
        examples = vw._parse("\n".join(self._lines(context)))
        try:
            pylibvw.vw.predict_multi(vw, examples)
            probs = examples[0].get_action_scores()
            gains = [-float(ex.get_partial_prediction()) for ex in examples[1:]]
        finally:
            pylibvw.vw._finish_example_multi_ex(vw, examples)
        if len(probs) != len(context.arms):  # VW drops nothing for ADF, but a mismatch must not pass
            raise RuntimeError(f"vowpalwabbit returned {len(probs)} probabilities for {len(context.arms)} arms")
        return probs, gains

    def _learn(self, context: Context, decision: Decision, reward: float) -> None:
        lines = self._lines(context)
        i = decision.action + 1
        lines[i] = f"0:{-reward:.9g}:{decision.propensity:.9g} {lines[i]}"
        vw = self._vw
        examples = vw._parse("\n".join(lines))
        try:
            pylibvw.vw.learn_multi(vw, examples)
        finally:
            pylibvw.vw._finish_example_multi_ex(vw, examples)

    # --- state -----------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.vw")
            self._vw.save(path)
            with open(path, "rb") as f:
                blob = f.read()
        text, digest = pack_blob(blob)
        state: dict[str, Any] = {"args": self._args, "model": text, "sha256": digest}
        if self.snapshot is not None:
            state["snapshot"] = self.snapshot.state()
        return state

    def _load(self, state: dict[str, Any]) -> None:
        blob = unpack_blob(state["model"], state["sha256"], "the vw learner state's model")
        try:  # VW applies the options a model's header holds: none may name a file
            check_model_options(blob, "vw learner state: the model")
        except VWArgsError as exc:
            raise ControllerStateError(str(exc)) from None
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.vw")
            with open(path, "wb") as f:
                f.write(blob)
            vw = vowpalwabbit.Workspace(f"--quiet -i {path}")
        snapshot = LinearSnapshot.from_state(state["snapshot"]) if state.get("snapshot") else None
        self._vw.finish()
        self._vw = vw
        self._args = str(state["args"])
        self.snapshot = snapshot

    def __del__(self) -> None:
        vw = getattr(self, "_vw", None)
        if vw is not None and not vw.finished:
            try:
                vw.finish()
            except Exception:
                pass  # interpreter shutdown: nothing to clean up any more
