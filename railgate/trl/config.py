"""``GatedGRPOConfig``: TRL's ``GRPOConfig`` plus the gate's settings, every one named ``gate_*``.

No field shadows one of ``GRPOConfig``'s (tests/test_trl_config.py checks it against TRL's own
field list), so every TRL setting keeps its meaning. The gate's rules live once, in railgate's
``controller.config`` dataclasses (``SaraConfig``, ``HoraConfig``, ``DsConfig``): ``gate_config``
builds them from these fields, and their checks run at construction with the messages naming
the ``gate_*`` field and the fix.

The probe size follows ``num_generations`` unless set (``gate_probe_size=0``: half the group):

>>> args = GatedGRPOConfig(output_dir="out", num_generations=8, per_device_train_batch_size=16, use_cpu=True,
...                        report_to=[])
>>> args.gate_kind, args.probe_size, args.gate_config().sara.probe_size, args.prompts_per_step
('sara', 4, 4, 2)
>>> GatedGRPOConfig(output_dir="out", num_generations=4, report_to=[], use_cpu=True).probe_size
2
>>> GatedGRPOConfig(output_dir="out", num_generations=4, gate_probe_size=4, report_to=[], use_cpu=True)
Traceback (most recent call last):
...
ValueError: gate_probe_size=4 is not below num_generations=4: the gate could never stop a group before it is full; lower gate_probe_size or raise num_generations
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trl import GRPOConfig

from controller.config import DsConfig, GateConfig, HoraConfig, SaraConfig
from pipeline.config.build import ConfigError

GATE_KINDS = ("sara", "hora", "ds", "uniform")
"""``gate_kind`` values: railgate's SARA (the default), HORA, DAPO dynamic sampling, and uniform
(every group committed whole: plain GRPO through the gated trainer)."""

GATE_MODES = ("live", "shadow")
"""``gate_mode`` values: the gate decides (``live``), or it only watches a plain GRPO run (``shadow``)."""

_RAILGATE_KEYS = {
    "gate.sara.probe_size": "gate_probe_size",
    "gate.hora.probe_size": "gate_probe_size",
    "gate.sara.tau_commit": "gate_tau_commit",
    "gate.sara.tau_abandon": "gate_tau_abandon",
    "gate.sara.reference_skip": "gate_reference_skip",
    "gate.sara.reference_skip_share": "gate_reference_skip_share",
    "gate.sara.reference_strength": "gate_reference_strength",
    "gate.sara.reference_calibrate": "gate_reference_calibrate",
    "gate.sara.probe_when": "gate_probe_when",
    "gate.sara.probe_max_lost": "gate_probe_max_lost",
    "gate.sara.reference_ahead": "gate_reference_ahead",
    "gate.hora.budget": "gate_hora_budget",
    "gate.ds.oversample": "gate_ds_oversample",
    "gate.ds.max_rounds": "gate_ds_max_rounds",
    "orchestrator.group_size": "num_generations",
    "orchestrator.batch_groups": "prompts per step",
}
"""railgate's config keys as the ``GatedGRPOConfig`` fields that set them (for error messages)."""


