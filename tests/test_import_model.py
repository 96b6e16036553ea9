"""``run.py import-model``: how SOURCE is found (a file, a directory, an installed package's
metadata) and the one-line errors for what cannot be imported. The real conversion of
SmolLM2 is in test_smollm2.py (slow)."""

from __future__ import annotations

import sys

import pytest

from railgate.cli import main
from railgate.import_model import ModelImportError, find_gguf, import_gguf


def fake_gguf(path, body: bytes = b"\x03\x00\x00\x00not a real model"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + body)
    return path


def fake_package(root, name: str, files: dict[str, bytes]):
    """An installed distribution ``name`` under ``root`` (dist-info with a RECORD), shipping ``files``."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/METADATA,,\n")


def run_cli(capsys, *args) -> tuple[int, str]:
    code = main(["import-model", *map(str, args)])
    return code, capsys.readouterr().err


def test_a_package_is_found_by_its_metadata(tmp_path, monkeypatch):
    fake_package(tmp_path, "smolfake", {"smolfake/__init__.py": b"", "smolfake/m.gguf": b"GGUF...."})
    fake_package(tmp_path, "twofake", {"twofake/a.gguf": b"GGUF", "twofake/b.gguf": b"GGUF"})
    fake_package(tmp_path, "nonefake", {"nonefake/__init__.py": b""})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_gguf("smolfake") == tmp_path / "smolfake" / "m.gguf"
    with pytest.raises(ModelImportError, match="package twofake ships 2 GGUF files .*a.gguf, b.gguf.*pass the path"):
        find_gguf("twofake")
    with pytest.raises(ModelImportError, match=r"installed package nonefake ships no \.gguf file.*\.\[smollm\]"):
        find_gguf("nonefake")
    assert "smolfake" not in sys.modules  # found without importing it
    one = fake_gguf(tmp_path / "dir" / "only.gguf")
    assert find_gguf(tmp_path / "dir") == one


def test_what_cannot_be_imported_is_one_line_and_exit_2(tmp_path, capsys):
    code, err = run_cli(capsys, tmp_path / "missing.gguf", tmp_path / "out")
    assert code == 2 and f"GGUF file {tmp_path / 'missing.gguf'} does not exist" in err and ".[smollm]" in err
    code, err = run_cli(capsys, "no-such-package-for-railgate", tmp_path / "out")
    assert code == 2 and "neither a file nor an installed package" in err
    text = tmp_path / "model.gguf"
    text.write_text("hello")
    code, err = run_cli(capsys, text, tmp_path / "out")
    assert code == 2 and "is not a GGUF file (it starts with b'hell'" in err
    code, err = run_cli(capsys, "pyyaml", tmp_path / "out")  # installed, no GGUF inside
    assert code == 2 and "ships no .gguf file" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_loaders_name_the_extra(tmp_path, monkeypatch):
    gguf = fake_gguf(tmp_path / "m.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an environment without the package looks like
    with pytest.raises(ModelImportError, match=r"needs the gguf package.*pip install -e '\.\[smollm\]'"):
        import_gguf(gguf, tmp_path / "out")
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ModelImportError, match="needs the gguf and accelerate packages"):
        import_gguf(gguf, tmp_path / "out")


def test_an_existing_out_is_left_alone_and_a_failed_read_leaves_nothing(tmp_path, capsys):
    gguf = fake_gguf(tmp_path / "m.gguf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = run_cli(capsys, gguf, out)
    assert code == 2 and "already exists and is not an empty directory" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    fresh = tmp_path / "fresh"
    code, err = run_cli(capsys, gguf, fresh)  # GGUF magic, then garbage: transformers cannot read it
    assert code == 2 and "transformers cannot read" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]  # no half-written directory
