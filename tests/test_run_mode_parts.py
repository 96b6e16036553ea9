"""Run modes are parts, not flags: the tracker's core holds no episode or learner-timing branch,
and capabilities are read as declared members (docs/design.md, "Run modes are parts")."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = [
    "tracker.py",
    "ledger.py",
    "samples.py",
    "lifecycles.py",
    "deciding.py",
    "group.py",
    "admission.py",
]  # not the shells
FLAGS = re.compile(r"episodes is (not )?None|\bepisodic\b|inline_learner|isinstance\([^)]*Clock\)")
FALLBACKS = re.compile(r"(getattr|hasattr)\((self\.)?(gate|controller), *[\"']")


def test_the_core_has_no_run_mode_flags():
    found = [
        f"pipeline/{name}:{i}: {line.strip()}"
        for name in CORE
        for i, line in enumerate((ROOT / "pipeline" / name).read_text(encoding="utf-8").splitlines(), 1)
        if FLAGS.search(line)
    ]
    assert not found, f"a run-mode flag in the tracker's core (use the Lifecycle or LearnerTiming part): {found}"


def test_capabilities_are_read_as_declared_members():
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{i}: {line.strip()}"
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FALLBACKS.search(line)
    ]
    assert not found, f"a gate's or controller's capability read with a fallback (declare it in protocols.py): {found}"
