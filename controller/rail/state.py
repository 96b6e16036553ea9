"""The RAIL controller's saved state: a versioned, JSON-able dict (``RailController.state_dict``
builds it, ``RailController.load_state_dict`` reads it back), its header and its file form.

What is kept: the learner (its model bytes, base64, with a SHA-256 checksum), the frozen copy,
the behaviour policy's and the decider's random states, the promotion window and mode, the
gain-error window, the response-length estimate, the counters and the guidance history
(``controller.rail.guide_history``). Open groups are not kept: a resumed run closes them, so
their decisions simply have no outcome in the trace.

A file that is missing, not JSON, of another format or version, or whose model fails its
checksum raises ``ControllerStateError`` naming the file and the fix; nothing is half-loaded
from a state whose header is wrong.

>>> import json, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "rail.json")
>>> with open(path, "w") as f:
...     _ = f.write('{"format": "railgate.rail", "version": 1, "learner": ')
>>> load_file(path)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
controller.rail.bandit.ControllerStateError: controller state file ... is not valid JSON (...); it is truncated or not a controller state -- delete it or restore an intact copy
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from controller.rail.bandit import ControllerStateError
from controller.rail.guide_history import GuideHistory

FORMAT = "railgate.rail"
VERSION = 1
HEADER = {"format": FORMAT, "version": VERSION}
"""The first keys of every state dict."""


def check_header(state: Any, where: str, backend: str | None = None) -> None:
    """``ControllerStateError`` unless ``state`` is a RAIL state of this format and version
    (and, given ``backend``, saved by that backend)."""
    if not isinstance(state, dict):
        raise ControllerStateError(f"{where} is a {type(state).__name__}, not a RAIL controller state (a dict)")
    if state.get("format") != FORMAT:
        raise ControllerStateError(
            f"{where} has format {state.get('format')!r}, not {FORMAT!r}: it is not a RAIL controller state"
        )
    if state.get("version") != VERSION:
        raise ControllerStateError(
            f"{where} has version {state.get('version')!r}; this railgate reads version {VERSION} -- "
            "start the controller fresh or use the release that wrote it"
        )
    if backend is not None and state.get("backend") != backend:
        raise ControllerStateError(
            f"{where} was saved by backend {state.get('backend')!r} but controller.rail.backend="
            f"{backend!r}; set the backend that saved it or start fresh"
        )


def corrupt(where: str, exc: BaseException) -> ControllerStateError:
    """The error for a state whose header is right but whose body does not load."""
    return ControllerStateError(
        f"{where} is corrupt ({type(exc).__name__}: {exc}); delete it or start the controller fresh"
    )


def pack_blob(blob: bytes) -> tuple[str, str]:
    """A learner's model bytes as they sit in a JSON state: base64 text and its SHA-256.

    >>> text, digest = pack_blob(b"weights")
    >>> unpack_blob(text, digest, "the model") == b"weights"
    True
    >>> unpack_blob(text, "0" * 64, "the model")
    Traceback (most recent call last):
    ...
    controller.rail.bandit.ControllerStateError: the model's checksum does not match (the state file is truncated or edited); delete it or restore an intact copy
    """
    return base64.b64encode(blob).decode("ascii"), hashlib.sha256(blob).hexdigest()


def unpack_blob(text: str, sha256: str, what: str) -> bytes:
    """The bytes ``pack_blob`` packed; ``ControllerStateError`` naming ``what`` when the text is
    not base64 or the bytes fail their checksum (the only guard against a truncated model, which
    VW would load silently as an untrained one)."""
    try:
        blob = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise ControllerStateError(f"{what} is not valid base64 ({exc}); the state is corrupt") from exc
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise ControllerStateError(
            f"{what}'s checksum does not match (the state file is truncated or edited); delete it or restore an intact copy"
        )
    return blob


def save_file(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``state`` as JSON through a temporary file, so a crash never leaves half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a state file; ``ControllerStateError`` for a missing, truncated or foreign file."""
    p = Path(path)
    if not p.is_file():
        raise ControllerStateError(f"controller state file {p} does not exist; pass the file RailController.save wrote")
    try:
        state = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ControllerStateError(
            f"controller state file {p} is not valid JSON ({exc}); it is truncated or not a controller "
            "state -- delete it or restore an intact copy"
        ) from exc
    check_header(state, f"controller state file {p}")
    return state


def controller_state(rail: Any) -> dict[str, Any]:
    """``RailController.state_dict``: the module docstring's state of ``rail``."""
    return {
        **HEADER,
        "backend": rail.config.backend,
        "learner": rail.learner.state_dict(),
        "frozen": rail.frozen.state_dict() if rail.frozen is not None else None,
        "behaviour": rail.behaviour.state_dict(),
        "decider": rail.decider.state_dict(),
        "promoter": rail.promoter.state_dict(),
        "gain_errors": rail.outcomes.gain_errors.state_dict(),
        "length": rail.length_estimate,
        "counts": dict(rail.counts),
        "guide_history": rail.guide_history.state_dict(),
    }


def load_controller_state(rail: Any, state: dict[str, Any], where: str) -> None:
    """``RailController.load_state_dict``: restore ``controller_state``'s output into ``rail``;
    ``ControllerStateError`` naming ``where`` for a state of another format, version or backend
    (nothing loaded) or a corrupt one."""
    check_header(state, where, rail.config.backend)
    outcomes = rail.outcomes
    try:
        frozen = outcomes.frozen_from_state(state["frozen"])
        # Validate everything that can fail before touching the live learner.
        promoter = dict(state["promoter"])
        length = float(state["length"])
        counts = {str(k): int(v) for k, v in state["counts"].items()}
        history = GuideHistory()
        history.load_state_dict(state.get("guide_history", {}))  # absent in states written before it was kept
        rail.learner.load_state_dict(state["learner"])
        rail.behaviour.load_state_dict(state["behaviour"])
        rail.decider.load_state_dict(state["decider"])
        outcomes.promoter.load_state_dict(promoter)
        outcomes.gain_errors.load_state_dict(state["gain_errors"])
    except ControllerStateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise corrupt(where, exc) from exc
    outcomes.frozen = frozen
    rail.length_estimate = length
    rail.counts.clear()
    rail.counts.update(counts)
    rail.guide_history = history
