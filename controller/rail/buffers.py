"""Per-request prefix buffers: what RAIL needs to branch from a sample's prefix.

A branch request carries its prefix (token ids and log-probs, ``BranchSpec``), so the
controller keeps, per streamed request, the tokens, log-probs and entropies it saw in
``on_tokens`` -- only while token hooks are on, capped at ``max_tokens`` per request and
``max_requests`` requests (oldest first out), and dropped when the group closes.

A branched sample streams from its prefix length on, so its buffer would start mid-response.
When the controller launches branches it registers the prefix it sent (``expect_branch``); the
first delta of a new request of that group that starts exactly there takes it over, so a branch
of a branch still knows its whole prefix. A request whose start is unknown (a branch the
controller did not make) is kept for its statistics but never branched from.

>>> from pipeline.types import TokenDelta
>>> bufs = PrefixBuffers(max_tokens=64, max_requests=8)
>>> b = bufs.observe(3, 0, TokenDelta("g3-s0", (7, 8, 9), (-0.5, -1.0, -1.5), (0.1, 2.0, 0.3), position=0))
>>> b.prefix(2), b.mean_logprob(2), b.entropy_at(1)
(((7, 8), (-0.5, -1.0)), -0.75, 2.0)
>>> bufs.expect_branch(3, b, position=2, n=1)
>>> c = bufs.observe(3, 1, TokenDelta("g3-s1", (5,), (-0.2,), None, position=2))
>>> c.known, c.prefix(3)
(True, ((7, 8, 5), (-0.5, -1.0, -0.2)))
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.types import TokenDelta


class RequestBuffer:
    """Tokens, log-probs and entropies of one request, from ``start``, kept as the deltas' own
    tuples: recording a delta appends references and one running sum, and the flat sequences are
    built only when asked for (a branch's prefix), which is rare next to the deltas."""

    __slots__ = (
        "request_id",
        "group_id",
        "sample_index",
        "start",
        "_tokens",
        "_logprobs",
        "_entropies",
        "_ends",
        "_sums",
        "has_entropy",
        "broken",
        "last_decision",
    )

    def __init__(self, request_id: str, group_id: int, sample_index: int, start: int):
        self.request_id = request_id
        self.group_id = group_id
        self.sample_index = sample_index
        self.start = start
        self._tokens: list[tuple[int, ...]] = []  # per recorded chunk
        self._logprobs: list[tuple[float, ...]] = []
        self._entropies: list[tuple[float, ...] | None] = []
        self._ends = [0]  # buffered length after each chunk
        self._sums = [0.0]  # sum of the log-probs after each chunk
        self.has_entropy = True
        self.broken = False  # a gap in the positions: stop recording, never branch
        self.last_decision = -(10**9)

    @property
    def known(self) -> bool:
        """The buffer holds the response from its first token (it can be branched from)."""
        return self.start == 0 and not self.broken

    @property
    def length(self) -> int:
        return self._ends[-1]

    @property
    def tokens(self) -> tuple[int, ...]:
        return _first(self._tokens, self.length)

    @property
    def logprobs(self) -> tuple[float, ...]:
        return _first(self._logprobs, self.length)

    @property
    def entropies(self) -> tuple[float, ...]:
        """The entropies (0.0 where a delta carried none)."""
        return _first(self._entropy_chunks(), self.length)

    def head(self, n: int) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
        """The first ``n`` buffered token ids, log-probs and entropies (0.0 where a delta carried
        none); the chunks past them are not read."""
        return _first(self._tokens, n), _first(self._logprobs, n), _first(self._entropy_chunks(), n)

    def _entropy_chunks(self):
        return (e if e is not None else (0.0,) * len(t) for e, t in zip(self._entropies, self._tokens))

    def extend(
        self, tokens: Sequence[int], logprobs: Sequence[float], entropies: Sequence[float] | None, room: int
    ) -> None:
        take = min(len(tokens), max(room, 0))
        if take <= 0:
            return
        if take < len(tokens):
            tokens, logprobs = tokens[:take], logprobs[:take]
            entropies = entropies[:take] if entropies is not None else None
        self._tokens.append(tuple(tokens))
        lps = tuple(logprobs)
        self._logprobs.append(lps)
        self._entropies.append(tuple(entropies) if entropies is not None else None)
        if entropies is None:
            self.has_entropy = False
        self._ends.append(self._ends[-1] + take)
        # CPython 3.11's sum adds floats one by one from the start value: the same value as a
        # running sum token by token (3.12's compensated sum would differ in the last bits).
        self._sums.append(sum(lps, self._sums[-1]))

    def _chunk(self, k: int) -> int:
        """The chunk that holds buffered token ``k`` (0 <= k < length)."""
        return bisect.bisect_right(self._ends, k) - 1

    def logprob_sum(self, k: int) -> float:
        """Sum of the first ``k`` buffered log-probs (0 <= k <= length)."""
        if k >= self._ends[-1]:
            return self._sums[-1]
        c = self._chunk(k)
        return sum(self._logprobs[c][: k - self._ends[c]], self._sums[c])

    def prefix(self, position: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Token ids and log-probs of the first ``position`` tokens (needs ``known``)."""
        if not self.known or not 0 <= position <= self.length:
            raise ValueError(
                f"request {self.request_id}: no known prefix of {position} tokens (buffered {self.length} "
                f"from position {self.start})"
            )
        tokens, logprobs, _ = self.head(position)
        return tokens, logprobs

    def mean_logprob(self, position: int) -> float:
        """Mean log-prob of the buffered tokens before ``position`` (0 for an empty prefix)."""
        k = min(max(position - self.start, 0), self.length)
        return self.logprob_sum(k) / k if k else 0.0

    def entropy_at(self, position: int) -> float:
        k = position - self.start
        if not 0 <= k < self.length:
            return 0.0
        c = self._chunk(k)
        entropies = self._entropies[c]
        return float(entropies[k - self._ends[c]]) if entropies is not None else 0.0


def _first(chunks: Iterable[Sequence[Any]], n: int) -> tuple[Any, ...]:
    """The first ``n`` items of ``chunks`` laid end to end."""
    return tuple(itertools.islice(itertools.chain.from_iterable(chunks), n))


class PrefixBuffers:
    """Bounded per-request buffers, indexed by group; see the module docstring."""

    def __init__(self, max_tokens: int, max_requests: int):
        if max_tokens < 1 or max_requests < 1:
            raise ValueError(f"max_tokens={max_tokens} and max_requests={max_requests} must both be >= 1")
        self.max_tokens = max_tokens
        self.max_requests = max_requests
        self._buffers: OrderedDict[str, RequestBuffer] = OrderedDict()
        self._groups: dict[int, dict[str, RequestBuffer]] = {}
        # (group_id, prefix_len) -> [source buffer, its prefix length, launches left]
        self._expected: dict[tuple[int, int], list] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def get(self, request_id: str) -> RequestBuffer | None:
        return self._buffers.get(request_id)

    def group(self, group_id: int) -> list[RequestBuffer]:
        return list(self._groups.get(group_id, {}).values())

    def expect_branch(self, group_id: int, source: RequestBuffer, position: int, n: int) -> None:
        """``n`` branches of ``source`` at ``position`` were launched in ``group_id``."""
        key = (group_id, position)
        entry = self._expected.get(key)
        if entry is not None and entry[0] is not source:
            entry[2] = -1  # two sources at one position: ambiguous, adopt neither
            return
        if entry is None:
            self._expected[key] = [source, position, n]
        elif entry[2] >= 0:
            entry[2] += n

    def observe(self, group_id: int, sample_index: int, delta: TokenDelta) -> RequestBuffer:
        """Record a delta; returns the request's buffer."""
        buf = self._buffers.get(delta.request_id)
        if buf is None:
            buf = self._open(delta.request_id, group_id, sample_index, delta.position)
        elif delta.position != buf.start + buf.length and buf.length < self.max_tokens:
            buf.broken = True  # a gap: positions we cannot account for
        if not buf.broken:
            buf.extend(delta.token_ids, delta.logprobs, delta.entropies, self.max_tokens - (buf.start + buf.length))
        return buf

    def _open(self, request_id: str, group_id: int, sample_index: int, position: int) -> RequestBuffer:
        buf = RequestBuffer(request_id, group_id, sample_index, position)
        if position > 0:
            entry = self._expected.get((group_id, position))
            if entry is not None and entry[2] > 0 and entry[0].known and entry[0].length >= position:
                source = entry[0]
                buf.start = 0
                tokens, logprobs, entropies = source.head(position)
                buf.extend(tokens, logprobs, entropies if source.has_entropy else None, self.max_tokens)
                entry[2] -= 1
                if entry[2] == 0:
                    del self._expected[(group_id, position)]
        self._buffers[request_id] = buf
        self._groups.setdefault(group_id, {})[request_id] = buf
        while len(self._buffers) > self.max_requests:
            old_id, old = self._buffers.popitem(last=False)
            members = self._groups.get(old.group_id)
            if members is not None:
                members.pop(old_id, None)
                if not members:
                    del self._groups[old.group_id]
            self.evicted += 1
        return buf

    def drop_group(self, group_id: int) -> None:
        """Forget every buffer and expected branch of a closed group."""
        for request_id in self._groups.pop(group_id, {}):
            self._buffers.pop(request_id, None)
        for key in [k for k in self._expected if k[0] == group_id]:
            del self._expected[key]

    def best_prefix(self, group_id: int, highest: bool, room: int) -> tuple[RequestBuffer, int] | None:
        """The (buffer, cut position) of the group whose prefix has the highest (or lowest) mean
        log-prob, over cuts at 1/4, 1/2 and 3/4 of each known response, strictly before its
        last token (which may be the end-of-sequence token) and below ``room`` tokens."""
        best, best_score = None, None
        for buf in self._groups.get(group_id, {}).values():
            length = buf.length
            if not buf.known or length < 2:
                continue
            last = min(length - 1, room - 1)
            for q in (1, 2, 3):
                pos = min(max(1, length * q // 4), last)
                if pos < 1:
                    continue
                score = (
                    buf.logprob_sum(pos) / pos
                )  # ``mean_logprob(pos)``: a known buffer starts at 0, and pos < length
                score = score if highest else -score
                if best_score is None or score > best_score:
                    best, best_score = (buf, pos), score
        return best
