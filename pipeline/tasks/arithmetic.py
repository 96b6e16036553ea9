"""Multi-digit arithmetic with the answer written backwards: ``00037+00415=`` -> ``254``.

Why reversed: a model writes its answer left to right, and the low digit of a sum is the
one that depends on the fewest inputs. Written backwards, each output digit needs only one
digit pair and the carry from the digit just written, so a 0.4M-parameter character model
learns addition digit by digit; in the usual order the first digit written depends on every
carry, which a tiny model does not learn in minutes. Multiplication stays hard even
reversed: it is there as a harder variant.

Why operands are zero-padded to ``max_digits`` (``padding="max"``): then answer digit k
always reads the operand digits at the same two positions, a pattern learned position
embeddings pick up within a few hundred steps. Measured here (GPT-2 d=128, 2 layers,
batch 64, 1-5 digits, sampled accuracy at T = 1):

=========  ==============================================================================
padding    what a short warm start learns
=========  ==============================================================================
``max``    0.11 / 0.76 / 0.98 at steps 200 / 400 / 600, every width at once; at 0.43
           accuracy pass rates fall smoothly with width (0.57 ... 0.24), 25% of groups
           of 8 saturated
``pair``   the shorter operand padded to the longer one's length: one position pattern
           per width, learned one width at a time with long plateaus: at step 1500,
           widths 1-2 perfect, 3-5 near 0 (accuracy 0.40, 86% of groups saturated)
``none``   0.04 at step 600: the digits to read move with both operands' lengths
=========  ==============================================================================

With ``scratchpad=True`` (addition only) the response writes the sum digit by digit first,
one fixed-width step per digit position with its carry, then ``>`` and the answer
(``pipeline.tasks.scratchpad``): 52 tokens at most for 5 digits instead of 7.

Difficulty is the number of digits of the longer operand (``min_digits``..``max_digits``,
drawn uniformly); the other operand has between 1 and that many digits. Subtraction puts
the larger operand first, so answers are never negative.
"""

from __future__ import annotations

import random

from pipeline.tasks.base import Problem, Task
from pipeline.tasks.scratchpad import SCRATCHPAD_CHARS, join_steps

