"""Append-only Arrow IPC stream segments: the one place that writes and reads railgate's files.

The trace log (``pipeline.store.tracelog``) and the committed-group buffer (``pipeline.store.buffer``) both
store their records as *segments*: Arrow IPC **stream** files named ``<prefix>-NNNNN.arrows``
in one directory. Each opening of a writer takes the next free segment number, so a resumed
run appends new files and never rewrites old ones.

Every segment's schema metadata carries three keys:

* ``railgate.kind``            the record kind, equal to the file prefix (``decisions``, ...);
* ``railgate.schema_version``  the format version of that kind, checked on read;
* ``railgate.run_id``          the run that wrote the segment.

Durability: each record batch is written and flushed to the OS as a whole (``fsync`` on
request), so a crash loses at most the batch being written. Such a crash leaves a *torn* tail;
``read_segment`` returns every complete batch before it and reports the tear instead of raising.

>>> import tempfile
>>> kind = SegmentKind("points", pa.schema([("x", pa.int64())]), version=1)
>>> d = tempfile.mkdtemp()
>>> with SegmentWriter(d, kind, number=0, run_id="demo") as w:
...     w.write(pa.record_batch([pa.array([1, 2])], schema=kind.schema))
>>> table, reads = read_segments(segment_paths(d, "points"), kind)
>>> table.column("x").to_pylist(), reads[0].run_id, reads[0].torn
([1, 2], 'demo', False)
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

KIND_KEY = b"railgate.kind"
VERSION_KEY = b"railgate.schema_version"
RUN_ID_KEY = b"railgate.run_id"
SUFFIX = ".arrows"
SUPERSEDED_FILE = "superseded.jsonl"

# Every IPC stream message since Arrow 0.15 starts with this continuation marker; a file that
# does not is not an Arrow stream at all (as opposed to a stream whose tail was cut off).
_CONTINUATION = b"\xff\xff\xff\xff"
_WRITE_BUFFER_BYTES = 1 << 20


class SegmentFormatError(ValueError):
    """A segment file that is missing, not an Arrow stream, or of another kind or version."""


class TornSegmentWarning(UserWarning):
    """A segment ended in the middle of a record batch (its writer crashed); earlier batches were kept."""


@dataclass(frozen=True)
class SegmentKind:
    """What one family of segment files holds: file prefix, column schema, format version.

    ``older`` lets a reader take segments of earlier versions: version -> (its columns, a
    function that turns one of its record batches into a batch of the current columns)."""

    prefix: str
    schema: pa.Schema  # the columns; metadata is added per segment by ``schema_for``
    version: int
    older: Mapping[int, tuple[pa.Schema, Callable[[pa.RecordBatch], pa.RecordBatch]]] = field(default_factory=dict)

    def schema_for(self, run_id: str) -> pa.Schema:
        """The schema written into a segment of this kind, with its metadata."""
        return self.schema.with_metadata(
            {KIND_KEY: self.prefix.encode(), VERSION_KEY: str(self.version).encode(), RUN_ID_KEY: run_id.encode()}
        )

    def table_metadata(self) -> dict[bytes, bytes]:
        """Metadata of a table concatenated from several segments (run ids are reported apart)."""
        return {KIND_KEY: self.prefix.encode(), VERSION_KEY: str(self.version).encode()}


def segment_number(path: Path, prefix: str) -> int | None:
    """The segment number in ``<prefix>-NNNNN.arrows``, or None for any other file name."""
    m = re.fullmatch(re.escape(prefix) + r"-(\d+)" + re.escape(SUFFIX), path.name)
    return int(m.group(1)) if m else None


def segment_paths(directory: str | os.PathLike, prefix: str) -> list[Path]:
    """The segments of one prefix in ``directory``, in segment-number order (empty if none)."""
    found = []
    for path in Path(directory).glob(f"{prefix}-*{SUFFIX}"):
        number = segment_number(path, prefix)
        if number is not None:
            found.append((number, path))
    return [path for _, path in sorted(found)]


def next_segment_number(directory: str | os.PathLike, prefixes: Sequence[str]) -> int:
    """One past the highest segment number used by any of ``prefixes`` (0 in a new directory)."""
    numbers = [segment_number(p, prefix) for prefix in prefixes for p in segment_paths(directory, prefix)]
    return max(numbers, default=-1) + 1


class SegmentWriter:
    """Writes record batches to a new segment ``<directory>/<prefix>-NNNNN.arrows``.

    The file is created exclusively: if ``number`` is taken, ``FileExistsError`` is raised and
    the caller picks another number. The schema message is flushed at once, so even a writer
    that crashes before its first batch leaves a readable (empty) segment.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        kind: SegmentKind,
        number: int,
        run_id: str = "",
        fsync: bool = False,
        compression: str | None = None,
    ) -> None:
        self.kind = kind
        self.fsync = fsync
        self.path = Path(directory) / f"{kind.prefix}-{number:05d}{SUFFIX}"
        self.schema = kind.schema_for(run_id)
        self._file = open(self.path, "xb", buffering=_WRITE_BUFFER_BYTES)
        try:
            options = ipc.IpcWriteOptions(compression=compression)
            self._writer = ipc.new_stream(self._file, self.schema, options=options)
            self._sync()
        except BaseException:
            self._file.close()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one record batch and hand it to the OS (and to the disk when ``fsync``)."""
        if not batch.schema.equals(self.kind.schema, check_metadata=False):
            raise SegmentFormatError(
                f"record batch schema {batch.schema} does not match the {self.kind.prefix} segment schema "
                f"{self.kind.schema}; build batches with the writer's kind.schema"
            )
        self._writer.write_batch(batch)
        self._sync()

    def close(self) -> None:
        """Write the end-of-stream marker and close the file (idempotent)."""
        if self._file.closed:
            return
        try:
            self._writer.close()
            self._sync()
        finally:
            self._file.close()

    def _sync(self) -> None:
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class SegmentRead:
    """The complete record batches of one segment, and whether its tail was torn."""

    path: Path
    batches: tuple[pa.RecordBatch, ...]
    run_id: str
    torn: bool


def read_segment(
    path: str | os.PathLike,
    kind: SegmentKind,
    error: type[SegmentFormatError] = SegmentFormatError,
    memory_map: bool = False,
) -> SegmentRead:
    """Read every complete record batch of one segment.

    A tail cut inside a message (a writer killed mid-batch) ends the read cleanly with
    ``torn=True``. A missing file, a file that is not an Arrow stream, or a segment of another
    kind, version or column layout raises ``error`` naming the file. ``memory_map`` avoids
    copying (the caller must then not truncate the file while it holds the batches).
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{path} does not exist or is not a file; pass a {kind.prefix} segment or its directory")
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"ARROW1"):
        raise error(f"{path} is an Arrow IPC *file* (random-access format); railgate segments are Arrow IPC streams")
    if not _CONTINUATION.startswith(head[:4]):
        raise error(f"{path} is not an Arrow IPC stream (it does not start with the stream continuation marker)")
    source = pa.memory_map(str(path)) if memory_map else pa.OSFile(str(path), "r")
    with source:
        try:
            reader = ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError):
            # The writer died before its schema message was complete: nothing was recorded.
            return SegmentRead(path, (), "", torn=True)
        run_id = _check_schema(path, reader.schema, kind, error)
        version = int(reader.schema.metadata[VERSION_KEY].decode())
        upgrade = kind.older[version][1] if version != kind.version else None
        batches, torn = [], False
        while True:
            try:
                batch = reader.read_next_batch()
                batches.append(upgrade(batch) if upgrade is not None else batch)
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError):
                torn = True
                break
    return SegmentRead(path, tuple(batches), run_id, torn)


