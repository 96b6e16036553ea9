"""A synthetic group log: ``bench replay --synthetic PROMPTSxSAMPLES`` times the replay on it.

Each prompt's pass rate is drawn from Beta(0.4, 0.6) (many near-sure and near-hopeless prompts,
as late in a real run), its K samples succeed with that rate, finish in a random order and run
20-199 tokens; the reference log-likelihood is the pass rate plus noise (sd 0.05), so it behaves
like an exact reference. Two groups share each prompt id. Seeded: the same arguments give the
same log. It measures the replay's speed, not a model: its figures say nothing about any gate
on real data.

>>> log = synthetic_log(4, 8)
>>> log.group_size, len(log.groups), synthetic_log(4, 8) == log
(8, 4, True)
>>> parse_size("1000x16")
(1000, 16)
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.config.build import ConfigError
from pipeline.store.grouplog import GroupLog, RecordedGroup, RecordedSample


def parse_size(text: str) -> tuple[int, int]:
    """``"PROMPTSxSAMPLES"`` -> (prompts, samples), or a ``ConfigError`` naming the form."""
    try:
        prompts, samples = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--synthetic {text!r}: write PROMPTSxSAMPLES, e.g. --synthetic 1000x16") from None
    if prompts < 1 or samples < 2:
        raise ConfigError(f"--synthetic {text!r}: at least 1 prompt and 2 samples each")
    return prompts, samples


def synthetic_log(prompts: int, samples: int, seed: int = 0) -> GroupLog:
    """``prompts`` groups of ``samples`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(prompts):
        p = rng.beta(0.4, 0.6)
        rewards = (rng.random(samples) < p).astype(float)
        tokens = rng.integers(20, 200, samples)
        finish = rng.permutation(samples)
        q = min(0.999, max(1e-4, p + rng.normal(0, 0.05)))
        recorded = tuple(RecordedSample(i, float(rewards[i]), int(tokens[i]), int(finish[i])) for i in range(samples))
        groups.append(RecordedGroup(g, g // 2, recorded, reference_logprob=math.log(q)))
    return GroupLog(tuple(groups), (f"synthetic {prompts}x{samples}",), "synthetic")
