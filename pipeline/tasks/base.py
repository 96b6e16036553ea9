"""What a task is: a source of problems, a prompt template, a reward, and SFT examples.

A ``Problem`` is one task instance in the task's own terms (its text, the graded answer, a
reference solution, a difficulty). ``Task.train_prompts`` / ``eval_prompts`` turn problems
into the pipeline's ``Prompt`` messages.

**Train and eval are disjoint by construction.** A stable hash of a problem's ``key`` puts
it in the eval split (a share ``eval_share`` of the problem space) or the train split, and
each split draws from its own seeded generator, rejecting the other split's problems. No
seed, count or order of calls can leak an eval problem into training. The same hash gives
the ``prompt_id``: the same problem has the same id in every run, and a problem drawn twice
(likely for small problem spaces, e.g. 1-digit additions) appears twice with one id.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.tasks.rewards import TextReward, build_reward
from pipeline.types import Prompt

Split = Literal["train", "eval"]
Encode = Callable[[Any], Sequence[int]]  # text (or chat messages) -> token ids
Messages = list  # chat messages: [{"role": ..., "content": ...}, ...]


def is_messages(prompt: Any) -> bool:
    """True when ``prompt`` is a list of chat messages (dicts with ``role`` and ``content``), the
    other form a task's prompt takes besides text.

    >>> is_messages([{"role": "user", "content": "2+2?"}]), is_messages("2+2?")
    (True, False)
    """
    return (
        isinstance(prompt, (list, tuple))
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


_HASH_BUCKETS = 1_000_000
_ID_MASK = (1 << 63) - 1  # prompt ids fit a signed 64-bit Arrow column


@dataclass(frozen=True)
class Problem:
    """One task instance.

    ``key`` identifies the problem (its hash gives the prompt id and the split); ``text`` is
    what the prompt template formats; ``answer`` is what the reward grades against (it
    becomes ``Prompt.answer``); ``solution`` is a correct response, the SFT target.
    """

    key: str
    text: str
    answer: str
    solution: str
    difficulty: float = 0.0


def stable_hash(namespace: str, key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(f"{namespace}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Task(ABC):
    """Base class of tasks. Subclasses set ``name`` and ``reward`` and implement
    ``sample_problem`` and ``alphabet``; the template defaults to the problem text.

    Parameters
    ----------
    eval_share
        Share of the problem space reserved for evaluation, in (0, 1).
    """

    name: str = "task"
    reward: str = "exact"  # a key of pipeline.tasks.rewards.REWARDS
    success_threshold: float = 0.5  # a reward above it is a success (task.success_threshold; set by build_task)
    scratchpad: bool = False  # responses write steps, then '>' and the answer (pipeline/tasks/scratchpad.py)
    sample_tokens: int = 32  # tokens sampled per response when measuring the policy (pipeline.policy.warmstart)

    def __init__(self, eval_share: float = 0.1) -> None:
        if not 0 < eval_share < 1:
            raise ValueError(
                f"eval_share={eval_share} must be in (0, 1); 0.1 reserves a tenth of the problems for evaluation"
            )
        self.eval_share = eval_share

    # -- what subclasses define --------------------------------------------------------------

    @abstractmethod
    def sample_problem(self, rng: random.Random) -> Problem:
        """Draw one problem (of either split) with ``rng``."""

    @property
    @abstractmethod
    def alphabet(self) -> str:
        """Every character that can appear in this task's prompts and solutions."""

    def format_prompt(self, problem: Problem) -> str:
        """The prompt text the model sees."""
        return problem.text

    def prompt_source(self, problem: Problem) -> str | list[dict[str, Any]]:
        """What the tokenizer renders: the formatted text, or a list of chat messages
        (``{"role", "content"}`` dicts) for a dataset row that holds them."""
        return self.format_prompt(problem)

    # -- derived -----------------------------------------------------------------------------

    def sft_example(self, problem: Problem) -> tuple[str, str]:
        """``(prompt_text, target_text)`` for supervised warm-starting."""
        return self.format_prompt(problem), problem.solution

    @property
    def unique_response(self) -> bool:
        """True when a problem's ``solution`` is the only response text its reward accepts (an
        exact-match answer with nothing before it), so the policy's likelihood of that text is the
        pass rate; False (the default) where other responses also earn it."""
        return False

    def scorer(self, decode: Callable[[Sequence[int]], str]) -> TextReward:
        """This task's reward as a ``Scorer`` over token ids, decoding with ``decode`` (a
        scratchpad task grades only the final answer: ``pipeline.tasks.scratchpad``)."""
        if self.scratchpad:
            from pipeline.tasks.scratchpad import FinalAnswerDecode

            decode = FinalAnswerDecode(decode)
        return build_reward(self.reward, decode)

    def score(self, prompt: Prompt, response_text: str) -> float:
        """The reward of ``response_text`` for ``prompt``."""
        if self.scratchpad:
            from pipeline.tasks.scratchpad import final_answer

            response_text = final_answer(response_text)
        return self.scorer(_no_decode).score_text(prompt, response_text)

    def split_of(self, problem: Problem) -> Split:
        """Which split ``problem`` belongs to (a pure function of its key)."""
        bucket = (stable_hash(self.name, problem.key) >> 20) % _HASH_BUCKETS
        return "eval" if bucket < self.eval_share * _HASH_BUCKETS else "train"

    def prompt_id(self, problem: Problem) -> int:
        return stable_hash(self.name, problem.key) & _ID_MASK

    def problems(self, split: Split, n: int, seed: int, unique: bool = False) -> list[Problem]:
        """``n`` problems of ``split``, drawn with a generator seeded by ``(name, split, seed)``.

        ``unique`` skips repeats; it raises when the split cannot supply ``n`` distinct problems.
        """
        if split not in ("train", "eval"):
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        out: list[Problem] = []
        seen: set[str] = set()
        attempts, limit = 0, 100 * n + 1000
        while len(out) < n:
            attempts += 1
            if attempts > limit:
                raise ValueError(
                    f"{self.name}: found only {len(out)} of n={n} {'distinct ' if unique else ''}{split} problems in "
                    f"{limit} draws; the problem space is too small: widen the task (more digits or numbers), "
                    "ask for fewer problems, or pass unique=False"
                )
            problem = self.sample_problem(rng)
            if self.split_of(problem) != split or (unique and problem.key in seen):
                continue
            seen.add(problem.key)
            out.append(problem)
        return out

    def from_pool(self, pool: Sequence[Problem], split: Split, n: int, seed: int) -> list[Problem]:
        """``n`` problems of a finite ``pool`` (a task's rows of ``split``) in an order seeded like
        ``problems``, reshuffled after each pass over the pool."""
        rng = random.Random(f"{self.name}:{split}:{seed}")
        out: list[Problem] = []
        while len(out) < n:
            order = list(pool)
            rng.shuffle(order)
            out.extend(order[: n - len(out)])
        return out

    def train_problems(self, n: int, seed: int, unique: bool = False) -> list[Problem]:
        return self.problems("train", n, seed, unique)

    def eval_problems(self, n: int, seed: int, unique: bool = False) -> list[Problem]:
        return self.problems("eval", n, seed, unique)

    def to_prompt(self, problem: Problem, encode: Encode | None = None) -> Prompt:
        """The pipeline message for ``problem``; ``encode`` (e.g. ``tokenizer.encode_prompt``,
        given the ``prompt_source``: text or chat messages) fills ``token_ids``, else they are
        left empty for an engine that tokenizes itself. ``text`` is the prompt as the task wrote
        it (chat messages as JSON), before any chat template."""
        source = self.prompt_source(problem)
        text = source if isinstance(source, str) else json.dumps(source, ensure_ascii=False)
        return Prompt(
            prompt_id=self.prompt_id(problem),
            text=text,
            token_ids=tuple(encode(source)) if encode is not None else (),
            answer=problem.answer,
            difficulty=float(problem.difficulty),
            success_threshold=self.success_threshold,
        )

    def train_prompts(self, n: int, seed: int, encode: Encode | None = None, unique: bool = False) -> list[Prompt]:
        """``n`` training prompts (see ``problems``)."""
        return [self.to_prompt(p, encode) for p in self.problems("train", n, seed, unique)]

    def eval_prompts(self, n: int, seed: int, encode: Encode | None = None, unique: bool = False) -> list[Prompt]:
        """``n`` held-out prompts, disjoint from every training prompt."""
        return [self.to_prompt(p, encode) for p in self.problems("eval", n, seed, unique)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _no_decode(ids: Sequence[int]) -> str:
    raise TypeError("Task.score grades text; call task.scorer(tokenizer.decode) to grade token ids")
