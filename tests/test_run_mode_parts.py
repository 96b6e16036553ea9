"""Run modes are parts, not flags: the tracker's core holds no episode or learner-timing branch,
and capabilities are read as declared members (docs/design.md, "Run modes are parts")."""

import re
from pathlib import Path

import pytest

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
        f"pipeline/core/{name}:{i}: {line.strip()}"
        for name in CORE
        for i, line in enumerate((ROOT / "pipeline" / "core" / name).read_text(encoding="utf-8").splitlines(), 1)
        if FLAGS.search(line)
    ]
    assert not found, f"a run-mode flag in the tracker's core (use the Lifecycle or LearnerTiming part): {found}"


def _lines_in_pipeline(pattern: re.Pattern) -> list[str]:
    """Every line of pipeline/ (its folders included) that ``pattern`` finds, as path:line: text."""
    return [
        f"{path.relative_to(ROOT).as_posix()}:{i}: {line.strip()}"
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def test_capabilities_are_read_as_declared_members():
    found = _lines_in_pipeline(FALLBACKS)
    assert not found, f"a gate's or controller's capability read with a fallback (declare it in protocols.py): {found}"


# --- the learner's timing: two parts, chosen when the run is built ---------------------------

TIMING_FLAGS = re.compile(r"trains_inline|in_thread|inline_learner")


def test_no_learner_timing_flag_is_branched_on_in_the_tracker_or_the_shells():
    found = _lines_in_pipeline(TIMING_FLAGS)
    assert not found, f"a learner-timing flag (use the LearnerTiming part, pipeline/shells/learner_timing.py): {found}"


def test_each_clock_takes_one_learner_timing_part_for_the_shell_and_the_tracker():
    from pipeline.clock import LockstepClock, VirtualClock, WallClock
    from pipeline.core.actions import CONCURRENT, INLINE
    from pipeline.shells.learner_timing import ConcurrentLearning, InlineLearning, learning_for

    assert (
        type(learning_for(VirtualClock())) is InlineLearning and type(learning_for(LockstepClock())) is InlineLearning
    )
    assert type(learning_for(WallClock())) is ConcurrentLearning
    assert InlineLearning.timing is INLINE and ConcurrentLearning.timing is CONCURRENT
    with pytest.raises(TypeError, match="no learner timing is declared for a object"):
        learning_for(object())


def _tick_after_a_batch(timing):
    """The actions of the tick that hands out the first batch, under ``timing``."""
    from controller.gates.uniform import UniformGate
    from controller.noop import NoopController
    from controller.prompts import PromptPool
    from pipeline.config.sections import OrchestratorConfig
    from pipeline.core.actions import ShellSettings, Start
    from pipeline.core.messages import Started, Tick
    from pipeline.core.tracker import GroupTracker
    from pipeline.types import FinishReason, Prompt, SampleFinished

    pool = PromptPool([Prompt(i, "", (1,)) for i in range(8)], seed=0)
    cfg = OrchestratorConfig(batch_groups=1, group_size=2, steps=4, max_concurrent_samples=2, max_open_groups=1)
    tracker = GroupTracker(UniformGate(pool, 2), NoopController(), cfg, shell=ShellSettings(timing))
    starts = [a for a in [*tracker.handle(Started()), *tracker.handle(Tick())] if type(a) is Start]
    for start in starts:
        rid = start.request.request_id
        [score] = tracker.handle(SampleFinished(rid, (7,), (0.0,), FinishReason.STOP, 0))
        tracker.handle(score.answer(1.0))
    return [type(a).__name__ for a in tracker.handle(Tick())]


def test_inline_a_batch_ends_the_tick_and_concurrent_the_tick_goes_on():
    from pipeline.core.actions import CONCURRENT, INLINE

    assert _tick_after_a_batch(INLINE) == ["Train"]  # its StepDone finishes the tick
    assert _tick_after_a_batch(CONCURRENT) == ["Train", "Start", "Start"]  # the next group is admitted now
