"""The base policy: a tiny GPT-2-style causal LM built from a config, saved as a model directory.

No model hub is reachable here, so the CPU default trains its own starting policy: a
0.4M-parameter decoder (d_model 128, 2 layers) with the character tokenizer, warm-started by
supervised training on the task until its sampled accuracy is nearest 0.4 (``pipeline.policy.warmstart``;
measured on this 2-core CPU: arithmetic 31 s, the checkpoint of step 280 kept, held-out accuracy 0.394,
2026-12-03; Countdown 4 min with the earlier rule, which stopped at the first check above the target). It is a plain
``transformers`` ``GPT2LMHeadModel``, so the torch engine, the learner and vLLM all load it
the usual way.

Why GPT-2 and not Llama: the arithmetic task is a positional algorithm (answer digit k reads
operand digits at fixed places), and learned absolute position embeddings pick that up
far faster than rotary ones: measured here (operands padded to 5 digits), 400 warm-start
steps gave sampled accuracy 0.76 with GPT-2 and 0.05 with an otherwise equal Llama. Engines that left-pad
prompts must pass ``position_ids`` counted from each row's first real token.

Why here and not in learner/: the engine (pipeline/) and the learner both load this model,
and building it needs the tasks and the tokenizer, which live in pipeline/; learner/
imports only pipeline's buffer types, so the model arrives there from the wiring.

A model directory holds ``config.json`` and ``model.safetensors`` (``save_pretrained``), the
tokenizer (``railgate_tokenizer.json`` plus the Hugging Face tokenizer files) and, for
cached base models, ``railgate_base.json`` (the task and model settings it was built for,
and the warm-start report).

A user's model (``model.path``) is any standard Hugging Face causal-LM directory:
``config.json``, safetensors (or ``pytorch_model.bin``) weights and a tokenizer that
``AutoTokenizer`` loads (``pipeline.policy.hf_tokenizer.HFTokenizer``). The rule for such a model:
it is used as it is, with no warm start (it is assumed to be competent enough that some
groups are mixed), and its context length is its config's ``max_position_embeddings``
(``model.max_len`` and the architecture settings apply only to the project's model). A
directory holding ``railgate_tokenizer.json`` is the project's own model and keeps the
character tokenizer.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.config.build import to_dict
from pipeline.policy.config import BaseModelConfig  # also read as pipeline.policy.models.BaseModelConfig
from pipeline.policy.hf_tokenizer import HFTokenizer
from pipeline.policy.tokenizer import VOCAB_FILE, CharTokenizer, TokenizerError

META_FILE = "railgate_base.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BASE_DIR_NAME = "base_model"


class ModelDirError(RuntimeError):
    """A model directory is missing, incomplete or corrupt; the message names the path."""


@dataclass
class BaseModel:
    """A loaded policy: the model, its tokenizer, where it lives and what it was built for."""

    model: Any
    tokenizer: CharTokenizer | HFTokenizer
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def context_length(self) -> int:
        """Longest prompt + response the model takes: its config's position range."""
        config = self.model.config.get_text_config(decoder=True)
        for name in ("max_position_embeddings", "n_positions"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        raise ModelDirError(
            f"{self.path}/config.json names no max_position_embeddings; add it (the model's context length)"
        )


def model_config(
    vocab_size: int,
    d_model: int = 128,
    n_layers: int = 2,
    n_heads: int = 4,
    max_len: int = 64,
    pad_id: int | None = 0,
    bos_id: int = 1,
    eos_id: int = 2,
    initializer_range: float = 0.02,
    *,
    arch: str = "gpt2",
    mlp_ratio: int = 4,
    **extra: Any,
) -> Any:
    """The transformers config of a small causal LM: the project's GPT-2 (``GPT2Config``, tied
    head) or, ``arch="llama"``, a Llama (``LlamaConfig``: rotary positions, untied head, as many
    key/value heads as heads) of the same shape. MLP width ``mlp_ratio`` x d_model; no dropout,
    because RL needs the engine's and the learner's log-probs to agree; ``initializer_range``:
    the spread of the initial weights (larger gives peaked logits); ``pad_id`` None: no pad token
    (a Llama zeroes its pad row of the embedding at init, so it changes the weights); ``extra``:
    further fields of the config.

    >>> model_config(20, 32, 1, 2, 16, arch="llama", mlp_ratio=2).intermediate_size
    64
    >>> model_config(20, 30, 1, 4)
    Traceback (most recent call last):
    ...
    ValueError: d_model=30 is not a multiple of n_heads=4; change one of them
    """
    from transformers import GPT2Config, LlamaConfig

    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}; change one of them")
    fields = dict(
        vocab_size=vocab_size,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        initializer_range=initializer_range,
    )
    fields.update(extra)
    if arch == "gpt2":
        return GPT2Config(
            n_positions=max_len,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            n_inner=None if mlp_ratio == 4 else mlp_ratio * d_model,  # None: GPT-2's own 4 x, as saved before
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **fields,
        )
    if arch == "llama":
        return LlamaConfig(
            hidden_size=d_model,
            intermediate_size=mlp_ratio * d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=n_heads,
            max_position_embeddings=max_len,
            **fields,
        )
    raise ValueError(f"arch={arch!r} must be gpt2 or llama")


