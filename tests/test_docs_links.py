"""Every relative link in the user docs (README.md, CHANGELOG.md, docs/**/*.md) points at a file
that exists, and a link with an anchor at a heading of its target page (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")] if p.is_file())
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where a ``[x](y)`` is not a link."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.

    >>> slug("Does probing pay? (`probe_when: pays`, `controller/probing.py`)")
    'does-probing-pay-probe_when-pays-controllerprobingpy'
    """
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8"))) if not re.match(r"[a-z]+:", t)]


def test_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/usage.md", "docs/config.md", "docs/benchmarks/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"broken links in {page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path: Path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n[ok](#title) [bad](missing.md) `[code](not-a-link.md)`\n", encoding="utf-8")
    assert links(page) == ["#title", "missing.md"]
    assert anchors(page) == {"title"}
