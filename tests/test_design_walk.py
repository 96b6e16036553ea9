"""docs/design.md's walk names the files a rollout actually runs, derived here, not by hand.

How it is derived (dynamically, not from the import graph: an import is not a call): a small
simulator run (``configs/sim.yaml`` with configs/default.yaml's gate, SARA; one learner step) is
trained through ``railgate.train.train``, and while ``Orchestrator.run`` runs -- from the first
admission to the end of the last learner step, its evaluation and trace included -- a profiler on
every thread (``sys.setprofile``, ``threading.setprofile``) collects the project files whose
functions were called (a dataclass's generated ``__init__`` counts for the file that defines the
class: making a message is using its module). Wiring (config, run directory, building the parts) happens before the run
and is not counted; the simulator stands in for a model engine and a torch learner, so the list
names ``pipeline/sim/`` where a real run would name the torch engine and learner.

The list in docs/design.md stands between the ``walk:begin`` and ``walk:end`` markers. Rewrite
it with ``python tests/test_design_walk.py``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PACKAGES = ("pipeline", "controller", "learner", "railgate")
BEGIN, END = "<!-- walk:begin -->", "<!-- walk:end -->"
REGENERATE = "python tests/test_design_walk.py"
RUN = [
    "gate.kind=sara",  # configs/default.yaml's gate (sim.yaml's own is uniform)
    "orchestrator.steps=1",
    "orchestrator.batch_groups=4",
    "orchestrator.eval_every=1",
    "sim.num_prompts=64",
    "sim.num_eval_prompts=16",
    "log.tensorboard=false",
    "log.checkpoint_every=0",
]


def files_a_rollout_runs(run_dir: Path) -> list[str]:
    """The project files (relative paths) whose functions ran during a small run's ``Orchestrator.run``."""
    from pipeline.shells.orchestrator import Orchestrator
    from railgate.config import load_config
    from railgate.train import train

    roots = tuple(str(ROOT / package) + "/" for package in PACKAGES)
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":  # importing a module runs none of it
            return
        filename = frame.f_code.co_filename
        if filename == "<string>" and "self" in frame.f_locals:  # a dataclass's generated method:
            module = sys.modules.get(type(frame.f_locals["self"]).__module__)  # the class's own file
            filename = getattr(module, "__file__", None) or filename
        if filename.startswith(roots):
            seen.add(filename)

    original = Orchestrator.run

    async def traced(self: Orchestrator) -> Any:
        sys.setprofile(profile)
        threading.setprofile(profile)  # worker threads: rewards, the learner off the event loop
        try:
            return await original(self)
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
            sys.setprofile(None)

    Orchestrator.run = traced  # type: ignore[method-assign]
    try:
        train(load_config(ROOT / "configs" / "sim.yaml", RUN + [f"run_dir={run_dir}"]), progress=False)
    finally:
        Orchestrator.run = original  # type: ignore[method-assign]
    return sorted(Path(f).relative_to(ROOT).as_posix() for f in seen)


def render(files: list[str]) -> str:
    """The walk's list as docs/design.md holds it: one line per folder."""
    folders: dict[str, list[str]] = {}
    for file in files:
        folder, _, name = file.rpartition("/")
        folders.setdefault(folder, []).append(name)
    lines = [f"- `{folder}/`: " + ", ".join(f"`{name}`" for name in names) for folder, names in sorted(folders.items())]
    return "\n".join([BEGIN, *lines, END])


def listed_in_design() -> str:
    text = DESIGN.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_the_walk_lists_the_files_a_rollout_runs(tmp_path):
    files = files_a_rollout_runs(tmp_path / "run")
    # the derivation sees the core, a shell, the gate and the simulator, or it measured nothing
    assert {"pipeline/core/tracker.py", "pipeline/shells/orchestrator.py", "pipeline/sim/engine.py"} <= set(files)
    assert listed_in_design() == render(files), (
        f"docs/design.md's walk does not list the files a rollout runs; regenerate it with `{REGENERATE}`"
    )


def test_render_groups_files_by_folder():
    assert render(["a/b/c.py", "a/d.py", "a/e.py"]) == f"{BEGIN}\n- `a/`: `d.py`, `e.py`\n- `a/b/`: `c.py`\n{END}"


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy
    with tempfile.TemporaryDirectory() as tmp:
        new = render(files_a_rollout_runs(Path(tmp) / "run"))
    text = DESIGN.read_text(encoding="utf-8")
    DESIGN.write_text(text.replace(listed_in_design(), new), encoding="utf-8")
    print(new)