def _check_schema(path: Path, schema: pa.Schema, kind: SegmentKind, error: type[SegmentFormatError]) -> str:
    meta = schema.metadata or {}
    if VERSION_KEY not in meta or KIND_KEY not in meta:
        raise error(
            f"{path} is an Arrow stream but not a railgate segment (no {VERSION_KEY.decode()} in its schema "
            f"metadata); railgate writes these with pipeline.store.tracelog / pipeline.store.buffer"
        )
    found_kind = meta[KIND_KEY].decode()
    if found_kind != kind.prefix:
        raise error(f"{path} holds {found_kind!r} records, not {kind.prefix!r}; rename it or read it as {found_kind}")
    version = meta[VERSION_KEY].decode()
    older = {str(v): columns for v, (columns, _) in kind.older.items()}
    if version != str(kind.version) and version not in older:
        known = sorted([str(kind.version), *older])
        supported = f"version {known[0]}" if len(known) == 1 else f"versions {', '.join(known)}"
        raise error(
            f"{path} has {kind.prefix} schema version {version}; this reader supports {supported}; "
            f"read it with the railgate release that wrote it"
        )
    expected = kind.schema if version == str(kind.version) else older[version]
    if not schema.remove_metadata().equals(expected):
        missing = [n for n in expected.names if n not in schema.names]
        extra = [n for n in schema.names if n not in expected.names]
        differ = f"missing column(s) {', '.join(missing)}" if missing else ""
        differ += ("; " if differ else "") + f"unexpected column(s) {', '.join(extra)}" if extra else ""
        raise error(
            f"{path} claims {kind.prefix} version {version} but its columns differ "
            f"({differ or 'a type or the order'}: {schema.remove_metadata()}); write {kind.prefix} segments "
            f"with railgate's writer for them, or read the file with the release that wrote it"
        )
    return meta.get(RUN_ID_KEY, b"").decode()


