"""docs/config.md is the configuration reference generated from the config classes: it names
every key of ``RunConfig`` and is up to date with the classes."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from railgate.config import RunConfig
from railgate.config_reference import REGENERATE, first_sentence, render, sections

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def leaf_keys(cls: type, prefix: str = "") -> set[str]:
    """Every dotted leaf key of ``cls``, walked independently of the generator."""
    hints, out = typing.get_type_hints(cls), set()
    renamed = {v: k for k, v in getattr(cls, "YAML_KEYS", {}).items()}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{renamed.get(f.name, f.name)}"
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]):
            out |= leaf_keys(hints[f.name], key + ".")
        else:
            out.add(key)
    return out


def test_page_is_up_to_date():
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/config.md is out of date; regenerate it: {REGENERATE}"


def test_every_key_is_listed_with_a_meaning():
    listed = {k.key: k for s in sections(RunConfig) for k in s.keys}
    assert set(listed) == leaf_keys(RunConfig)
    assert {"gate.sara.reference_skip", "task.env.class", "seed"} <= set(listed)
    undocumented = sorted(k for k, v in listed.items() if not v.meaning)
    assert not undocumented, f"fields without a docstring under them: {undocumented}"


def test_defaults_and_types_are_the_classes():
    listed = {k.key: k for s in sections(RunConfig) for k in s.keys}
    assert listed["gate.kind"].default == '"uniform"'
    assert listed["gate.kind"].type.startswith('"uniform" | "ds"')
    assert listed["orchestrator.steps"].type == "int"


def test_first_sentence_keeps_abbreviations_and_short_names_together():
    assert first_sentence("Wait, e.g. 5 s. More text.") == "Wait, e.g. 5 s."
    assert first_sentence("Hidden size.") == "Hidden size."
    assert first_sentence("Compute dtype. bfloat16 is slower. Else.") == "Compute dtype. bfloat16 is slower."
