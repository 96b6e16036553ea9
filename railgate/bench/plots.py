"""The allocation benchmark's figure: held-out accuracy against cumulative rollouts, one line per
policy (the mean over seeds), one panel per scenario and training model (or the real model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from railgate.bench.policies import order


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["scenario"], r["model"]) for r in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (scenario, model) in zip(axes[0], panels):
        rs = [r for r in results if r["scenario"] == scenario and r["model"] == model]
        budget = max(r["budget"] for r in rs)
        grid = np.linspace(0, budget, 200)
        for policy in sorted({r["policy"] for r in rs}, key=order):
            curves = []
            for r in rs:
                if r["policy"] != policy:
                    continue
                x = np.array([c[0] for c in r["curve"]])
                y = np.array([c[3] for c in r["curve"]])
                curves.append(np.interp(grid, x, y, right=np.nan))
            # A plain mean: the line stops where any seed's run has ended (no survivor bias).
            ax.plot(grid, np.mean(np.array(curves), axis=0), label=policy)
        ax.set_title(f"{scenario}, {model} training model" if scenario else f"real model ({rs[0].get('engine', '')})")
        ax.set_xlabel("cumulative rollouts")
        ax.set_ylabel("held-out accuracy" + (" (exact)" if scenario else " (sampled)"))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