def read_segments(
    paths: Sequence[str | os.PathLike],
    kind: SegmentKind,
    error: type[SegmentFormatError] = SegmentFormatError,
) -> tuple[pa.Table, list[SegmentRead]]:
    """All complete batches of ``paths``, concatenated in order into one table (with the kind's
    schema even when there are no rows), and the per-segment reads (tears, run ids).
    Rows superseded by a resumed run (``mark_superseded``) are left out."""
    reads = [read_segment(p, kind, error) for p in paths]
    schema = kind.schema.with_metadata(kind.table_metadata())
    batches = []
    for r in reads:
        rules = _superseded_rules(r.path, kind)
        for b in r.batches:
            for column, start in rules:
                b = b.filter(pc.less(b.column(column), start))
            batches.append(b.replace_schema_metadata(schema.metadata))
    return pa.Table.from_batches(batches, schema=schema), reads


def mark_superseded(directory: str | os.PathLike, prefix: str, before_segment: int, column: str, start: int) -> None:
    """Record that a resumed run redoes everything from ``column >= start``: rows of ``prefix``
    segments numbered below ``before_segment`` with such values are dropped on read.

    A run killed after its last checkpoint has written records (decisions, trained steps) that
    the resumed run writes again; this keeps readers from seeing both, while the files stay
    append-only. The rules live in ``superseded.jsonl`` beside the segments.
    """
    line = json.dumps({"prefix": prefix, "before_segment": before_segment, "column": column, "start": int(start)})
    path = Path(directory) / SUPERSEDED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _superseded_rules(path: Path, kind: SegmentKind) -> list[tuple[str, int]]:
    rules_file = path.parent / SUPERSEDED_FILE
    if not rules_file.is_file():
        return []
    number = segment_number(path, kind.prefix)
    rules = []
    try:
        lines = rules_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SegmentFormatError(
            f"{rules_file} cannot be read ({exc}); restore it from a copy or delete it "
            "(then rows a resumed run redid are read twice)"
        ) from None
    for i, line in enumerate(lines, start=1):
        try:
            rule = json.loads(line)
        except ValueError:
            if i == len(lines):
                continue  # a torn last line: its resume never started writing
            rule = None
        try:
            prefix, column = rule["prefix"], rule["column"]
            before, start = int(rule["before_segment"]), int(rule["start"])
        except (TypeError, KeyError, ValueError, OverflowError):
            raise SegmentFormatError(
                f"{rules_file} line {i} is not a supersede rule ({line[:80]!r}); each line must be "
                '{"prefix": ..., "before_segment": N, "column": ..., "start": N}: restore the file or delete that line'
            ) from None
        if prefix == kind.prefix and number is not None and number < before and column in kind.schema.names:
            rules.append((column, start))
    return rules


def warn_torn(reads: Sequence[SegmentRead]) -> None:
    """Emit one ``TornSegmentWarning`` naming every torn segment, if any."""
    torn = [str(r.path) for r in reads if r.torn]
    if torn:
        warnings.warn(
            f"torn tail (a writer crashed mid-batch) in {', '.join(torn)}; every complete batch before it was read",
            TornSegmentWarning,
            stacklevel=3,
        )
