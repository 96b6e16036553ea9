"""``bench replay``'s outputs: a table per log, ``replay.json``, ``replay.csv`` and ``replay.png``.

>>> row = {"informative_per_1k_rollouts": [50.0, 40.0, 60.0]}
>>> _interval(row["informative_per_1k_rollouts"])
'50.0 (40.0-60.0)'
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from railgate.replay.probe_value import probe_line
from railgate.report import markdown_table

HEADERS = (
    "gate",
    "mixed/1k rollouts (95%)",
    "x uniform",
    "x DS",
    "mixed/1M tokens",
    "rollouts/step",
    "tokens/step",
    "wrong abandons",
    "mixed skipped",
    "wasted commits",
    "decided <=4",
    "trained pass rate",
    "distinct prompts",
    "forecast/1k",
)


def _interval(v: Sequence[float], digits: int = 1) -> str:
    value, lo, hi = v[:3]
    if not math.isfinite(value):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:,.{digits}f}"


def table(report: dict[str, Any]) -> str:
    """One log's readable table, with what the log holds and the gates that could not be replayed."""
    log = report["log"]
    lines = [
        f"## {', '.join(log['sources'])}",
        "",
        f"{log['groups']:,} groups of {log['group_size_recorded']} ({log['format']}), {log['source_prompts']:,} source "
        f"prompts, {log['mixed_groups']:,} mixed ({log['mixed_first_g']:,.0f} in their first {report['group_size']}); replayed as groups of {report['group_size']}, steps of "
        f"{report['batch']} informative groups, {report['orders']} order(s); {report['seconds']:.1f} s",
    ]
    if log["skipped_rows"] or log["skipped_groups"]:
        lines.append(f"skipped: {log['skipped_rows']:,} bad rows in {log['skipped_groups']:,} groups")
    lines += [f"note: {n}" for n in log["notes"] + report.get("notes", [])]
    rows = []
    for name, g in report["gates"].items():
        trained = g["pass_rate_trained"]
        rows.append(
            [
                name,
                _interval(g["informative_per_1k_rollouts"]),
                _interval(g["yield_vs"]["uniform"], 2) if "uniform" in g["yield_vs"] else "-",
                _interval(g["yield_vs"]["ds"], 2) if "ds" in g["yield_vs"] else "-",
                _num(g["informative_per_1m_tokens"][0], 0),
                _num(g["fill_rollouts"]),
                _num(g["fill_tokens"]),
                _pct(g["wrong_abandon_share"]),
                _pct(g["skipped_mixed_share"]),
                _pct(g["wasted_commits_served"])
                + (
                    ""
                    if _same(g["wasted_commits_served"], g["wasted_commits_full"])
                    else f" / {_pct(g['wasted_commits_full'])} full"
                ),
                _pct(g["decided_within_4"]),
                "n/a" if not trained["n"] else f"{trained['mean']:.2f} ({trained['q25']:.2f}-{trained['q75']:.2f})",
                _num(g["distinct_prompts_trained"]),
                _num(g["forecast"]["per_1k_rollouts"], 1) if "per_1k_rollouts" in g["forecast"] else "-",
            ]
        )
    lines += ["", markdown_table(HEADERS, rows), ""]
    all_mixed = next(iter(report["gates"].values()), {}).get("pass_rate_all_mixed")
    if all_mixed and all_mixed["n"]:
        lines.append(
            f"all mixed groups of the log: pass rate {all_mixed['mean']:.2f} ({all_mixed['q25']:.2f}-{all_mixed['q75']:.2f}), "
            "the profile a gate's 'trained pass rate' is compared with"
        )
    for name, why in report["not_replayable"].items():
        lines.append(f"not replayable: {name}: {why}")
    if report.get("probe_value"):
        lines += ["", probe_line(report["probe_value"])]
    if report.get("calibration"):
        lines += ["", calibration_table(report["calibration"])]
    return "\n".join(lines)


CALIBRATION_HEADERS = (
    "reference q (quintile)",
    "groups",
    "observed pass rate",
    "observed mixed",
    "exact: pass rate",
    "exact: mixed",
    "calibrated: pass rate",
    "calibrated: mixed",
)


