"""RAIL's prefix buffers: the group-level branch point (``PrefixBuffers.best_prefix``)."""

from __future__ import annotations

import random

import pytest

from controller.rail.buffers import PrefixBuffers
from pipeline.types import TokenDelta


def reference_best(buffers, group_id, highest, room):
    """``best_prefix``'s rule spelled out with the buffers' own ``mean_logprob``."""
    best, best_score = None, None
    for buf in buffers.group(group_id):
        if not buf.known or buf.length < 2:
            continue
        for q in (1, 2, 3):
            pos = min(max(1, buf.length * q // 4), buf.length - 1, room - 1)
            if pos < 1:
                continue
            score = buf.mean_logprob(pos) * (1 if highest else -1)
            if best_score is None or score > best_score:
                best, best_score = (buf, pos), score
    return best


@pytest.mark.parametrize("seed", range(5))
def test_the_best_prefix_is_the_cut_with_the_highest_or_lowest_mean_logprob(seed):
    rng = random.Random(seed)
    buffers = PrefixBuffers(max_tokens=64, max_requests=64)
    for index in range(8):
        length = rng.choice([1, 2, 3, 7, 20, 40])
        start = 0 if index % 4 else rng.choice([0, 5])  # a request that starts mid-response is never branched
        logprobs = tuple(-rng.random() * 3 for _ in range(length))
        buffers.observe(1, index, TokenDelta(f"g1-s{index}", tuple(range(length)), logprobs, None, position=start))
    found = 0
    for highest in (True, False):
        for room in (1, 2, 6, 64):
            best = buffers.best_prefix(1, highest, room)
            expected = reference_best(buffers, 1, highest, room)
            assert (best is None) == (expected is None)
            if best is not None:
                found += 1
                assert best[0] is expected[0] and best[1] == expected[1] and best[1] < min(best[0].length, room)
    assert found > 0 and buffers.best_prefix(2, True, 64) is None  # another group has no buffers
