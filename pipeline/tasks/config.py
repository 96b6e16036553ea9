"""Settings of the real tasks (``task:`` in the YAML configs); ``build_task`` turns them into a Task."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.build import require
from pipeline.envs.config import EnvConfig

BUILTIN_REWARDS = ("math_verify", "exact", "numeric")
USER_REWARD = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # module:function


def _template_ok(template: str) -> bool:
    try:
        template.format(a=1, op="+", b=2)
    except (KeyError, IndexError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class ArithmeticConfig:
    """``task.name: arithmetic``: multi-digit arithmetic, answers written backwards."""

    min_digits: int = 1
    """Fewest digits of the longer operand."""
    max_digits: int = 5
    """Most digits of the longer operand (difficulty is drawn uniformly in between)."""
    ops: str = "+"
    """Operators drawn from, a subset of '+-*'."""
    reverse_answer: bool = True
    """Write answers least-significant digit first (learnable by a tiny model)."""
    padding: Literal["max", "pair", "none"] = "max"
    """Zero-pad both operands to max_digits ('max': learned in a few hundred steps), the
    shorter to the longer one's length ('pair': learned width by width, slowly) or not at
    all ('none': too slow for a CPU warm start). See pipeline/tasks/arithmetic.py."""
    scratchpad: bool = False
    """Responses write the work first, one 'a+b+carry=sum' step per digit position, then '>'
    and the answer (up to 10 x max_digits + 2 tokens; orchestrator.max_tokens and model.max_len
    follow from it when a config does not give them: ``TaskConfig.lengths``); the reward
    grades the answer only. Addition only."""
    template: str = ""
    """The prompt in words for a pretrained chat model, with {a}, {op} and {b} (operands
    unpadded), e.g. 'What is {a} {op} {b}? Answer with the number only.'; empty: the compact
    '00037+00415=' form. Set reverse_answer=false with it."""
    reward: Literal["exact", "numeric"] = "exact"
    """'exact': the response is the answer; 'numeric': the response's last number is."""

    def __post_init__(self) -> None:
        require(
            1 <= self.min_digits <= self.max_digits,
            f"task.arithmetic min_digits={self.min_digits}, "
            f"max_digits={self.max_digits}: need 1 <= min_digits <= max_digits",
        )
        require(
            bool(self.ops) and set(self.ops) <= set("+-*"),
            f"task.arithmetic.ops={self.ops!r} must be a non-empty subset of '+-*'",
        )
        require(
            not self.scratchpad or self.ops == "+",
            f"task.arithmetic.scratchpad=true writes the carries of additions; "
            f"ops={self.ops!r} must be '+' (or set scratchpad=false)",
        )
        require(
            not (self.scratchpad and self.template),
            "task.arithmetic.scratchpad=true writes the compact form; "
            "set task.arithmetic.template='' or scratchpad=false",
        )
        require(
            _template_ok(self.template),
            f"task.arithmetic.template={self.template!r} may hold only the fields "
            "{a}, {op} and {b} (write literal braces as {{ and }})",
        )

    @property
    def response_tokens(self) -> int:
        """Longest reference response in tokens, <eos> included (scratchpad: 10 x max_digits + 2)."""
        return 10 * self.max_digits + 2 if self.scratchpad else self.max_digits + 2

    @property
    def prompt_tokens(self) -> int:
        """Longest compact prompt in tokens, <bos> included: two operands padded to max_digits,
        the operator and '=' (``00037+00415=`` is 13 tokens)."""
        return 2 * self.max_digits + 3


@dataclass(frozen=True)
class CountdownConfig:
    """``task.name: countdown``: reach a target from a few numbers."""

    min_numbers: int = 2
    """Fewest numbers given."""
    max_numbers: int = 4
    """Most numbers given (difficulty is the count)."""
    max_number: int = 20
    """Numbers are drawn from 1..max_number."""
    max_target: int = 200
    """Targets lie in 1..max_target."""
    ops: str = "+-*"
    """Operators of the reference solutions (responses may use + - * / and parentheses)."""
    scratchpad: bool = False
    """Responses write one equation per step (e.g. '3+7=10,10+12=22'), then '>' and the
    expression; the reward grades the expression only. About 24 tokens on average, 44 at most
    with the defaults: orchestrator.max_tokens and model.max_len follow (56 and 96) unless the
    config sets them."""

    def __post_init__(self) -> None:
        require(
            2 <= self.min_numbers <= self.max_numbers,
            f"task.countdown min_numbers={self.min_numbers}, "
            f"max_numbers={self.max_numbers}: need 2 <= min_numbers <= max_numbers",
        )
        require(self.max_number >= 2, f"task.countdown.max_number={self.max_number} must be >= 2")
        require(self.max_target >= 1, f"task.countdown.max_target={self.max_target} must be >= 1")
        require(
            "+" in self.ops and set(self.ops) <= set("+-*/"),
            f"task.countdown.ops={self.ops!r} must be a subset of '+-*/' with '+'",
        )


