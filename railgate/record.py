"""Record full groups from a real model into a group log (``python run.py record``).

Each of the first P training prompts of the config's task (``SamplerParts.prompts``: the
task's seeded order, ``Task.train_problems(data.num_train_prompts, derive_seed(data.seed,
"train"))``, before a run's gate shuffles it) gets K samples from the run's engine with the
run's sampling settings (``orchestrator.temperature``, ``top_p``, ``max_tokens``), each
seeded as a training run seeds sample k of group g (``pipeline.seeding.sample_seed(seed, g,
k)``, request ``g<g>-s<k>``), and scored by the run's reward service. Group g is the g-th
prompt: ``group_id`` = its position, ``step`` = 0 (every group is sampled by the base policy,
``policy_version`` 0). Its ``reference_logprob`` is the policy's teacher-forced log-likelihood
of the prompt's reference response (the task's solution, then end-of-sequence), scored by
the learner as SARA's reference prior scores it (``pipeline.shells.learning``); null where the task
has no solution its reward accepts.

Prompts are sampled a batch at a time: every sample of ``batch_prompts`` prompts streams
through the engine at once, token by token, each read by its own task. A sample's
``finish_order`` is the order the engine ended its group's streams in: by the engine time of
each final event (``SampleFinished.engine_time``), then by the order the readers received
them. The torch engine stamps the rows that end in one collection of decode steps in step
order, then batch-row order, and a batch's requests join its decode batch at one step
boundary (``TorchEngine.admitting``): the order is the same in every recording of a seed,
whatever the readers' scheduling (which orders the final events of one collection by who
collected, not by when the engine ended them). On vLLM the engine time is when the reader
absorbed vLLM's output, so the order is the readers'.

Another source of prompts and rewards (``RecordSource``) replaces the config's task: ``bench
trl``'s chat tasks (``railgate.record_trl``, ``run.py record --trl-task``).

Durable and resumable: each batch's groups are one record batch of the log (fsynced) before
the next batch starts, so a crash loses at most the batch being sampled; ``record.json``
(``railgate.record_manifest``) says what the directory was recorded with, and a later run
into it records only the prompts it lacks, into a new segment.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from pipeline.config.build import to_dict
from pipeline.seeding import sample_seed
from pipeline.store.arrowio import segment_paths
from pipeline.store.grouplog import GROUPS, GroupLogWriter, RecordedGroup, RecordedSample, recorded_groups
from pipeline.types import FinishReason, Prompt, Rollout, SampleFinished, SampleRequest, SamplingParams
from railgate.build import SamplerParts, build_sampler
from railgate.config import RunConfig
from railgate.progress import ProgressBar
from railgate.record_manifest import (
    RecordError,
    RecordManifest,
    check_manifest,
    model_digest,
    read_manifest,
    write_manifest,
)

DEFAULT_SAMPLES = 16


@dataclass(frozen=True)
class RecordPlan:
    """What to record: the first ``prompts`` training prompts, ``samples`` each, sampled
    ``batch_prompts`` prompts at a time (None: as many as fill ``torch_engine.max_batch``)."""

    prompts: int
    samples: int = DEFAULT_SAMPLES
    batch_prompts: int | None = None

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise RecordError(f"--prompts {self.prompts} must be >= 1")
        if self.samples < 2:
            raise RecordError(f"--samples {self.samples} must be >= 2 (a group of one is never mixed)")
        if self.batch_prompts is not None and self.batch_prompts < 1:
            raise RecordError(f"--batch-prompts {self.batch_prompts} must be >= 1")

    def batch_size(self, max_batch: int) -> int:
        """Prompts per batch: ``batch_prompts``, or as many whose samples fit ``max_batch`` rows."""
        return self.batch_prompts or max(1, max_batch // self.samples)


@dataclass(frozen=True)
class RecordResult:
    """What a recording did."""

    out: Path
    prompts: int
    samples: int
    kept: int
    """Groups already in ``out`` when it started (a resume)."""
    recorded: int
    """Groups this run wrote."""
    segment: Path | None
    """The segment it wrote them to (None: nothing left to record)."""
    setup_s: float
    """Building the parts: warm start or model load, engine start."""
    sampling_s: float
    """Sampling, scoring and writing the groups it recorded."""
    mixed: int
    """Groups of the whole log with both a success and a failure."""
    no_reward: int
    """Samples whose reward function gave none (recorded as 0)."""
    reward_failures: int = 0
    """Samples whose reward function raised or timed out (scored 0, as in a training run)."""

    def summary(self) -> str:
        per_group = self.sampling_s / self.recorded if self.recorded else math.nan
        lines = [
            f"recorded {self.recorded} groups x {self.samples} samples into {self.out}"
            + (f" ({self.segment.name})" if self.segment is not None else "")
            + (f"; {self.kept} were there already" if self.kept else ""),
            f"the log holds {self.kept + self.recorded} of {self.prompts} prompts, {self.mixed} groups mixed",
            f"time: setup {self.setup_s:.1f} s, sampling {self.sampling_s:.1f} s"
            + (f" = {per_group * 1000:.0f} ms per group" if self.recorded else ""),
        ]
        if self.no_reward:
            lines.append(f"{self.no_reward} samples got no reward from the reward function and are recorded as 0")
        if self.reward_failures:
            lines.append(f"{self.reward_failures} samples' rewards raised or timed out and are recorded as 0")
        return "\n".join(lines)


class RecordSource(Protocol):
    """Where a recording's prompts, model parts and rewards come from: the config's own task
    (``ConfigTask``, the default) or another (``railgate.record_trl.TrlRecordSource``: a ``bench
    trl`` task)."""

    def build(self, cfg: RunConfig, num_prompts: int, progress: bool = True) -> SamplerParts:
        """The parts that sample, score and reference-score the first ``num_prompts`` prompts."""
        ...

    def manifest_task(self, cfg: RunConfig) -> dict[str, Any]:
        """The task settings ``record.json`` records (a resume must match them)."""
        ...

    def manifest_data(self, cfg: RunConfig) -> dict[str, Any]:
        """What decides the prompts and their order, as ``record.json`` records it."""
        ...


class ConfigTask:
    """The config's task (``task.*``), its training prompts in ``data.seed``'s order."""

    def build(self, cfg: RunConfig, num_prompts: int, progress: bool = True) -> SamplerParts:
        return build_sampler(cfg, num_prompts, progress=progress)

    def manifest_task(self, cfg: RunConfig) -> dict[str, Any]:
        return _task_settings(cfg)

    def manifest_data(self, cfg: RunConfig) -> dict[str, Any]:
        return {"seed": cfg.data.seed, "num_train_prompts": cfg.data.num_train_prompts}


def manifest_of(
    cfg: RunConfig, parts: SamplerParts, plan: RecordPlan, source: RecordSource | None = None
) -> RecordManifest:
    """The ``record.json`` of a recording of ``cfg`` with ``parts`` and ``plan`` (from ``source``,
    None: the config's task)."""
    source = source or ConfigTask()
    o = cfg.orchestrator
    return RecordManifest(
        model=str(parts.model_dir.resolve()),
        model_digest=model_digest(parts.model_dir),
        task=source.manifest_task(cfg),
        data=source.manifest_data(cfg),
        prompts=plan.prompts,
        samples=plan.samples,
        seed=cfg.seed,
        engine=cfg.engine.kind,
        sampling={"temperature": o.temperature, "top_p": o.top_p, "max_tokens": o.max_tokens},
    )


def _task_settings(cfg: RunConfig) -> dict[str, Any]:
    """The task settings that decide the prompts and rewards: the shared ones and the section of
    the task named (``task.arithmetic`` for arithmetic; other tasks' sections do not matter)."""
    task = to_dict(cfg.task)
    return {k: v for k, v in task.items() if not isinstance(v, dict) or k == task["name"]}


def record(
    cfg: RunConfig,
    out: str | Path,
    plan: RecordPlan,
    progress: bool | None = None,
    on_written: Callable[[int], None] | None = None,
    source: RecordSource | None = None,
) -> RecordResult:
    """Record ``plan`` from ``cfg``'s model into the group log ``out`` (resuming it if it holds
    groups); ``on_written(groups)`` is called after each batch is durable, with the groups
    the log holds then. ``source``: where the prompts and rewards come from (None: the
    config's task)."""
    out = Path(out)
    show = cfg.log.progress if progress is None else progress
    source = source or ConfigTask()
    started = time.monotonic()
    parts = source.build(cfg, plan.prompts, progress=show)
    try:
        manifest = manifest_of(cfg, parts, plan, source)
        if read_manifest(out) is None:
            if segment_paths(out, GROUPS.prefix) if out.exists() else []:
                raise RecordError(
                    f"--out {out} holds groups that run.py record did not write (no record.json); "
                    "record into a new --out directory"
                )
            write_manifest(out, manifest)
        check_manifest(out, manifest)
        kept = _kept_groups(out, parts.prompts, plan)
        recorder = _Recorder(cfg, parts, plan)
        todo = [i for i in range(plan.prompts) if i not in {g.group_id for g in kept}]
        batch = plan.batch_size(cfg.torch_engine.max_batch)
        setup_s = time.monotonic() - started
        bar = ProgressBar(total=plan.prompts, enabled=show, desc="record", initial=len(kept))
        new: list[RecordedGroup] = []
        segment = None
        sampling_started = time.monotonic()
        try:
            if todo:
                with GroupLogWriter(out, run_id=cfg.name) as writer:
                    segment = writer.path

                    async def run_all() -> None:
                        for start in range(0, len(todo), batch):
                            groups = await recorder.sample_groups(todo[start : start + batch])
                            writer.write(groups)  # one record batch, fsynced: durable before the next
                            new.extend(groups)
                            bar.update(len(kept) + len(new), {})
                            if on_written is not None:
                                on_written(len(kept) + len(new))

                    anyio.run(_closing(run_all, parts.engine))
        finally:
            bar.close()
        sampling_s = time.monotonic() - sampling_started
    finally:
        parts.scoring.close()
    everything = kept + new
    return RecordResult(
        out=out,
        prompts=plan.prompts,
        samples=plan.samples,
        kept=len(kept),
        recorded=len(new),
        segment=segment,
        setup_s=setup_s,
        sampling_s=sampling_s,
        mixed=sum(g.is_mixed for g in everything),
        no_reward=recorder.no_reward,
        reward_failures=parts.scoring.errors + parts.scoring.timeouts,
    )


def _closing(work: Callable[[], Any], engine: Any) -> Callable[[], Any]:
    """``work`` then the engine's close, in one event loop (vLLM's client is bound to its loop)."""

    async def main() -> None:
        try:
            await work()
        finally:
            with anyio.CancelScope(shield=True):
                await engine.aclose()

    return main


def _kept_groups(out: Path, prompts: Sequence[Prompt], plan: RecordPlan) -> list[RecordedGroup]:
    """The groups ``out`` holds already, each checked against the prompt at its position."""
    kept = recorded_groups(out) if out.exists() else []
    for g in kept:
        where = f"--out {out}: group {g.group_id}"
        if not 0 <= g.group_id < plan.prompts:
            raise RecordError(f"{where} is not one of the {plan.prompts} prompts asked for; record into a new --out")
        expected = prompts[g.group_id]
        if g.prompt_id != expected.prompt_id or g.step != 0 or g.size != plan.samples:
            raise RecordError(
                f"{where} holds prompt {g.prompt_id} at step {g.step} with {g.size} samples, where this recording "
                f"has prompt {expected.prompt_id} at step 0 with {plan.samples}; the directory was recorded from "
                "other prompts: record into a new --out directory"
            )
    return kept


class _Recorder:
    """Samples, scores and assembles the groups of one batch of prompts."""

    def __init__(self, cfg: RunConfig, parts: SamplerParts, plan: RecordPlan) -> None:
        self.parts, self.plan, self.seed = parts, plan, cfg.seed
        o = cfg.orchestrator
        self.temperature, self.top_p, self.max_tokens = o.temperature, o.top_p, o.max_tokens
        self.no_reward = 0

    def reference_logprobs(self, prompts: Sequence[Prompt]) -> dict[int, float]:
        """Each prompt's reference log-likelihood under the policy (prompts with a reference)."""
        refs = self.parts.references
        scored = [p for p in dict.fromkeys(prompts) if p.prompt_id in refs]
        rollouts = [
            Rollout(f"reference-{p.prompt_id}", 0, p.token_ids, refs[p.prompt_id], (), 1.0, FinishReason.STOP, -1)
            for p in scored
        ]
        if not rollouts:
            return {}
        return {p.prompt_id: float(sum(lps)) for p, lps in zip(scored, self.parts.learner.logprobs(rollouts))}

    def request(self, group_id: int, index: int) -> SampleRequest:
        """Sample ``index`` of group ``group_id``, seeded as a training run seeds it."""
        params = SamplingParams(self.temperature, self.top_p, self.max_tokens, sample_seed(self.seed, group_id, index))
        return SampleRequest(f"g{group_id}-s{index}", group_id, index, self.parts.prompts[group_id], params)

    async def sample_groups(self, group_ids: Sequence[int]) -> list[RecordedGroup]:
        """The full groups of ``group_ids``: all their samples streamed at once."""
        prompts = self.parts.prompts
        logprobs = await anyio.to_thread.run_sync(self.reference_logprobs, [prompts[g] for g in group_ids])
        engine = self.parts.engine
        requests = [self.request(g, k) for g in group_ids for k in range(self.plan.samples)]
        admitting = getattr(engine, "admitting", contextlib.nullcontext)
        with admitting():  # the torch engine: every request joins at one step boundary
            streams = [engine.stream(r) for r in requests]
        ended: dict[int, list[tuple[float, int, int]]] = {g: [] for g in group_ids}
        results: dict[tuple[int, int], tuple[SampleFinished, float]] = {}
        received = itertools.count()

        async def consume(request: SampleRequest, stream: Any) -> None:
            final = None
            async with contextlib.aclosing(stream):
                async for event in stream:
                    if isinstance(event, SampleFinished):
                        final = event
                        ended[request.group_id].append((event.engine_time, next(received), request.sample_index))
            if final is None or not final.finish_reason.is_success:
                why = "no final event" if final is None else f"{final.finish_reason.name}: {final.error}"
                raise RecordError(f"sample {request.request_id} did not complete ({why}); the engine failed")
            reward, _error = await self.parts.scoring.score(request.prompt, final.token_ids)
            results[request.group_id, request.sample_index] = (final, reward)

        try:
            async with anyio.create_task_group() as tg:
                for request, stream in zip(requests, streams):
                    tg.start_soon(consume, request, stream)
        finally:
            for stream in streams:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
        return [self._group(g, ended[g], results, logprobs.get(prompts[g].prompt_id)) for g in group_ids]

    def _group(
        self,
        group_id: int,
        ended: list[tuple[float, int, int]],
        results: dict[tuple[int, int], tuple[SampleFinished, float]],
        reference_logprob: float | None,
    ) -> RecordedGroup:
        prompt = self.parts.prompts[group_id]
        order = {index: rank for rank, (_, _, index) in enumerate(sorted(ended))}
        samples = []
        for k in range(self.plan.samples):
            final, reward = results[group_id, k]
            if math.isnan(reward):  # the reward function gave none: a log's rewards are numbers
                self.no_reward += 1
                reward = 0.0
            samples.append(
                RecordedSample(
                    index=k,
                    reward=float(reward),
                    num_tokens=final.num_tokens,
                    finish_order=order[k],
                    token_ids=tuple(final.token_ids),
                    text=self.parts.tokenizer.decode(final.token_ids),
                    finish_reason=final.finish_reason,
                    policy_version=final.policy_version,
                )
            )
        return RecordedGroup(
            group_id=group_id,
            prompt_id=prompt.prompt_id,
            samples=tuple(samples),
            step=0,
            prompt_text=prompt.text,
            answer=prompt.answer,
            difficulty=prompt.difficulty
            if self.parts.difficulties is None
            else self.parts.difficulties[prompt.prompt_id],
            reference_logprob=reference_logprob,
            success_threshold=prompt.success_threshold,
        )
