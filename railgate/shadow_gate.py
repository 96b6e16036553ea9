"""The shadow gate's rule: what a gate would have generated and trained on one step's groups.

A run in shadow mode (``GatedGRPOConfig(gate_mode="shadow")`` in TRL, ``gate.mode: shadow`` in
railgate's own trainer) trains as plain GRPO, writes every step's full groups to a group log
and, per step, replays the configured gate on that step's groups. The rule, the same in both
trainers and in ``python run.py bench replay DIR --per-step``:

* one replay per step, on the step's groups alone, in the order they were written (order seed 0:
  each group's samples in their recorded finish order);
* a *fresh* gate each step (``railgate.replay.driver.replay`` builds it from the saved config,
  seeded from its ``seed``), with the run's group size and prompts per step; what a gate learns
  across steps (SARA's fit of the run's pass rates, a calibrated reference prior, DPS's beliefs)
  starts cold every step, so a learning gate's per-step figures are those of a cold start. The
  whole log replayed as one run (``bench replay DIR`` without ``--per-step``) shows the gate
  carried across steps;
* the figures are sums over the step's groups of ``railgate.replay.figures.prompt_figures``
  (the same definitions ``bench replay`` reports).

The config the replays use is saved beside the log as ``shadow.json`` (``ShadowRule.save``), so
the per-step figures can be recomputed from the directory alone, exactly.

>>> from pipeline.store.grouplog import RecordedGroup
>>> from railgate.config import load_config
>>> rule = ShadowRule(load_config(None, ["gate.kind=ds", "orchestrator.group_size=4", "orchestrator.batch_groups=2"]))
>>> groups = [RecordedGroup.of(g, g, r) for g, r in enumerate([(1, 0, 1, 1), (0, 0, 0, 0), (1, 1, 0, 0)])]
>>> f = rule.figures(groups)
>>> f["grpo_rollouts"], f["grpo_mixed"], f["rollouts"], f["mixed_trained"]
(12.0, 2.0, 12.0, 2.0)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.build import ConfigError
from pipeline.replay.order import ReplayOrder
from pipeline.replay.timing import DEFAULT_RATE
from pipeline.store.atomic import atomic_write
from pipeline.store.grouplog import GroupLog, RecordedGroup, read_group_log
from railgate.config import RunConfig, dump_config, load_config
from railgate.replay.driver import not_replayable, replay
from railgate.replay.figures import prompt_figures

SPEC_FILE = "shadow.json"
"""Where in a shadow run's group-log directory the replayed config is saved."""

FIGURES = (
    "rollouts",
    "tokens",
    "groups_trained",
    "mixed_trained",
    "wrong_abandons",
    "skipped_mixed",
    "grpo_rollouts",
    "grpo_tokens",
    "grpo_mixed",
    "groups",
)
"""A step's figures: what the gate would have generated (``rollouts``, ``tokens``), trained
(``groups_trained``: committed groups; ``mixed_trained``: of them, those whose served samples are
mixed -- a gradient), ``wrong_abandons`` (abandoned though the full group is mixed),
``skipped_mixed`` (never opened though mixed); what GRPO generated (``grpo_rollouts``,
``grpo_tokens``: every recorded sample) and how many of its groups were mixed (``grpo_mixed``);
``groups``: the step's recorded groups."""


@dataclass(frozen=True)
class ShadowRule:
    """The gate of ``config`` replayed on a step's groups (see the module docstring). The group
    size and prompts per step are ``config.orchestrator``'s ``group_size`` and ``batch_groups``."""

    config: RunConfig
    rate: float = DEFAULT_RATE
    """Tokens a second of the replay's clock (``pipeline.replay.timing``)."""

    def __post_init__(self) -> None:
        why = not_replayable(self.config)
        if why:
            raise ValueError(f"the shadow gate cannot be replayed: {why}")

    @property
    def group_size(self) -> int:
        return self.config.orchestrator.group_size

    @property
    def batch_groups(self) -> int:
        return self.config.orchestrator.batch_groups

    def figures(self, groups: Sequence[RecordedGroup]) -> dict[str, float]:
        """The step's figures (``FIGURES``) for ``groups``, replayed in the order given."""
        out = dict.fromkeys(FIGURES, 0.0)
        if not groups:
            return out
        k = self.group_size
        order = ReplayOrder(GroupLog(tuple(groups), ("shadow",)), seed=0)
        run = replay(self.config, order, k, self.batch_groups, self.rate)
        f = prompt_figures(order, run.outcomes, k)
        out.update(
            rollouts=float(f["samples"].sum()),
            tokens=float(f["tokens"].sum()),
            groups_trained=float(f["committed"].sum()),
            mixed_trained=float(f["informative"].sum()),
            wrong_abandons=float(f["wrong_abandon"].sum()),
            skipped_mixed=float(f["skipped_mixed"].sum()),
            grpo_rollouts=float(sum(min(g.size, k) for g in groups)),
            grpo_tokens=float(sum(s.num_tokens for g in groups for s in g.in_finish_order()[:k])),
            grpo_mixed=float(f["full_mixed"].sum()),
            groups=float(len(groups)),
        )
        return out

    def save(self, directory: str | os.PathLike) -> Path:
        """``shadow.json`` in ``directory``: the config (``dump_config``) and the rate."""
        path = Path(directory) / SPEC_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "rule": "per-step replay, fresh gate, order seed 0",
            "rate": self.rate,
            "config": dump_config(self.config),
        }
        atomic_write(path, json.dumps(record, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ShadowRule:
        """The rule a shadow run saved in ``directory``; ``ConfigError`` naming the fix."""
        path = Path(directory) / SPEC_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path} not found: --per-step replays a shadow run's group log (railgate_groups/ of a TRL run with "
                "gate_mode='shadow', groups/ of a railgate run with gate.mode=shadow), which holds it"
            )
        record = json.loads(path.read_text(encoding="utf-8"))
        return cls(load_config(None, base=record["config"]), rate=float(record["rate"]))


