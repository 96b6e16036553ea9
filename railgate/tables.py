"""A run's buffer and trace as two flat Parquet files that pandas, polars and DuckDB read
with no railgate code: ``buffer.parquet`` and ``trace.parquet`` (``python run.py export``).

What an outside reader of the raw Arrow streams would have to know is applied here:

* **resume rules**: rows a killed run wrote after its last checkpoint, which the resumed run
  wrote again, are left out (``pipeline.store.arrowio.mark_superseded``): each step and decision once;
* **one step numbering**: ``step`` is the learner step that trained the row, counted from 1
  as in ``metrics.jsonl`` (the raw buffer counts from 0);
* **one time base**: ``time`` (of a decision) and ``outcome_time`` are seconds on the run's
  clock (wall seconds, or the simulator's virtual seconds). A resumed process restarts its
  clock; its segments are shifted to continue after the latest time kept from the segments
  before, so times never run backwards. (Traces written before outcomes were stamped with the
  run's clock hold Unix times in ``outcome_time``.)
* **plain types**: ``finish_reason`` is a string (``stop``, ``length``, ``aborted``,
  ``error``); a decision's ``features`` map becomes one float column per feature,
  ``feature_<name>`` (null where a decision did not have it); ``actions`` is a list of strings.

``buffer.parquet`` columns: step, prompt_id, group_id, sample_index, request_id, prompt
(decoded with special tokens: what the model read, chat template included), completion
(decoded without special tokens: what the reward graded), prompt_token_ids, completion_ids,
logprobs, reward, advantage, finish_reason, policy_version, group_launched, group_tokens.
Without a tokenizer (the simulator, whose tokens are not text) prompt and completion are null.

``trace.parquet`` columns: the decision's (decision_id, time, run_id, mode, decision_point,
prompt_id, group_id, sample_index, token_position, actions, chosen, propensity,
behaviour_propensity, predicted_gain, policy_version), its outcome (outcome_time, reward,
tokens; null while it had none) and the feature columns. A decision with several outcomes has
one row each.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.store.arrowio import read_segments, segment_number, segment_paths, warn_torn
from pipeline.store.buffer import STEPS, BufferFormatError
from pipeline.store.tracelog import DECISIONS, OUTCOMES, Trace, TraceFormatError
from pipeline.types import FinishReason

BUFFER_FILE = "buffer.parquet"
TRACE_FILE = "trace.parquet"
_FINISH_NAMES = {int(r): r.name.lower() for r in FinishReason}


def export_tables(run_dir: str | os.PathLike, out: str | os.PathLike, tokenizer: Any = None) -> list[Path]:
    """Write ``out/buffer.parquet`` and ``out/trace.parquet`` from ``run_dir``'s ``buffer/`` and
    ``trace/`` (each only when the run recorded it); returns the files written.

    ``tokenizer`` (``decode(ids, skip_special=...)``) decodes prompts and completions.
    """
    run, target = Path(run_dir), Path(out)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    if (run / "buffer").is_dir():
        written.append(_write(buffer_table(run / "buffer", tokenizer), target / BUFFER_FILE))
    if (run / "trace").is_dir():
        written.append(_write(trace_table(run / "trace"), target / TRACE_FILE))
    return written


def buffer_table(directory: Path, tokenizer: Any = None) -> pa.Table:
    """The buffer's rows, flattened as the module docstring says."""
    raw, reads = read_segments(segment_paths(directory, STEPS.prefix), STEPS, BufferFormatError)
    warn_torn(reads)
    prompts = raw.column("prompt_token_ids").to_pylist()
    completions = raw.column("token_ids").to_pylist()
    if tokenizer is not None:
        decoded: dict[tuple[int, ...], str] = {}  # a prompt repeats in every row of its group
        for p in prompts:
            if tuple(p) not in decoded:
                decoded[tuple(p)] = tokenizer.decode(p, skip_special=False)
        prompt_text = [decoded[tuple(p)] for p in prompts]
        completion_text = [tokenizer.decode(c, skip_special=True) for c in completions]
    else:
        prompt_text = completion_text = [None] * raw.num_rows
    finish = [_FINISH_NAMES.get(int(v), str(v)) for v in raw.column("finish_reason").to_pylist()]
    columns = {
        "step": pc.add(raw.column("step"), 1),
        "prompt_id": raw.column("prompt_id"),
        "group_id": raw.column("group_id"),
        "sample_index": raw.column("sample_index"),
        "request_id": raw.column("request_id"),
        "prompt": pa.array(prompt_text, pa.string()),
        "completion": pa.array(completion_text, pa.string()),
        "prompt_token_ids": raw.column("prompt_token_ids"),
        "completion_ids": raw.column("token_ids"),
        "logprobs": raw.column("logprobs"),
        "reward": raw.column("reward"),
        "advantage": raw.column("advantage"),
        "finish_reason": pa.array(finish, pa.string()),
        "policy_version": raw.column("policy_version"),
        "group_launched": raw.column("group_launched"),
        "group_tokens": raw.column("group_tokens"),
    }
    return pa.table(columns)


def trace_table(directory: Path) -> pa.Table:
    """Decisions joined to outcomes, with one time base and flat feature columns."""
    decision_parts, outcome_parts = [], []
    offset = 0.0
    for decisions_path, outcomes_path in _segment_pairs(directory):
        d = _read(decisions_path, DECISIONS)
        o = _read(outcomes_path, OUTCOMES)
        d = d.set_column(d.schema.get_field_index("time"), "time", pc.add(d.column("time"), offset))
        o = o.set_column(o.schema.get_field_index("time"), "time", pc.add(o.column("time"), offset))
        latest = [t for t in (pc.max(d.column("time")).as_py(), pc.max(o.column("time")).as_py()) if t is not None]
        offset = max([offset, *latest])
        decision_parts.append(d)
        outcome_parts.append(o)
    decisions = pa.concat_tables(decision_parts) if decision_parts else _read(None, DECISIONS)
    outcomes = pa.concat_tables(outcome_parts) if outcome_parts else _read(None, OUTCOMES)
    joined = Trace(decisions, outcomes, (), ()).joined()
    features = joined.column("features").to_pylist()
    names = list(dict.fromkeys(k for row in features if row for k, _ in row))
    table = joined.drop_columns(["features"])
    for name in names:
        values = [dict(row).get(name) if row else None for row in features]
        table = table.append_column(f"feature_{name}", pa.array(values, pa.float64()))
    return table.replace_schema_metadata(None)


def _segment_pairs(directory: Path) -> list[tuple[Path | None, Path | None]]:
    """(decisions, outcomes) segments of each opening of the trace, in order."""
    by_number: dict[int, list[Path | None]] = {}
    for i, prefix in enumerate((DECISIONS.prefix, OUTCOMES.prefix)):
        for path in segment_paths(directory, prefix):
            by_number.setdefault(segment_number(path, prefix), [None, None])[i] = path
    return [tuple(pair) for _, pair in sorted(by_number.items())]  # type: ignore[misc]


def _read(path: Path | None, kind) -> pa.Table:
    table, reads = read_segments([path] if path is not None else [], kind, TraceFormatError)
    warn_torn(reads)
    return table


def _write(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` through a temporary file (an interrupted export keeps the old one)."""
    tmp = path.with_name(f".{path.name}.tmp")  # a plain file: the user's umask applies
    try:
        pq.write_table(table.replace_schema_metadata(None), tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["BUFFER_FILE", "TRACE_FILE", "buffer_table", "export_tables", "trace_table"]
