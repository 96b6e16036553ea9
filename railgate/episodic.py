"""What an environment task (``task.name: env``) adds to a run's components: the renderer that
turns episodes into the model's tokens, the environment service the shell steps episodes
through, and the rules that end an episode (``pipeline.core.episodes``).

Rewards come from the environment, turn by turn, so the run's scorer is never called; the
reference prior (one reference response per prompt) has nothing to score here and is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config.sections import EpisodeSettings
from pipeline.envs.render import renderer_for
from pipeline.envs.service import EnvService
from pipeline.types import Prompt
from railgate.config import RunConfig

logger = logging.getLogger(__name__)


def is_episodic(task: Any) -> bool:
    """The task is an environment: its samples are episodes of turns."""
    return callable(getattr(task, "sft_episodes", None))


class EnvironmentReward:
    """The scorer of an environment task: episodes get their rewards from the environment, so
    being called means a sample took the single-turn path by mistake."""

    runs_inline = True

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float:
        raise RuntimeError(
            f"prompt {prompt.prompt_id} was scored as a single response, but task.name=env rewards come "
            "from its environment, turn by turn (pipeline.core.episodes); this is a bug in the wiring"
        )


@dataclass
class EnvParts:
    renderer: Any
    service: EnvService
    settings: EpisodeSettings


def env_parts(cfg: RunConfig, task: Any, tokenizer: Any, context: int | None = None) -> EnvParts:
    """The renderer, the environment service and the episode rules of ``cfg``'s environment task;
    ``context``: the model's context length (None: ``model.max_len``, the project's model)."""
    env = cfg.task.env
    if cfg.gate.kind in ("sara", "sara_dps") and cfg.gate.sara.reference_prior:
        # The default config turns the prior on for tasks with references; an episode has none, so
        # SARA starts from its own prior here, as it does for a prompt that was never scored.
        logger.info(
            "gate.sara.reference_prior=true: task.name=env runs episodes of turns, which have no reference "
            "response to score; SARA starts each group from gate.sara.prior"
        )
    o = cfg.orchestrator
    settings = EpisodeSettings(
        max_turns=env.max_turns,
        max_episode_tokens=env.max_episode_tokens,
        turn_tokens=o.max_tokens,
        reward=env.reward,
        check_first=o.reward_check_first,
        max_context=context or cfg.model.max_len,
    )
    renderer = renderer_for(tokenizer)
    return EnvParts(renderer, EnvService(task, renderer, settings, threads=max(1, o.reward_threads)), settings)
