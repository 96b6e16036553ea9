"""The keys a TRL or verl user types, answered with the railgate key they mean.

``pipeline.config.build.build`` looks an unknown key up here before guessing a close
spelling, so ``--set learner.beta=0.04`` says "TRL's beta is learner.kl_coef" instead of
suggesting Adam's ``betas``. A key matches by its longest dotted suffix in the table
(``actor_rollout_ref.rollout.n`` matches ``rollout.n``); a bare ``n`` matches nothing.

>>> hint = foreign_hint("actor_rollout_ref.rollout.n")
>>> hint
"verl's rollout.n is orchestrator.group_size here (rollouts per prompt)"
>>> foreign_hint("orchestrator.group_sise") is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForeignKey:
    """A TRL or verl setting: the railgate key that does its job, and what differs."""

    railgate: str
    source: str
    note: str = ""


_TRL, _VERL, _BOTH = "TRL", "verl", "TRL/verl"

FOREIGN_KEYS: dict[str, ForeignKey] = {
    # rollouts
    "num_generations": ForeignKey("orchestrator.group_size", _TRL, "rollouts per prompt"),
    "rollout.n": ForeignKey("orchestrator.group_size", _VERL, "rollouts per prompt"),
    "max_completion_length": ForeignKey("orchestrator.max_tokens", _TRL, "tokens per response"),
    "max_response_length": ForeignKey("orchestrator.max_tokens", _VERL, "tokens per response"),
    "max_prompt_length": ForeignKey(
        "task.dataset.max_prompt_chars",
        _BOTH,
        "prompts are not truncated: a prompt longer than the context minus orchestrator.max_tokens stops the run "
        "before it starts; max_prompt_chars skips long dataset rows",
    ),
    "temperature": ForeignKey("orchestrator.temperature", _BOTH),
    "top_p": ForeignKey("orchestrator.top_p", _BOTH),
    "use_vllm": ForeignKey("engine.kind", _TRL, "engine.kind=vllm"),
    "rollout.name": ForeignKey("engine.kind", _VERL, "engine.kind=vllm or torch"),
    # batches and steps
    "per_device_train_batch_size": ForeignKey(
        "orchestrator.batch_groups", _TRL, "counted in groups of orchestrator.group_size rollouts per learner step"
    ),
    "train_batch_size": ForeignKey("orchestrator.batch_groups", _VERL, "prompts (groups) per learner step"),
    "ppo_mini_batch_size": ForeignKey("orchestrator.batch_groups", _VERL, "one optimizer step per batch of groups"),
    "gradient_accumulation_steps": ForeignKey(
        "learner.micro_batch", _TRL, "a learner step accumulates gradients over micro-batches of this many rollouts"
    ),
    "ppo_micro_batch_size_per_gpu": ForeignKey("learner.micro_batch", _VERL, "rollouts per micro-batch"),
    "ppo_micro_batch_size": ForeignKey("learner.micro_batch", _VERL, "rollouts per micro-batch"),
    "num_iterations": ForeignKey("learner.ppo_epochs", _TRL, "passes over each batch"),
    "actor.ppo_epochs": ForeignKey("learner.ppo_epochs", _VERL),
    "max_steps": ForeignKey("orchestrator.steps", _TRL, "learner steps"),
    "num_train_epochs": ForeignKey("orchestrator.steps", _TRL, "runs are counted in learner steps"),
    "total_training_steps": ForeignKey("orchestrator.steps", _VERL, "learner steps"),
    "total_epochs": ForeignKey("orchestrator.steps", _VERL, "runs are counted in learner steps"),
    # the loss
    "beta": ForeignKey("learner.kl_coef", _TRL, "weight of the KL penalty to the base policy; 0 = none"),
    "kl_coef": ForeignKey("learner.kl_coef", _VERL, "weight of the KL penalty to the base policy; 0 = none"),
    "kl_loss_coef": ForeignKey("learner.kl_coef", _VERL, "weight of the KL penalty to the base policy; 0 = none"),
    "use_kl_loss": ForeignKey("learner.kl_coef", _VERL, "a kl_coef above 0 turns the KL penalty on"),
    "epsilon": ForeignKey("learner.clip_low", _TRL, "and learner.clip_high: PPO's clip range below and above 1"),
    "epsilon_high": ForeignKey("learner.clip_high", _TRL, "the clip-higher bound; DAPO uses 0.28"),
    "clip_ratio": ForeignKey("learner.clip_low", _VERL, "and learner.clip_high: PPO's clip range below and above 1"),
    "clip_ratio_low": ForeignKey("learner.clip_low", _VERL),
    "clip_ratio_high": ForeignKey("learner.clip_high", _VERL, "the clip-higher bound; DAPO uses 0.28"),
    "loss_type": ForeignKey(
        "learner.loss_agg",
        _TRL,
        "token_mean (grpo, bnpo, dapo) or seq_mean_token_sum; dr_grpo is learner.algorithm=drgrpo",
    ),
    "loss_agg_mode": ForeignKey("learner.loss_agg", _VERL),
    "scale_rewards": ForeignKey("learner.algorithm", _TRL, "false (no std scaling) is learner.algorithm=drgrpo"),
    "adv_estimator": ForeignKey("learner.algorithm", _VERL, "grpo, drgrpo or rloo"),
    # the optimizer
    "learning_rate": ForeignKey("learner.lr", _TRL),
    "optim.lr": ForeignKey("learner.lr", _VERL),
    "lr": ForeignKey("learner.lr", _BOTH),
    "max_grad_norm": ForeignKey("learner.grad_clip", _TRL),
    "grad_clip": ForeignKey("learner.grad_clip", _VERL),
    "adam_beta1": ForeignKey("learner.betas", _TRL, "learner.betas=[beta1, beta2]"),
    "adam_beta2": ForeignKey("learner.betas", _TRL, "learner.betas=[beta1, beta2]"),
    "adam_epsilon": ForeignKey("learner.adam_eps", _TRL),
    "bf16": ForeignKey("learner.dtype", _TRL, "learner.dtype=bfloat16"),
    # data, model, logging
    "model_name_or_path": ForeignKey("model.path", _TRL, "a local Hugging Face model directory"),
    "reward_funcs": ForeignKey("task.dataset.reward", _TRL, "one function, as 'module:function'"),
    "train_files": ForeignKey("task.dataset.train_path", _VERL),
    "val_files": ForeignKey("task.dataset.eval_path", _VERL),
    "prompt_key": ForeignKey("task.dataset.prompt_field", _VERL),
    "output_dir": ForeignKey("run_dir", _TRL),
    "save_steps": ForeignKey("log.checkpoint_every", _TRL),
    "save_freq": ForeignKey("log.checkpoint_every", _VERL),
    "save_total_limit": ForeignKey("log.keep_checkpoints", _TRL),
    "eval_steps": ForeignKey("orchestrator.eval_every", _TRL),
    "test_freq": ForeignKey("orchestrator.eval_every", _VERL),
}


def lookup(path: str) -> tuple[str, ForeignKey] | None:
    """The table's entry for dotted key ``path``: its longest dotted suffix in the table."""
    parts = path.split(".")
    for start in range(len(parts)):
        name = ".".join(parts[start:])
        if name in FOREIGN_KEYS:
            return name, FOREIGN_KEYS[name]
    return None


def foreign_hint(path: str, value: Any = None) -> str | None:
    """One sentence naming the railgate key for an unknown key ``path`` (None: not a TRL or
    verl name). ``value``: the key's value; a mapping is searched for the names under it
    (``actor_rollout_ref: {rollout: {n: 8}}``)."""
    for leaf in [path] + [f"{path}.{sub}" for sub in _leaves(value)]:
        found = lookup(leaf)
        if found is not None:
            name, entry = found
            note = f" ({entry.note})" if entry.note else ""
            return f"{entry.source}'s {name} is {entry.railgate} here{note}"
    return None


def _leaves(value: Any, prefix: str = "") -> list[str]:
    if not isinstance(value, dict):
        return []
    out = []
    for key, sub in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out += [name] + _leaves(sub, name)
    return out
