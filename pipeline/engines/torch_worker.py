"""The torch engine's decode thread: runs ``DecodeBatch`` steps back to back, a bounded distance ahead.

The event loop never waits for a decode step to *start*: it drops joins and removals into an
inbox (a lock and a condition, no awaiting), and the thread picks them up at its next step
boundary. The thread keeps decoding while it has rows and fewer than ``ahead`` step results
are waiting to be read; a reader (``take``, called from a worker thread of the event loop)
drains every waiting result at once. So a reader that is a few milliseconds late to wake up
(an oversubscribed machine) costs nothing while the thread is ahead, and a reader that stops
reading stops the thread after ``ahead`` steps (backpressure).

``pause()`` / ``resume()`` bracket a weight update: ``pause`` returns once the current step
has ended, and no step starts until ``resume``.

``inline=True`` (the engine's lock step, ``orchestrator.deterministic``): no thread at all;
each ``take`` runs one step in the caller's thread with the joins and removals submitted until
then, so which rows a step holds depends on the caller's order of calls, never on timing.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from pipeline.engines.torch_batch import DecodeBatch, RowSpec
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
...     num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64)).eval()
>>> worker = DecodeWorker(DecodeBatch(model, eos_id=None), ahead=2)
>>> worker.submit([RowSpec(0, (5, 6), (), max_tokens=3, temperature=1.0, top_p=1.0, seed_key=1)], [])
>>> tokens = []
>>> while len(tokens) < 3:
...     tokens += [t for out in worker.take() for t in out.tokens]
>>> len(tokens), worker.take()  # the row finished: nothing more comes
(3, [])
>>> worker.stop()
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple

from pipeline.engines.torch_batch import DecodeBatch, RowSpec, StepOutput


class StepFailed(NamedTuple):
    """A decode step raised: the batch was reset, and the rows it held (``keys``: resident and
    joining) failed. Rows that join later are not touched by it."""

    error: BaseException
    keys: frozenset[int]


class DecodeWorker:
    """One thread that owns a ``DecodeBatch``; see the module docstring.

    ``lock`` (optional) is held for every step: share it with other torch work (a learner
    step in its own thread) that must not run at the same time as decoding.
    """

    def __init__(
        self,
        batch: DecodeBatch,
        *,
        ahead: int = 2,
        lock: AbstractContextManager | None = None,
        inline: bool = False,
    ):
        if ahead < 1:
            raise ValueError(f"ahead={ahead} must be >= 1")
        self.batch = batch
        self.inline = inline
        self.ahead = ahead
        self._lock = lock if lock is not None else nullcontext()
        self._cv = threading.Condition()
        self._joins: dict[int, RowSpec] = {}
        self._removals: set[int] = set()
        self._results: list[StepOutput | StepFailed] = []
        self._version = 0
        self._rows = 0  # rows resident after the last step
        self._running = False
        self._paused = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    # --- called from the event loop (never blocks for long) -------------------------------

    def submit(self, joins: list[RowSpec], removals: list[int]) -> None:
        """Queue rows to join and rows to leave at the next step boundary (in that order of calls)."""
        if not joins and not removals:
            return
        with self._cv:
            for key in removals:
                if self._joins.pop(key, None) is None:  # not admitted yet: cancelled, nothing to remove
                    self._removals.add(key)
            for spec in joins:
                self._joins[spec.key] = spec
            self._cv.notify_all()
        if self._thread is None and not self.inline:
            self._thread = threading.Thread(target=self._run, name="torch-engine-decode", daemon=True)
            self._thread.start()

    def set_version(self, version: int) -> None:
        with self._cv:
            self._version = version

    # --- called from worker threads of the event loop (they block) ------------------------

    def take(self) -> list[StepOutput | StepFailed]:
        """Every step result not read yet; waits for one while the thread has work to do
        (``inline``: runs one step now, if there is work)."""
        if self.inline:
            return [self._step()] if self._has_work() and not self._stopped else []
        with self._cv:
            while not self._results and not self._stopped and self._has_work():
                self._cv.wait()
            out, self._results = self._results, []
            self._cv.notify_all()
            return out

    def pause(self) -> None:
        """Return once no step runs; none starts until ``resume``."""
        with self._cv:
            self._paused = True
            while self._running:
                self._cv.wait()

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def stop(self) -> None:
        """End the thread after its current step and drop the batch."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.batch.reset()

    # --- the thread -----------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return self._running or bool(self._joins or self._removals or self._rows)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and (
                    self._paused
                    or len(self._results) >= self.ahead
                    or not (self._joins or self._removals or self._rows)
                ):
                    self._cv.wait()
                if self._stopped:
                    return
                work = self._start_step()
            result = self._compute(*work)
            with self._cv:
                self._end_step(result)
                self._results.append(result)
                self._cv.notify_all()

    def _step(self) -> StepOutput | StepFailed:
        """One decode step in the caller's thread (``inline``)."""
        with self._cv:
            work = self._start_step()
        result = self._compute(*work)
        with self._cv:
            self._end_step(result)
        return result

    def _start_step(self) -> tuple[list[RowSpec], set[int], int]:
        """Take the inbox for the next step (the condition held)."""
        joins, self._joins = list(self._joins.values()), {}
        removals, self._removals = self._removals, set()
        self._running = True
        return joins, removals, self._version

    def _compute(self, joins: list[RowSpec], removals: set[int], version: int) -> StepOutput | StepFailed:
        held = {row.spec.key for row in self.batch.rows} | {spec.key for spec in joins}
        try:
            with self._lock:
                return self.batch.step(joins, removals, version)
        except BaseException as exc:  # reported to the reader; the batch starts afresh
            self.batch.reset()
            return StepFailed(exc, frozenset(held))

    def _end_step(self, result: StepOutput | StepFailed) -> None:
        """The step has ended (the condition held)."""
        self._running = False
        self._rows = self.batch.num_rows - self.batch.num_finished