class ShadowTally:
    """Running totals of the per-step figures (``total_*``)."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(FIGURES, 0.0)

    def add(self, figures: dict[str, float]) -> dict[str, float]:
        """Add a step's figures; the totals so far as ``total_NAME``."""
        for name in FIGURES:
            self.totals[name] += figures[name]
        return {f"total_{name}": value for name, value in self.totals.items()}


def by_step(groups: Iterable[RecordedGroup]) -> dict[int, list[RecordedGroup]]:
    """The groups of each step, in the order they were written, steps ascending."""
    out: dict[int, list[RecordedGroup]] = {}
    for g in groups:
        out.setdefault(g.step, []).append(g)
    return dict(sorted(out.items()))


def replay_per_step(directory: str | os.PathLike, rule: ShadowRule | None = None) -> list[dict[str, float]]:
    """Each step of the shadow log in ``directory``, replayed with its saved rule (or ``rule``):
    one record per step, ``step``, the figures and their running totals -- the numbers the run
    logged."""
    rule = rule or ShadowRule.load(directory)
    log = read_group_log(directory)
    tally = ShadowTally()
    rows = []
    for step, groups in by_step(log.groups).items():
        figures = rule.figures(groups)
        rows.append({"step": float(step), **figures, **tally.add(figures)})
    return rows


def replayed_config(config: RunConfig) -> RunConfig:
    """The config a shadow run's steps are replayed under: ``config`` with ``gate.mode`` back to
    ``live`` and SARA's reference prior off -- shadow logs hold no ``reference_logprob`` (scoring
    the reference would change what a shadow run computes), so the prior's skips and head starts
    are not in the shadow figures.

    >>> cfg = replayed_config(load_config(None, ["gate.kind=sara", "gate.mode=shadow"]))
    >>> cfg.gate.mode, cfg.gate.sara.reference_prior
    ('live', False)
    """
    gate = config.gate
    sara = dataclasses.replace(gate.sara, reference_prior=False)
    return dataclasses.replace(config, gate=dataclasses.replace(gate, mode="live", sara=sara))


TABLE_COLUMNS = (
    ("step", "step"),
    ("groups", "groups"),
    ("rollouts", "gate rollouts"),
    ("grpo_rollouts", "GRPO rollouts"),
    ("tokens", "gate tokens"),
    ("grpo_tokens", "GRPO tokens"),
    ("groups_trained", "trained"),
    ("mixed_trained", "mixed trained"),
    ("grpo_mixed", "GRPO mixed"),
    ("wrong_abandons", "wrong abandons"),
)
"""What ``per_step_table`` shows, and the headings."""


def per_step_table(rows: Sequence[dict[str, float]]) -> str:
    """The per-step figures as a text table, with a total line.

    >>> print(per_step_table([{**dict.fromkeys(FIGURES, 1.0), "step": 0.0}]).splitlines()[0].split()[:3])
    ['step', 'groups', 'gate']
    """
    heads = [h for _, h in TABLE_COLUMNS]
    lines = [[f"{int(r[k])}" if float(r[k]).is_integer() else f"{r[k]:.4g}" for k, _ in TABLE_COLUMNS] for r in rows]
    if rows:
        total = ["total"] + [f"{sum(r[k] for r in rows):g}" for k, _ in TABLE_COLUMNS[1:]]
        lines.append(total)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(heads)]
    out = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def write_per_step(rows: Sequence[dict[str, float]], directory: str | os.PathLike) -> list[Path]:
    """``per_step.json`` and ``per_step.csv`` in ``directory`` (every figure and running total)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    js, cs = out / "per_step.json", out / "per_step.csv"
    atomic_write(js, json.dumps(list(rows), indent=2))
    names = list(rows[0]) if rows else ["step", *FIGURES]
    with cs.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
    return [js, cs]
