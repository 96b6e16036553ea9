"""The configurations railgate ships (``default.yaml``, ``sim.yaml``, the benchmark configs and
``scenarios/``), found the same way from a checkout, an editable install or a wheel.

``resolve`` turns what a user typed after ``--config`` into a file: an existing path as it is,
otherwise a path that starts with ``configs/`` (or a bare name) is looked up here, so the
README's commands work from any directory once the package is installed.

>>> resolve("configs/sim.yaml").name
'sim.yaml'
>>> resolve("sim.yaml") == resolve("configs/sim.yaml").resolve() == CONFIG_DIR / "sim.yaml"
True
>>> resolve("no_such.yaml")  # left as typed: the loader names it in its error
PosixPath('no_such.yaml')
>>> sorted(p.stem for p in (CONFIG_DIR / "scenarios").glob("*.yaml"))[:2]
['balanced', 'drift']
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
SCENARIO_DIR = CONFIG_DIR / "scenarios"


def resolve(path: str | Path) -> Path:
    """``path`` if it exists, else the shipped config it names (``configs/X`` or ``X``)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    parts = p.parts[1:] if p.parts and p.parts[0] == "configs" else p.parts
    shipped = CONFIG_DIR.joinpath(*parts) if parts else p
    return shipped if shipped.is_file() else p
