"""Import an environment class named ``module:Class``, with errors that say what to fix.

>>> load_env_class("pipeline.envs.chain:ChainEnv").__name__
'ChainEnv'
>>> load_env_class("pipeline.envs.chain")
Traceback (most recent call last):
...
pipeline.envs.loading.EnvLoadError: task.env.class='pipeline.envs.chain' must be 'module:Class', e.g. 'pipeline.envs.chain:ChainEnv'
>>> load_env_class("pipeline.envs.chain:ChainEnvv")
Traceback (most recent call last):
...
pipeline.envs.loading.EnvLoadError: task.env.class='pipeline.envs.chain:ChainEnvv': module 'pipeline.envs.chain' has no attribute 'ChainEnvv'; did you mean 'ChainEnv'?
"""

from __future__ import annotations

import difflib
import importlib
import re

from pipeline.envs.protocol import REQUIRED_METHODS

_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

# Packages an environment may come from, and how to install them.
_INSTALL_HINTS = {"skyrl_gym": "pip install 'railgate[skyrl]' (or pip install skyrl-gym)"}


class EnvLoadError(ValueError):
    """``task.env.class`` names nothing usable; the message names the value and the fix."""


def load_env_class(spec: str, key: str = "task.env.class") -> type:
    """The class ``spec`` (``"package.module:Class"``; ``Class`` may be dotted for a nested class).

    Raises ``EnvLoadError`` when the spec is malformed, the module cannot be imported (missing,
    or one of its own imports is missing, or it raises), the attribute is missing, is not
    callable, or lacks ``init`` / ``step``. The module is imported from the working directory
    or ``PYTHONPATH`` like any other.
    """
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise EnvLoadError(f"{key}={spec!r} must be 'module:Class', e.g. 'pipeline.envs.chain:ChainEnv'")
    module_name, attr_path = spec.split(":", 1)
    module = _import(module_name, spec, key)
    obj: object = module
    for i, part in enumerate(attr_path.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr_path.split('.')[:i])}"
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else f" (it has: {', '.join(sorted(names)[:12]) or 'nothing public'})"
            )
            raise EnvLoadError(f"{key}={spec!r}: module {owner!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvLoadError(
            f"{key}={spec!r} is a {type(obj).__name__}, not a class; name the environment class "
            "(called as Class(env_config, extras))"
        )
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise EnvLoadError(
            f"{key}={spec!r} has no method {' or '.join(missing)}; an environment needs "
            "init(prompt) -> (conversation, metadata) and step(action) -> {observations, reward, done, "
            "metadata} (docs/envs.md)"
        )
    return obj  # type: ignore[return-value]


def class_name(cls: type) -> str:
    """``module:Class`` of ``cls``, for messages."""
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', getattr(cls, '__name__', repr(cls)))}"


def _import(module_name: str, spec: str, key: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        top = missing.split(".")[0]
        install = _INSTALL_HINTS.get(top)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            fix = install or "check the spelling, and that its directory is the working directory or on PYTHONPATH"
            raise EnvLoadError(f"{key}={spec!r}: no module named {missing!r}; {fix}") from None
        fix = install or f"install the package that provides {top!r}"
        raise EnvLoadError(
            f"{key}={spec!r}: importing {module_name!r} needs {missing!r}, which is not installed; {fix}"
        ) from None
    except Exception as exc:  # the module's own code failed: say so rather than crash with its traceback
        raise EnvLoadError(
            f"{key}={spec!r}: importing {module_name!r} raised {type(exc).__name__}: {str(exc)[:200]}; fix the module"
        ) from exc
