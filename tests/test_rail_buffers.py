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


@pytest.mark.parametrize("seed", range(4))
def test_a_buffer_of_many_deltas_reads_like_the_flat_response(seed):
    """Deltas of random sizes (one without entropies, the last cut by the token cap) read back
    position by position as the flat response would: prefix, mean log-prob, entropy."""
    rng = random.Random(seed)
    cap = 50
    buffers = PrefixBuffers(max_tokens=cap, max_requests=4)
    tokens, logprobs, entropies = [], [], []
    position, blind = 0, rng.randrange(3)
    k = 0
    while position < cap + 5:
        n = rng.randint(1, 9)
        t = tuple(rng.randrange(1000) for _ in range(n))
        lp = tuple(-rng.random() * 4 for _ in range(n))
        ent = None if k == blind else tuple(rng.random() * 3 for _ in range(n))
        buf = buffers.observe(0, 0, TokenDelta("g0-s0", t, lp, ent, position=position))
        position += n
        tokens += t
        logprobs += lp
        entropies += ent if ent is not None else (0.0,) * n
        k += 1
    tokens, logprobs, entropies = tokens[:cap], logprobs[:cap], entropies[:cap]
    assert buf.length == len(tokens) == cap and buf.known and not buf.has_entropy
    assert buf.tokens == tuple(tokens) and buf.logprobs == tuple(logprobs) and buf.entropies == tuple(entropies)
    for pos in range(cap + 1):
        assert buf.prefix(pos) == (tuple(tokens[:pos]), tuple(logprobs[:pos]))
        expected = sum(logprobs[:pos]) / pos if pos else 0.0
        assert buf.mean_logprob(pos) == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert buf.entropy_at(pos) == (entropies[pos] if pos < cap else 0.0)
    with pytest.raises(ValueError, match="no known prefix of 51 tokens"):
        buf.prefix(cap + 1)
