"""What the RAIL controller reports: its trace records and its step metrics.

* a **decision** record per decision point (``decision_point`` ``group_rescue``,
  ``group_extend``, ``token`` or ``turn``; a turn's ``sample_index`` is its episode's and its
  ``token_position`` the boundary's ``prefix_len``): the context features (plus the shadow-only ``shadow.*``
  keys, ``controller.rail.decider``), the available arms, the executed arm, its propensities
  and the learned model's predicted gain;
* a **promotion** record per mode switch (``chosen`` = the new mode, ``actions`` = both modes),
  whose features hold the evidence: the window size, the acting policy's on-policy value and
  the other policy's doubly-robust value with their bounds, the old mode and whether the switch
  was made by hand;
* pieces of the ``controller/...`` metrics that ``RailController.metrics`` gathers: decision
  latency percentiles and the latest promotion evidence.

>>> rec = switch_record(3, 1.5, "run", "live", None, policy_version=2, manual=True)
>>> rec.decision_point, rec.chosen, rec.features
('promotion', 'live', {'manual': 1.0})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from controller.rail.features import DECISION_POINTS
from controller.rail.promotion import Evidence
from pipeline.types import DecisionRecord, GroupSnapshot

if TYPE_CHECKING:
    from controller.rail.decider import Choice
    from controller.rail.features import Context


def decision_record(
    decision_id: int,
    time: float,
    run_id: str,
    mode: str,
    point: str,
    snapshot: GroupSnapshot,
    sample_index: int,
    position: int,
    context: Context,
    choice: Choice,
) -> DecisionRecord:
    return DecisionRecord(
        decision_id=decision_id,
        time=time,
        run_id=run_id,
        mode=mode,
        decision_point=DECISION_POINTS[point],
        prompt_id=snapshot.prompt.prompt_id,
        group_id=snapshot.group_id,
        sample_index=sample_index,
        token_position=position,
        features={**context.features, **choice.extra_features} if choice.extra_features else context.features.copy(),
        actions=context.names,
        chosen=choice.acted.arm,
        propensity=choice.propensity,
        behaviour_propensity=choice.behaviour_propensity,
        predicted_gain=choice.predicted_gain,
        policy_version=snapshot.policy_version,
    )


def switch_record(
    decision_id: int,
    time: float,
    run_id: str,
    new_mode: str,
    evidence: Evidence | None,
    policy_version: int,
    manual: bool = False,
) -> DecisionRecord:
    features = evidence.features() if evidence is not None else {}
    features["manual"] = float(manual)
    return DecisionRecord(
        decision_id=decision_id,
        time=time,
        run_id=run_id,
        mode=new_mode,
        decision_point="promotion",
        prompt_id=-1,
        group_id=-1,
        sample_index=-1,
        token_position=-1,
        features=features,
        actions=("shadow", "live"),
        chosen=new_mode,
        propensity=1.0,
        behaviour_propensity=1.0,
        predicted_gain=evidence.other.value if evidence is not None else float("nan"),
        policy_version=policy_version,
    )


def latency_metrics(latency_ns: Sequence[int]) -> dict[str, float]:
    """Median and 99th percentile of decision durations given in nanoseconds, in microseconds.

    >>> latency_metrics([1000, 2000, 3000])
    {'controller/decision_p50_us': 2.0, 'controller/decision_p99_us': 3.0}
    """
    latency = sorted(latency_ns)
    if not latency:
        return {}
    return {
        "controller/decision_p50_us": latency[len(latency) // 2] / 1000.0,
        "controller/decision_p99_us": latency[min(len(latency) - 1, int(0.99 * len(latency)))] / 1000.0,
    }


def evidence_metrics(evidence: Evidence | None) -> dict[str, float]:
    """The latest promotion check's estimates (none before the first check)."""
    if evidence is None:
        return {}
    return {
        "controller/acting_value": evidence.acting.value,
        "controller/other_value": evidence.other.value,
        "controller/other_lower": evidence.other.lower,
        "controller/other_upper": evidence.other.upper,
        "controller/window_decisions": float(evidence.n),
    }


def controller_metrics(
    counts: Mapping[str, int],
    length_estimate: float,
    buffers: Any,
    open_groups: int,
    latency_ns: Sequence[int],
    outcomes: Any,
) -> dict[str, float]:
    """``RailController.metrics``: the counters, the length estimate, the prefix buffers
    (``PrefixBuffers``), open groups, the decision latency percentiles and ``outcomes``'
    (``Outcomes.metrics``)."""
    out = {f"controller/{k}": float(v) for k, v in sorted(counts.items())}
    out["controller/length_estimate"] = float(length_estimate)
    out["controller/buffered_requests"] = float(len(buffers))
    out["controller/buffer_evictions"] = float(buffers.evicted)
    out["controller/open_groups"] = float(open_groups)
    out.update(latency_metrics(latency_ns))
    out.update(outcomes.metrics())
    return out
