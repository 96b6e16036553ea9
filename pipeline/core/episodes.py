"""Multi-turn episodes: a rollout made of the policy's turns and the environment's answers.

An episode is one sample of a group whose task is an environment (``task.name: env``). Each
turn is one engine request whose prompt is the whole context so far; when it finishes, the
environment steps on it (``EnvStep``, in the shell) and answers with a ``TurnDone``: its
observation already rendered as tokens, the turn's reward and whether it is done. The
observation joins the context, masked out of the loss, and the next turn starts -- until the
environment says done, the turns reach ``max_turns``, the next turn could overrun
``max_episode_tokens``, the engine's turn did not complete, or the environment failed. An
episode whose next turn (its context, the observation and the turn's ``max_tokens``) could not
fit the model's context (``max_context``) ends truncated instead of being sent to an engine
that would refuse it: its sample finishes ``LENGTH`` with ``turns.truncated`` set, the run
counts it (``pipeline/episodes_truncated_context``) and goes on.

``EpisodeBook`` keeps the episodes in progress and these rules; the group tracker drives it
through ``pipeline.core.lifecycles.Episodes``, the run's lifecycle when the task is an environment.
An ended episode becomes one ``ScoredSample`` whose response is every turn and observation,
with its ``Turns`` (where turns end, their rewards, which tokens the policy wrote) and the
reward that trains (``reward``: the final turn's, or the sum over turns). A branch starts a
new episode from another's context after its first ``turns`` turns.

>>> from pipeline.types import FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams
>>> book = EpisodeBook(EpisodeSettings(max_turns=3, max_episode_tokens=64, turn_tokens=4))
>>> first = SampleRequest("g0-s0", 0, 0, Prompt(0, "", (1, 2)), SamplingParams(max_tokens=4))
>>> _ = book.begin(first)
>>> ended = book.turn_done(first, SampleFinished("g0-s0", (7, 8), (-0.5, -0.5), FinishReason.STOP, 0),
...                        observation=(5,), reward=0.0, done=False)
>>> ended is None, book.next_request(first).prompt.token_ids     # the context: prompt, turn, observation
(True, (1, 2, 7, 8, 5))
>>> second = book.next_request(first)
>>> done = book.turn_done(second, SampleFinished(second.request_id, (9,), (-0.1,), FinishReason.STOP, 0),
...                       observation=(), reward=1.0, done=True)
>>> done.result.token_ids, done.turns.policy_mask, done.reward
((7, 8, 5, 9), (True, True, False, True), 1.0)
"""

from __future__ import annotations

import dataclasses

from pipeline.config.sections import EpisodeSettings
from pipeline.seeding import derive_seed
from pipeline.types import FinishReason, SampleFinished, SampleRequest, ScoredSample, Turns


class Episode:
    """One episode in progress: its first request and everything in its response so far."""

    __slots__ = ("request", "current", "tokens", "logprobs", "mask", "ends", "rewards", "policy_version")

    def __init__(self, request: SampleRequest):
        self.request = request  # its first turn's (a branch's: the one that continues the source)
        self.current = request.request_id  # the request of the turn in progress
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[bool] = []
        self.ends: list[int] = []
        self.rewards: list[float] = []
        self.policy_version = -1

    @property
    def turns(self) -> int:
        return len(self.ends)

    def context(self) -> tuple[int, ...]:
        return (*self.request.prompt.token_ids, *self.tokens)


def episode_key(request: SampleRequest) -> str:
    """The name of the episode a turn's request belongs to: its group and sample, ``g<g>-s<i>``."""
    return f"g{request.group_id}-s{request.sample_index}"


