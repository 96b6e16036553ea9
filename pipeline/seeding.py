"""Every random source's seed, derived from the run seed in this one place.

``derive_seed(run_seed, "gate")`` gives the gate's seed, ``derive_seed(run_seed, "sample",
group_id, index)`` a sample's, and so on: stable across runs and processes (no ``hash()``,
whose value changes per process), independent between components.

>>> derive_seed(0, "gate") == derive_seed(0, "gate"), derive_seed(0, "gate") == derive_seed(1, "gate")
(True, False)
"""

from __future__ import annotations

import hashlib


def derive_seed(run_seed: int, *names: object) -> int:
    """A 63-bit seed for the component named by ``names`` under ``run_seed``."""
    key = "/".join([str(int(run_seed)), *map(str, names)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def sample_seed(run_seed: int, group_id: int, sample_index: int) -> int:
    """Seed of one sample; a cheap arithmetic mix, since it is called for every rollout."""
    x = int(run_seed) * 0x9E3779B97F4A7C15 + group_id * 0xBF58476D1CE4E5B9 + sample_index * 0x94D049BB133111EB
    return (x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF
