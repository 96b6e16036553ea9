"""The committed-group buffer: one Arrow record batch per learner step, optionally on disk.

``ArrowBuffer.put`` turns a ``TrainBatch`` into one record batch, one row per rollout, groups
contiguous and in batch order, and appends it to ``steps-NNNNN.arrows`` segments (Arrow IPC
streams, see ``pipeline.store.arrowio``; each opening of a buffer starts a new segment).

Columns (``STEPS.schema``)::

    step int64, prompt_id int64, group_id int64, sample_index int32, request_id string,
    prompt_token_ids list<int32>, token_ids list<int32>, logprobs list<float32>,
    reward float64, finish_reason int8 (FinishReason value), policy_version int64,
    advantage float32 (the learner's, null from a learner without them), group_launched int64, group_tokens int64,
    turn_ends list<int32>, turn_rewards list<float64>, policy_mask list<bool>
        (a multi-turn episode's structure, ``pipeline.types.Turns``; null for a single response),
    guide_len int32, guide_level float32
        (a guided rollout's reference prefix, ``Rollout.guide_len``; null in a step with no guided rollout)

Version 1 segments (before multi-turn episodes) read with null turn columns, versions 1 and 2
(before guidance) with null guide columns.

The orchestrator trains on each batch from memory and writes it here behind the learner step,
with ``Learner.advantages`` (null for the simulator's learner, which computes none).

Precision: ``logprobs`` are float32, the precision models compute them in, so log-probs that
came from a float32 tensor round-trip exactly and others are rounded to the nearest float32
(relative error below 6e-8). ``reward`` is float64 so that rewards round-trip exactly: they are
one value per rollout and the cost is nil. ``to_train_batch(put(b)) == b`` therefore holds
exactly when the log-probs are float32 values, and up to float32 rounding otherwise.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.store.arrowio import (
    SegmentFormatError,
    SegmentKind,
    SegmentWriter,
    next_segment_number,
    read_segments,
    segment_paths,
    warn_torn,
)
from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch, Turns

BUFFER_SCHEMA_VERSION = 3

_V1_FIELDS = [
    ("step", pa.int64()),
    ("prompt_id", pa.int64()),
    ("group_id", pa.int64()),
    ("sample_index", pa.int32()),
    ("request_id", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())),
    ("token_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("reward", pa.float64()),
    ("finish_reason", pa.int8()),
    ("policy_version", pa.int64()),
    ("advantage", pa.float32()),
    ("group_launched", pa.int64()),
    ("group_tokens", pa.int64()),
]
_TURN_FIELDS = [
    ("turn_ends", pa.list_(pa.int32())),
    ("turn_rewards", pa.list_(pa.float64())),
    ("policy_mask", pa.list_(pa.bool_())),
]
_GUIDE_FIELDS = [("guide_len", pa.int32()), ("guide_level", pa.float32())]
_V1 = pa.schema(_V1_FIELDS)
_V2 = pa.schema(_V1_FIELDS + _TURN_FIELDS)
_V3 = pa.schema(_V1_FIELDS + _TURN_FIELDS + _GUIDE_FIELDS)


def _with_nulls(batch: pa.RecordBatch, fields: list[tuple[str, pa.DataType]]) -> pa.RecordBatch:
    """``batch`` with the current schema's columns it lacks, all null (the newest ones)."""
    nulls = [pa.nulls(batch.num_rows, type=t) for _, t in fields]
    return pa.record_batch([*batch.columns, *nulls], schema=_V3)


