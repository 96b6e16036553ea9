"""A shell's handler table: what it does for each action the tracker can emit, declared once.

Every shell around ``pipeline.core.tracker.GroupTracker`` carries the actions it is handed out by
looking their type up in a ``HandlerTable``, declared once in the shell's class: the async shell
(``pipeline.shells.orchestrator``: one table for each of its rooms, the tracking loop and the two
stream sides), the round driver (``pipeline.shells.rounds``), bench replay's driver
(``railgate.replay.driver``) and the gate harness (``tests/gate_harness.py``). A table names
every action type of ``pipeline.core.actions.ACTION_TYPES``, each with a handler, a ``Skip`` (done by
doing nothing, and why) or a ``Refuse`` (not carried out here, and why); a key may be a tuple of
types that share an entry (``EPISODES``, ``ASKED_BY_SETTINGS``). A table that leaves one out is
an error where it is declared, so a new action is placed in every shell at once
(``tests/test_shell_dispatch.py``). An action of any other type is refused as well.

A handler is called as ``handler(shell, action, *context)``; in the async shell it may return an
awaitable, which the shell awaits before the next action.

>>> from pipeline.core.actions import ACTION_TYPES, Evaluate, Stop
>>> class Shell:
...     def _stop(self, action):
...         return f"stopped: {action.reason}"
...     HANDLERS = HandlerTable("a shell", {Stop: _stop, **{t: Refuse("not here") for t in ACTION_TYPES if t is not Stop}})
>>> Shell.HANDLERS[Stop](Shell(), Stop("steps"))
'stopped: steps'
>>> Shell.HANDLERS[Evaluate](Shell(), Evaluate(2))
Traceback (most recent call last):
TypeError: a shell cannot carry out the action Evaluate (Evaluate(step=2)): not here; carry it out there, or set the ShellSettings under which the tracker does not ask for it
>>> HandlerTable("a short shell", {Stop: Shell._stop})
Traceback (most recent call last):
TypeError: a short shell's handler table names no handler, Skip or Refuse for Start, Cancel, Score, EnvStep, ForkEpisode, CloseEpisode, Post, Evaluate, Train, Record, Checkpoint; declare one for each
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.actions import (
    ACTION_TYPES,
    Checkpoint,
    CloseEpisode,
    EnvStep,
    Evaluate,
    ForkEpisode,
    cannot_carry_out,
)

EPISODES = (EnvStep, ForkEpisode, CloseEpisode)
"""The actions of the episode lifecycle (``pipeline.core.episodes``): a shell that runs single-turn
samples refuses them."""
ASKED_BY_SETTINGS = (Evaluate, Checkpoint)
"""The actions the tracker asks for only under ``ShellSettings`` that say so (``evaluates``,
``checkpoint_every``)."""


@dataclass(frozen=True)
class Skip:
    """The shell carries this action out by doing nothing; ``why`` says why nothing is needed."""

    why: str


@dataclass(frozen=True)
class Refuse:
    """The shell does not carry this action out (``cannot_carry_out``); ``why`` names where it is
    carried out instead, or why the tracker never asks this shell for it."""

    why: str


Entry = Callable[..., Any] | Skip | Refuse
Key = type | tuple[type, ...]


def _nothing(shell: object, action: object, *context: Any) -> None:
    return None


class HandlerTable(dict):
    """Action type -> handler of one shell (or one room of a shell); see the module docstring.
    ``declared`` keeps the entries as declared (handlers, ``Skip``s and ``Refuse``s)."""

    def __init__(self, shell: str, declared: Mapping[Key, Entry]):
        entries = {
            kind: entry for key, entry in declared.items() for kind in (key if isinstance(key, tuple) else (key,))
        }
        missing = [t.__name__ for t in ACTION_TYPES if t not in entries]
        unknown = [t.__name__ for t in entries if t not in ACTION_TYPES]
        if missing or unknown:
            raise TypeError(
                f"{shell}'s handler table "
                + (f"names no handler, Skip or Refuse for {', '.join(missing)}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"names {', '.join(unknown)}, which the tracker never emits" if unknown else "")
                + "; declare one for each"
                + (" (pipeline.core.actions.ACTION_TYPES)" if unknown else "")
            )
        super().__init__({kind: self._handler(entry) for kind, entry in entries.items()})
        self.shell = shell
        self.declared = dict(entries)

    def _handler(self, entry: Entry) -> Callable[..., Any]:
        if isinstance(entry, Skip):
            return _nothing
        if isinstance(entry, Refuse):
            return self._refuser(entry.why)
        return entry

    def _refuser(self, why: str) -> Callable[..., Any]:
        def refuse(shell: object, action: object, *context: Any) -> None:
            raise cannot_carry_out(self.shell, action, why)

        return refuse

    def __missing__(self, kind: type) -> Callable[..., Any]:
        return self._refuser("")
