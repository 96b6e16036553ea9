"""``task.name: env``: prompts for multi-turn episodes against an environment (``pipeline.envs``).

Problems are rows in SkyRL's format (``pipeline.envs.rows``): from ``task.env.dataset`` (and
``eval_dataset``), or drawn from the environment class's own generator (a ``sample_row(rng,
env_config)`` classmethod) when no dataset is given. Train and eval are disjoint as in every
task (``pipeline.tasks.base``): by file when an eval file is given, else by the stable hash of
each row's key (its prompt and reward_spec).

The environment needs each prompt's row, which a ``Prompt`` does not carry: ``row(prompt_id)``
gives it (the prompt messages for ``init`` and the ``extras`` the class is built with), for
every prompt this task has handed out. ``Prompt.answer`` holds the ground truth as text (for
reports); ``Prompt.text`` the prompt messages as JSON.

The warm start gets whole episodes: ``sft_episodes(n, seed)`` plays a teacher's actions
through the env (``pipeline.envs.demos``), a share ``task.env.demo_mistakes`` of them with a
wrong turn and the env's feedback before the corrected one; ``sft_pairs(renderer, n, seed)``
makes them ``(context_ids, target_ids)`` pairs. ``sft_example`` (one turn, text) serves the
single-turn warm start.

>>> from pipeline.envs.config import EnvConfig
>>> task = EnvTask(EnvConfig())
>>> p = task.train_prompts(1, seed=0)[0]
>>> row = task.row(p.prompt_id)
>>> row.prompt == json.loads(p.text), p.answer == row.ground_truth
(True, True)
>>> demo = task.sft_episodes(1, seed=0)[0]
>>> [t.target for t in demo.turns][-1], demo.reward
(True, 1.0)
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.datafiles import DatasetError
from pipeline.envs.config import EnvConfig
from pipeline.envs.demos import Demo, play_demo, sft_pairs, teacher_actions
from pipeline.envs.loading import EnvLoadError, load_env_class
from pipeline.envs.rows import EnvRow, load_env_rows
from pipeline.envs.session import INIT_CHARS, EnvRunner
from pipeline.tasks.base import Problem, Split, Task
from pipeline.types import Prompt


class EnvTask(Task):
    """Prompts, rows and demonstrations of an environment task (see the module docstring).

    Parameters
    ----------
    config
        ``task.env``.
    eval_share
        Share of the rows (or of the generated problem space) held out for evaluation.
    """

    name = "env"
    reward = "env"  # rewards come from the episodes, not from a text reward

    def __init__(self, config: EnvConfig, eval_share: float = 0.1) -> None:
        super().__init__(eval_share)
        self.config = config
        self.cls = load_env_class(config.cls)
        self._runner: EnvRunner | None = None
        self._rows: dict[str, EnvRow] = {}  # key -> row, for every problem handed out
        self._by_id: dict[int, EnvRow] = {}
        self._pools: dict[str, list[Problem]] | None = None
        if config.dataset:
            self._load(config)
        elif not callable(getattr(self.cls, "sample_row", None)):
            raise EnvLoadError(
                f"task.env.dataset is empty and task.env.class={config.cls!r} has no sample_row(rng, "
                "env_config) to generate problems; set task.env.dataset to a JSONL or Parquet file of rows"
            )

    # -- problems ----------------------------------------------------------------------------

    def sample_problem(self, rng: random.Random) -> Problem:
        if self._pools is not None:
            return rng.choice(self._pools["train"] + self._pools["eval"])
        record = self.cls.sample_row(rng, self.config.config)
        return self._problem(EnvRow.of(record))

    def problems(self, split: Split, n: int, seed: int, unique: bool = False) -> list[Problem]:
        if self._pools is None:
            return super().problems(split, n, seed, unique)
        pool = self._pools[split]
        if not pool and n:
            raise DatasetError(
                f"task.env: the {split} split is empty; give task.env.eval_dataset or raise task.eval_share"
            )
        if unique and n > len(pool):
            raise DatasetError(f"n={n} distinct {split} rows asked of a pool of {len(pool)}; ask for fewer")
        return self.from_pool(pool, split, n, seed)

    def split_of(self, problem: Problem) -> Split:
        if self._pools is not None and self.config.eval_dataset:
            return "eval" if problem.key in self._eval_keys else "train"
        return super().split_of(problem)

    def row(self, prompt_id: int) -> EnvRow:
        """The row of a prompt this task made: prompt messages for ``init``, ``extras`` for the class."""
        try:
            return self._by_id[prompt_id]
        except KeyError:
            raise KeyError(
                f"prompt_id={prompt_id} was not made by this task (EnvTask.train_prompts / eval_prompts); "
                "ask the task that made the prompt"
            ) from None

    def to_prompt(self, problem: Problem, encode: Callable[[Any], Sequence[int]] | None = None) -> Prompt:
        prompt = super().to_prompt(problem, encode)
        self._by_id[prompt.prompt_id] = self._rows[problem.key]
        return prompt

    def prompt_source(self, problem: Problem) -> list[dict[str, Any]]:
        return [dict(m) for m in self._rows[problem.key].prompt]

    def format_prompt(self, problem: Problem) -> str:
        """The prompt's contents joined (the plain format's text, for single-turn use)."""
        return "".join(m["content"] for m in self._rows[problem.key].prompt)

    @property
    def alphabet(self) -> str:
        own = getattr(self.cls, "alphabet", None)
        if callable(own):
            return own(self.config.config)
        chars = {c for row in self._rows.values() for m in row.prompt for c in m["content"]}
        return "".join(sorted(chars))

    # -- rewards and demonstrations ------------------------------------------------------------

    @property
    def runner(self) -> EnvRunner:
        """The environment runner (made on first use)."""
        if self._runner is None:
            self._runner = EnvRunner(self.config, self.cls)
        return self._runner

    def scorer(self, decode):  # type: ignore[override]
        raise TypeError(
            "task.name=env is rewarded by its environment, turn by turn: run episodes through "
            "pipeline.envs.session.EnvSession (EnvTask.runner), not a text reward"
        )

    def score(self, prompt: Prompt, response_text: str) -> float:
        """The reward of ``response_text`` as the first turn of an episode (0 for an env failure)."""
        row = self.row(prompt.prompt_id)
        session = self.runner.session(row.extras)
        try:
            if session.start(row.prompt).error:
                return 0.0
            result = session.step(response_text)
            return 0.0 if result.error else result.reward
        finally:
            session.close()

    def sft_episodes(self, n: int, seed: int) -> list[Demo]:
        """``n`` played demonstrations of training problems (``demo_mistakes`` of them with a wrong turn)."""
        rng = random.Random(f"{self.name}:demos:{seed}")
        demos: list[Demo] = []
        for problem in self.problems("train", n, seed):
            row = self._rows[problem.key]
            mistake = rng.random() < self.config.demo_mistakes
            demo = play_demo(self.runner, row, teacher_actions(self.cls, row, rng, mistake, self.config.config))
            if demo is None and mistake:  # the env allows no retry here: the plain demonstration
                demo = play_demo(self.runner, row, teacher_actions(self.cls, row, rng, False, self.config.config))
            if demo is None:
                raise ValueError(
                    f"task.env: the teacher's episode for row {row.key[:80]!r} failed in "
                    f"{self.cls.__qualname__} (an env failure, or it ended before the last answer); "
                    "check the env on this row"
                )
            demos.append(demo)
        return demos

    def sft_pairs(self, renderer: Any, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
        """``(context_ids, target_ids)`` of ``n`` demonstrations, every target turn of each."""
        return [pair for demo in self.sft_episodes(n, seed) for pair in sft_pairs(renderer, demo)]

    def sft_example(self, problem: Problem) -> tuple[str, str]:
        """The first turn: the prompt text and the teacher's first right action."""
        row = self._rows[problem.key]
        actions = teacher_actions(self.cls, row, random.Random(0), False, self.config.config)
        return self.format_prompt(problem), next(a for a, target in actions if target)

    # -- internals ---------------------------------------------------------------------------

    def _problem(self, row: EnvRow) -> Problem:
        key = row.key
        self._rows.setdefault(key, row)
        truth = row.ground_truth
        difficulty = getattr(self.cls, "difficulty", None)
        record = {"prompt": row.prompt, **row.extras}
        return Problem(
            key=key,
            text=json.dumps(row.prompt, ensure_ascii=False),
            answer="" if truth is None else truth if isinstance(truth, str) else json.dumps(truth),
            solution="",
            difficulty=float(difficulty(record)) if callable(difficulty) else 0.0,
        )

    def _load(self, config: EnvConfig) -> None:
        limit = INIT_CHARS * config.max_observation_chars
        train_rows, self.load_report = load_env_rows(config.dataset, config.on_bad_row, limit)
        train = [self._problem(r) for r in train_rows]
        self._eval_keys: set[str] = set()
        if config.eval_dataset:
            eval_rows, self.eval_load_report = load_env_rows(config.eval_dataset, config.on_bad_row, limit)
            held_out = [self._problem(r) for r in eval_rows]
            self._eval_keys = {p.key for p in held_out}
            self._pools = {"train": [p for p in train if p.key not in self._eval_keys], "eval": held_out}
        else:
            self._pools = {"train": [], "eval": []}
            for p in train:
                self._pools[super().split_of(p)].append(p)

    def __repr__(self) -> str:
        source = self.config.dataset or "generated"
        return f"EnvTask(class={self.config.cls!r}, rows={source!r})"
