"""Typed configuration: frozen dataclasses built from YAML-shaped dicts, strictly.

Each package owns the dataclasses of its settings (``pipeline.config.sections``, ``controller.config``,
``learner.config``); ``railgate.config.RunConfig`` composes them. This module only converts:
it rejects unknown keys (naming the key and the closest valid one, or for a key that TRL or
verl users type, the railgate key it means: ``pipeline.config.foreign_keys``), coerces scalars to
the annotated type, and applies ``--set a.b=c`` overrides.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Gate:
...     probe_size: int = 4
...     '''Samples in the probe.'''
>>> build(Gate, {"probe_size": "6"}).probe_size
6
>>> build(Gate, {"probe_sise": 6})
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: unknown key 'probe_sise'; did you mean 'probe_size'? (valid keys: probe_size)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from pipeline.config.foreign_keys import foreign_hint

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range. The message names the key."""


def build(cls: type[T], data: dict[str, Any] | None, path: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, recursively; unknown keys are errors."""
    data = dict(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__}")
    renamed = getattr(cls, "YAML_KEYS", {})  # a YAML key that is a Python keyword (class) -> its field
    data = {renamed.get(k, k): v for k, v in data.items()}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            foreign = foreign_hint(_join(path, key), data[key])  # a TRL or verl name first
            names = sorted({v: k for k, v in renamed.items()}.get(f, f) for f in fields)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"; {foreign}"
                if foreign
                else f"; did you mean '{_join(path, close[0]).rsplit('.', 1)[-1]}'?"
                if close
                else ""
            )
            raise ConfigError(f"unknown key '{_join(path, key)}'{hint} (valid keys: {', '.join(names)})")
    kwargs = {key: _coerce(hints[key], value, _join(path, key)) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or cls.__name__}: {exc}") from exc


def to_dict(obj: Any) -> Any:
    """The plain-dict form of a config (what a YAML file of it would hold)."""
    if dataclasses.is_dataclass(obj):
        yaml_key = {v: k for k, v in getattr(obj, "YAML_KEYS", {}).items()}
        return {yaml_key.get(f.name, f.name): to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file."""
    from configs import CONFIG_DIR, resolve

    p = resolve(path)
    if not p.is_file():
        raise ConfigError(
            f"config file {p} does not exist; pass an existing file to --config (the shipped ones are in {CONFIG_DIR})"
        )
    try:
        data = parse_yaml(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {shorten(str(exc), 300)}") from None
    except ConfigError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML scalars) to a nested dict."""
    out = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {shorten(item)} must look like key.sub=value, e.g. --set gate.kind=sara")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set {shorten(item)} has an empty key")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {shorten(item)}: '{shorten(part)}' is a value, not a section")
            node = child
        try:
            node[parts[-1]] = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"--set {shorten(item)}: the value is not a YAML scalar or list "
                f"({shorten(str(exc).splitlines()[0], 120)}); quote it"
            ) from None
        except ConfigError as exc:
            raise ConfigError(f"--set {shorten(item)}: {exc}") from None
    return out


MAX_YAML_ALIASES = 100
"""Aliases (``*name``) one YAML document may use; a few are handy, thousands are an alias bomb."""


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document using more than ``MAX_YAML_ALIASES`` aliases,
    before anything is expanded: nested aliases ("a billion laughs") would otherwise build a
    structure exponentially larger than the file, which copying and validating never finish."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"the YAML uses more than {MAX_YAML_ALIASES} aliases (*name) by line {mark.line + 1}: "
                    "an alias bomb? write the values out"
                )
        return super().compose_node(parent, index)


MAX_YAML_NODES = 100_000
"""Values (mappings, lists, scalars) one YAML document may expand to. A config holds a few
hundred; aliases that nest (``b: [*a, *a]``, ``c: [*b, *b]``, ...) double the expanded size with
each level, so 30 levels and 60 aliases make a billion values that copying never finishes."""


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with the alias limit of ``_LimitedLoader`` and a bound on the size the
    document expands to (``MAX_YAML_NODES``), both checked before anything is expanded.

    >>> parse_yaml("a: &x [1, 2]\\nb: *x")
    {'a': [1, 2], 'b': [1, 2]}
    >>> bomb = "a: &a [x, x]\\n" + "".join(f"{c}: &{c} [*{p}, *{p}]\\n" for p, c in zip("abcdefgh", "bcdefghi"))
    >>> bomb += "j: [" + ", ".join(["*i"] * 100) + "]"
    >>> parse_yaml(bomb)
    Traceback (most recent call last):
    ...
    pipeline.config.build.ConfigError: the YAML uses more than 100 aliases (*name) by line 10: an alias bomb? write the values out
    """
    loader = _LimitedLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    size = expanded_size(data)
    if size < 0:
        raise ConfigError(
            "the YAML holds an alias inside the value it names (&name ... *name): it never ends; write the values out"
        )
    if size > MAX_YAML_NODES:
        raise ConfigError(
            f"the YAML expands to {size:.3g} values through nested aliases (*name), above the limit of "
            f"{MAX_YAML_NODES}: an alias bomb? write the values out"
        )
    return data


def expanded_size(value: Any, limit: int = MAX_YAML_NODES) -> int:
    """How many values ``value`` holds once every shared (aliased) part is copied out, counted
    once per distinct object (so in time linear in the document, however large the result);
    -1 for a structure that holds itself, ``limit + 1`` for one nested too deep to count.

    >>> a = [1, 2]
    >>> expanded_size({"x": a, "y": [a, a]})  # the dict, its 2 keys, a (3 values), [a, a] (7)
    13
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:  # an alias of an enclosing node: it never ends
            raise _Endless
        active.add(key)
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1 + sum(size(child) for child in children)
        active.discard(key)
        sizes[key] = total
        return total

    try:
        return size(value)
    except _Endless:
        return -1
    except RecursionError:  # nested deeper than Python recurses: no config is
        return limit + 1


class _Endless(Exception):
    """A structure that holds itself (``expanded_size``)."""


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``top`` over ``base`` (mappings merge, everything else replaces)."""
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = _deep_copy(value)
    return out


def require(condition: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``condition``; for ``__post_init__`` checks."""
    if not condition:
        raise ConfigError(message)


def at_most(key: str, value: float, limit: float) -> None:
    """``ConfigError`` when ``value`` is above ``limit``: sizes far past any real run are typos
    (an extra digit or two), and would otherwise allocate or loop until memory or patience ends.

    >>> at_most("orchestrator.batch_groups", 10**9, 65536)
    Traceback (most recent call last):
    ...
    pipeline.config.build.ConfigError: orchestrator.batch_groups=1000000000 is above its limit of 65536; check for a typo
    """
    require(value <= limit, f"{key}={value} is above its limit of {limit}; check for a typo")


def shorten(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for error messages, cut to about ``limit`` characters with the full length
    noted, so that a 1 MB value does not become a 1 MB error line.

    >>> shorten("x" * 1000)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (1000 characters)"
    >>> shorten(0.5)
    '0.5'
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 20 else f"{text[:limit]}... ({len(text)} characters)"


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"'{path}' must be a section (mapping), got {shorten(value)}")
        return build(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"'{path}'={shorten(value)} has the wrong type")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"'{path}'={shorten(value)} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{path}' must be a list, got {shorten(value)}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            raise ConfigError(f"'{path}' must have {len(args)} items, got {len(value)}")
        item_types = [args[0]] * len(value) if (origin is list or (args and args[-1] is Ellipsis)) else list(args)
        items = (
            [_coerce(t, v, f"{path}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))] if args else list(value)
        )
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{path}' must be a mapping, got {shorten(value)}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"'{path}'={shorten(value)} must be true or false")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"'{path}'={shorten(value)} must be a number, not a boolean")
        try:
            number = tp(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"'{path}'={shorten(value)} must be {'an integer' if tp is int else 'a number'}"
            ) from None
        if tp is float and not math.isfinite(number):
            raise ConfigError(f"'{path}'={shorten(value)} must be a finite number (not NaN or infinity)")
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"'{path}'={shorten(value)} must be an integer")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"'{path}' must be a string, got {shorten(value)}")
        return str(value)
    return value
