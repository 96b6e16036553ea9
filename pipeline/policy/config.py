"""Settings of the base policy (``model:`` in the YAML configs), apart from the model code.

The run configuration (``railgate.config``) composes this class, and every command reads the
configuration, so it lives here, free of torch and transformers: ``pipeline.policy.models``, which
builds, warm-starts and loads the model, imports torch at its top and re-exports this class.

>>> cfg = BaseModelConfig(d_model=64, n_heads=4)
>>> cfg.d_model // cfg.n_heads, cfg.path == ""
(16, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.build import at_most, require


@dataclass(frozen=True)
class BaseModelConfig:
    """The base policy: load it from ``path``, or build and warm-start it in the run directory."""

    path: str = ""
    """A model directory to load (config.json, weights, tokenizer); empty: build one."""
    d_model: int = 128
    """Hidden size."""
    n_layers: int = 2
    """Decoder layers."""
    n_heads: int = 4
    """Attention heads (d_model must be divisible by it)."""
    max_len: int = 64
    """Longest prompt + response in tokens (the model's max_position_embeddings)."""
    warm_start_steps: int = 1500
    """Most supervised steps on the task's reference solutions (the warm start usually stops
    earlier, at warm_start_target)."""
    warm_start_target: float = 0.4
    """Stop the warm start once sampled accuracy (T = 1) on training prompts reaches this:
    partial competence, so that many groups are mixed. 0: run all warm_start_steps."""
    warm_start_batch: int = 64
    """Examples per supervised step."""
    warm_start_lr: float = 3e-3
    """Peak AdamW learning rate of the warm start (linear warm-up, cosine decay)."""
    seed: int = 0
    """Seed of the initial weights and of the warm-start data."""
    threads: int = 2
    """torch threads while warm-starting."""

    def __post_init__(self) -> None:
        require(
            self.d_model >= 8 and self.n_heads >= 1 and self.d_model % self.n_heads == 0,
            f"model d_model={self.d_model} must be a multiple of n_heads={self.n_heads}",
        )
        require(self.n_layers >= 1, f"model.n_layers={self.n_layers} must be >= 1")
        require(self.max_len >= 8, f"model.max_len={self.max_len} must be >= 8")
        require(self.warm_start_steps >= 0, f"model.warm_start_steps={self.warm_start_steps} must be >= 0")
        require(self.warm_start_batch >= 1, f"model.warm_start_batch={self.warm_start_batch} must be >= 1")
        require(self.warm_start_lr > 0, f"model.warm_start_lr={self.warm_start_lr} must be > 0")
        require(0 <= self.warm_start_target < 1, f"model.warm_start_target={self.warm_start_target} must be in [0, 1)")
        require(self.threads >= 1, f"model.threads={self.threads} must be >= 1")
        for key, limit in (
            ("d_model", 1 << 16),
            ("n_layers", 1024),
            ("n_heads", 1024),
            ("max_len", 1 << 20),
            ("warm_start_batch", 1 << 16),
            ("warm_start_steps", 10**8),
            ("threads", 1024),
        ):
            at_most(f"model.{key}", getattr(self, key), limit)
