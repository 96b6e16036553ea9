"""The part every gate of this package shares: a prompt selector, its groups, its verdicts.

``BaseGate`` keeps

* ``source``: the ``PromptSelector`` prompts come from (a ``PromptPool`` is wrapped in the
  plain ``CursorSelector``; DPS plugs in ``DpsSelector``);
* one typed record per open group (``_groups``, of the subclass's ``Record`` type), made by
  ``_open`` when ``admit`` plans the group under the id the orchestrator offered, and dropped
  at ``on_closed``: the gate's own decisions on the group, never a copy of its counts (those
  come with each snapshot: the reported group's, every open group's in ``groups``
  (``OpenGroups``) at ``update`` and ``on_step``, and the closing one);
* verdict counters, reported by ``metrics()`` as ``gate/<reason>``;
* selector feedback: an abandoned (or dropped) group's rewards at ``on_closed`` (those of its
  closing snapshot its verdict saw, ``GroupSnapshot.verdict_counts``), a shipped
  group's full rewards from the batch at ``on_step`` (the orchestrator stops calling
  ``update`` once a group is committed), then ``source.advance``.

``update`` is a template method: it finds the group's record and hands it with the snapshot
and the open groups to the subclass's ``_update``; ``on_closed`` hands the closing snapshot to ``_closed``. Subclasses implement ``admit`` and
``_update`` and add their own state through ``_extra_state`` / ``_load_extra_state``.
``state_dict()`` is plain JSON-able data.

``SealingGate`` is the base of the gates that commit each group once, whole (DPS, the
oracle): its ``_update`` passes over sealed groups, abandons those the engine keeps failing
and leaves the rest to the subclass's ``_judge``; ``_seal`` commits.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from controller.gates.common import GroupRecord, SealedRecord, Verdicts, abandon, commit, too_many_failures
from controller.prompts import PromptPool
from controller.selectors import PromptSelector, as_selector
from pipeline.protocols import Gate, OpenGroups
from pipeline.types import GroupAction, GroupSnapshot, Prompt, TrainBatch

R = TypeVar("R", bound=GroupRecord)  # a gate's own record of a group
S = TypeVar("S", bound=SealedRecord)  # the record of a gate that commits once


class BaseGate(Gate, Generic[R]):
    """Shared state and lifecycle of the gates in ``controller.gates`` (not a gate by itself).

    Parameters
    ----------
    source
        Where prompts come from: a ``PromptPool``, or a ``PromptSelector`` (DPS) over one.
    group_size
        G, the size of a full group (``orchestrator.group_size``).

    ``group_size`` (and a subclass's ``batch_groups``) are the orchestrator's; their ranges are
    checked once, by ``OrchestratorConfig``, and not again here."""

    name = "gate"
    Record: type[GroupRecord] = GroupRecord
    """The class of this gate's records: ``R``, which ``_open`` makes."""

    def __init__(self, source: PromptPool | PromptSelector, group_size: int):
        self.source = as_selector(source)
        self.group_size = group_size
        self._groups: dict[int, R] = {}
        self._verdicts = Verdicts()
        # Groups of a checkpoint written before groups were numbered at admission, which had not
        # reported when it was taken (in plan order); a resumed run closes them unseen.
        self._unnumbered: list[R] = []

    # --- shared lifecycle ---------------------------------------------------------------

    def _abandon_failed(self, group_id: int) -> list[GroupAction]:
        """Abandon a group the engine keeps failing (``common.too_many_failures``), counted as
        the ``abandon_failures`` verdict."""
        self._verdicts.add("abandon_failures")
        return [abandon(group_id, "failures")]

    def _open(self, group_id: int, prompt: Prompt, **fields: Any) -> R:
        """Record a group ``admit`` is planning (``fields``: the subclass record's own)."""
        rec = self._groups[group_id] = cast(R, self.Record(prompt_id=prompt.prompt_id, **fields))
        return rec

    def update(self, snapshot: GroupSnapshot, groups: OpenGroups) -> list[GroupAction]:
        rec = self._groups.get(snapshot.group_id)
        if rec is None:
            raise ValueError(
                f"{type(self).__name__} got an update for group {snapshot.group_id} of prompt "
                f"{snapshot.prompt.prompt_id}, which it never opened; only the gate that admitted a group may be asked about it"
            )
        return self._update(snapshot, rec, groups)

    def _update(self, snapshot: GroupSnapshot, rec: R, groups: OpenGroups) -> list[GroupAction]:
        """Subclass hook: the decision on one more ended sample of the group ``rec`` records
        (``groups``: every open group as it stands, for a decision on other groups too)."""
        raise NotImplementedError

    def on_closed(self, closing: GroupSnapshot, committed: bool) -> None:
        rec = self._groups.pop(closing.group_id, None)
        if rec is None:
            if not self._unnumbered:
                return
            rec = self._unnumbered.pop(0)
            if committed:
                return
        self.source.release(rec.prompt_id)
        if not committed:
            self.source.observe(rec.prompt_id, *self._outcome(closing, rec))
        self._closed(closing, rec, committed)

    def _outcome(self, closing: GroupSnapshot, rec: R) -> tuple[int, int]:
        """(successes, samples): what the closed group says of its prompt's pass rate, the
        rewards its verdict saw (a subclass may say less: SARA's guided rollouts do not count)."""
        return closing.verdict_counts

    def _closed(self, closing: GroupSnapshot, rec: R, committed: bool) -> None:
        """Subclass hook: the group left (shipped or dropped); ``closing``: its final snapshot."""

    def on_step(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        for group in batch.groups:
            # A guided rollout's reward is not a draw of the prompt's own pass rate: only the rest count.
            successes, samples = group.unguided
            self.source.observe(group.prompt_id, successes, samples)
            self._shipped(group.prompt_id, successes, samples)
        self.source.advance(step)
        return self._stepped(step, batch, groups)

    def _shipped(self, prompt_id: int, successes: int, samples: int) -> None:
        """Subclass hook: a group of ``prompt_id`` was trained on with these rewards."""

    def _stepped(self, step: int, batch: TrainBatch, groups: OpenGroups) -> list[GroupAction]:
        """Subclass hook: actions after a learner step, on open groups as ``groups`` holds them."""
        return []

    # --- reporting ----------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """No prompt can be selected any more (every prompt evicted)."""
        return self.source.active == 0

    @property
    def open_groups(self) -> int:
        """Groups this gate has opened and not yet seen closed."""
        return len(self._groups) + len(self._unnumbered)

    def metrics(self) -> dict[str, float]:
        return self._verdicts.metrics()

    # --- checkpoint ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "groups": {str(k): v.to_state() for k, v in self._groups.items()},
            "verdicts": self._verdicts.state_dict(),
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state["source"])
        self._groups = {int(k): self._record_from_state(v) for k, v in state["groups"].items()}
        # An earlier release kept the plans of groups that had not reported in a "book".
        book = state.get("book", {}).get("pending", {})
        plans = sorted((p for queue in book.values() for p in queue), key=lambda p: p["plan_seq"])
        self._unnumbered = [self._record_from_state(p) for p in plans]
        self._verdicts.load_state_dict(state["verdicts"])
        self._load_extra_state(state)

    def _record_from_state(self, state: dict[str, Any]) -> R:
        return cast(R, self.Record.from_state(state))

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        return None


class SealingGate(BaseGate[S], Generic[S]):
    """A gate that commits each group once, whole (not a gate by itself): once ``_seal`` has
    committed a group its later updates change nothing, a group the engine keeps failing is
    abandoned (``_abandon_failed``), and every other update is the subclass's ``_judge``."""

    def _update(self, snapshot: GroupSnapshot, rec: S, groups: OpenGroups) -> list[GroupAction]:
        if rec.sealed:
            return []
        if too_many_failures(snapshot):
            return self._abandon_failed(snapshot.group_id)
        return self._judge(snapshot, rec)

    def _judge(self, snapshot: GroupSnapshot, rec: S) -> list[GroupAction]:
        """Subclass hook: the decision on a group not yet committed, nor failing in the engine."""
        raise NotImplementedError

    def _seal(self, group_id: int, rec: S) -> list[GroupAction]:
        """Commit the group, once (the ``commit`` verdict, counted once; the reason is the gate's name)."""
        rec.sealed = True
        self._verdicts.add("commit")
        return [commit(group_id, self.name)]
