"""What a ``GatedGRPOTrainer`` refuses at construction, with the setting and the fix.

The gate generates each group in separate requests (the probe, then the rest) and picks its
prompts by dataset row. TRL modes whose generation cannot be split that way, or whose prompts
cannot be picked by index, fail before TRL loads anything (``check_arguments``) or, for what
only the loaded processor tells, right after (``check_processor``):

* ``tools`` / ``environment_factory``: a tool-calling loop runs inside one generation;
* ``rollout_func``: the user's function owns generation and its extra fields;
* images (a vision-language processor, or ``image``/``images`` columns): the gate's requests
  carry no images;
* an ``IterableDataset``, or no ``prompt`` column: the gate picks prompts by row index;
* vLLM colocate with tensor parallelism: a group's rows would have to be gathered within each
  tensor-parallel group.
"""

from __future__ import annotations

import inspect
from typing import Any

from trl import GRPOTrainer

from railgate.trl.config import GatedGRPOConfig

FIX = "use trl's GRPOTrainer for this run"


def check_arguments(call_args: tuple, call_kwargs: dict) -> None:
    """Raise ``ValueError`` (``TypeError`` for the config) naming what the gate cannot run, from
    the arguments ``GRPOTrainer.__init__`` is about to get."""
    bound = inspect.signature(GRPOTrainer.__init__).bind(None, *call_args, **call_kwargs).arguments
    args = bound.get("args")
    if not isinstance(args, GatedGRPOConfig):
        raise TypeError(
            f"GatedGRPOTrainer needs a GatedGRPOConfig, got {type(args).__name__}; build args with "
            "railgate.trl.GatedGRPOConfig (every GRPOConfig field, plus the gate_* fields)"
        )
    tools = bound.get("tools")
    if tools:
        raise ValueError(
            f"tools={[getattr(t, '__name__', t) for t in tools]}: the gate generates a group in two "
            f"requests (probe, rest) and cannot split a tool-calling loop; drop tools or {FIX}"
        )
    if bound.get("environment_factory") is not None:
        raise ValueError(
            f"environment_factory is set: the gate cannot split an environment's multi-turn rollouts into "
            f"probe and rest; drop environment_factory or {FIX}"
        )
    rollout = bound.get("rollout_func")
    if rollout is not None:
        raise ValueError(
            f"rollout_func={getattr(rollout, '__name__', rollout)}: a custom rollout function owns "
            f"generation, which the gate must split; drop rollout_func or {FIX}"
        )
    _check_dataset(bound.get("train_dataset"))
    if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1:
        raise ValueError(
            f"vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} with vllm_mode='colocate': the "
            "gate splits a round's rows over processes, which tensor-parallel colocation cannot take; "
            "set vllm_tensor_parallel_size=1, or vllm_mode='server' with a tensor-parallel server"
        )


def _check_dataset(dataset: Any) -> None:
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        raise ValueError(
            f"train_dataset={type(dataset).__name__}: the gate picks prompts by row index and needs a "
            "map-style datasets.Dataset with a 'prompt' column; pass Dataset.from_list(...) or load it "
            "without streaming"
        )
    columns = dataset.column_names
    if "prompt" not in columns:
        raise ValueError(
            f"the train dataset has no 'prompt' column (columns: {', '.join(columns)}); rename the prompt "
            "column to 'prompt'"
        )
    images = sorted({"image", "images"} & set(columns))
    if images:
        raise ValueError(
            f"the train dataset has image columns ({', '.join(images)}): the gate's requests carry no "
            f"images; train on text prompts or {FIX}"
        )


def check_processor(trainer: Any) -> None:
    """A vision-language processor: refused (the gate's requests carry no images)."""
    if trainer._is_vlm:
        raise ValueError(
            f"processing_class={type(trainer.processing_class).__name__} is a vision-language processor: "
            f"the gate's requests carry no images; train a text-only model or {FIX}"
        )
