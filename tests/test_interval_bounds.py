"""Accuracy intervals mean what they say: within [0, 1], no t interval on one degree of freedom
of seeds, and the paired difference keeps its pairing (issue 53, item 5)."""

from __future__ import annotations

import math
import random

from pipeline.intervals import MIN_SEEDS, over_seeds, paired_difference, prompt_mean, seeds_and_prompts
from railgate.bench.paired import difference, final_accuracy


def _rates(rng: random.Random, n: int, p: float) -> list[float]:
    return [sum(rng.random() < p for _ in range(4)) / 4 for _ in range(n)]


def test_accuracy_intervals_stay_within_zero_and_one():
    rng = random.Random(0)
    for p in (0.01, 0.05, 0.5, 0.95, 0.99):
        for n in (2, 3, 8, 64):
            e = prompt_mean(_rates(rng, n, p))
            assert 0.0 <= e.lo <= e.mean <= e.hi <= 1.0, (p, n, e)
            seeds = [_rates(rng, n, p) for _ in range(rng.choice((2, 3, 5)))]
            e = seeds_and_prompts(seeds, bounds=(0.0, 1.0))
            assert 0.0 <= e.lo <= e.mean <= e.hi <= 1.0, (p, n, e)


def test_differences_stay_within_minus_one_and_one():
    e = paired_difference([1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0])
    assert -1.0 <= e.lo and e.hi <= 1.0
    assert e.hi == 1.0  # t alone reaches 1.55


def test_too_few_seeds_leave_their_part_unresolved_and_the_report_says_so():
    # The case: two seeds whose means differ a lot; Welch t had about one degree of
    # freedom there and printed 0.040 to 1.223 for an accuracy of 0.631.
    a = [0.6] * 50 + [0.7] * 50
    b = [0.5] * 50 + [0.7] * 50
    two = seeds_and_prompts([a, b], bounds=(0.0, 1.0))
    assert two.scope == "prompts"
    per_prompt = prompt_mean([(x + y) / 2 for x, y in zip(a, b)])
    assert (two.lo, two.hi) == (per_prompt.lo, per_prompt.hi)
    runs = [{"policy": "uniform", "seed": s, "rates_final": r} for s, r in enumerate((a, b))]
    assert final_accuracy(runs, "uniform").endswith("; prompts only, 2 seeds)")
    three = seeds_and_prompts([a, b, a], bounds=(0.0, 1.0))
    assert MIN_SEEDS == 3 and three.scope == "" and three.hi - three.lo > two.hi - two.lo


def test_over_seeds_gives_no_interval_below_three_seeds():
    assert math.isnan(over_seeds([0.1, 0.3]).lo)
    e = over_seeds([0.1, 0.3, 0.2])
    assert e.lo < 0.2 < e.hi


def test_the_paired_difference_keeps_its_pairing():
    # Prompt-to-prompt variation is large, but each prompt moved by exactly +0.25 under the
    # policy: paired, the interval is the point; unpaired it would span the prompts' spread.
    rng = random.Random(1)
    base = [[rng.choice((0.0, 0.25, 0.5, 0.75)) for _ in range(40)] for _ in range(2)]
    runs = [{"policy": "uniform", "seed": s, "rates_final": r} for s, r in enumerate(base)]
    runs += [{"policy": "sara", "seed": s, "rates_final": [x + 0.25 for x in r]} for s, r in enumerate(base)]
    assert difference(runs, "sara") == "+0.250 (+0.250 to +0.250; prompts only, 2 seeds)"
