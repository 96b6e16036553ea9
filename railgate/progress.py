"""A progress bar over learner steps that shows the metrics people watch, and the reward
function's failures as they happen (``reward_failed``: raised / timed out / None)."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm

_SHOWN = {
    "eval/accuracy": "acc",
    "pipeline/rollouts_started": "rollouts",
    "pipeline/effective_yield": "yield",
    "pipeline/staleness_mean": "stale",
}


class ProgressBar:
    """tqdm on stderr; a no-op when disabled (CI logs, benchmarks)."""

    def __init__(self, total: int, enabled: bool = True, desc: str = "", initial: int = 0):
        self._bar = (
            tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, mininterval=0.5, initial=initial)
            if enabled else None
        )
        self._postfix: dict[str, str] = {}
        self._shown_at = 0.0

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self._bar is None:
            return
        for key, short in _SHOWN.items():
            if key in metrics:
                value = metrics[key]
                self._postfix[short] = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def reward_failed(self, health: Any) -> None:
        """A ``RewardHealth`` listener: show its counts now (at most twice a second), even when no
        learner step has ended yet."""
        if self._bar is None:
            return
        self._postfix["reward fail"] = f"{health.errors}/{health.timeouts}/{health.none}"
        now = time.monotonic()
        refresh = now - self._shown_at >= 0.5
        if refresh:
            self._shown_at = now
        self._bar.set_postfix(self._postfix, refresh=refresh)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
