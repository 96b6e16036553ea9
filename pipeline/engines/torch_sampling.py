"""Per-row sampling for the torch engine: temperature, top-p and counter-based random numbers.

Every row of a decode batch carries its own temperature, top-p and random stream. A row's
random number at response position ``t`` is a pure function of its 64-bit stream key and
``t`` (a splitmix64 hash), so a sample does not depend on which other rows share its batch
or on the order requests arrived in. Sampling is inverse-CDF with that one uniform per row:
top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (a prefix of
the sorted order), so the uniform is scaled by that mass and looked up in the sorted CDF.

Reported log-probs and entropies are those of the *policy at temperature 1* (plain
``log_softmax`` of the logits), whatever temperature and top-p the token was sampled with:
that is the distribution the learner scores, so PPO ratios compare like with like. The
probability the token was actually drawn with differs when ``temperature != 1`` or
``top_p < 1``.

>>> import numpy as np, torch
>>> key = stream_key(0, 7, group_id=0, sample_index=0)
>>> u = uniforms(np.array([key, key], dtype=np.uint64), np.array([0, 0]))
>>> bool(u[0] == u[1]) and 0.0 <= float(u[0]) < 1.0
True
>>> int(_splitmix64(np.array([12345], dtype=np.uint64))[0]) == _splitmix64_int(12345)
True
>>> logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
>>> tok, lp, ent = sample_rows(logits, torch.tensor([[1e-3], [1.0]]), torch.ones(2),
...                            torch.tensor([0.99, 0.99], dtype=torch.float64), use_top_p=False)
>>> tok.tolist()  # near-greedy: the argmax; T=1 with u=0.99: the last token of the CDF
[1, 2]
>>> bool(torch.allclose(lp, torch.log_softmax(logits, -1).gather(1, tok[:, None])[:, 0]))
True
"""

from __future__ import annotations

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (arithmetic wraps modulo 2**64)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def stream_key(engine_seed: int, sample_seed: int, group_id: int, sample_index: int) -> int:
    """The 64-bit key of one request's random stream: (engine seed, ``params.seed``, group id,
    sample index).

    The request's *name* is not part of it: the same sample of the same prompt draws the same
    tokens whatever its request is called (an evaluation at step 0 or 200, a Ray replica's
    renamed request), so held-out evaluations of one policy agree exactly. The group id and
    sample index are, so that members of a group that share ``params.seed`` (a caller that
    leaves it at its default) still draw different samples.

    >>> stream_key(0, 7, 3, 1) == stream_key(0, 7, 3, 1), stream_key(0, 7, 3, 1) == stream_key(0, 7, 3, 2)
    (True, False)
    """
    h = 0
    for w in (engine_seed, sample_seed, group_id, sample_index):
        h = _splitmix64_int(h ^ (w & _MASK64))
    return h


def _splitmix64_int(x: int) -> int:
    """``_splitmix64`` on one Python int (the same values; no array round trip per request)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def uniforms(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per row: a hash of the row's stream key and response position."""
    h = _splitmix64(keys ^ _splitmix64(positions.astype(np.uint64)))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
    *,
    unit_temperature: bool = False,
    use_top_p: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens, T=1 log-probs of them, T=1 entropies).

    Parameters
    ----------
    logits : float tensor [B, V]
    temperature : float tensor [B, 1], > 0
    top_p : float tensor [B], in (0, 1]
    u : float64 tensor [B] of uniforms in [0, 1) (see ``uniforms``)
    unit_temperature, use_top_p : shortcuts the caller may take when every row has
        temperature 1 (skip a softmax) or top_p 1 (skip the sort).
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p1 = logp.exp()
    entropy = -(p1 * logp).sum(-1)
    probs = p1 if unit_temperature else torch.softmax(logits / temperature, dim=-1)
    last = probs.shape[-1] - 1
    if use_top_p:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cdf = sorted_p.cumsum(-1)
        # Mass of the nucleus: the CDF at the first sorted token where it reaches top_p.
        cut = torch.searchsorted(cdf, top_p[:, None].to(cdf.dtype)).clamp_(max=last)
        mass = cdf.gather(1, cut)
        idx = torch.searchsorted(cdf, (u[:, None] * mass.double()).to(cdf.dtype), right=True)
        idx = torch.minimum(idx, cut)  # rounding of u * mass must not step outside the nucleus
        tokens = order.gather(1, idx)[:, 0]
    else:
        cdf = probs.cumsum(-1)
        target = (u[:, None] * cdf[:, -1:].double()).to(cdf.dtype)
        tokens = torch.searchsorted(cdf, target, right=True).clamp_(max=last)[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0], entropy