def build_model(*config_args: Any, seed: int = 0, **config_kwargs: Any):
    """A freshly initialised small causal LM of ``model_config(*config_args, **config_kwargs)``,
    seeded by ``seed`` (the global RNG is left as it was). The one builder of every small model:
    the project's policy, the engine benchmark's and the tests'.

    >>> model = build_model(vocab_size=20, d_model=32, n_layers=1, n_heads=2, max_len=16)
    >>> type(model).__name__, model.config.n_positions
    ('GPT2LMHeadModel', 16)
    >>> type(build_model(20, 32, 1, 2, 16, arch="llama")).__name__
    'LlamaForCausalLM'
    """
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    config = model_config(*config_args, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (LlamaForCausalLM if config.model_type == "llama" else GPT2LMHeadModel)(config)
    if config.pad_token_id is not None:
        model.generation_config.pad_token_id = config.pad_token_id
    return model


def save_model(model, tokenizer: CharTokenizer, directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` (and ``meta``) into ``directory``; returns it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(d))
    tokenizer.save(d)
    if meta is not None:
        (d / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return d


def load_model(directory: str | Path, chat_template: bool = False) -> BaseModel:
    """Load what ``save_model`` wrote, or a Hugging Face causal-LM directory (its tokenizer
    through ``AutoTokenizer``; ``chat_template`` renders plain prompts as chat). ``ModelDirError``
    names the path and what is missing."""
    from transformers import AutoModelForCausalLM

    d = Path(directory)
    if not d.is_dir():
        raise ModelDirError(
            f"model directory {d} does not exist; set model.path to a Hugging Face model directory, or leave it empty to build one"
        )
    missing = [name for name in ("config.json",) if not (d / name).is_file()]
    if not any((d / name).is_file() for name in WEIGHT_FILES) and not any(d.glob("model-*.safetensors")):
        missing.append(" or ".join(WEIGHT_FILES))
    if missing:
        raise ModelDirError(
            f"model directory {d} lacks {', '.join(missing)}; save the model into it with save_pretrained"
        )
    read_model_config(d)  # a broken config.json is named as such, not as the tokenizer that reads it first
    own = (d / VOCAB_FILE).is_file()  # the project's model: the character tokenizer
    if own and chat_template:
        raise ModelDirError(
            f"task.chat_template=true, but {d} holds the project's character-level model, which has no chat template; "
            "set task.chat_template=false or point model.path at a chat model"
        )
    try:
        tokenizer: CharTokenizer | HFTokenizer = CharTokenizer.load(d) if own else HFTokenizer.load(d, chat_template)
    except TokenizerError as exc:
        raise ModelDirError(f"model directory {d}: {exc}") from None
    try:
        # float32 whatever the checkpoint's dtype: the learner's optimizer and log-probs need it.
        model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    except Exception as exc:  # transformers/safetensors raise many types for corrupt files
        raise ModelDirError(
            f"model directory {d} holds a corrupt or incompatible model ({type(exc).__name__}: {str(exc)[:300]}); "
            f"{_repair(d)}"
        ) from None
    # A Hugging Face model's embedding table may be padded beyond its tokenizer (never below it).
    vocab = model.config.get_text_config(decoder=True).vocab_size
    if vocab < tokenizer.vocab_size or (own and vocab != tokenizer.vocab_size):
        raise ModelDirError(
            f"model directory {d}: the model's vocab_size={vocab} {'differs from' if own else 'is below'} the tokenizer's "
            f"{tokenizer.vocab_size}; the files come from different models: save them together again"
        )
    meta: dict[str, Any] = {}
    if (d / META_FILE).is_file():
        try:
            meta = json.loads((d / META_FILE).read_text())
        except json.JSONDecodeError as exc:
            raise ModelDirError(f"{d / META_FILE} is not valid JSON ({exc}); {_repair(d)}") from None
    model.eval()
    return BaseModel(model=model, tokenizer=tokenizer, path=d, meta=meta)


def read_model_config(directory: str | Path) -> dict[str, Any]:
    """A model directory's ``config.json`` as a mapping; ``ModelDirError`` naming the file when it
    is not a JSON object.

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 2048}')
    >>> model_context(read_model_config(d))
    2048
    """
    d = Path(directory)
    path = d / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(
            f"{path} is not valid JSON ({str(exc)[:120]}): the model's configuration is damaged; {_repair(d)}"
        ) from None
    except OSError as exc:
        raise ModelDirError(f"{path} cannot be read ({exc.strerror}); {_repair(d)}") from None
    if not isinstance(data, dict):
        raise ModelDirError(
            f"{path} holds a JSON {type(data).__name__}, not the model's configuration (an object); {_repair(d)}"
        )
    return data


def model_context(config: dict[str, Any]) -> int | None:
    """The context length a model's ``config.json`` states (None: none stated)."""
    for tree in (config, config.get("text_config")):
        if isinstance(tree, dict):
            for name in ("max_position_embeddings", "n_positions"):
                value = tree.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def _repair(d: Path) -> str:
    """The fix for a damaged model directory: railgate's own cache is rebuilt; a user's is theirs."""
    if d.name == BASE_DIR_NAME and (d / META_FILE).is_file():
        return f"delete {d}: railgate builds and warm-starts it again"
    return (
        f"{d} is your model directory: save the model into it again (save_pretrained), or point model.path at an "
        "intact copy"
    )


def base_settings(task_cfg, model_cfg: BaseModelConfig) -> dict[str, Any]:
    """The task and model settings that decide a warm-started base model's weights, as its
    ``railgate_base.json`` records them: a cached model is reused only for equal settings.

    >>> from pipeline.tasks import TaskConfig
    >>> sorted(base_settings(TaskConfig(), BaseModelConfig())["model"])[:3]
    ['d_model', 'max_len', 'n_heads']
    """
    # settings that change the weights; threads and path do not
    model_settings = {k: v for k, v in to_dict(model_cfg).items() if k not in ("threads", "path")}
    # how rewards are read and prompts rendered do not change the warm start's weights
    task_settings = {k: v for k, v in to_dict(task_cfg).items() if k not in ("success_threshold", "chat_template")}
    for section in task_settings.values():  # scratchpad=false: base models cached before it existed still match
        if isinstance(section, dict) and section.get("scratchpad") is False:
            del section["scratchpad"]
    arith = task_settings.get("arithmetic")  # likewise its template and reward at their defaults
    for key, before in (("template", ""), ("reward", "exact")):
        if isinstance(arith, dict) and arith.get(key) == before:
            del arith[key]
    return {"task": task_settings, "model": model_settings}


def ensure_base_model(
    run_dir: str | Path, task_cfg, model_cfg: BaseModelConfig | None = None, progress: bool = True, task: Any = None
) -> BaseModel:
    """The base policy of a run: ``model_cfg.path`` if set, else ``run_dir/base_model``,
    built and warm-started on the first call and loaded from there afterwards. When the task
    and model settings are those of the model the project ships (``pipeline.policy.shipped``:
    configs/default.yaml's), the first call copies that model instead of warm-starting, after
    checking its files' digests.

    A cached model built for other task or model settings is an error, not silently reused.
    The directory appears atomically (built in a temporary sibling, then renamed), so an
    interrupted warm start leaves no half-written model behind. ``task``: the task ``task_cfg``
    describes, when the caller has built it already.
    """
    from pipeline.tasks import build_task

    model_cfg = model_cfg or BaseModelConfig()
    chat = bool(getattr(task_cfg, "chat_template", False))
    if model_cfg.path:  # a user's model is used as it is: no warm start
        return _check_alphabet(load_model(model_cfg.path, chat_template=chat), task or build_task(task_cfg))
    if chat:
        raise ModelDirError(
            "task.chat_template=true needs a chat model; the project's model (model.path empty) has no chat template: "
            "set model.path to a Hugging Face chat model directory, or task.chat_template=false"
        )
    target = Path(run_dir) / BASE_DIR_NAME
    wanted = base_settings(task_cfg, model_cfg)
    if not target.exists() and _is_shipped(wanted):
        from pipeline.policy.shipped import copy_shipped

        copy_shipped(target)  # the same start on every machine (pipeline.policy.shipped); digests checked
    if target.exists():
        base = load_model(target)
        stale = [k for k in wanted if base.meta.get(k) != wanted[k]]
        if stale:
            raise ModelDirError(
                f"{target} was built for other {' and '.join(stale)} settings than this run's; "
                "delete it to rebuild, or use a new run directory"
            )
        return base
    return build_base_model(task_cfg, model_cfg, target, progress, task)


def _is_shipped(wanted: dict[str, Any]) -> bool:
    from pipeline.policy.shipped import shipped_settings

    return shipped_settings() == json.loads(json.dumps(wanted))  # as railgate_base.json records them


def build_base_model(
    task_cfg, model_cfg: BaseModelConfig, target: str | Path, progress: bool = True, task: Any = None
) -> BaseModel:
    """Build the project's model for ``task_cfg``, warm-start it and save it as ``target`` (a
    model directory that ``model.path`` loads as it is). ``target`` must not exist, or be an
    empty directory; it appears atomically (built in a temporary sibling, then renamed). ``task``:
    the task ``task_cfg`` describes, when the caller has built it already."""
    from pipeline.policy.warmstart import warm_start
    from pipeline.tasks import build_task

    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ModelDirError(
            f"{target} already exists and is not an empty directory; choose a new directory or delete it"
        )
    task = task or build_task(task_cfg)
    tokenizer = CharTokenizer.for_tasks(task)
    model = build_model(
        tokenizer.vocab_size,
        model_cfg.d_model,
        model_cfg.n_layers,
        model_cfg.n_heads,
        model_cfg.max_len,
        seed=model_cfg.seed,
    )
    report = warm_start(
        task,
        tokenizer,
        model,
        steps=model_cfg.warm_start_steps,
        batch=model_cfg.warm_start_batch,
        lr=model_cfg.warm_start_lr,
        seed=model_cfg.seed,
        progress=progress,
        threads=model_cfg.threads,
        target_accuracy=model_cfg.warm_start_target,
    )
    meta = {**base_settings(task_cfg, model_cfg), "warm_start": to_dict(report)}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        save_model(model, tokenizer, tmp, meta)
        if target.exists():
            target.rmdir()  # empty: checked above
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    model.eval()
    return BaseModel(model=model, tokenizer=tokenizer, path=target, meta=meta)


def _check_alphabet(base: BaseModel, task) -> BaseModel:
    if not isinstance(base.tokenizer, CharTokenizer):
        return base  # a subword tokenizer encodes any text
    missing = sorted(set(task.alphabet) - set(base.tokenizer.alphabet))
    if missing:
        raise ModelDirError(
            f"the tokenizer in {base.path} cannot encode {''.join(missing)!r}, which task {task.name!r} uses; "
            "point model.path at a model built for this task, or leave it empty to build one"
        )
    return base
