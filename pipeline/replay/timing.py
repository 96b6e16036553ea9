"""When a replayed sample's tokens arrive: one rule for the replay engine and ``bench replay``.

A replayed sample is streamed at its recorded length: launched at engine time ``t`` on a decoder
of ``rate`` tokens a second, its token ``j`` (0-based) is out at ``t + (j + 1) / rate`` and it
finishes at ``t + n / rate``. An abort at engine time ``u`` pays for the tokens out by then.
Both replay paths (the pipeline over ``pipeline.engines.replay`` and ``bench replay``'s direct
driver) count time and tokens through these two functions, so they agree to the token.

>>> finish_time(launched_at=2.0, num_tokens=30, rate=10.0)
5.0
>>> tokens_out(launched_at=2.0, num_tokens=30, rate=10.0, now=3.05), tokens_out(2.0, 30, 10.0, now=9.0)
(10, 30)
"""

from __future__ import annotations

import math

DEFAULT_RATE = 1000.0
"""Tokens a second a replayed sample is released at, unless the replay says otherwise."""


def finish_time(launched_at: float, num_tokens: int, rate: float) -> float:
    """Engine time at which a sample launched at ``launched_at`` finishes."""
    return launched_at + num_tokens / rate


def tokens_out(launched_at: float, num_tokens: int, rate: float, now: float) -> int:
    """Tokens a sample has released by engine time ``now`` (what an abort then pays for)."""
    if now <= launched_at:
        return 0
    # a small tolerance so that a token due exactly at `now` counts despite float rounding
    return min(num_tokens, int(math.floor((now - launched_at) * rate + 1e-9)))
