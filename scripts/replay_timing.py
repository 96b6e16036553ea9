"""Time ``bench replay`` on a synthetic log of 1,000 prompts x 16 samples (not a test).

    python scripts/replay_timing.py [--prompts 1000] [--samples 16] [--orders 1]

Writes the log (pass rates drawn from Beta(0.4, 0.6), reference log-likelihoods near them,
20-200 tokens a sample) to a temporary directory, replays every default gate on it under one
order and prints each gate's seconds and the total.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import numpy as np

from pipeline.replay.order import ReplayOrder
from pipeline.store.grouplog import GroupLogWriter, RecordedGroup, RecordedSample, read_group_log
from railgate.replay.bench import DEFAULT_GATES, gate_config
from railgate.replay.driver import replay
from railgate.replay.gate_parts import not_replayable


def synthetic_groups(prompts: int, samples: int, seed: int = 0) -> list[RecordedGroup]:
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
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--orders", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        with GroupLogWriter(d, run_id="synthetic", fsync=False) as w:
            w.write(synthetic_groups(args.prompts, args.samples))
        log = read_group_log(d)
    total = 0.0
    for name in DEFAULT_GATES:
        cfg = gate_config(name, args.samples, 32, ())
        if not_replayable(cfg):
            continue
        for seed in range(args.orders):
            order = ReplayOrder(log, seed)
            started = time.perf_counter()
            run = replay(cfg, order, args.samples, 32)
            took = time.perf_counter() - started
            total += took
            print(f"{name:15s} order {seed}: {took:5.2f} s, {sum(o.samples for o in run.outcomes):,} rollouts")
    print(f"all gates: {total:.2f} s")


if __name__ == "__main__":
    main()
