"""A round's samples generated and scored by TRL itself, split over its processes.

``TrlSampler`` is the ``pipeline.shells.rounds.Sampler`` of a ``GatedGRPOTrainer``: given the samples
the gate launched this round (``SampleRequest``\\ s, identical on every rank), it cuts them into
runs of one group's consecutive samples, makes one generation call per run length (a probe of
k, the rest of G - k, one more), and in each call every process generates an equal contiguous
share (``railgate.trl.ranks.Split``) through TRL's own ``_generate`` -- transformers
``generate``, continuous batching or vLLM, whichever the config picked, with TRL's
tokenization and decoding -- and scores it with TRL's ``_calculate_rewards`` (the user's
reward functions, weights, async functions and reward models). Rewards come back gathered;
the completions are gathered too, so every rank keeps every row (``rows``, by request id) and
the gate sees the same group on every rank.

vLLM's server mode sends the gathered prompts of a call as one request, taking every
``num_generations``-th prompt and asking for ``num_generations`` completions of each: the call
runs with ``num_generations`` set to its run length, so a probe of k is one request with n = k
and the rest of the committed groups another with n = G - k (tests/test_trl_vllm.py checks the
two requests against a fake server).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pipeline.shells.rounds import Generated
from pipeline.types import FinishReason, SampleRequest
from railgate.trl.ranks import Split, gather_all
from railgate.trl.rows import Row, scalar_reward


class TrlSampler:
    """Generates and scores a round's requests with ``trainer``; see the module docstring."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.rows: dict[str, Row] = {}  # this step's completions, by request id
        self.filler_rollouts = 0
        self.filler_tokens = 0
        self.calls = 0  # generation calls (one per run length per round)
        self._weights = [float(w) for w in trainer.reward_weights]
        self._stops = set(trainer.eos_token_ids) | {trainer._tokenizer.pad_token_id}

    def begin_step(self) -> None:
        """Forget the previous step's rows (they were trained on)."""
        self.rows = {}

    def __call__(self, requests: Sequence[SampleRequest]) -> list[Generated]:
        out: dict[str, Generated] = {}
        for length, runs in _runs_by_length(requests).items():
            out.update(self._call(length, runs))
        return [out[r.request_id] for r in requests]

    def _call(self, length: int, runs: list[list[SampleRequest]]) -> dict[str, Generated]:
        """One generation call: ``runs`` (each ``length`` samples of one prompt), split over the ranks."""
        trainer = self.trainer
        acc = trainer.accelerator
        split = Split.of(len(runs), length, acc.num_processes)
        flat = [r for run in runs for r in run] + [runs[-1][0]] * split.fillers
        mine = [flat[i] for i in split.local(acc.process_index)]
        inputs = [dict(trainer.train_dataset[r.prompt.prompt_id]) for r in mine]
        prompts = [x["prompt"] for x in inputs]
        with _group_size(trainer, length):
            prompt_ids, completion_ids, _, completions, logprobs, *_ = trainer._generate(prompts)
        pending = trainer._pending_extra_logs
        before = {k: len(v) for k, v in pending.items()}
        rewards = trainer._calculate_rewards(inputs, prompts, completions, completion_ids).cpu().tolist()
        extras = _take_extras(pending, before, len(mine))
        local = [
            (tuple(p), tuple(c), comp, None if logprobs is None else tuple(lp), extra)
            for p, c, comp, lp, extra in zip(
                prompt_ids, completion_ids, completions, logprobs or [None] * len(mine), extras
            )
        ]
        everything = gather_all(local)
        self.calls += 1
        out = {}
        for i, (request, (p, c, comp, lp, extra)) in enumerate(zip(flat, everything)):
            if i >= len(flat) - split.fillers:
                self.filler_rollouts += 1
                self.filler_tokens += len(c)
                continue
            row = Row(request.prompt.prompt_id, p, c, comp, lp, tuple(float(x) for x in rewards[i]), extras=extra)
            self.rows[request.request_id] = row
            truncated = bool(c) and c[-1] not in self._stops
            out[request.request_id] = Generated(
                token_ids=c,
                reward=scalar_reward(row.rewards, self._weights),
                finish_reason=FinishReason.LENGTH if truncated else FinishReason.STOP,
            )
        return out


def _runs_by_length(requests: Sequence[SampleRequest]) -> OrderedDict[int, list[list[SampleRequest]]]:
    """Consecutive requests of one group as runs, the runs bucketed by length in order of first
    appearance (a run of one prompt stays together in the call of its length).

    >>> from pipeline.types import Prompt, SamplingParams
    >>> def req(g, i):
    ...     return SampleRequest(f"g{g}-s{i}", g, i, Prompt(g, "", ()), SamplingParams())
    >>> buckets = _runs_by_length([req(0, 4), req(0, 5), req(1, 0), req(1, 1), req(2, 0)])
    >>> {n: [[r.request_id for r in run] for run in runs] for n, runs in buckets.items()}
    {2: [['g0-s4', 'g0-s5'], ['g1-s0', 'g1-s1']], 1: [['g2-s0']]}
    """
    runs: list[list[SampleRequest]] = []
    for request in requests:
        if runs and runs[-1][0].group_id == request.group_id:
            runs[-1].append(request)
        else:
            runs.append([request])
    buckets: OrderedDict[int, list[list[SampleRequest]]] = OrderedDict()
    for run in runs:
        buckets.setdefault(len(run), []).append(run)
    return buckets


def _take_extras(pending: dict[str, list], before: dict[str, int], rows: int) -> list[tuple[tuple[str, Any], ...]]:
    """What the reward functions logged per row during one call (``log_extra``), taken out of
    TRL's pending logs: the rows it belongs to may never be trained on, and a trained row brings
    it back when its batch is logged."""
    per_row: list[dict[str, Any]] = [{} for _ in range(rows)]
    for column, values in pending.items():
        start = before.get(column, 0)
        for row, value in zip(per_row, values[start:]):
            row[column] = value
        del values[start:]
    return [tuple(sorted(r.items())) for r in per_row]


@contextmanager
def _group_size(trainer: Any, n: int) -> Iterator[None]:
    """TRL's ``_generate`` with ``num_generations`` = ``n``: the run length vLLM's server mode
    groups the gathered prompts by (the other backends generate one completion per row)."""
    saved = trainer.num_generations
    trainer.num_generations = n
    try:
        yield
    finally:
        trainer.num_generations = saved