@dataclass(frozen=True)
class DatasetConfig:
    """``task.name: dataset``: prompts and answers from local JSONL or Parquet files."""

    train_path: str = ""
    """JSONL or Parquet file of training rows."""
    eval_path: str = ""
    """Optional file of held-out rows; without it eval_share of the train rows are held out."""
    prompt_field: str = "prompt"
    """Field holding the prompt text (e.g. 'problem')."""
    answer_field: str = "answer"
    """Field holding the graded answer (e.g. 'solution' with a \\boxed{} answer)."""
    solution_field: str = ""
    """Optional field of a full reference response, the warm-start target (else the answer)."""
    difficulty_field: str = ""
    """Optional numeric field copied into Prompt.difficulty (for reports)."""
    template: str = "{prompt}"
    """Prompt template; {prompt} is replaced by the row's prompt."""
    reward: str = "math_verify"
    """How responses are graded: 'math_verify', 'exact' or 'numeric' against the answer, or your
    own TRL-style function 'module:function' (f(prompts, completions, **columns) -> list[float |
    None], columns = the row's other fields; None = no reward: counted, not trained on).
    The module is imported from the working directory or PYTHONPATH."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """Rows with a missing, non-string or empty field, or a prompt over max_prompt_chars:
    skip and count them, or stop with an error naming the row."""
    max_prompt_chars: int = 0
    """Prompts longer than this are bad rows (0: no limit)."""

    def __post_init__(self) -> None:
        require("{prompt}" in self.template, f"task.dataset.template={self.template!r} must contain '{{prompt}}'")
        require(
            self.reward in BUILTIN_REWARDS or bool(USER_REWARD.fullmatch(self.reward)),
            f"task.dataset.reward={self.reward!r} must be one of {', '.join(BUILTIN_REWARDS)} or a function "
            "of your own as 'module:function' (e.g. my_rewards:accuracy)",
        )
        require(self.max_prompt_chars >= 0, f"task.dataset.max_prompt_chars={self.max_prompt_chars} must be >= 0")


@dataclass(frozen=True)
class TaskConfig:
    """Which task the policy is trained and evaluated on."""

    name: Literal["arithmetic", "countdown", "dataset", "env"] = "arithmetic"
    """The task; its settings are in the section of the same name."""
    eval_share: float = 0.1
    """Share of the problem space held out for evaluation (disjoint from training by hash)."""
    chat_template: bool = False
    """Render every prompt through the model's chat template (as one user message, with the
    generation prompt); needs model.path with a chat template. Chat-message prompts of a
    dataset are always rendered so."""
    success_threshold: float = 0.5
    """A rollout counts as a success when its reward is above this: gates, the controller and
    eval/accuracy read rewards so (set it for shaped or summed rewards)."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    countdown: CountdownConfig = field(default_factory=CountdownConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    """``task.name: env``: multi-turn episodes against an environment (pipeline/envs/, docs/envs.md)."""

    def lengths(self, min_len: int) -> tuple[int, int] | None:
        """``(orchestrator.max_tokens, model.max_len)`` that fit this task on the project's model:
        the one source of the generation and context lengths when a config does not give them.
        None where the task states no token need (datasets, templated arithmetic prompts).

        max_tokens is the longest reference response plus at least 9 tokens of slack, rounded
        up to a multiple of 4; max_len holds the longest prompt and max_tokens, rounded up to a
        multiple of 32, and is at least ``min_len`` (``model.max_len``'s default).

        >>> TaskConfig().lengths(64)  # answer-only addition up to 5 digits: 7-token answers
        (16, 64)
        >>> TaskConfig(arithmetic=ArithmeticConfig(scratchpad=True)).lengths(64)  # 52-token responses
        (64, 96)
        >>> TaskConfig(name="countdown").lengths(64), TaskConfig(name="countdown", countdown=CountdownConfig(scratchpad=True)).lengths(64)
        ((16, 64), (56, 96))
        """
        if self.name == "countdown":
            # answers such as (12+3)*(4-2) take at most 16 tokens with <eos>; scratchpads 44 at
            # most with the default settings (CountdownConfig.scratchpad)
            return (56, max(min_len, 96)) if self.countdown.scratchpad else (16, min_len)
        if self.name != "arithmetic" or self.arithmetic.template:
            return None
        need = self.arithmetic.response_tokens
        max_tokens = need + 12 - need % 4
        room = max_tokens + self.arithmetic.prompt_tokens
        return max_tokens, max(min_len, -(-room // 32) * 32)

    def __post_init__(self) -> None:
        require(0 < self.eval_share < 1, f"task.eval_share={self.eval_share} must be in (0, 1)")
        require(
            math.isfinite(self.success_threshold),
            f"task.success_threshold={self.success_threshold} must be a finite number",
        )
        require(
            self.name != "dataset" or bool(self.dataset.train_path),
            "task.name=dataset needs task.dataset.train_path; set it to a JSONL or Parquet file",
        )
