"""Crash a writer mid-run: start Python code in a child process and SIGKILL it.

The child gets the directory to write to as ``sys.argv[1]`` and the repository on its path,
and prints a running count (one line each time more of its output is on disk).

>>> kill_after("import sys; print(3, flush=True); print(7, flush=True)", ".", 5)
7
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kill_after(code: str, directory: str | os.PathLike, count: int) -> int:
    """Run ``code`` until it has printed a count of at least ``count``, then SIGKILL it; the
    last count it printed (fails if it exits before reaching ``count``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        done = 0
        while done < count:
            line = child.stdout.readline()
            assert line, f"the writer exited after {done} of the {count} it had to reach"
            done = int(line)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        child.kill()
        child.stdout.close()
    return done
