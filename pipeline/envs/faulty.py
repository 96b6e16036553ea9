"""An environment that misbehaves on purpose, for tests of everything that runs environments.

``FaultyEnv`` plays a trivial episode (each step answers ``ok N``, reward 1 at the last of
``turns`` steps) until step ``at_step`` (0: construction, or ``init`` for the faults of what it returns), where it
commits its ``fault``:

=================  =====================================================================
``none``           behaves
``raise``          raises ``RuntimeError``
``hang``           sleeps ``hang_s`` seconds (a hang a thread deadline can leave behind)
``gil``            one long C call that holds the GIL (only a process can be stopped in it)
``exit``           raises ``SystemExit``
``not_dict``       returns a list
``no_reward``      leaves out ``reward``
``str_reward``     ``reward`` is ``"1"``
``nan_reward``     ``reward`` is NaN
``int_done``       ``done`` is ``1``
``str_obs``        ``observations`` is a string
``bad_message``    an observation without ``content``
``huge``           an observation of ``huge_chars`` characters
``never_done``     never sets ``done`` (and declares no ``max_turns``)
``random``         observations that differ on every run (replay cannot rebuild it)
=================  =====================================================================

>>> env = FaultyEnv({"fault": "str_reward", "at_step": 2}, {})
>>> env.step("a")["reward"], env.step("b")["reward"]
(0.0, '1')
"""

from __future__ import annotations

import itertools
import time
from typing import Any

FAULTS = (
    "none",
    "raise",
    "hang",
    "gil",
    "exit",
    "not_dict",
    "no_reward",
    "str_reward",
    "nan_reward",
    "int_done",
    "str_obs",
    "bad_message",
    "huge",
    "never_done",
    "random",
)
_RUNS = itertools.count()


class FaultyEnv:
    """See the module docstring; ``env_config``: ``fault``, ``at_step`` (1), ``turns`` (3),
    ``hang_s`` (3600), ``huge_chars`` (10**6)."""

    def __init__(self, env_config: dict[str, Any] | None, extras: dict[str, Any]) -> None:
        cfg = dict(env_config or {})
        self.fault = cfg.get("fault", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r} must be one of {', '.join(FAULTS)}")
        self.at_step = int(cfg.get("at_step", 1))
        self.turns_needed = int(cfg.get("turns", 3))
        self.hang_s = float(cfg.get("hang_s", 3600))
        self.huge_chars = int(cfg.get("huge_chars", 10**6))
        if self.fault != "never_done":
            self.max_turns = self.turns_needed
        self.turns = 0
        if self.at_step == 0 and self.fault in ("raise", "hang", "gil", "exit"):
            self._misbehave()

    def init(self, prompt: list[dict[str, str]]) -> Any:
        if self.at_step == 0 and self.fault in ("not_dict", "str_obs", "bad_message", "huge"):
            if self.fault == "not_dict":
                return "a string"
            return self._misbehave({"observations": prompt})["observations"], {}
        return prompt, {}

    def step(self, action: str) -> Any:
        self.turns += 1
        done = self.turns >= self.turns_needed and self.fault != "never_done"
        out: dict[str, Any] = {
            "observations": [] if done else [{"role": "user", "content": f"ok {self.turns}"}],
            "reward": float(done),
            "done": done,
            "metadata": {"turn": self.turns},
        }
        if self.fault == "random":
            out["observations"] = [{"role": "user", "content": f"run {next(_RUNS)}"}]
        if self.turns == self.at_step:
            return self._misbehave(out)
        return out

    def snapshot(self) -> dict[str, int]:
        return {"turns": self.turns}

    def restore(self, state: dict[str, int]) -> None:
        self.turns = state["turns"]

    def close(self) -> None:
        pass

    def _misbehave(self, out: dict[str, Any] | None = None) -> Any:
        out = dict(out or {})
        fault = self.fault
        if fault == "raise":
            raise RuntimeError("the env broke on purpose")
        if fault == "hang":
            time.sleep(self.hang_s)
        elif fault == "gil":
            sum(range(10**13))  # a single C loop: the GIL is never released
        elif fault == "exit":
            raise SystemExit(3)
        elif fault == "not_dict":
            return [out]
        elif fault == "no_reward":
            out.pop("reward", None)
        elif fault == "str_reward":
            out["reward"] = "1"
        elif fault == "nan_reward":
            out["reward"] = float("nan")
        elif fault == "int_done":
            out["done"] = 1
        elif fault == "str_obs":
            out["observations"] = "ok"
        elif fault == "bad_message":
            out["observations"] = [{"role": "user"}]
        elif fault == "huge":
            out["observations"] = [{"role": "user", "content": "x" * self.huge_chars}]
        return out
