"""Ctrl-C during a run: stop at a step boundary with a checkpoint, instead of a traceback.

``run_orchestrator(orchestrator)`` runs ``orchestrator.run`` and turns the first SIGINT into
``Orchestrator.request_stop``: the step being trained (if any) finishes, a checkpoint of that
last finished step is written, the run ends with ``stop_reason == "interrupted"``, and the
caller (``railgate.train``) flushes and closes the trace, the buffer and the metrics as after
any run. ``train --resume RUN_DIR`` then continues from that checkpoint. A second Ctrl-C
interrupts at once (``KeyboardInterrupt``): the previous checkpoint stays the newest.

Only the main thread can receive signals; elsewhere (a run started from a worker thread) the
orchestrator runs as it is.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import anyio

INTERRUPTED = "interrupted"
"""``RunSummary.stop_reason`` of a run stopped by Ctrl-C."""


def run_orchestrator(orchestrator: Any) -> Any:
    """``anyio.run(orchestrator.run)``, with Ctrl-C handled as described above."""
    if threading.current_thread() is not threading.main_thread():
        return anyio.run(orchestrator.run)
    return anyio.run(_run_until_interrupted, orchestrator)


async def _run_until_interrupted(orchestrator: Any) -> Any:
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_first_sigint_stops, orchestrator)
            summary = await orchestrator.run()
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The run's own error (a reward that never works, a stalled gate), as itself: the
        # command line turns it into one line, which it cannot do for a group.
        errors = [e for e in group.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
        if len(errors) == 1:
            raise errors[0] from None
        raise
    return summary


async def _first_sigint_stops(orchestrator: Any) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            orchestrator.request_stop()
            break
    # Leaving the receiver restores Python's default handler: a second Ctrl-C raises
    # KeyboardInterrupt wherever the run is.
    await anyio.sleep_forever()
