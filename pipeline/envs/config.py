"""Settings of a multi-turn environment task (``task.name: env``, ``task.env:`` in the YAML).

>>> cfg = EnvConfig()
>>> cfg.cls, cfg.reward, cfg.state, cfg.isolation
('pipeline.envs.chain:ChainEnv', 'final', 'replay', 'thread')
>>> EnvConfig(step_timeout_s=0)
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: task.env.step_timeout_s=0 must be > 0 (seconds one env call may take); e.g. 10
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, ClassVar, Literal

from pipeline.config.build import at_most, require, shorten

_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
DATASET_SUFFIXES = (".jsonl", ".ndjson", ".parquet", ".pq")


@dataclass(frozen=True)
class EnvConfig:
    """``task.name: env``: episodes of turns against a text environment (docs/envs.md)."""

    YAML_KEYS: ClassVar[dict[str, str]] = {"class": "cls"}  # YAML key -> field (``class`` is a Python keyword)

    cls: str = "pipeline.envs.chain:ChainEnv"
    """YAML key ``class``: the environment class as 'module:Class', constructed as
    Class(config, row extras); SkyRL-Gym's run unmodified, e.g.
    'skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv' (pip install 'railgate[skyrl]')."""
    config: dict[str, Any] = field(default_factory=dict)
    """The env_config mapping handed to every instance (the class's own settings, e.g. ChainEnv's
    steps and operand sizes)."""
    dataset: str = ""
    """JSONL or Parquet file of rows in SkyRL's format (prompt as chat messages, reward_spec,
    extra_info, ...); empty: the class generates its own problems (a ``sample_row`` classmethod)."""
    eval_dataset: str = ""
    """Optional file of held-out rows; without it the stable hash of each prompt holds out
    task.eval_share of the rows."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """Dataset rows that break the format: skip and count them, or stop naming the row."""
    max_turns: int = 8
    """The most assistant turns of an episode. An env still not done then: truncated when the
    env itself allows more turns (its max_turns attribute), else an environment failure."""
    max_episode_tokens: int = 512
    """The most tokens of an episode after its prompt (every turn plus every observation); the
    engine-side cap, enforced by the core."""
    step_timeout_s: float = 10.0
    """Seconds one env call (construction + init, or one step) may take; past it the episode is
    an environment failure and the call returns within the timeout plus a short grace."""
    max_observation_chars: int = 8192
    """Characters one step's observations may hold; more is an environment failure."""
    reward: Literal["final", "sum"] = "final"
    """Which reward trains: the last step's ('final', SkyRL's choice for outcome rewards) or the
    sum of the per-turn rewards ('sum'; set task.success_threshold to match)."""
    state: Literal["replay", "snapshot"] = "replay"
    """How a branch rebuilds the env at a turn boundary: replay the recorded actions into a
    fresh instance (any deterministic env), or restore a saved snapshot() (the class needs
    snapshot and restore)."""
    isolation: Literal["thread", "process"] = "thread"
    """Where env calls run: a worker thread per episode (cheap; a call stuck in C code holding
    the GIL stalls the whole process), or a worker process per live episode (killed at a
    timeout, so the timeout always holds; costs a process per concurrent episode)."""
    demo_mistakes: float = 0.3
    """Share of the warm start's demonstration episodes that hold a wrong turn followed by the
    env's feedback and a corrected turn (only the correct turns are targets)."""

    def __post_init__(self) -> None:
        require(
            isinstance(self.cls, str) and bool(_SPEC.fullmatch(self.cls)),
            f"task.env.class={shorten(self.cls)} must be 'module:Class', e.g. 'pipeline.envs.chain:ChainEnv'",
        )
        require(
            isinstance(self.config, dict) and all(isinstance(k, str) for k in self.config),
            f"task.env.config={shorten(self.config)} must be a mapping with string keys (the env_config)",
        )
        for key in ("dataset", "eval_dataset"):
            path = getattr(self, key)
            require(
                not path or PurePath(path).suffix.lower() in DATASET_SUFFIXES,
                f"task.env.{key}={path!r} must be a JSONL or Parquet file ({', '.join(DATASET_SUFFIXES)})",
            )
        require(
            not self.eval_dataset or bool(self.dataset),
            f"task.env.eval_dataset={self.eval_dataset!r} needs task.env.dataset too; set it, or drop eval_dataset",
        )
        require(self.max_turns >= 1, f"task.env.max_turns={self.max_turns} must be >= 1")
        at_most("task.env.max_turns", self.max_turns, 1000)
        require(self.max_episode_tokens >= 1, f"task.env.max_episode_tokens={self.max_episode_tokens} must be >= 1")
        at_most("task.env.max_episode_tokens", self.max_episode_tokens, 1_000_000)
        require(
            self.step_timeout_s > 0,
            f"task.env.step_timeout_s={self.step_timeout_s} must be > 0 (seconds one env call may take); e.g. 10",
        )
        at_most("task.env.step_timeout_s", self.step_timeout_s, 3600)
        require(
            self.max_observation_chars >= 1, f"task.env.max_observation_chars={self.max_observation_chars} must be >= 1"
        )
        at_most("task.env.max_observation_chars", self.max_observation_chars, 10_000_000)
        require(0 <= self.demo_mistakes <= 1, f"task.env.demo_mistakes={self.demo_mistakes} must be in [0, 1]")

    def episode_reward(self, rewards: list[float] | tuple[float, ...]) -> float:
        """The reward that trains, from an episode's per-turn rewards (0 for no turn).

        >>> EnvConfig().episode_reward([0.0, 1.0, 1.0]), EnvConfig(reward="sum").episode_reward([0.0, 1.0, 1.0])
        (1.0, 2.0)
        """
        if not rewards:
            return 0.0
        return float(rewards[-1]) if self.reward == "final" else float(sum(rewards))
