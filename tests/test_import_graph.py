"""The project's import graph: no cycles, and every package imports only what docs/design.md's
"Packages" table allows.

Imports are read from the source with ``ast``, at every level: module-level ones, those inside
functions and those under ``if TYPE_CHECKING:``. An import inside a function still ties the two
modules together; it only moves the failure from import time to call time. An import of
``a.b.c`` is an edge to the module ``a.b.c`` itself (not to the packages above it, whose
``__init__`` a package's own modules need not know about); ``from a.b import c`` is an edge to
``a.b.c`` when that is a module, else to ``a.b``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "controller", "learner", "railgate", "configs")

# docs/design.md, "Packages": which of our packages each one must not import.
FORBIDDEN = {
    "pipeline": ("controller", "learner", "railgate"),
    "controller": ("railgate",),
    "learner": ("railgate",),
}

# docs/design.md, "Packages": inside pipeline/, the sans-IO core imports no shell and none of the
# packages that do IO; of pipeline's sub-packages it imports its settings (``pipeline.config``) only.
CORE = "pipeline.core"
CORE_MAY_NOT_IMPORT = tuple(
    f"pipeline.{p.name}"
    for p in sorted((ROOT / "pipeline").iterdir())
    if (p / "__init__.py").is_file()
    if p.name not in ("core", "config")
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The project modules ``module`` imports, at any level, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:  # ``import a.b.c``: the longest of a.b.c, a.b, a that is ours
                parts = alias.name.split(".")
                targets.update(
                    next(
                        ([".".join(parts[:k])] for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in modules), []
                    )
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in modules:
                    targets.add(name)
                elif base in modules:
                    targets.add(base)
    targets.discard(module)
    return targets


def import_graph() -> dict[str, set[str]]:
    """Every module of ours -> the modules of ours it imports."""
    paths = project_modules()
    return {module: imports_of(module, path, set(paths)) for module, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path whose last module is its first, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_finder_names_a_cycle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_function_level_and_type_checking_imports_count(tmp_path):
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.sim import mux\n"
        "def f():\n    from . import world\n    import pipeline.clock\n"
    )
    path = tmp_path / "pipeline" / "sim" / "fake.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    modules = {"pipeline.sim.mux", "pipeline.sim.world", "pipeline.clock", "pipeline.sim.fake"}
    assert imports_of("pipeline.sim.fake", path, modules) == modules - {"pipeline.sim.fake"}


def test_no_module_of_ours_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_two_subpackages_import_each_other():
    """The sub-packages of one package (``pipeline.tasks`` and ``pipeline.policy``, ``controller.gates``
    and ``controller.rail``, ...) form no cycle either, whatever modules carry the imports."""
    modules = project_modules()

    def subpackage(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) >= 2 and (ROOT / parts[0] / parts[1]).is_dir() else None

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            a, b = subpackage(module), subpackage(target)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)
    assert set(map(subpackage, modules)) - {None}, "no sub-packages found"
    cycle = find_cycle(graph)
    assert cycle is None, "sub-packages import each other: " + " -> ".join(cycle)


def test_packages_import_only_what_the_design_allows():
    broken = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
    )
    assert not broken, "against docs/design.md's Packages table:\n" + "\n".join(broken)


def test_the_core_imports_no_shell():
    assert "pipeline.shells" in CORE_MAY_NOT_IMPORT and "pipeline.engines" in CORE_MAY_NOT_IMPORT
    broken = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module == CORE or module.startswith(CORE + ".")
        for target in targets
        if any(target == name or target.startswith(name + ".") for name in CORE_MAY_NOT_IMPORT)
    )
    assert not broken, (
        "the sans-IO core (pipeline/core/) imports a shell or a package that does IO, against "
        "docs/design.md's Packages table; hand the shell an action instead:\n" + "\n".join(broken)
    )


# docs/design.md, "Packages": pipeline's top-level modules are the vocabulary every part shares
# (the engines and the simulator import the clock, the core imports the Protocols), so none
# imports a shell; of the core, only the Protocols import anything: its message vocabulary, for
# ``EpisodeService.step``'s answer (a ``TurnDone``). Nothing of the core imports them back.
TOP_LEVEL_MAY_IMPORT_FROM_CORE = {"pipeline.protocols": {"pipeline.core.messages"}}


def top_level_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a top-level module of pipeline/ against the rule above."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("pipeline.")
        and module.count(".") == 1
        and (ROOT / "pipeline" / f"{module[9:]}.py").is_file()
        for target in targets
        if target.startswith("pipeline.shells")
        or (target.startswith(CORE + ".") and target not in TOP_LEVEL_MAY_IMPORT_FROM_CORE.get(module, ()))
    )


def test_pipeline_top_level_imports_no_shell_and_of_the_core_only_what_is_allowed():
    assert not top_level_breaks(import_graph()), (
        "a top-level module of pipeline/ (the shared vocabulary) imports a shell or the core, against "
        "docs/design.md's Packages table; move what it needs down to the top level, or the module up:\n"
        + "\n".join(top_level_breaks(import_graph()))
    )
    messages = import_graph()["pipeline.core.messages"]
    assert "pipeline.protocols" not in messages  # the allowed edge is one way


def test_the_top_level_check_finds_a_clock_importing_a_shell():
    graph = {
        "pipeline.clock": {"pipeline.shells.learner_timing"},
        "pipeline.types": {"pipeline.core.tracker"},
        "pipeline.protocols": {"pipeline.core.messages"},
    }
    assert top_level_breaks(graph) == [
        "pipeline.clock imports pipeline.shells.learner_timing",
        "pipeline.types imports pipeline.core.tracker",
    ]


def test_the_core_check_finds_a_core_module_importing_a_shell(tmp_path):
    path = tmp_path / "pipeline" / "core" / "fake.py"
    path.parent.mkdir(parents=True)
    path.write_text("def f():\n    from pipeline.shells.orchestrator import Orchestrator\n")
    targets = imports_of("pipeline.core.fake", path, {"pipeline.core.fake", "pipeline.shells.orchestrator"})
    assert any(t.startswith(name) for t in targets for name in CORE_MAY_NOT_IMPORT)