def _from_v1(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A version 1 batch with null turn and guide columns: every rollout a single, unguided response."""
    return _with_nulls(batch, _TURN_FIELDS + _GUIDE_FIELDS)


def _from_v2(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A version 2 batch with null guide columns: every rollout unguided."""
    return _with_nulls(batch, _GUIDE_FIELDS)


STEPS = SegmentKind("steps", _V3, BUFFER_SCHEMA_VERSION, older={1: (_V1, _from_v1), 2: (_V2, _from_v2)})
_REASONS = {int(r): r for r in FinishReason}


class BufferFormatError(SegmentFormatError):
    """A buffer path that is missing, not an Arrow stream, or of an unsupported schema version."""


class ArrowBuffer:
    """Converts each learner step's ``TrainBatch`` to Arrow and, with ``persist``, appends it to disk.

    Parameters
    ----------
    directory
        Where ``steps-NNNNN.arrows`` segments go (created if missing); may be None without persist.
    persist
        Write every ``put`` batch to the directory (flushed to the OS at once).
    run_id
        Stored in the segment's schema metadata.
    fsync, compression
        ``fsync`` each batch; Arrow IPC buffer compression (``"zstd"``, ``"lz4"`` or None).

    Examples
    --------
    >>> import tempfile
    >>> from pipeline.types import CommittedGroup, FinishReason, Rollout, TrainBatch, Turns
    >>> r = Rollout("g0.s0", 0, (1, 2), (3, 4), (-0.5, -0.25), 1.0, FinishReason.STOP, 0)
    >>> batch = TrainBatch(step=0, groups=(CommittedGroup(0, 7, (r,), launched=1, tokens=2),))
    >>> d = tempfile.mkdtemp()
    >>> with ArrowBuffer(d) as buf:
    ...     rb = buf.put(batch, advantages=[[0.0]])
    >>> to_train_batch(rb) == batch, read_all(d).num_rows
    (True, 1)
    """

    def __init__(
        self,
        directory: str | os.PathLike | None,
        persist: bool = True,
        run_id: str = "",
        fsync: bool = False,
        compression: str | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.persist = persist
        self.steps_written = 0
        self._writer: SegmentWriter | None = None
        if not persist:
            return
        if self.directory is None:
            raise ValueError(
                "ArrowBuffer(directory=None, persist=True) has nowhere to write; pass a directory or persist=False"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        number = next_segment_number(self.directory, (STEPS.prefix,))
        while self._writer is None:
            try:
                self._writer = SegmentWriter(self.directory, STEPS, number, run_id, fsync, compression)
            except FileExistsError:  # another buffer took this number first
                number += 1

    @property
    def segment_path(self) -> Path | None:
        """The file this buffer appends to (None without persist)."""
        return self._writer.path if self._writer else None

    def put(self, batch: TrainBatch, advantages: Sequence[Sequence[float]] | None = None) -> pa.RecordBatch:
        """Convert one step's batch (and optional per-rollout advantages) and persist it."""
        record_batch = to_record_batch(batch, advantages)
        if self._writer is not None:
            self._writer.write(record_batch)
        self.steps_written += 1
        return record_batch

    @staticmethod
    def to_train_batch(record_batch: pa.RecordBatch | pa.Table) -> TrainBatch:
        """The module's ``to_train_batch``, for callers that hold only the buffer."""
        return to_train_batch(record_batch)

    @staticmethod
    def read_all(directory: str | os.PathLike) -> pa.Table:
        """The module's ``read_all``, for callers that hold only the buffer."""
        return read_all(directory)

    def close(self) -> None:
        """Close the segment (idempotent)."""
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> ArrowBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _list_column(seqs: list[tuple], value_type: pa.DataType, dtype: type) -> pa.ListArray:
    """A list column from per-row tuples, built from one flat numpy array and its offsets."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=dtype, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=value_type))


def to_record_batch(batch: TrainBatch, advantages: Sequence[Sequence[float]] | None = None) -> pa.RecordBatch:
    """``batch`` as one record batch with one row per rollout (see the module docstring)."""
    _check_batch(batch, advantages)
    rollouts = [r for g in batch.groups for r in g.rollouts]
    sizes = [len(g.rollouts) for g in batch.groups]

    def per_group(values: Iterable[int]) -> np.ndarray:
        return np.repeat(np.fromiter(values, dtype=np.int64, count=len(sizes)), sizes)

    if advantages is None:
        advantage = pa.nulls(len(rollouts), type=pa.float32())
    else:
        advantage = pa.array(np.fromiter(itertools.chain.from_iterable(advantages), np.float32, len(rollouts)))
    columns = {
        "step": np.full(len(rollouts), batch.step, dtype=np.int64),
        "prompt_id": per_group(g.prompt_id for g in batch.groups),
        "group_id": per_group(g.group_id for g in batch.groups),
        "sample_index": np.fromiter((r.sample_index for r in rollouts), np.int32, len(rollouts)),
        "request_id": pa.array([r.request_id for r in rollouts], type=pa.string()),
        "prompt_token_ids": _list_column([r.prompt_token_ids for r in rollouts], pa.int32(), np.int32),
        "token_ids": _list_column([r.token_ids for r in rollouts], pa.int32(), np.int32),
        "logprobs": _list_column([r.logprobs for r in rollouts], pa.float32(), np.float32),
        "reward": np.fromiter((r.reward for r in rollouts), np.float64, len(rollouts)),
        "finish_reason": np.fromiter((r.finish_reason for r in rollouts), np.int8, len(rollouts)),
        "policy_version": np.fromiter((r.policy_version for r in rollouts), np.int64, len(rollouts)),
        "advantage": advantage,
        "group_launched": per_group(g.launched for g in batch.groups),
        "group_tokens": per_group(g.tokens for g in batch.groups),
        **_turn_columns(rollouts),
        **_guide_columns(rollouts),
    }
    arrays = [
        columns[f.name] if isinstance(columns[f.name], pa.Array) else pa.array(columns[f.name], type=f.type)
        for f in STEPS.schema
    ]
    return pa.record_batch(arrays, schema=STEPS.schema)


def _turn_columns(rollouts: list[Rollout]) -> dict[str, pa.Array]:
    """The turn columns: null for single responses (all of them, usually: no cost then)."""
    if all(r.turns is None for r in rollouts):
        return {name: pa.nulls(len(rollouts), type=t) for name, t in _TURN_FIELDS}
    turns = [r.turns for r in rollouts]
    return {
        "turn_ends": pa.array([t.ends if t else None for t in turns], type=pa.list_(pa.int32())),
        "turn_rewards": pa.array([t.rewards if t else None for t in turns], type=pa.list_(pa.float64())),
        "policy_mask": pa.array([t.policy_mask if t else None for t in turns], type=pa.list_(pa.bool_())),
    }


def _guide_columns(rollouts: list[Rollout]) -> dict[str, pa.Array]:
    """The guide columns: null in a step with no guided rollout (no cost then)."""
    if all(r.guide_len == 0 for r in rollouts):
        return {name: pa.nulls(len(rollouts), type=t) for name, t in _GUIDE_FIELDS}
    return {
        "guide_len": pa.array([r.guide_len for r in rollouts], type=pa.int32()),
        "guide_level": pa.array([r.guide_level for r in rollouts], type=pa.float32()),
    }


def _check_batch(batch: TrainBatch, advantages: Sequence[Sequence[float]] | None) -> None:
    # A row-per-rollout layout cannot represent an empty batch or group, and rebuilds groups from
    # runs of equal group_id: refuse what would not round-trip rather than lose it silently.
    if not batch.groups:
        raise ValueError(f"TrainBatch(step={batch.step}) has no groups; there is nothing to buffer")
    seen = set()
    for g in batch.groups:
        if not g.rollouts:
            raise ValueError(
                f"group {g.group_id} of step {batch.step} has no rollouts; commit only groups with samples"
            )
        if g.group_id in seen:
            raise ValueError(
                f"group_id {g.group_id} appears twice in TrainBatch(step={batch.step}); group ids must be unique"
            )
        seen.add(g.group_id)
    if advantages is not None:
        if len(advantages) != len(batch.groups):
            raise ValueError(
                f"advantages has {len(advantages)} groups, the batch {len(batch.groups)}; give one list per group"
            )
        for g, adv in zip(batch.groups, advantages):
            if len(adv) != len(g.rollouts):
                raise ValueError(
                    f"advantages of group {g.group_id} has {len(adv)} values for {len(g.rollouts)} rollouts; give one per rollout"
                )


def _split(column: pa.Array | pa.ChunkedArray) -> list[tuple]:
    """A list column back to per-row tuples of Python numbers."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy()
    flat = column.values.to_numpy(zero_copy_only=False).tolist()
    return [tuple(flat[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def to_train_batch(record_batch: pa.RecordBatch | pa.Table) -> TrainBatch:
    """Rebuild the ``TrainBatch`` of one step from its record batch (inverse of ``put``)."""
    if record_batch.num_rows == 0:
        raise ValueError("the record batch has no rows; a buffered step has at least one rollout")
    col = {name: record_batch.column(name) for name in STEPS.schema.names}
    steps = np.unique(col["step"].to_numpy())
    if len(steps) != 1:
        raise ValueError(f"the rows hold steps {steps.tolist()}; pass one step's rows (filter on 'step' first)")
    py = {
        name: col[name].to_pylist()
        for name in (
            "prompt_id",
            "group_id",
            "sample_index",
            "request_id",
            "reward",
            "finish_reason",
            "policy_version",
            "group_launched",
            "group_tokens",
        )
    }
    prompt_ids, token_ids, logprobs = _split(col["prompt_token_ids"]), _split(col["token_ids"]), _split(col["logprobs"])
    turns = [
        None if ends is None else Turns(tuple(ends), tuple(rewards), tuple(mask))
        for ends, rewards, mask in zip(*(col[name].to_pylist() for name, _ in _TURN_FIELDS))
    ]
    guide_len = [n or 0 for n in col["guide_len"].to_pylist()]
    guide_level = [float(x or 0.0) for x in col["guide_level"].to_pylist()]
    rollouts = [
        Rollout(rid, si, pt, tk, lp, rw, _REASONS[fr], pv, tn, gl, gv)
        for rid, si, pt, tk, lp, rw, fr, pv, tn, gl, gv in zip(
            py["request_id"],
            py["sample_index"],
            prompt_ids,
            token_ids,
            logprobs,
            py["reward"],
            py["finish_reason"],
            py["policy_version"],
            turns,
            guide_len,
            guide_level,
        )
    ]
    groups, start, gids = [], 0, py["group_id"]
    for i in range(1, len(gids) + 1):
        if i == len(gids) or gids[i] != gids[start]:
            groups.append(
                CommittedGroup(
                    gids[start],
                    py["prompt_id"][start],
                    tuple(rollouts[start:i]),
                    launched=py["group_launched"][start],
                    tokens=py["group_tokens"][start],
                )
            )
            start = i
    return TrainBatch(step=int(steps[0]), groups=tuple(groups))


def read_all(directory: str | os.PathLike) -> pa.Table:
    """Every complete step of every segment in ``directory``, in order.

    A torn tail (a writer killed mid-step) ends that segment's read cleanly and emits a
    ``TornSegmentWarning`` naming the file; later segments are still read.
    """
    path = Path(directory)
    if not path.is_dir():
        raise BufferFormatError(f"buffer directory {path} does not exist; pass the directory ArrowBuffer wrote")
    table, reads = read_segments(segment_paths(path, STEPS.prefix), STEPS, BufferFormatError)
    warn_torn(reads)
    return table
