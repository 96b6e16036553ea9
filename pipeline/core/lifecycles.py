"""How a sample runs from its start to its end: the run mode's ``Lifecycle``, a part of the run.

A run's samples are single engine requests (``SingleTurn``) or episodes of turns
(``Episodes``: each turn a request, each turn's end a step of the episode's environment,
``pipeline.core.episodes`` keeps the rules). The lifecycle is one of the run's parts
(``pipeline.shells.parts.RunParts.lifecycle``, chosen by ``railgate.build`` from the task); the
group tracker and its ledger call it and hold no branch of their own for either mode.
``pipeline.core.samples`` keeps the record of each sample, whichever lifecycle moves it.

>>> from pipeline.config.sections import EpisodeSettings
>>> SingleTurn().answer.__name__, Episodes(EpisodeSettings(2, 64, 4)).answer.__name__
('Score', 'EnvStep')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from pipeline.config.sections import EpisodeSettings
from pipeline.core.actions import CloseEpisode, EnvStep, ForkEpisode, Score
from pipeline.core.episodes import EpisodeBook, episode_key
from pipeline.core.messages import TurnDone
from pipeline.core.samples import Samples
from pipeline.metrics import Budget
from pipeline.types import FinishReason, SampleRequest, ScoredSample, TurnPoint


class Lifecycle(Protocol):
    """How a sample runs from its start to its end, the part the tracker is built with: one
    engine request (``SingleTurn``) or an episode of turns (``Episodes``). The
    tracker and its ledger call it and hold no branch of their own for either. It says what a
    finished stream asks for (``answer``: a ``Score``, or an ``EnvStep`` of the episode's
    environment), whether a cancelled sample whose stream completed anyway is scored as a
    straggler (``scores_cancelled``), the request a started sample sends (``start``), what an
    environment's answer does (``after_turn``), which budget counter a stream's end goes to
    (``count_stream_end``), and what an abandonment and the run's stop close (``abandon``, ``stop``)."""

    @property
    def answer(self) -> type[Score] | type[EnvStep]:
        """What a finished stream asks the shell for, made from its request and final event."""

    @property
    def scores_cancelled(self) -> bool:
        """A cancelled sample whose stream completed anyway is scored (and dropped by the tracker)."""

    def start(self, request: SampleRequest, out: list) -> SampleRequest: ...

    def after_turn(self, msg: TurnDone, out: list) -> ScoredSample | tuple[SampleRequest, TurnPoint]: ...

    @property
    def count_stream_end(self) -> Callable[[Budget, FinishReason], None]:
        """The ``Budget`` method that counts a stream's end (the ledger calls it): a rollout's
        end by its reason, or an episode's turn."""

    def abandon(self, request_id: str, streaming: bool, out: list) -> bool: ...

    def stop(self, samples: Samples, out: list) -> int: ...


class SingleTurn:
    """Each sample is one engine request: its stream's end is the rollout's end, counted by its
    reason, and its answer is its score.

    >>> from pipeline.types import Prompt, SamplingParams
    >>> request = SampleRequest("g0-s0", 0, 0, Prompt(0, "", (1,)), SamplingParams())
    >>> SingleTurn().start(request, []) is request, SingleTurn().abandon("g0-s0", False, [])
    (True, False)
    """

    answer = Score
    scores_cancelled = True
    count_stream_end = staticmethod(Budget.count_rollout_end)

    def start(self, request: SampleRequest, out: list) -> SampleRequest:
        return request

    def after_turn(self, msg: TurnDone, out: list) -> ScoredSample | tuple[SampleRequest, TurnPoint]:
        raise TypeError(
            f"GroupTracker.handle got a TurnDone for {msg.request.request_id} in a run without episodes; "
            "only a run whose task is an environment (task.name: env) steps environments"
        )

    def abandon(self, request_id: str, streaming: bool, out: list) -> bool:
        return False  # its stream's cut counts it

    def stop(self, samples: Samples, out: list) -> int:
        return 0


class EnvironmentFailing(RuntimeError):
    """Each of a run's first episodes ended in an environment failure; the message names the
    first failure (the environment's class and step) and the fix."""


