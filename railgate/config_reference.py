"""The configuration reference (docs/config.md), generated from the config classes.

Walks ``railgate.config.RunConfig`` and the dataclasses it composes, and writes every key
(dotted, as ``--set`` takes it), its type, its default and one line of meaning: the first
sentence of the docstring under the field. A new field, or a new section, appears here without
any change to this module; ``tests/test_config_reference.py`` fails when docs/config.md is out
of date. Regenerate it with::

    python -m railgate.config_reference > docs/config.md

>>> from controller.config import DsConfig
>>> keys(DsConfig, "gate.ds")[0]
Key(key='gate.ds.oversample', type='float', default='3.0', meaning='Prompts per round as a multiple of batch_groups (DAPO: 3).')
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, get_args, get_origin

from pipeline.config.build import to_dict

REGENERATE = "python -m railgate.config_reference > docs/config.md"
"""The command that rewrites docs/config.md (the test that checks the page names it)."""


@dataclass(frozen=True)
class Key:
    """One setting: its dotted key, type, default and the first sentence of its docstring."""

    key: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Section:
    """One dataclass of settings: its dotted prefix, the class's first sentence and its keys."""

    prefix: str
    title: str
    keys: tuple[Key, ...]


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (and of the dataclasses it extends),
    read from the source: Python keeps no attribute docstrings at run time."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


_NOT_AN_END = ("e.g.", "i.e.", "cf.", "vs.", "etc.")


SHORT_SENTENCE = 3
"""A first sentence of fewer words than this ("Training model.") only names the setting; the
reference then gives the next sentence too."""


def first_sentence(text: str) -> str:
    """The first sentence of ``text``, on one line, with RST's double backquotes as Markdown's
    single ones (a sentence ends at '.', '!' or '?' before a space, except after
    e.g./i.e./cf./vs.; a first sentence of one or two words takes the next one along).

    >>> first_sentence("Seconds to wait, e.g. 5. Longer waits are rare.")
    'Seconds to wait, e.g. 5.'
    >>> first_sentence("Starting mode. ``shadow``: logged only. Else live.")
    'Starting mode. `shadow`: logged only.'
    >>> first_sentence("uniform (GRPO) | ds")
    'uniform (GRPO) | ds'
    """
    flat = " ".join(text.replace("``", "`").split())
    for match in re.finditer(r"[.!?](?=\s)", flat):
        head = flat[: match.end()]
        if not head.endswith(_NOT_AN_END) and len(head.split()) >= SHORT_SENTENCE:
            return head
    return flat


def type_name(hint: Any) -> str:
    """A type annotation as a reader writes it.

    >>> type_name(Literal["a", "b"]), type_name(tuple[float, ...]), type_name(int | None)
    ('"a" | "b"', 'tuple[float, ...]', 'int | None')
    """
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))


def show(value: Any) -> str:
    """A default as it would be written in YAML (JSON flow style for containers).

    >>> show(True), show(None), show("sara"), show(0.5), show((1.0, 2.0))
    ('true', 'null', '"sara"', '0.5', '[1.0, 2.0]')
    """
    return json.dumps(to_dict(value))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _yaml_name(cls: type, name: str) -> str:
    return {v: k for k, v in getattr(cls, "YAML_KEYS", {}).items()}.get(name, name)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def keys(cls: type, prefix: str = "") -> list[Key]:
    """The leaf settings directly in dataclass ``cls`` (nested sections are ``sections``')."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or _is_section(hints[f.name]):
            continue
        default = _default(f)
        out.append(
            Key(
                key=_join(prefix, _yaml_name(cls, f.name)),
                type=type_name(hints[f.name]),
                default="(required)" if default is dataclasses.MISSING else show(default),
                meaning=first_sentence(docs.get(f.name, "")),
            )
        )
    return out


def sections(cls: type, prefix: str = "") -> list[Section]:
    """``cls`` and every dataclass of settings under it, depth first, in field order."""
    hints = typing.get_type_hints(cls)
    found = [Section(prefix, first_sentence(inspect.cleandoc(cls.__doc__ or "")), tuple(keys(cls, prefix)))]
    for f in dataclasses.fields(cls):
        if f.init and _is_section(hints[f.name]):
            found += sections(hints[f.name], _join(prefix, _yaml_name(cls, f.name)))
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(root: type | None = None) -> str:
    """docs/config.md: one table per section of ``root`` (``RunConfig`` by default)."""
    if root is None:
        from railgate.config import RunConfig

        root = RunConfig
    lines = [
        "# Configuration reference",
        "",
        "Every setting of a run: its key (as `--set key=value` and the YAML files in `configs/` take it),",
        "type, default and the first sentence of its docstring in the config classes. The full",
        "docstrings, and the rules that tie settings together, are in the classes themselves.",
        "",
        f"Generated by `{REGENERATE}`; do not edit by hand.",
    ]
    for section in sections(root):
        if not section.keys:
            continue
        lines += ["", f"## `{section.prefix}`" if section.prefix else "## Top level", "", section.title, ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for k in section.keys:
            lines.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {_cell(k.meaning)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
