"""``python run.py shadow`` and ``python run.py replay TRACE...``: evaluating RAIL before it acts.

``shadow`` trains with the RAIL controller in shadow mode: the behaviour policy (the ARPO-like
heuristic, randomised for IPS) acts, the learned controller decides and logs alongside, and no
promotion happens. At the end the run's own trace is replayed to estimate, with IPS, SNIPS
and doubly-robust confidence intervals, what promoting the controller would be worth.

``replay`` does the same offline for any traces: it trains a fresh controller on the logged
decisions (progressive validation) and evaluates it, always-no-op and the heuristic.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.rail.config import RailConfig
from controller.rail.replay import LoggedSet, MixedRunsError, ReplayError, ReplayReport, load_logged, replay
from pipeline.config.build import ConfigError
from pipeline.store.atomic import atomic_savefig, atomic_write
from pipeline.store.tracelog import segment_digest, trace_segment_paths
from railgate.config import RunConfig
from railgate.report import markdown_table


def shadow(cfg: RunConfig, progress: bool | None = None, overwrite: bool = False) -> ReplayReport:
    """Train in shadow mode, then report the off-policy estimate of promoting the controller."""
    from railgate.train import train

    rail = dataclasses.replace(cfg.controller.rail, mode="shadow", auto_promote=False)
    cfg = dataclasses.replace(cfg, controller=dataclasses.replace(cfg.controller, kind="rail", rail=rail))
    if not cfg.log.trace:
        raise ConfigError("shadow mode needs the trace log; remove log.trace=false")
    result = train(cfg, progress=progress, overwrite=overwrite, command="shadow")
    report = replay(load_logged(result.run_dir / "trace", run_id=result.run_id), rail, seed=cfg.seed)
    write_report(report, result.run_dir, title=f"Shadow evaluation of run {cfg.name}")
    return report


def replay_traces(
    paths: Sequence[Path], rail: RailConfig, out: Path, run_id: str | None = None, seed: int = 0
) -> ReplayReport:
    """Train and evaluate a controller offline from one or more traces (a run directory, its
    ``trace/`` directory, or segment files).

    Each input is read as one trace (outcomes joined to decisions of their own run); segment
    files named one by one are one input per directory, so ``decisions-00000.arrows
    outcomes-00000.arrows`` is read as the pair it is. A segment file that an earlier input
    already holds -- the same path, or a copy with the same bytes -- is read once, not counted
    as more evidence (``LoggedSet.duplicates`` lists it). Runs are told apart by their run ids
    (``railgate.runid``): one run id found in two places that are not the same files is
    refused, as is an ``out`` that holds another run's files."""
    check_report_dir(out)
    sets, seen, duplicates, places = [], set(), [], {}
    for place, label, found in _inputs(paths):
        segments = []
        for segment in found:
            keys = {segment.resolve(), segment_digest(segment)}
            if keys & seen:
                duplicates.append(segment)
                continue
            seen |= keys
            segments.append(segment)
        if not segments:
            continue  # every file of this input was given already
        kinds = {p.name.split("-")[0] for p in found}
        if "decisions" in kinds and "outcomes" not in kinds:
            raise ConfigError(
                f"replay {label}: decisions without their outcomes (outcomes-NNNNN.arrows, beside them); "
                f"pass the trace directory, which holds both: railgate replay {place}"
            )
        try:
            logged = load_logged(segments, run_id=run_id)
        except MixedRunsError as exc:
            raise ConfigError(
                f"replay {label}: it holds decisions of {len(exc.run_ids)} runs ({', '.join(exc.run_ids)}); "
                f"pick one with --run-id, e.g. --run-id {exc.run_ids[0]}"
            ) from None
        except ReplayError as exc:
            raise ConfigError(f"replay {label}: {exc}") from None
        _check_unique_runs(places, (run_id,) if run_id else logged.run_ids, place, label)
        sets.append(logged)
    logged = _concat(sets)
    logged = dataclasses.replace(logged, duplicates=tuple(duplicates) + logged.duplicates)
    report = replay(logged, rail, seed=seed)
    write_report(report, out, title=f"Offline replay of {', '.join(map(str, paths))}")
    return report


def _inputs(paths: Sequence[Path]) -> list[tuple[Path, str, list[Path]]]:
    """``(directory, label, segment files)`` per input: each directory given, and the files
    given one by one grouped by the directory they are in (in the order first named)."""
    inputs: dict[Path, tuple[Path, str, list[Path]]] = {}
    for given in map(Path, paths):
        path = trace_input(given)
        if path.is_dir():
            inputs[path.resolve()] = (path.resolve(), str(given), trace_segment_paths(path))
            continue
        files = trace_segment_paths(path)  # a missing path is reported here
        place = path.resolve().parent
        key = place / "\0files"  # files given one by one: one input per directory, apart from the directory itself
        _, label, held = inputs.setdefault(key, (place, str(given), []))
        held.extend(files)
    return list(inputs.values())


def trace_input(path: Path) -> Path:
    """What a replay input names: a trace directory or segment file as it is, a run directory
    as its ``trace/``; ``ConfigError`` for a directory holding no trace segment."""
    if not path.is_dir():
        return path  # a segment file (a missing path is reported by the reader)
    if trace_segment_paths(path):
        return path
    if (path / "trace").is_dir() and trace_segment_paths(path / "trace"):
        return path / "trace"
    raise ConfigError(
        f"replay {path}: no trace there (decisions-NNNNN.arrows and outcomes-NNNNN.arrows files); pass a "
        "run directory or its trace directory, e.g. railgate replay runs/NAME/trace"
    )