@dataclass
class GatedGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with the gate's settings; see the module docstring and docs/trl.md."""

    gate_mode: str = "live"
    """``live``: the gate decides which groups are generated and trained. ``shadow``: train exactly
    as ``GRPOTrainer`` does (TRL's own generation, rewards and loss; the gate decides nothing) and
    record every generation batch's full groups to ``output_dir/railgate_groups/`` with, per batch,
    what the gate of ``gate_kind`` and these ``gate_*`` settings would have generated and trained on
    them (``railgate/shadow_*``; ``railgate.trl.shadow``). SARA's reference prior is not part of the
    shadow figures (the log holds no reference likelihoods)."""
    gate_kind: str = "sara"
    """Which gate decides: ``sara`` (probe each prompt, train on it only if its group may turn out
    mixed), ``hora`` (probe a step's prompts, split the rest of a budget by hit utility),
    ``ds`` (DAPO dynamic sampling: full groups, drop the all-same ones, refill) or ``uniform``
    (every group whole: plain GRPO)."""
    gate_probe_size: int = 0
    """SARA's probe k and HORA's G0: rollouts a prompt gets before the gate decides; below
    ``num_generations``. 0: derived, ``num_generations // 2`` (at least 1; ``probe_size``)."""
    gate_tau_commit: float = 0.5
    """SARA: train on a group once its chance of ending mixed is at least this."""
    gate_tau_abandon: float = 0.45
    """SARA: drop a group once its chance of ending mixed is at most this (the paper's 0.45)."""
    gate_success_threshold: float = 0.5
    """A completion whose summed, weighted reward is above this counts as a success for the gate
    (set it between a wrong and a right answer's reward when rewards are shaped)."""
    gate_reference_prior: bool = True
    """SARA: start each group from the policy's likelihood of the prompt's reference completion
    (one forward pass before any rollout), and skip prompts that likelihood says will not give a
    mixed group. Needs ``temperature=1`` and ``top_p=1``. Off, or with no reference column, SARA
    starts from its uniform prior."""
    gate_reference_column: str = "auto"
    """Dataset column holding each prompt's reference completion (text that earns the reward);
    ``auto``: the first of ``reference``, ``solution``, ``answer``, ``completion`` present (none:
    the reference prior is off, with a warning). Rows whose reference does not earn the reward
    (checked with the reward functions before it is used) get no prior from it."""
    gate_reference_exact: bool = False
    """The reference completion is the only one that earns the reward (an exact-match answer, one
    tokenization), so its likelihood is the prompt's pass rate. False: a lower bound on it, which
    only skips prompts the policy nearly always solves."""
    gate_reference_skip: float = 0.45
    """Skip a prompt before any rollout when the reference prior gives its group a chance of
    ending mixed of at most this (railgate's CPU default uses 0.8 with an exact reference)."""
    gate_reference_skip_share: float = 0.5
    """The largest share of prompts the reference prior skips: a prompt is skipped only if its chance
    is also under this quantile of the latest prompts' chances, so a hard start, where every prompt
    looks alike, skips at most about this share (1: ``gate_reference_skip`` alone decides, which on
    SmolLM2's 4% start skipped most prompts and yielded 0.94x whole groups' mixed groups per rollout,
    against 1.09x at 0.5: docs/benchmarks/replay.md)."""
    gate_reference_calibrate: bool = True
    """With ``gate_reference_exact=False``: fit online how the reference's likelihood maps to the pass
    rates the run observes (``controller.reference_fit``) and, once fitted (32 scored groups), start
    each group from that calibrated prior, so the prior pays without knowing whether the reference
    is exact. False: the likelihood stays a lower bound (skips only near-sure successes)."""
    gate_probe_when: str = "pays"
    """SARA: ``pays`` fits how the run's pass rates spread (from its own groups) and launches a
    prompt's whole group, trained on as GRPO would, wherever probing it would yield fewer mixed
    groups per generated rollout (``controller.probing``); ``always`` probes every prompt."""
    gate_probe_max_lost: float = 0.1
    """SARA with ``gate_probe_when="pays"``: probe only while the latest groups launched whole show
    that a probe would abandon at most this share of the mixed groups (and find more of them per
    rollout); until 16 whole groups are in, and past the cap, groups are launched whole. 1: no cap."""
    gate_probe_price_steps: bool = False
    """SARA with ``gate_probe_when="pays"``: price optimiser steps as well as rollouts, with the
    gradient noise scale measured from the run's own steps (``railgate.trl.noise``): where a step's
    mixed groups are many times the noise scale (a step-limited run), every step counts about the
    same and the cheaper step -- whole groups -- wins even where probing finds more mixed groups per
    rollout (``controller.probing.step_value``). False: rollouts only."""
    gate_reference_strength: float = 64.0
    """Pseudo-rollouts an exact reference likelihood counts for in the prior."""
    gate_reference_ahead: int = 0
    """Prompts scored ahead of admission, in the gate's order; 0: 4 (8 above a skip of 0.5) per
    prompt of a step."""
    gate_hora_budget: int = 0
    """HORA: rollouts per step, probes included; 0: prompts x (gate_probe_size + num_generations) / 2.
    No group takes more than ``num_generations`` (TRL's slots), so a budget of prompts x
    ``num_generations`` would give every group all of them: plain GRPO."""
    gate_ds_oversample: float = 3.0
    """DS: prompts per round as a multiple of the step's prompts (DAPO: 3). The trainer opens
    only as many as the step still needs, so no surplus group is generated."""
    gate_ds_max_rounds: int = 10
    """DS: rounds per step before the last round's all-same groups fill the step."""
    gate_step_rollouts: float = 4.0
    """Most rollouts one step may generate, as a multiple of prompts x ``num_generations``; past it
    no prompt is opened and the groups not filled are zero-advantage padding (no generation)."""
    gate_max_rollouts: int = 0
    """Stop training once this many rollouts were generated (0: no limit; ``max_steps`` still
    applies): a rollout budget for comparisons."""
    gate_trace: bool = True
    """Write railgate's decision trace to ``output_dir/trace`` (``python run.py replay`` reads it)."""
    gate_rail_shadow: bool = False
    """Run railgate's RAIL controller in shadow mode beside the gate: it decides and logs to the
    trace at every commit and abandon, and never acts (its behaviour policy is the no-op)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate_mode not in GATE_MODES:
            raise ValueError(
                f"gate_mode={self.gate_mode!r} is not one of {', '.join(GATE_MODES)}; use 'live' (the gate decides) or "
                "'shadow' (train as GRPOTrainer, log what the gate would have done)"
            )
        if self.gate_kind not in GATE_KINDS:
            raise ValueError(f"gate_kind={self.gate_kind!r} is not one of {', '.join(GATE_KINDS)}; pick one of them")
        if self.gate_probe_size < 0:
            raise ValueError(f"gate_probe_size={self.gate_probe_size} must be >= 0 (0: num_generations // 2); raise it")
        if self.gate_kind in ("sara", "hora") and self.probe_size >= self.num_generations:
            raise ValueError(
                f"gate_probe_size={self.probe_size} is not below num_generations={self.num_generations}: "
                "the gate could never stop a group before it is full; lower gate_probe_size or raise "
                "num_generations"
            )
        if self.gate_step_rollouts < 1:
            raise ValueError(
                f"gate_step_rollouts={self.gate_step_rollouts} must be >= 1 (a step may always generate "
                "one full group per prompt); raise it"
            )
        if self.gate_probe_price_steps and not (self.gate_kind == "sara" and self.gate_probe_when == "pays"):
            raise ValueError(
                f"gate_probe_price_steps=True prices steps in SARA's probing rule, which gate_kind={self.gate_kind!r} "
                f"with gate_probe_when={self.gate_probe_when!r} does not run; set gate_kind='sara' and "
                "gate_probe_when='pays', or gate_probe_price_steps=False"
            )
        if self.gate_max_rollouts < 0:
            raise ValueError(f"gate_max_rollouts={self.gate_max_rollouts} must be >= 0 (0: no limit)")
        if self.uses_reference and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError(
                f"gate_reference_prior=True reads a prompt's odds from the policy's own probabilities, which "
                f"are the sampling probabilities only at temperature 1 and top_p 1, not temperature="
                f"{self.temperature} and top_p={self.top_p}; sample at 1 and 1 or set gate_reference_prior=False"
            )
        self.gate_config()  # the rules of railgate's own configs, with these fields' names

    @property
    def uses_reference(self) -> bool:
        """SARA with the reference prior on (a column still has to be found)."""
        return self.gate_kind == "sara" and self.gate_reference_prior

    @property
    def probe_size(self) -> int:
        """The probe the gate uses: ``gate_probe_size``, or when it is 0 ``num_generations // 2``
        (at least 1), so any group size of 2 or more has a probe below it."""
        return self.gate_probe_size or max(1, self.num_generations // 2)

    @property
    def prompts_per_step(self) -> int:
        """Groups in one generation batch: ``generation_batch_size / num_generations``."""
        return self.generation_batch_size // self.num_generations

    def gate_config(self, reference_prior: bool | None = None) -> GateConfig:
        """railgate's ``GateConfig`` of these settings (``reference_prior``: override whether SARA
        uses it, e.g. when no reference column exists); ``ValueError`` naming the ``gate_*`` field."""
        b, g, k = self.prompts_per_step, self.num_generations, self.probe_size
        use_reference = self.uses_reference if reference_prior is None else reference_prior
        sections = {
            "sara": lambda: {
                "sara": SaraConfig(
                    probe_size=k,
                    tau_commit=self.gate_tau_commit,
                    tau_abandon=self.gate_tau_abandon,
                    reference_prior=use_reference,
                    reference_skip=self.gate_reference_skip,
                    reference_skip_share=self.gate_reference_skip_share,
                    reference_calibrate=self.gate_reference_calibrate,
                    probe_when=self.gate_probe_when,  # type: ignore[arg-type]  # checked by SaraConfig
                    probe_max_lost=self.gate_probe_max_lost,
                    reference_strength=self.gate_reference_strength,
                    reference_ahead=self.gate_reference_ahead,
                    whole_when_certain=True,
                )
            },  # a batched generator: one call for a group its prior settles
            "hora": lambda: {
                "hora": HoraConfig(probe_size=k, budget=self.gate_hora_budget or b * (k + g) // 2, max_group_size=g)
            },
            "ds": lambda: {"ds": DsConfig(oversample=self.gate_ds_oversample, max_rounds=self.gate_ds_max_rounds)},
            "uniform": dict,
        }
        try:
            config = GateConfig(kind=self.gate_kind, **sections[self.gate_kind]())
            config.check_sizes(g, b)
        except ConfigError as exc:
            raise ValueError(_renamed(str(exc))) from None
        return config

    def step_rollouts(self) -> int:
        """``gate_step_rollouts`` in rollouts."""
        return int(self.gate_step_rollouts * self.prompts_per_step * self.num_generations)


def _renamed(message: str) -> str:
    """A railgate config error in this config's field names."""
    for key, field in sorted(_RAILGATE_KEYS.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(key, field)
    return message


def gate_fields() -> tuple[str, ...]:
    """The fields ``GatedGRPOConfig`` adds to ``GRPOConfig``."""
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    return tuple(f.name for f in dataclasses.fields(GatedGRPOConfig) if f.name not in base)
