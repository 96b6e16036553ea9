"""Held-out evaluation of a real policy: sample each held-out prompt through the engine.

Reports ``eval/accuracy`` (the mean over prompts of each prompt's share of samples that
succeed, i.e. whose reward is above its ``success_threshold``: the expected pass@1 at the
sampling temperature), its 95% interval over prompts ``eval/accuracy_lo`` and
``eval/accuracy_hi`` (``pipeline.intervals.prompt_mean``: the samples of one prompt are not
independent), ``eval/pass@k`` (the fraction of prompts with at least one success among
``samples_per_prompt``), and accuracy per difficulty level (``eval/accuracy/d=<level>``), so
that what GRPO leaves near zero on the hardest levels is visible. Samples the reward function
gives no reward (None) are left out. Each evaluation also reports how many of its rewards raised,
timed out or gave None (``eval/reward_errors``, ``eval/reward_timeouts``, ``eval/rewards_none``),
and raises ``RewardsFailing`` when every one of them failed: an accuracy of 0 from a broken
reward would otherwise read as a policy that solves nothing. ``last_rates`` keeps the latest evaluation's per-prompt
rates, for paired comparisons (``pipeline.intervals.paired_difference``).

**Common draws.** Sample j of held-out prompt i always has the seed
``sample_seed(seed, i, j)``, group id ``-1 - i`` and index j, and the engines key their random
numbers by those, never by the request's name (``torch_sampling.stream_key``). So the same
policy evaluates to the same number at every step, in every run of a seed and under every gate,
and two policies evaluated with one seed differ by what they do, not by luck of the draw. The
torch engine is exact up to floating-point differences between batch shapes (see its
docstring); vLLM likewise (see ``vllm_engine``); the simulator's evaluation is exact.

>>> import anyio
>>> from pipeline.config.sections import SimConfig
>>> from pipeline.sim.world import SimWorld, SimAnswerScorer
>>> from pipeline.sim.engine import SimEngine
>>> engine = SimEngine(SimWorld(SimConfig(num_prompts=16, num_eval_prompts=4)))
>>> evaluator = SamplingEvaluator(engine, [engine.prompt(i) for i in range(16)], SimAnswerScorer(),
...                               samples_per_prompt=4, max_tokens=512)
>>> async def twice():
...     return [await evaluator.evaluate(step) for step in (0, 7)]
>>> result, later = anyio.run(twice)
>>> 0.0 <= result["eval/accuracy"] <= result["eval/pass@4"] <= 1.0
True
>>> result["eval/accuracy_lo"] <= result["eval/accuracy"] <= result["eval/accuracy_hi"]
True
>>> later == result  # the same draws at any step: the same numbers
True
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import anyio

from pipeline.envs.play import finish, play_episode
from pipeline.intervals import prompt_mean
from pipeline.protocols import Scorer
from pipeline.seeding import sample_seed
from pipeline.tasks.rewards.health import RewardsFailing
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import Prompt, SampleRequest, SamplingParams

_DEFAULT_REWARD_TIMEOUT_S = 5.0  # orchestrator.reward_timeout_s's default


class SamplingEvaluator:
    """Accuracy and pass@k on fixed held-out prompts, sampled through ``engine``."""

    def __init__(
        self,
        engine: Any,
        prompts: Sequence[Prompt],
        scorer: Scorer,
        samples_per_prompt: int = 4,
        temperature: float = 1.0,
        max_tokens: int = 64,
        concurrency: int = 256,
        seed: int = 0,
        reward_timeout_s: float | None = None,
        reward_threads: int = 2,
        check_rewards: bool = True,
        episodes: Any = None,
        inline_rewards: bool | None = None,
    ):
        if not prompts:
            raise ValueError("the evaluator needs at least one held-out prompt; raise eval.num_prompts")
        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt={samples_per_prompt} must be >= 1")
        self.engine = engine
        self.prompts = list(prompts)
        self.scorer = scorer
        self.k = samples_per_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.seed = seed
        self.reward_timeout_s = reward_timeout_s  # a reward past it counts as wrong, as in training
        self.check_rewards = check_rewards  # an evaluation whose rewards all failed raises RewardsFailing
        # The training run's reward service, timeout and worker processes included (None: its default).
        # inline_rewards: scored on the event loop (a deterministic run), None: as the scorer declares.
        self.scoring = ScoringService(
            scorer, reward_timeout_s or _DEFAULT_REWARD_TIMEOUT_S, reward_threads, inline=inline_rewards
        )
        self.last_rates: tuple[float, ...] = ()  # per prompt, of the latest evaluation (nan: no sample scored)
        # An environment task: each sample is an episode played through this EpisodeService
        # (``pipeline.envs.play``); its reward is the environment's.
        self.episodes = episodes

    async def evaluate(self, step: int) -> dict[str, float]:
        rewards: dict[int, list[float]] = defaultdict(list)
        limiter = anyio.Semaphore(self.concurrency)
        health, before, scored = self.scoring.health, self.scoring.health.counts(), [0]

        async def one(i: int, j: int) -> None:
            prompt = self.prompts[i]
            # The same draws at every evaluation (seed, group id and index; the name is not part
            # of the engines' random key): differences between steps are the policy's.
            request = SampleRequest(
                request_id=f"eval-p{i}-s{j}",
                group_id=-1 - i,
                sample_index=j,
                prompt=prompt,
                params=SamplingParams(self.temperature, 1.0, self.max_tokens, sample_seed(self.seed, i, j)),
            )
            if self.episodes is not None:
                async with limiter:
                    episode = await play_episode(self.engine, self.episodes, self.episodes.settings, request)
                rewards[i].append(episode.reward if episode.is_valid else 0.0)
                return
            async with limiter:
                final = await finish(self.engine, request)  # a stream without a final event: an error
            reward = 0.0
            if final.finish_reason.is_success:
                # raising or timing out counts as wrong, as in training (counted on self.scoring)
                scored[0] += 1
                reward, _ = await self.scoring.score(prompt, final.token_ids)
                if math.isnan(reward):  # NO_REWARD: left out, as in training
                    return
            rewards[i].append(reward)

        async with anyio.create_task_group() as tg:
            for i in range(len(self.prompts)):
                for j in range(self.k):
                    tg.start_soon(one, i, j)
        if self.episodes is not None:
            return self._summarise(rewards)
        failed = health.since(before)
        if self.check_rewards and scored[0] and sum(failed.values()) == scored[0]:
            raise RewardsFailing(
                f"held-out evaluation at step {step}: "
                f"{health.message(scored[0], failed, which='all', regardless=False)}"
            )
        counts = {
            "eval/reward_errors": failed["errors"],
            "eval/reward_timeouts": failed["timeouts"],
            "eval/rewards_none": failed["none"],
        }
        return {**self._summarise(rewards), **{k: float(v) for k, v in counts.items()}}

    def _summarise(self, rewards: dict[int, list[float]]) -> dict[str, float]:
        # a success: a reward above the prompt's success_threshold
        hits = {i: [r > self.prompts[i].success_threshold for r in rs] for i, rs in rewards.items() if rs}
        self.last_rates = tuple(
            sum(hits[i]) / len(hits[i]) if i in hits else math.nan for i in range(len(self.prompts))
        )
        accuracy = prompt_mean(self.last_rates)
        out = {
            "eval/accuracy": accuracy.mean if accuracy.n else 0.0,
            "eval/accuracy_lo": accuracy.lo,
            "eval/accuracy_hi": accuracy.hi,
            f"eval/pass@{self.k}": sum(any(hs) for hs in hits.values()) / max(1, len(hits)),
        }
        by_level: dict[float, list[bool]] = defaultdict(list)
        for i, hs in hits.items():
            by_level[self.prompts[i].difficulty].extend(hs)
        if 1 < len(by_level) <= 16:
            for level, hs in sorted(by_level.items()):
                out[f"eval/accuracy/d={level:g}"] = sum(hs) / len(hs)
        return out