def check_report_dir(out: Path) -> None:
    """``ConfigError`` unless ``out`` may take a replay report: not a file, and holding no
    files of a run (a shadow run's own ``offpolicy.*`` would be overwritten)."""
    from railgate.rundir import run_entries
    from railgate.runid import read_run_id

    if out.exists() and not out.is_dir():
        raise ConfigError(f"replay --out {out}: it is a file, not a directory; pass a directory for the report")
    report_files = {"offpolicy.md", "offpolicy.json", "offpolicy.png"}
    held = [p.name for p in run_entries(out) if p.name not in report_files]
    held += [p.name for p in sorted(out.glob("*.arrows"))[:2]] if out.is_dir() else []
    if held:
        try:
            owner = f"run {read_run_id(out) or out.name}"
        except Exception:  # noqa: BLE001 - an unreadable run_id file: still another run's directory
            owner = "a run"
        raise ConfigError(
            f"replay --out {out}: it holds {owner}'s files ({', '.join(held[:4])}), and the report would "
            "overwrite its offpolicy.* files; pass another --out, e.g. --out runs/replay"
        )


def _check_unique_runs(places: dict[str, Path], run_ids: Sequence[str], place: Path, given: str) -> None:
    """One run id in two places (not the same files) is two runs under one name, or two copies
    of one run that each went on: refused, since replaying them as one run would mix them."""
    for rid in run_ids:
        other = places.setdefault(rid, place)
        if other != place:
            raise ConfigError(
                f"replay: {other} and {given} both hold decisions of run {rid!r} but are not the same files: copies of one "
                f"run that each went on, or runs of a railgate release before unique run ids (named by their directory); "
                "replay them one at a time"
            )


def _concat(sets: list[LoggedSet]) -> LoggedSet:
    if len(sets) == 1:
        return sets[0]
    return LoggedSet(
        records=tuple(r for s in sets for r in s.records),
        run_ids=tuple(dict.fromkeys(i for s in sets for i in s.run_ids)),
        torn=tuple(t for s in sets for t in s.torn),
        skipped_no_outcome=sum(s.skipped_no_outcome for s in sets),
        skipped_zero_propensity=sum(s.skipped_zero_propensity for s in sets),
        skipped_not_rail=sum(s.skipped_not_rail for s in sets),
        duplicates=tuple(d for s in sets for d in s.duplicates),
    )


def report_rows(report: ReplayReport) -> list[list[Any]]:
    rows = [
        ["logged (on-policy)", "mean", report.logged_value.value, report.logged_value.lower, report.logged_value.upper]
    ]
    for policy in report.policies:
        for name in ("ips", "snips", "dr"):
            e = getattr(policy, name)
            rows.append([policy.name, name.upper(), e.value, e.lower, e.upper])
    return rows


def write_report(report: ReplayReport, out: Path, title: str) -> None:
    """``offpolicy.md``, ``offpolicy.json`` and ``offpolicy.png`` in ``out``, each written whole."""
    out.mkdir(parents=True, exist_ok=True)
    logged = report.logged
    notes = (
        f"{report.n} decisions used; skipped: {logged.skipped_no_outcome} without outcome, "
        f"{logged.skipped_zero_propensity} with zero behaviour propensity, {logged.skipped_not_rail} not RAIL's. "
        f"Runs: {', '.join(logged.run_ids) or '-'}."
        + (f" Torn files (complete batches used): {', '.join(map(str, logged.torn))}." if logged.torn else "")
        + (f" Given twice, read once: {', '.join(map(str, logged.duplicates))}." if logged.duplicates else "")
    )
    table = markdown_table(["policy", "estimator", "value", "lower", "upper"], report_rows(report))
    text = f"# {title}\n\n{notes}\n\nValue = mean reward per decision (variance gain minus cost_lambda x rollout-equivalents spent).\n\n{table}\n"
    atomic_write(out / "offpolicy.md", text)
    atomic_write(out / "offpolicy.json", json.dumps({"n": report.n, "rows": report_rows(report)}, default=float))
    _plot(report, out / "offpolicy.png", title)
    print(text)


def _plot(report: ReplayReport, path: Path, title: str = "Off-policy evaluation") -> None:
    import matplotlib.pyplot as plt

    fig = offpolicy_figure(report, title)
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def offpolicy_figure(report: ReplayReport, title: str = "Off-policy evaluation") -> Any:
    """Each candidate policy's estimated value per decision under IPS, SNIPS and DR: a point
    and its confidence interval as error bars; the dashed line is the logged policy's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    labels, values, lows, highs, confidence = [], [], [], [], 0.95
    for policy in report.policies:
        for name in ("ips", "snips", "dr"):
            e = getattr(policy, name)
            labels.append(f"{policy.name}\n{name.upper()}")
            values.append(e.value)
            lows.append(e.value - e.lower)
            highs.append(e.upper - e.value)
            confidence = e.confidence
    ax.errorbar(
        range(len(values)),
        values,
        yerr=[lows, highs],
        fmt="o",
        capsize=3,
        label=f"estimate; bars: {confidence:.0%} confidence interval",
    )
    ax.axhline(
        report.logged_value.value, color="grey", linestyle="--", label="logged (behaviour) policy, on-policy mean"
    )
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_xlabel("candidate policy and off-policy estimator")
    ax.set_ylabel("value per decision\n(variance gain - rollout cost)", fontsize=8)
    ax.set_title(f"{title[:80]} ({report.n} decisions)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