class EpisodeBook:
    """Episodes in progress by key, and the rules of the module docstring."""

    def __init__(self, settings: EpisodeSettings):
        self.settings = settings
        self._episodes: dict[str, Episode] = {}

    def __len__(self) -> int:
        return len(self._episodes)

    def begin(self, request: SampleRequest, source: str | None = None, turns: int = 0) -> SampleRequest:
        """An episode starts with ``request``; the request of its first turn. A branch continues
        episode ``source`` after its first ``turns`` turns and the observation that followed."""
        episode = Episode(request)
        if source is not None and turns > 0:
            src = self._episodes[source]
            keep = self.boundary(source, turns)
            episode.tokens, episode.logprobs, episode.mask = src.tokens[:keep], src.logprobs[:keep], src.mask[:keep]
            episode.ends, episode.rewards = src.ends[:turns], src.rewards[:turns]
        self._episodes[episode_key(request)] = episode
        prompt = dataclasses.replace(request.prompt, token_ids=episode.context())
        return dataclasses.replace(request, prompt=prompt, branch=None)

    def boundary(self, key: str, turns: int) -> int:
        """Where episode ``key``'s response stands after ``turns`` turns and the observation
        after the last of them: the length of the prefix a branch from there continues."""
        episode = self._episodes[key]
        keep = episode.ends[turns - 1]
        while keep < len(episode.mask) and not episode.mask[keep]:
            keep += 1
        return keep

    def get(self, key: str) -> Episode | None:
        return self._episodes.get(key)

    def items(self) -> list[tuple[str, Episode]]:
        return list(self._episodes.items())

    def next_request(self, request: SampleRequest) -> SampleRequest:
        """The request of the turn after ``request``'s: the same sample, the context as its prompt."""
        episode = self._episodes[episode_key(request)]
        prompt = dataclasses.replace(episode.request.prompt, token_ids=episode.context())
        episode.current = f"{episode_key(request)}-t{episode.turns}"
        params = request.params
        if params.seed is not None:  # each turn its own draws (the same seed would repeat the first turn's)
            params = dataclasses.replace(params, seed=derive_seed(params.seed, "turn", episode.turns))
        return dataclasses.replace(request, request_id=episode.current, prompt=prompt, params=params, branch=None)

    def turn_done(
        self,
        request: SampleRequest,
        finished: SampleFinished,
        observation: tuple[int, ...],
        reward: float,
        done: bool,
        error: str = "",
    ) -> ScoredSample | None:
        """A turn and the environment's answer: None while the episode goes on, else its sample."""
        episode = self._episodes[episode_key(request)]
        episode.tokens += finished.token_ids
        episode.logprobs += finished.logprobs
        episode.mask += [True] * finished.num_tokens
        episode.ends.append(len(episode.tokens))
        episode.rewards.append(float(reward))
        episode.policy_version = finished.policy_version if episode.policy_version < 0 else episode.policy_version
        completed = finished.finish_reason.is_success and not error
        s = self.settings
        over = len(episode.tokens) + len(observation) + s.turn_tokens > s.max_episode_tokens
        if not (completed and not done and episode.turns < s.max_turns and not over):
            return self._finish(episode, finished, error)
        if not self.fits(episode, len(observation), request.params.max_tokens):
            return self._finish(episode, finished, error, truncated=True)
        episode.tokens += observation
        episode.logprobs += [0.0] * len(observation)
        episode.mask += [False] * len(observation)
        return None

    def fits(self, episode: Episode, observation: int, max_tokens: int) -> bool:
        """The next turn of ``episode`` -- its context, an ``observation`` of that many tokens
        and up to ``max_tokens`` of the turn -- fits the model's context (always, unknown)."""
        limit = self.settings.max_context
        return not limit or len(episode.context()) + observation + max_tokens <= limit

    def drop_key(self, key: str) -> None:
        """Forget an episode that ended without a sample (its group was abandoned)."""
        self._episodes.pop(key, None)

    def _finish(self, episode: Episode, last: SampleFinished, error: str, truncated: bool = False) -> ScoredSample:
        del self._episodes[episode_key(episode.request)]
        reason = FinishReason.ERROR if error else FinishReason.LENGTH if truncated else last.finish_reason
        result = SampleFinished(
            request_id=episode_key(episode.request),
            token_ids=tuple(episode.tokens),
            logprobs=tuple(episode.logprobs),
            finish_reason=reason,
            policy_version=episode.policy_version,
            error=error or last.error,
            engine_time=last.engine_time,
        )
        turns = Turns(tuple(episode.ends), tuple(episode.rewards), tuple(episode.mask), truncated)
        reward = episode.rewards[-1] if self.settings.reward == "final" else sum(episode.rewards)
        request = dataclasses.replace(episode.request, request_id=episode_key(episode.request))
        return ScoredSample(request, result, reward if not error else 0.0, error, turns=turns)
