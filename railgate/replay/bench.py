"""``python run.py bench replay LOG...``: every gate replayed on the same recorded groups, paired.

For each log: each gate (a policy name of ``railgate.bench.policies``) is replayed with the
direct driver (``railgate.replay.driver``) under ``orders`` replay orders (seed 0: as recorded;
then seeded shuffles of the prompt order and each group's sample order), and the report
(``railgate.replay.report``) compares them on the same groups. A gate that cannot be replayed
is listed with the reason instead.

Settings every gate gets: ``orchestrator.group_size`` (default: the log's K) and
``orchestrator.batch_groups`` (``--batch``), then the policy's own overrides, then ``--set``.
HORA may give a group any share of its extra budget, past the K samples a log holds; unless
``--set gate.hora.max_group_size=...`` says otherwise, replay caps its groups at the group size
(what HORA does for a trainer with fixed group slots) and says so in the notes. SARA's reference
prior takes the log's ``reference_logprob`` as the pass rate (``replay.reference_exact=true``)
unless the policy (``trl_default``) or ``--set replay.reference_exact=false`` says it is only a
lower bound. ``trl_default``'s probe is half the group, as ``GatedGRPOConfig`` derives it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.gates.rounds import RoundCapError
from pipeline.config.build import ConfigError
from pipeline.replay.order import NotReplayable, ReplayOrder
from pipeline.replay.timing import DEFAULT_RATE
from pipeline.store.grouplog import GroupLog
from railgate.bench.policies import POLICIES, base_overrides, overrides, sized_overrides
from railgate.config import RunConfig, load_config
from railgate.progress import ProgressBar
from railgate.replay.calibration import calibration
from railgate.replay.driver import ReplayRun, replay
from railgate.replay.gate_parts import not_replayable
from railgate.replay.logs import open_log
from railgate.replay.probe_value import probe_value
from railgate.replay.report import log_report, log_summary

DEFAULT_GATES = (
    "uniform",
    "ds",
    "pilot_commit",
    "hora",
    "sara",
    "sara_ref",
    "sara_ref_skip",
    "trl_default",
    "oracle",
)
"""The baselines, SARA with and without its reference prior, the CPU default's gate
(``sara_ref_skip``: configs/default.yaml), ``GatedGRPOConfig``'s default gate (``trl_default``:
a calibrated, not exact, reference prior and the probing rule) and the oracle. DPS is not among them: a replay offers
each recorded prompt once, which leaves DPS nothing to predict (``gate_parts.not_replayable``)."""


@dataclass(frozen=True)
class ReplaySpec:
    """What ``bench replay`` replays: the gates, the group and step sizes, the orders."""

    gates: tuple[str, ...] = DEFAULT_GATES
    group_size: int = 0
    """0: the log's K."""
    batch: int = 32
    orders: int = 3
    rate: float = DEFAULT_RATE
    extra: tuple[str, ...] = ()
    """``--set`` overrides, applied to every gate after its policy's."""
    resamples: int = 1000
    notes: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.batch < 1 or self.orders < 1 or self.group_size < 0 or self.resamples < 1:
            raise ConfigError(
                f"--batch={self.batch} and --orders={self.orders} must be >= 1 and --group-size={self.group_size} >= 0 "
                "(0: the log's K)"
            )
        unknown = [g for g in self.gates if g not in POLICIES]
        if unknown or not self.gates:
            raise ConfigError(
                f"--gates: unknown policy {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
            )
        load_config(None, list(self.extra))  # a bad --set fails here, not as every gate's reason


def open_replay_log(
    path: Path,
    fmt: str = "auto",
    tokenizer: str | None = None,
    num_generations: int | None = None,
    on_bad_row: str = "error",
) -> GroupLog:
    """The log at ``path``, of any format (``railgate.replay.logs.open_log``)."""
    return open_log(path, fmt, tokenizer, num_generations, on_bad_row)


def gate_config(name: str, group_size: int, batch: int, extra: Sequence[str]) -> RunConfig:
    """The config gate ``name`` is replayed under (the module docstring has the order)."""
    sizes = [f"orchestrator.group_size={group_size}", f"orchestrator.batch_groups={batch}"]
    own = overrides(name) + sized_overrides(name, group_size)
    defaults = []
    if not any(s.startswith("gate.hora.max_group_size=") for s in extra):
        defaults.append(f"gate.hora.max_group_size={group_size}")
    if not any(s.startswith("replay.reference_exact=") for s in [*own, *extra]):
        defaults.append("replay.reference_exact=true")
    return load_config(None, sizes + base_overrides(name) + own + defaults + list(extra))


def replay_log(log: GroupLog, spec: ReplaySpec, progress: bool = True) -> dict[str, Any]:
    """Every gate of ``spec`` replayed on ``log`` under ``spec.orders`` orders; the report."""
    spec.check()
    started = time.perf_counter()
    k = log.group_size
    group_size = spec.group_size or k
    if group_size > k:
        raise NotReplayable(
            f"--group-size {group_size} is above the log's {k} recorded samples per group "
            f"({', '.join(log.sources)}); use --group-size {k} or less, or record more samples per prompt"
        )
    if group_size < 2:
        raise ConfigError(f"group size {group_size} must be >= 2 (a group-relative advantage); the log has K={k}")
    orders = [ReplayOrder(log, seed) for seed in range(spec.orders)]
    notes = list(spec.notes)
    runs: dict[str, list[ReplayRun]] = {}
    configs: dict[str, RunConfig] = {}
    skipped: dict[str, str] = {}
    bar = ProgressBar(len(spec.gates) * len(orders), enabled=progress, desc="bench replay")
    done = 0
    for i, name in enumerate(spec.gates):
        try:
            cfg = gate_config(name, group_size, spec.batch, spec.extra)
            why = not_replayable(cfg, k)
            if why:
                raise NotReplayable(why)
            got = []
            for order in orders:
                got.append(replay(cfg, order, group_size, spec.batch, spec.rate))
                done += 1
                bar.update(done, {})
        except (NotReplayable, RoundCapError, ConfigError) as exc:
            skipped[name] = str(exc)
            done = (i + 1) * len(orders)
            bar.update(done, {})
            continue
        runs[name], configs[name] = got, cfg
    bar.close()
    if "hora" in runs and not any(s.startswith("gate.hora.max_group_size=") for s in spec.extra):
        notes.append(f"hora's groups capped at {group_size} samples (gate.hora.max_group_size): a log holds no more")
    if "oracle" in runs:
        notes.append("oracle: p = the recorded group's success fraction; its saturated groups' cost is counted")
    gates = log_report(orders, runs, configs, group_size, spec.batch, spec.resamples) if runs else {}
    return {
        "log": log_summary(orders, group_size),
        "group_size": group_size,
        "batch": spec.batch,
        "orders": spec.orders,
        "rate": spec.rate,
        "gates": gates,
        "calibration": calibration(orders[0], group_size),
        "probe_value": probe_value(orders[0], group_size),
        "not_replayable": skipped,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }
