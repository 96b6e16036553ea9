"""The gate's side of a ``GatedGRPOTrainer``: railgate's own gate, tracker and trace, per TRL step.

``GateSession`` builds, from the trainer's ``GatedGRPOConfig`` and train dataset, what
``railgate.build`` builds for railgate's own run -- a ``PromptPool`` over the dataset rows
(seeded from ``args.seed``; in dataset order when ``shuffle_dataset=False``), the gate of
``gate_kind`` (``controller.gates.registry.build_gate``: SARA, HORA, DS or uniform, the same
classes and rules), SARA's ``ReferenceScreen`` fed by ``railgate.trl.reference``, RAIL in
observe-only shadow mode when asked, the decision trace (``output_dir/trace``, written by the
main process) -- and runs them in a ``GroupTracker`` driven by ``pipeline.shells.rounds.RoundDriver``,
with ``railgate.trl.sampling.TrlSampler`` generating each round through TRL.

One call of ``next_rows`` is one TRL generation batch: the previous batch is reported trained to
the gate, rounds run until the step's prompts are all committed groups, and the step comes
back as ``prompts x num_generations`` rows in TRL's layout (``railgate.trl.rows.layout``). The
gate runs on every rank on the same gathered results; ``next_rows`` compares a fingerprint of
the step's decisions across ranks and raises if they ever differ.

Seeds (``pipeline.seeding.derive_seed`` of ``args.seed``): ``prompts`` for the pool's order,
``gate`` for the gate, ``controller`` for RAIL -- the names railgate's own run uses.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from controller.gates.registry import build_gate
from controller.gates.sara import SaraGate
from controller.noop import NoopController
from controller.prompts import PromptPool
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration
from pipeline.config.sections import OrchestratorConfig
from pipeline.core.decisions import NullSink
from pipeline.seeding import derive_seed
from pipeline.shells.rounds import RoundDriver
from pipeline.store.tracelog import TraceLog
from pipeline.types import Prompt, SamplingParams, TrainBatch
from railgate.trl.ranks import digest, gather_all
from railgate.trl.reference import ReferenceScorer, reference_column
from railgate.trl.rows import Row, layout
from railgate.trl.sampling import TrlSampler

logger = logging.getLogger(__name__)

TRACE_DIR = "trace"
"""Where in ``output_dir`` the trace goes."""


class DatasetOrder(PromptPool):
    """A ``PromptPool`` that keeps the dataset's order every epoch (``shuffle_dataset=False``)."""

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.arange(len(self.prompts))


