"""A user's reward code never runs in the run's own process.

A ``task.dataset.reward: "module:function"`` is the user's code. railgate trusts it to be what
the user chose -- it is not sandboxed: it can read and write what the user can -- but it keeps
its failures away from the run: a module that raises, hangs, or ends its process
(``os._exit``, a segfault in an extension) at import or in a call must cost rewards, not the run.
So the module is imported only in separate processes:

* ``check_reward_function`` imports it once in a fresh interpreter before anything is built
  (a wrong name, a failing import, an import that exits: one ``ConfigError`` naming it);
* the run's rewards go through ``ScoringService``'s worker processes (``workers``);
* the few rewards the run's own code asks for outside the scoring service (the warm start's
  accuracy checks, the reference prior's check of each solution) go through ``IsolatedScore``,
  one worker process with a timeout, its failures counted in a ``RewardHealth``.

>>> check_reward_function("json:dumps")  # importable, and a function
>>> check_reward_function("json:nothing_here")
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: task.dataset.reward='json:nothing_here': module 'json' has no function 'nothing_here' (it has: JSONDecodeError, JSONDecoder, JSONEncoder, detect_encoding, dump, dumps, load, loads); name one of them
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from pipeline.config.build import ConfigError
from pipeline.processes import worker_env
from pipeline.tasks.rewards.health import RewardHealth
from pipeline.tasks.rewards.user import DatasetRow, UserReward
from pipeline.tasks.rewards.workers import RewardFailed, RewardTimeout, RewardWorkers
from pipeline.types import Prompt

_MARK = "RAILGATE-CONFIG-ERROR: "
_PROBE = f"""
import sys
from pipeline.config.build import ConfigError
from pipeline.tasks.rewards.user import load_reward_function
try:
    load_reward_function(sys.argv[1], sys.argv[2])
except ConfigError as exc:
    print({_MARK!r} + str(exc), file=sys.stderr)
    sys.exit(3)
"""
_PASSED: set[tuple[str, str]] = set()
IMPORT_TIMEOUT_S = 300.0  # a fresh interpreter importing a reward's packages, on a loaded machine


def check_reward_function(spec: str, key: str = "task.dataset.reward") -> None:
    """Import ``spec`` (``module:function``) in a fresh interpreter in the working directory;
    ``ConfigError`` naming ``key``, the value and the fix when that fails in any way. A name
    that passed once in this process (and this working directory) is not checked again."""
    if (spec, os.getcwd()) in _PASSED:
        return
    try:
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, spec, key],
            cwd=os.getcwd(),
            env=worker_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=IMPORT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{key}={spec!r}: importing its module took over {IMPORT_TIMEOUT_S:g}s; make the import fast "
            "(no work at import time)"
        ) from None
    if result.returncode == 0:
        _PASSED.add((spec, os.getcwd()))
        return
    for line in result.stderr.splitlines():
        if line.startswith(_MARK):
            raise ConfigError(line[len(_MARK) :])
    last = next((line.strip() for line in reversed(result.stderr.splitlines()) if line.strip()), "no message")
    raise ConfigError(
        f"{key}={spec!r}: importing module {spec.split(':')[0]!r} ended its process with exit status "
        f"{result.returncode} ({last[:200]}); fix the module so that importing it returns"
    )


class IsolatedScore:
    """``score(prompt, text)`` of a user's reward in one worker process, with a timeout; failures
    (raised, timed out, a dead worker) score 0 and None stays None, each counted in ``health``,
    which stops (``RewardsFailing``) when every one of the first ``check_first`` failed.

    >>> from pipeline.tasks.rewards.user import DatasetRow
    >>> score = IsolatedScore("json:loads", {}, timeout_s=60.0)
    >>> score(Prompt(0, "p", ()), "1.5"), score.health.errors
    (0.0, 1)
    >>> score.close()
    """

    def __init__(
        self, spec: str, rows: Mapping[int, DatasetRow], timeout_s: float = 5.0, check_first: int = 32
    ) -> None:
        self.timeout_s = timeout_s
        self.health = RewardHealth(spec, check_first)
        self._workers = RewardWorkers(UserReward(spec, _text_of, rows), workers=1)

    def __call__(self, prompt: Prompt, text: str) -> float | None:
        try:
            value = self._workers.call(prompt, (text,), self.timeout_s)
        except RewardTimeout as exc:
            self.health.failed("timeout", str(exc))
            return 0.0
        except RewardFailed as exc:
            self.health.failed("error", f"{exc.kind}: {exc}")
            return 0.0
        if value is None:
            self.health.failed("none")
            return None
        self.health.succeeded()
        return value

    def close(self) -> None:
        self._workers.close()


def _text_of(token_ids: Any) -> str:
    """The ``decode`` of ``IsolatedScore``'s worker: its "token ids" are ``(text,)``."""
    return token_ids[0]
