"""One whole episode played outside the group tracker: the held-out evaluation's and the
benchmarks' way to run an environment task's policy.

``play_episode`` streams each turn from the engine, hands it to the environment through an
``EpisodeService`` (``pipeline.envs.service.EnvService``) and follows ``pipeline.core.episodes``'
rules -- the same ``EpisodeBook`` the tracker keeps, so an episode ends here exactly where it
would end in training -- and returns the episode's ``ScoredSample``. A branch (``source`` and
``turns``) continues another episode's environment after its first ``turns`` turns.
"""

from __future__ import annotations

from typing import Any

from pipeline.config.sections import EpisodeSettings
from pipeline.core.episodes import EpisodeBook, episode_key
from pipeline.types import FinishReason, SampleFinished, SampleRequest, ScoredSample


async def finish(engine: Any, request: SampleRequest) -> SampleFinished:
    """Stream ``request`` to its end; its final event (a stream that ends without one: failed)."""
    stream = engine.stream(request)
    final = None
    try:
        async for event in stream:
            if isinstance(event, SampleFinished):
                final = event
    finally:
        await stream.aclose()
    if final is None:
        return SampleFinished(
            request.request_id,
            (),
            (),
            FinishReason.ERROR,
            engine.policy_version,
            error="the engine ended the stream without a final event",
        )
    return final


async def play_episode(
    engine: Any,
    service: Any,
    settings: EpisodeSettings,
    request: SampleRequest,
    book: EpisodeBook | None = None,
    close: bool = True,
    first: SampleRequest | None = None,
) -> ScoredSample:
    """Play the episode that ``request`` starts (its first turn) to its end; ``first``: a turn
    already begun in ``book`` (a branch's) to play from instead."""
    book = book if book is not None else EpisodeBook(settings)
    turn = first if first is not None else book.begin(request)
    try:
        while True:
            final = await finish(engine, turn)
            answer = await service.step(turn, final)
            scored = book.turn_done(turn, final, answer.observation, answer.reward, answer.done, answer.error)
            if scored is not None:
                return scored
            turn = book.next_request(turn)
    finally:
        if close:
            service.close(episode_key(request))