PADDINGS = ("none", "pair", "max")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(Task):
    """Additions (and optionally subtractions, multiplications) of ``min_digits``..``max_digits``
    digit numbers; the answer is the result's digits reversed (``reverse_answer``).

    Parameters
    ----------
    min_digits, max_digits
        Range of the longer operand's digit count (the difficulty knob).
    ops
        The operators to draw from, a subset of ``"+-*"``.
    reverse_answer
        Write answers least-significant digit first (see the module docstring).
    padding
        ``"max"``: zero-pad both operands to ``max_digits``; ``"pair"``: the shorter one to
        the longer one's length; ``"none"``: as written (see the module docstring).
    scratchpad
        Write the work before the answer: ``a+b+carry=sum`` per digit position, lowest first,
        then ``>`` and the answer; the reward grades the answer only. Addition only.
    template
        The prompt as words for a pretrained chat model, with ``{a}``, ``{op}``, ``{b}`` (the
        operands unpadded); empty: the compact ``00037+00415=``. Problem keys (and so the
        train/eval split) stay the compact form.
    reward
        ``"exact"`` (the response is the answer) or ``"numeric"`` (its last number is).
    eval_share
        Share of the problem space held out for evaluation.

    Examples
    --------
    >>> task = ArithmeticTask(min_digits=1, max_digits=3)
    >>> problem = task.train_problems(1, seed=0)[0]
    >>> prompt_text, target = task.sft_example(problem)
    >>> prompt_text.endswith("="), target == problem.answer
    (True, True)
    >>> p = task.eval_prompts(1, seed=0)[0]
    >>> task.score(p, p.answer), task.score(p, p.answer + "1")
    (1.0, 0.0)
    >>> ArithmeticTask().sft_example(ArithmeticTask().make_problem(37, "+", 415))
    ('00037+00415=', '254')
    >>> [ArithmeticTask(padding=p).make_problem(37, "+", 415).text for p in ("pair", "none")]
    ['037+415', '37+415']
    >>> ArithmeticTask(max_digits=3, scratchpad=True).make_problem(37, "+", 85).solution
    '7+5+0=12,3+8+1=12,0+0+1=01>221'
    >>> chat = ArithmeticTask(reverse_answer=False, template="What is {a} {op} {b}?", reward="numeric")
    >>> problem = chat.make_problem(37, "+", 415)
    >>> chat.format_prompt(problem), problem.answer
    ('What is 37 + 415?', '452')
    >>> p = chat.eval_prompts(1, seed=0)[0]
    >>> chat.score(p, f"The sum is {p.answer}."), chat.score(p, "I do not know")
    (1.0, 0.0)
    """

    name = "arithmetic"
    reward = "exact"

    def __init__(
        self,
        min_digits: int = 1,
        max_digits: int = 5,
        ops: str = "+",
        reverse_answer: bool = True,
        padding: str = "max",
        scratchpad: bool = False,
        template: str = "",
        reward: str = "exact",
        eval_share: float = 0.1,
    ) -> None:
        super().__init__(eval_share)
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"min_digits={min_digits}, max_digits={max_digits}: need 1 <= min_digits <= max_digits")
        bad = sorted(set(ops) - set(_OPS))
        if not ops or bad:
            raise ValueError(f"ops={ops!r} must be a non-empty subset of '+-*' (unknown: {bad})")
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.ops = "".join(sorted(set(ops), key="+-*".index))
        self.reverse_answer = reverse_answer
        if padding not in PADDINGS:
            raise ValueError(f"padding={padding!r} must be one of {', '.join(PADDINGS)}")
        self.padding = padding
        if scratchpad and self.ops != "+":
            raise ValueError(f"scratchpad=True writes carries of additions; ops={self.ops!r} must be '+'")
        self.scratchpad = scratchpad
        if template:
            try:
                template.format(a=1, op="+", b=2)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"template={template!r} may hold only {{a}}, {{op}} and {{b}} ({exc!r})") from None
        if scratchpad and template:
            raise ValueError("scratchpad=True writes the compact form; set template='' or scratchpad=False")
        self.template = template
        if reward not in ("exact", "numeric"):
            raise ValueError(f"reward={reward!r} must be 'exact' or 'numeric'")
        self.reward = reward
        if scratchpad:
            self.sample_tokens = self.max_response_tokens(max_digits)

    @staticmethod
    def max_response_tokens(max_digits: int) -> int:
        """Longest scratchpad response in tokens, ``<eos>`` included: ``max_digits`` steps of 8
        characters and their commas, ``>``, an answer of up to ``max_digits + 1`` digits, ``<eos>``.

        >>> ArithmeticTask.max_response_tokens(5)
        52
        """
        return 9 * max_digits - 1 + 1 + (max_digits + 1) + 1

    @property
    def alphabet(self) -> str:
        words = "".join(sorted(set(self.template.format(a=0, op=self.ops, b=0)))) if self.template else ""
        return "0123456789=" + self.ops + (SCRATCHPAD_CHARS if self.scratchpad else "") + words

    def make_problem(self, a: int, op: str, b: int) -> Problem:
        """The problem ``a op b`` (for tests and examples)."""
        result = _OPS[op](a, b)
        answer = str(result)[::-1] if self.reverse_answer else str(result)
        width = {"none": 0, "pair": max(len(str(a)), len(str(b))), "max": self.max_digits}[self.padding]
        text = f"{a:0{width}d}{op}{b:0{width}d}"
        solution = join_steps(_carry_steps(a, b, len(text.split(op)[0])), answer) if self.scratchpad else answer
        words = self.template.format(a=a, op=op, b=b) if self.template else text
        return Problem(
            key=text, text=words, answer=answer, solution=solution, difficulty=float(max(len(str(a)), len(str(b))))
        )

    def sample_problem(self, rng: random.Random) -> Problem:
        op = rng.choice(self.ops)
        digits = rng.randint(self.min_digits, self.max_digits)
        a = _number_with_digits(rng, digits)
        b = _number_with_digits(rng, rng.randint(1, digits))
        if rng.random() < 0.5:
            a, b = b, a
        if op == "-" and a < b:
            a, b = b, a
        return self.make_problem(a, op, b)

    @property
    def unique_response(self) -> bool:
        """The exact reward on the compact form accepts the answer's digits alone (its alphabet has
        no whitespace for the match to strip); a scratchpad's work, words or a numeric match do not.

        >>> ArithmeticTask().unique_response, ArithmeticTask(scratchpad=True).unique_response
        (True, False)
        """
        return self.reward == "exact" and not self.scratchpad and not self.template

    def format_prompt(self, problem: Problem) -> str:
        return problem.text if self.template else problem.text + "="

    def __repr__(self) -> str:
        return (
            f"ArithmeticTask(min_digits={self.min_digits}, max_digits={self.max_digits}, ops={self.ops!r}, "
            f"reverse_answer={self.reverse_answer}, padding={self.padding!r}"
            + (", scratchpad=True" if self.scratchpad else "")
            + (f", template={self.template!r}, reward={self.reward!r})" if self.template else ")")
        )


def _carry_steps(a: int, b: int, width: int) -> list[str]:
    """``a + b`` digit by digit, lowest first: ``x+y+carry=sum`` with a two-digit sum, over
    ``width`` positions or the longer operand's digits (the last carry still counts)."""
    steps, carry = [], 0
    for k in range(max(width, len(str(a)), len(str(b)))):
        x, y = a // 10**k % 10, b // 10**k % 10
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total:02d}")
        carry = total // 10
    return steps


def _number_with_digits(rng: random.Random, digits: int) -> int:
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)
