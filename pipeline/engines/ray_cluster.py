"""Joining or starting the Ray cluster of the ``ray`` engine, without hanging.

``ray.init(address=...)`` waits without end for an address that does not answer (measured
here: still waiting after 5 minutes), so an address is first checked with a plain TCP
connection that has a timeout. Replicas import this package, so a local cluster's workers get
the checkout on their ``PYTHONPATH``; on a multi-node cluster install the package on every
node (or pass ``runtime_env={"working_dir": ...}``).

>>> check_answers("not-an-address", 1.0)
Traceback (most recent call last):
...
pipeline.engines.base.EngineError: Ray address 'not-an-address' is not host:port (or ray://host:port, or auto); e.g. 10.0.0.1:6379
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from pipeline.engines.base import EngineError, import_engine_package

RAY_HINT = "pip install -e '.[ray]'"


def import_ray():
    """Import Ray, or raise ``EngineError`` naming the extra that installs it."""
    return import_engine_package("ray", "ray", "Ray", RAY_HINT)


def connect(ray, address: str | None, timeout_s: float, num_cpus: int, init_kwargs: dict[str, Any]) -> bool:
    """Join or start a Ray cluster; True when this call initialised Ray (the engine shuts it down)."""
    if address is not None:
        check_answers(address, timeout_s)
    if ray.is_initialized():
        return False
    init_kwargs.setdefault("include_dashboard", False)
    runtime_env = dict(init_kwargs.pop("runtime_env", None) or {})
    env_vars = dict(runtime_env.get("env_vars", {}))
    # Replicas import this package: on this machine's workers, from where it is installed or checked out.
    root = str(Path(__file__).resolve().parents[2])
    env_vars.setdefault("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    runtime_env["env_vars"] = env_vars
    if address is None:
        ray.init(num_cpus=max(1, num_cpus), runtime_env=runtime_env, **init_kwargs)
        return True
    ray.init(address=address, runtime_env=runtime_env, **init_kwargs)
    return True


def check_answers(address: str, timeout_s: float) -> None:
    """A TCP connection to the cluster's address, within ``timeout_s`` (``auto`` is left to Ray)."""
    host_port = address.split("://", 1)[-1]
    if host_port == "auto":
        return
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"Ray address {address!r} is not host:port (or ray://host:port, or auto); e.g. 10.0.0.1:6379")
    t0 = time.monotonic()
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise EngineError(
            f"Ray cluster at {address!r} did not answer within {timeout_s:g} s ({type(exc).__name__}: {exc}, after "
            f"{time.monotonic() - t0:.1f} s); start the head node there (ray start --head --port={port}) or fix the address"
        ) from None