class Episodes:
    """Each sample is an episode of turns (the rules of ``pipeline.core.episodes``): a finished turn goes to its
    environment (``EnvStep``), whose answer (``TurnDone``) starts the next turn or ends the
    episode; the environment actions (``ForkEpisode``, ``CloseEpisode``) go with starts and ends.
    A cancelled turn always counts as aborted (the episode was abandoned, whatever its turn
    did). When each of the first ``settings.check_first`` episodes ended in an environment
    failure the run stops with ``EnvironmentFailing``: no episode can teach anything.

    >>> from pipeline.config.sections import EpisodeSettings
    >>> from pipeline.types import Prompt, SampleRequest, SamplingParams
    >>> episodes, out = Episodes(EpisodeSettings(max_turns=2, max_episode_tokens=64, turn_tokens=4)), []
    >>> episodes.start(SampleRequest("g0-s0", 0, 0, Prompt(0, "", (1,)), SamplingParams()), out).request_id
    'g0-s0'
    >>> episodes.answer.__name__, episodes.abandon("g0-s0", streaming=False, out=out), out
    ('EnvStep', True, [CloseEpisode(key='g0-s0')])
    """

    answer = EnvStep
    scores_cancelled = False
    count_stream_end = staticmethod(Budget.count_turn)  # the episode's end is counted when it is scored

    def __init__(self, settings: EpisodeSettings):
        self.settings = settings
        self.book = EpisodeBook(settings)
        self.check_first = settings.check_first
        self._ended_well = 0  # episodes that ended without an environment failure
        self._failures = 0  # episodes that ended in an environment failure
        self._first_failure = ""

    def start(self, request: SampleRequest, out: list) -> SampleRequest:
        """The request of the first turn of the episode ``request`` starts (a branch's: after a
        ``ForkEpisode`` of its environment)."""
        branch = request.branch
        if branch is not None and branch.turns and self.book.get(branch.source_request_id) is None:
            # Its source ended while it waited for engine capacity (its environment closed with
            # it): nothing is left to continue, so it starts as a fresh episode of the prompt.
            request, branch = dataclasses.replace(request, branch=None), None
        if branch is not None and branch.turns:
            out.append(ForkEpisode(branch.source_request_id, branch.turns, episode_key(request)))
            first = self.book.begin(request, branch.source_request_id, branch.turns)
        else:
            first = self.book.begin(request)
        return first

    def after_turn(self, msg: TurnDone, out: list) -> ScoredSample | tuple[SampleRequest, TurnPoint]:
        """Book a turn. The episode's sample when it ended (its environment closed); else its next turn's request and the turn boundary this turn made (for the controller)."""
        request = msg.request
        scored = self.book.turn_done(request, msg.finished, msg.observation, msg.reward, msg.done, msg.error)
        if scored is None:
            episode = self.book.get(episode_key(request))
            point = TurnPoint(
                episode_key(request),
                episode.turns,
                len(episode.tokens),
                float(msg.reward),
                len(msg.observation),
                tuple(episode.rewards),
            )
            return self.book.next_request(request), point
        if msg.error:
            self._failures += 1
            self._first_failure = self._first_failure or msg.error
            if self.check_first and not self._ended_well and self._failures == self.check_first:
                raise EnvironmentFailing(
                    f"each of the first {self.check_first} episodes ended in an environment failure, the first: "
                    f"{self._first_failure}; fix the environment (task.env.class) or its settings (task.env.config), "
                    "or set orchestrator.reward_check_first=0 to run on regardless"
                )
        else:
            self._ended_well += 1
        out.append(CloseEpisode(scored.request.request_id))
        return scored

    def abandon(self, request_id: str, streaming: bool, out: list) -> bool:
        """The episode of ``request_id`` was abandoned with its group: its environment closes.
        One whose turn is ``streaming`` is counted by its stream's cut; one whose environment is
        answering ends now as an abort -- True: the tracker counts it, and its engine slot is
        free now (its answer, when it comes, is dropped)."""
        key = request_id.split("-t")[0]
        if self.book.get(key) is None:
            return False
        self.book.drop_key(key)
        out.append(CloseEpisode(key))
        return not streaming

    def stop(self, samples: Samples, out: list) -> int:
        """The run is over: every episode's environment closes; an episode between two turns
        (its environment answering) is cut now, one still streaming a turn by the engine's close
        (the ledger counts whatever its stream still brings as that cut). The episodes cut now."""
        streaming = samples.streaming_ids()
        cut = 0
        for key, episode in self.book.items():
            cut += episode.current not in streaming
            self.book.drop_key(key)
            out.append(CloseEpisode(key))
        samples.cancel_all()
        return cut