class GateSession:
    """Gate, tracker, sampler and trace of one ``GatedGRPOTrainer``; see the module docstring."""

    def __init__(self, trainer: Any):
        args = trainer.args
        acc = trainer.accelerator
        self.trainer = trainer
        self.group_size = args.num_generations
        self.prompts = args.prompts_per_step
        dataset = trainer.train_dataset
        column = reference_column(args.gate_reference_column, dataset.column_names) if args.uses_reference else None
        if args.uses_reference and column is None:
            logger.warning(
                "gate_reference_prior=True found no reference column (looked for %s); SARA runs with its "
                "uniform prior. Set gate_reference_column to the column of reference completions.",
                ", ".join(("reference", "solution", "answer", "completion")),
            )
        self.config = args.gate_config(reference_prior=column is not None)
        prompts = [
            Prompt(i, _text(row["prompt"]), (), success_threshold=args.gate_success_threshold)
            for i, row in enumerate(dataset.select_columns(["prompt"]))
        ]
        pool_type = PromptPool if args.shuffle_dataset else DatasetOrder
        self.pool = pool_type(prompts, seed=derive_seed(args.seed, "prompts"))
        self.gate = build_gate(
            self.config,
            self.pool,
            group_size=self.group_size,
            batch_groups=self.prompts,
            seed=derive_seed(args.seed, "gate"),
        )
        self.reference = None
        if column is not None:
            self.reference = ReferenceScorer(trainer, column, exact=args.gate_reference_exact)
            screen = ReferenceScreen(
                self.reference.references,
                self.gate.source.peek,
                exact=args.gate_reference_exact,
                strength=args.gate_reference_strength,
                ahead=self.config.sara.scored_ahead(self.prompts),
                calibration=ReferenceCalibration() if args.gate_reference_calibrate else None,
            )
            self.gate.attach_reference(screen)
            self.reference.screen = screen
        run_id = args.run_name or Path(args.output_dir).name
        self._started = time.monotonic()
        self.trace = (
            TraceLog(Path(args.output_dir) / TRACE_DIR, run_id=run_id, clock=self._clock)
            if args.gate_trace and acc.is_main_process
            else NullSink()
        )
        self.driver = RoundDriver(
            self.gate,
            self._controller(args, run_id),
            self._orchestrator(args),
            step_rollouts=args.step_rollouts(),
            before_admit=self.reference.refresh if self.reference else None,
            seed=args.seed,
            run_id=run_id,
            trace=self.trace,
            now=self._clock,
            policy_version=lambda: int(trainer.state.global_step),
        )
        self.tracker = self.driver.tracker
        self.sampler = TrlSampler(trainer)
        self.rollouts_trained = 0
        self.pad_rows = 0
        self.groups_mixed = 0  # trained groups whose rewards differ (non-zero advantage somewhere)
        # gate_probe_price_steps: the probing rule that is handed the measured noise scale
        self._priced = self.gate.probing if args.gate_probe_price_steps and isinstance(self.gate, SaraGate) else None
        self._last: TrainBatch | None = None
        self._filler: Row | None = None

    def _clock(self) -> float:
        return time.monotonic() - self._started

    def _orchestrator(self, args: Any) -> OrchestratorConfig:
        return orchestrator_config(args)

    def _controller(self, args: Any, run_id: str) -> Any:
        """RAIL deciding beside the gate and never acting (``gate_rail_shadow``), or nothing."""
        if not args.gate_rail_shadow:
            return NoopController()
        from controller.rail.config import RailConfig
        from controller.rail.controller import RailController

        # Observe-only: TRL's fixed batch cannot take an intervention's extra samples, so the
        # behaviour policy is the no-op (propensity 1) and the learned policy is only logged.
        rail = RailConfig(
            mode="shadow",
            behaviour="none",
            behaviour_epsilon=0.0,
            auto_promote=False,
            token_decisions=False,
            branch_sizes=(),
            batch_group_decisions=False,
        )
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_completion_length)
        return RailController(
            rail,
            sink=self.trace,
            default_params=params,
            seed=derive_seed(args.seed, "controller"),
            run_id=run_id,
            clock=self._clock,
        )

    # --- one TRL generation batch ---------------------------------------------------------

    def next_rows(self) -> list[Row]:
        """The next generation batch's global rows (see the module docstring)."""
        if self._last is not None:
            self.driver.step_done(self._last)
            self._price_steps()
        self.sampler.begin_step()
        batch = self.driver.next_batch(self.sampler)
        self._last = batch
        groups = [[r.request_id for r in g.rollouts] for g in batch.groups]
        rows = self.sampler.rows
        if rows and self._filler is None:
            self._filler = next(iter(rows.values()))
        out = layout(
            groups,
            rows,
            self.group_size,
            self.prompts,
            pad_token=self.trainer.eos_token_ids[0],
            blank=self._blank(),
            filler=self._filler,
        )
        self.rollouts_trained += sum(not r.is_pad for r in out)
        self.groups_mixed += sum(g.is_effective for g in batch.groups)
        self.pad_rows += sum(r.is_pad for r in out)
        self._check_ranks(batch)
        return out

    def _price_steps(self) -> None:
        """``gate_probe_price_steps``: hand SARA's probing rule the noise scale of the informative
        rows in mixed groups (the trainer's measured noise scale x the run's share of trained rows
        in mixed groups / G); until it is measured the rule prices rollouts only."""
        if self._priced is None:
            return
        noise = self.trainer.noise.noise_groups(self.group_size, self.mixed_row_share)
        if math.isfinite(noise) and noise >= 0:
            self._priced.noise_groups = noise

    @property
    def mixed_row_share(self) -> float:
        """The share of the rows handed to TRL so far that sit in mixed groups (0 before any)."""
        rows = self.rollouts_trained + self.pad_rows
        return self.groups_mixed * self.group_size / rows if rows else 0.0

    def _blank(self) -> Any:
        """A pad row's completion: empty text, or an empty assistant message for chat prompts."""
        first = next(iter(self.sampler.rows.values()), self._filler)
        return (
            [{"role": "assistant", "content": ""}] if first is not None and isinstance(first.completion, list) else ""
        )

    def _check_ranks(self, batch: TrainBatch) -> None:
        """Every rank's gate made the same decisions (they see the same gathered rewards)."""
        if self.trainer.accelerator.num_processes == 1:
            return
        mine = digest(
            batch.step, [(g.group_id, g.prompt_id, g.rewards) for g in batch.groups], self.tracker.budget.state_dict()
        )
        every = gather_all([mine])
        if len(set(every)) != 1:
            raise RuntimeError(
                f"the gate's decisions differ across processes at step {batch.step} (fingerprints "
                f"{every}); every rank must see the same prompts, rewards and seed"
            )

    # --- what the logs and the callbacks read ----------------------------------------------

    @property
    def rollouts_generated(self) -> int:
        """Every rollout generated so far: the gate's, and the fillers of uneven splits."""
        return self.tracker.budget.rollouts_started + self.sampler.filler_rollouts

    def metrics(self) -> dict[str, float]:
        """``railgate/*``: cumulative counts of the run (what was generated, trained, abandoned,
        skipped, padded) and the gate's own counters (``railgate/gate/*``)."""
        budget = self.tracker.budget
        gate = self.gate.metrics()
        out = {
            "railgate/rollouts_generated": float(self.rollouts_generated),
            "railgate/tokens_generated": float(budget.tokens_generated + self.sampler.filler_tokens),
            "railgate/rollouts_trained": float(self.rollouts_trained),
            "railgate/groups_committed": float(budget.groups_committed),
            "railgate/groups_abandoned": float(budget.groups_abandoned),
            "railgate/groups_mixed_trained": float(self.groups_mixed),
            "railgate/prompts_skipped": gate.get("gate/skip_reference", 0.0),
            "railgate/filler_rollouts": float(self.sampler.filler_rollouts),
            "railgate/pad_rows": float(self.pad_rows),
            "railgate/generation_rounds": float(self.driver.rounds),
            "railgate/generation_calls": float(self.sampler.calls),
            "railgate/short_steps": float(self.driver.short_batches),
        }
        if self.reference is not None:
            out["railgate/references_dropped"] = float(self.reference.dropped)
        out.update({f"railgate/{k}": float(v) for k, v in gate.items()})
        return out

    def flush(self) -> None:
        """Write the trace's buffered records."""
        self.trace.flush()


def orchestrator_config(args: Any) -> OrchestratorConfig:
    """The tracker's limits for a ``GatedGRPOConfig``: its group size and prompts per step, one
    step at a time (no step-ahead), no cap on concurrency (the shadow gate replays under them too)."""
    return OrchestratorConfig(
        batch_groups=args.prompts_per_step,
        group_size=args.num_generations,
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p if args.top_p is not None else 1.0,
        max_concurrent_samples=1 << 20,
        max_open_groups=1 << 20,
        max_async_steps=0,
        steps=10**8,
    )


def _text(prompt: Any) -> str:
    """A prompt as text for the gate's records: the prompt, or a chat's last message."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = prompt[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return str(prompt)
