"""railgate's gate inside TRL's ``GRPOTrainer`` (``pip install -e .[trl]``; docs/trl.md).

A TRL user changes two names::

    from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer   # was: from trl import GRPOConfig, GRPOTrainer

    args = GatedGRPOConfig(output_dir="out", num_generations=8, ...)       # every GRPOConfig field, plus gate_*
    trainer = GatedGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)
    trainer.train()

Each step, the gate (railgate's SARA by default) probes prompts with a few rollouts, trains on the
ones whose group may turn out mixed, and gives the rest of the group only to those; TRL's loss,
optimiser, logging, callbacks and launch command are unchanged. This package is the only one of
railgate that imports ``trl``. ``MeasuredGRPOTrainer`` is ``GRPOTrainer`` itself, logging the
gradient noise scale of its steps as the gated trainer does (``railgate.trl.noise``): which regime
a plain GRPO run is in, and so whether gating it can pay.
"""

from railgate.trl.config import GatedGRPOConfig
from railgate.trl.noise import MeasuredGRPOTrainer
from railgate.trl.trainer import GatedGRPOTrainer

__all__ = ["GatedGRPOConfig", "GatedGRPOTrainer", "MeasuredGRPOTrainer"]