def calibration_table(c: dict[str, Any]) -> str:
    """The calibration table (``railgate.replay.calibration``): does the reference likelihood
    predict the log's pass rates, and what the screen predicts against what was observed.

    >>> c = {"groups": 2, "rank_correlation": 0.5, "rank_z": 0.5, "rank_z_bar": 3.0, "informative": False,
    ...      "auc_any_success": 0.6, "gamma": 0.5, "kappa": 4.0, "bins": [{"q_low": 1e-5, "q_high": 0.02, "groups": 2,
    ...      "observed_pass_rate": 0.1, "observed_mixed": 0.5, "exact_pass_rate": 0.01, "exact_mixed": 0.1,
    ...      "calibrated_pass_rate": 0.1, "calibrated_mixed": 0.3}]}
    >>> print(calibration_table(c).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    calibration (2 groups with a reference score): Spearman(reference log-likelihood, pass rate) 0.50, z 0.50
    (informative at >= 3.0: no), AUC for any success 0.60; calibrated map gamma 0.50, kappa 4.0
    """
    head = (
        f"calibration ({c['groups']:,} groups with a reference score): Spearman(reference log-likelihood, pass rate) "
        f"{c['rank_correlation']:.2f}, z {c['rank_z']:.2f} (informative at >= {c['rank_z_bar']:.1f}: "
        f"{'yes' if c['informative'] else 'no'}), AUC for any success {_num(c['auc_any_success'], 2)}; "
        f"calibrated map gamma {_num(c['gamma'], 2)}, kappa {_num(c['kappa'], 1)}"
    )
    rows = [
        [
            f"{b['q_low']:.1e} - {b['q_high']:.1e}",
            str(b["groups"]),
            f"{b['observed_pass_rate']:.3f}",
            _pct(b["observed_mixed"]),
            f"{b['exact_pass_rate']:.3f}",
            _pct(b["exact_mixed"]),
            _num(b["calibrated_pass_rate"], 3),
            _pct(b["calibrated_mixed"]),
        ]
        for b in c["bins"]
    ]
    return "\n".join([head, "", markdown_table(CALIBRATION_HEADERS, rows)])


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


CSV_FIELDS = (
    "log",
    "gate",
    "orders",
    "groups_opened",
    "groups_committed",
    "informative",
    "rollouts",
    "tokens",
    "informative_per_1k_rollouts",
    "informative_per_1k_rollouts_lo",
    "informative_per_1k_rollouts_hi",
    "informative_per_1m_tokens",
    "informative_per_1m_tokens_lo",
    "informative_per_1m_tokens_hi",
    "vs_uniform",
    "vs_uniform_lo",
    "vs_uniform_hi",
    "vs_ds",
    "vs_ds_lo",
    "vs_ds_hi",
    "fill_rollouts",
    "fill_tokens",
    "wrong_abandon_share",
    "skipped_mixed_share",
    "wasted_commits_served",
    "wasted_commits_full",
    "decided_within_2",
    "decided_within_4",
    "decided_mean",
    "pass_rate_trained_mean",
    "pass_rate_all_mixed_mean",
    "distinct_prompts_trained",
    "commits_per_distinct_prompt",
    "forecast_per_1k_rollouts",
)


def csv_rows(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per log and replayed gate."""
    rows = []
    for report in reports:
        for name, g in report["gates"].items():
            row: dict[str, Any] = {"log": ";".join(report["log"]["sources"]), "gate": name}
            for key in ("orders", "groups_opened", "groups_committed", "informative", "rollouts", "tokens"):
                row[key] = g[key]
            for key in ("informative_per_1k_rollouts", "informative_per_1m_tokens"):
                row[key], row[f"{key}_lo"], row[f"{key}_hi"] = g[key]
            for ref in ("uniform", "ds"):
                v = g["yield_vs"].get(ref, [math.nan] * 3)
                row[f"vs_{ref}"], row[f"vs_{ref}_lo"], row[f"vs_{ref}_hi"] = v
            for key in CSV_FIELDS:
                if key not in row and key in g:
                    row[key] = g[key]
            row["pass_rate_trained_mean"] = g["pass_rate_trained"]["mean"]
            row["pass_rate_all_mixed_mean"] = g["pass_rate_all_mixed"]["mean"]
            row["forecast_per_1k_rollouts"] = g["forecast"].get("per_1k_rollouts", math.nan)
            rows.append(row)
    return rows


def write_outputs(reports: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """``replay.json`` (everything), ``replay.csv`` (a row per log and gate), ``replay.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "replay.json", out / "replay.csv", out / "replay.png"]
    paths[0].write_text(json.dumps({"logs": list(reports)}, indent=2, default=_plain) + "\n")
    with paths[1].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(reports))
    plot(reports, paths[2])
    return paths


def _plain(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


def plot(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """Per log: each gate's informative groups per 1,000 rollouts with its 95% interval, and the
    rollouts it took to fill a step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 2, figsize=(12, 4 * len(reports)), squeeze=False)
    for (left, right), report in zip(axes, reports):
        names = list(report["gates"])
        y = [report["gates"][g]["informative_per_1k_rollouts"] for g in names]
        err = [
            [max(0.0, v - lo) if math.isfinite(lo) else 0.0 for v, lo, _ in y],
            [max(0.0, hi - v) if math.isfinite(hi) else 0.0 for v, _, hi in y],
        ]
        left.bar(names, [v for v, _, _ in y], yerr=err, capsize=3, color="tab:blue")
        left.set_ylabel("informative groups / 1,000 rollouts")
        left.set_title(", ".join(report["log"]["sources"])[-60:])
        fills = [report["gates"][g]["fill_rollouts"] for g in names]
        right.bar(names, [f if math.isfinite(f) else 0.0 for f in fills], color="tab:orange")
        right.set_ylabel(f"rollouts to fill a step of {report['batch']} informative groups")
        for ax in (left, right):
            ax.tick_params(axis="x", rotation=45)
            ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
