"""Paired, common-draw comparisons of a benchmark's policies: final accuracy and its differences.

Every run of one seed evaluates the same held-out prompts with the same random draws (the
engines key them by seed, prompt and sample: ``pipeline.evaluation``), so two policies' final
evaluations at a seed differ by what the policies learned, not by luck of the draw. Each run
keeps the per-prompt success rates of its first and last evaluation (``RateLog``); a table
states, per policy, the final accuracy and its difference from a reference policy (GRPO,
``uniform``, where the benchmark ran it) as ``mean (lo to hi)``: the mean over seeds and prompts
and the 95% interval over both (``pipeline.intervals.seeds_and_prompts``: seed-to-seed and
prompt-to-prompt variation, Welch-Satterthwaite t), within [0, 1] for an accuracy and [-1, 1]
for a difference. Below ``pipeline.intervals.MIN_SEEDS`` seeds the seed-to-seed part is not
resolved: the interval is then over prompts only and the text says so ("prompts only, 2
seeds"). "Final" is each run's last evaluation.

>>> runs = [{"policy": p, "seed": s, "rates_final": r} for p, s, r in
...         [("uniform", 0, [0.5, 0.25, 1.0]), ("sara", 0, [0.75, 0.25, 1.0]),
...          ("uniform", 1, [0.5, 0.5, 0.75]), ("sara", 1, [0.75, 0.5, 1.0])]]
>>> difference(runs, "sara", "uniform")
'+0.125 (-0.186 to +0.436; prompts only, 2 seeds)'
>>> difference(runs, "uniform", "uniform"), final_accuracy(runs, "sara")
('+0.000 (+0.000 to +0.000; prompts only, 2 seeds)', '0.708 (0.000 to 1.000; prompts only, 2 seeds)')
>>> runs += [{"policy": "sara", "seed": 2, "rates_final": [0.75, 0.5, 0.75]}]
>>> final_accuracy(runs, "sara")  # three seeds: over seeds and prompts
'0.694 (0.090 to 1.000)'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pipeline.intervals import RATES, Interval, seeds_and_prompts

REFERENCE = "uniform"
"""The policy every other is compared with, when the benchmark ran it."""


class RateLog:
    """Wraps an evaluator (``pipeline.evaluation.SamplingEvaluator`` or the simulator's) and
    keeps the per-prompt success rates of every evaluation, by step.

    >>> import anyio
    >>> class Fixed:
    ...     last_rates = (0.5, 1.0)
    ...     async def evaluate(self, step): return {"eval/accuracy": 0.75}
    >>> log = RateLog(Fixed())
    >>> anyio.run(log.evaluate, 0), log.record()
    ({'eval/accuracy': 0.75}, {'rates_start': [0.5, 1.0], 'rates_final': [0.5, 1.0]})
    """

    def __init__(self, evaluator: Any):
        self.evaluator = evaluator
        self.rates: dict[int, tuple[float, ...]] = {}

    async def evaluate(self, step: int) -> dict[str, float]:
        result = await self.evaluator.evaluate(step)
        self.rates[step] = tuple(round(r, 6) for r in getattr(self.evaluator, "last_rates", ()))
        return result

    def record(self) -> dict[str, list[float]]:
        """The run record's ``rates_start`` and ``rates_final`` (empty without evaluations)."""
        if not self.rates:
            return {"rates_start": [], "rates_final": []}
        return {"rates_start": list(self.rates[min(self.rates)]), "rates_final": list(self.rates[max(self.rates)])}


def _by_seed(runs: Sequence[dict[str, Any]], policy: str, key: str) -> dict[int, list[float]]:
    return {r["seed"]: r[key] for r in runs if r["policy"] == policy and r.get(key)}


def _text(e: Interval, signed: bool, seeds: int) -> str:
    if not math.isfinite(e.mean):
        return "n/a"
    f = "+.3f" if signed else ".3f"
    if not (math.isfinite(e.lo) and math.isfinite(e.hi)):
        return f"{e.mean:{f}}"
    scope = f"; prompts only, {seeds} seed{'s' if seeds != 1 else ''}" if e.scope == "prompts" else ""
    return f"{e.mean:{f}} ({e.lo:{f}} to {e.hi:{f}}{scope})"


def final_accuracy(runs: Sequence[dict[str, Any]], policy: str) -> str:
    """The policy's final accuracy over seeds and prompts, with its 95% interval."""
    rates = list(_by_seed(runs, policy, "rates_final").values())
    if not rates or len({len(r) for r in rates}) != 1:
        return "n/a"
    return _text(seeds_and_prompts(rates, bounds=RATES), signed=False, seeds=len(rates))


def difference(runs: Sequence[dict[str, Any]], policy: str, reference: str = REFERENCE) -> str:
    """Final accuracy of ``policy`` minus ``reference``'s, paired by seed and prompt, with its
    95% interval over seeds and prompts; 'n/a' when they share no seed."""
    mine, theirs = _by_seed(runs, policy, "rates_final"), _by_seed(runs, reference, "rates_final")
    seeds = sorted(s for s in mine if s in theirs and len(mine[s]) == len(theirs[s]))
    if not seeds or len({len(mine[s]) for s in seeds}) != 1:
        return "n/a"
    paired = [[a - b for a, b in zip(mine[s], theirs[s])] for s in seeds]  # seed by seed, prompt by prompt
    return _text(seeds_and_prompts(paired), signed=True, seeds=len(seeds))


def reference_of(policies: Sequence[str]) -> str | None:
    """GRPO (``uniform``) when the benchmark ran it; else no reference (no difference column)."""
    return REFERENCE if REFERENCE in policies else None
