"""Progress bars: railgate's own, one per long phase, and none of any library's.

``ProgressBar`` is the bar over learner steps that shows the metrics people watch; the warm
start and the benchmarks have theirs. ``quiet_libraries`` keeps libraries' bars off the
terminal (transformers' "Loading weights" and "Writing model shards", the Hub's downloads)
and, for ``--no-progress``, every bar at all (``TQDM_DISABLE``: vLLM's, Ray's, and those of
worker processes, which inherit the environment).
"""

from __future__ import annotations

import os
import sys

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

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self._bar is None:
            return
        for key, short in _SHOWN.items():
            if key in metrics:
                value = metrics[key]
                self._postfix[short] = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def quiet_libraries(no_progress: bool) -> None:
    """No library's progress bar from here on (and in child processes); with ``no_progress``
    no bar at all, railgate's included.

    >>> quiet_libraries(False); os.environ["HF_HUB_DISABLE_PROGRESS_BARS"]
    '1'
    """
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by transformers when it is imported
    if "transformers" in sys.modules:  # imported already: switch its bars off directly
        from transformers.utils import logging

        logging.disable_progress_bar()
    if no_progress:
        os.environ["TQDM_DISABLE"] = "1"  # tqdm's default for every bar not told otherwise
