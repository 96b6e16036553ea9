"""Progress bars: railgate's own, one per long phase, and none of any library's.

``ProgressBar`` is the bar over learner steps that shows the metrics people watch and the reward
function's failures as they happen (``reward_failed``: raised / timed out / None); the warm
start and the benchmarks have theirs. ``quiet_libraries`` keeps libraries' bars off the
terminal while a command runs (transformers' "Loading weights" and "Writing model shards", the
Hub's downloads) and, for ``--no-progress``, every bar at all (railgate's by its own switch;
``TQDM_DISABLE`` for the processes the command starts: vLLM's engine core, benchmark workers).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
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
            if enabled
            else None
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


@contextlib.contextmanager
def quiet_libraries(no_progress: bool) -> Iterator[None]:
    """While a command runs (and in the processes it starts): no library's progress bar; with
    ``no_progress`` no bar at all, railgate's included. The environment and transformers' switch
    are put back afterwards, so a command run in-process (tests) leaves no trace.

    >>> with quiet_libraries(True):
    ...     os.environ["HF_HUB_DISABLE_PROGRESS_BARS"], os.environ["TQDM_DISABLE"]
    ('1', '1')
    """
    saved = {name: os.environ.get(name) for name in _SWITCHES}
    logging = sys.modules.get("transformers.utils.logging")
    was_active = (
        logging.is_progress_bar_enabled() if logging is not None else saved["HF_HUB_DISABLE_PROGRESS_BARS"] is None
    )
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by transformers and the Hub when imported
    if logging is not None:  # imported already: switch its bars off directly
        logging.disable_progress_bar()
    if no_progress:
        # tqdm reads it when imported: every bar of a process this command starts (vLLM's engine
        # core, a benchmark's workers) is off; in this process railgate passes its own switch.
        os.environ["TQDM_DISABLE"] = "1"
    silenced = _tqdm_off() if no_progress else None
    try:
        yield
    finally:
        if silenced is not None:
            silenced()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        logging = sys.modules.get("transformers.utils.logging")
        if logging is not None and was_active:
            # The Hub read its switch when imported (while it was set) and warns that it wins;
            # this process's bars stay off, which is what the command asked for.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                logging.enable_progress_bar()


_SWITCHES = ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def _tqdm_off() -> Callable[[], None] | None:
    """Every tqdm bar of this process off, until the returned function is called. ``TQDM_DISABLE``
    is read once, when tqdm is imported: a library that imported tqdm before the command began
    (transformers' GGUF conversion, "Converting and de-quantizing GGUF tensors") would still draw
    its bar. Not imported yet: the environment switch covers it, nothing to do here.

    >>> import io, tqdm
    >>> undo = _tqdm_off()
    >>> out = io.StringIO(); _ = list(tqdm.tqdm(range(3), file=out)); out.getvalue()
    ''
    >>> undo()
    """
    std = sys.modules.get("tqdm.std")
    if std is None:
        return None
    cls = std.tqdm
    original = cls.__init__

    def init(self, *args, **kwargs):
        kwargs["disable"] = True
        original(self, *args, **kwargs)

    cls.__init__ = init

    def undo() -> None:
        cls.__init__ = original

    return undo
