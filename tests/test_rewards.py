"""Rewards: exact, numeric, math-verify (also from worker threads) and the Countdown checker."""

import threading

import anyio
import pytest

from pipeline.policy.tokenizer import CharTokenizer
from pipeline.protocols import Scorer
from pipeline.tasks.rewards import (
    CountdownReward,
    ExactMatchReward,
    MathVerifyReward,
    NumericReward,
    build_reward,
    check_countdown,
    evaluate_expression,
)
from pipeline.tasks.rewards.countdown import ExpressionError, parse_spec
from pipeline.types import Prompt

TOK = CharTokenizer("0123456789+-*/()=., \\{}abcdefghijklmnopqrstuvwxyz$")


def prompt(answer: str) -> Prompt:
    return Prompt(prompt_id=1, text="q", token_ids=(), answer=answer)


def ids(text: str) -> list[int]:
    return TOK.encode_response(text)  # as an engine returns them: ending in <eos>


@pytest.mark.parametrize("cls", [ExactMatchReward, NumericReward, MathVerifyReward, CountdownReward])
def test_every_reward_is_a_threaded_scorer(cls):
    reward = cls(TOK.decode)
    assert reward.runs_inline is False
    assert isinstance(reward(prompt("1,2->3" if cls is CountdownReward else "3"), ids("3")), float)
    scorer: Scorer = reward  # structural: the orchestrator's Protocol
    assert callable(scorer)


def test_exact_match_strips_whitespace_and_eos():
    reward = ExactMatchReward(TOK.decode)
    assert reward(prompt("254"), ids("254")) == 1.0
    assert reward(prompt("254"), ids(" 254 ")) == 1.0
    assert reward(prompt("254"), ids("2540")) == 0.0
    assert ExactMatchReward(TOK.decode, strip=False)(prompt("254"), ids(" 254")) == 0.0


def test_numeric_tolerance_and_extraction():
    reward = NumericReward(TOK.decode, abs_tol=0.01)
    assert reward(prompt("3.14"), ids("pi is about 3.141")) == 1.0
    assert reward(prompt("3.14"), ids("3.2")) == 0.0
    assert reward(prompt("1234"), ids("total 1,234 units")) == 1.0
    assert reward(prompt("7"), ids("no number here")) == 0.0
    assert NumericReward(TOK.decode, rel_tol=0.1, abs_tol=0)(prompt("100"), ids("109")) == 1.0
    assert NumericReward(TOK.decode, which="whole")(prompt("5"), ids("x 5")) == 0.0
    with pytest.raises(ValueError, match="holds no number"):
        reward(prompt("none"), ids("5"))


def test_math_verify_equivalences():
    reward = MathVerifyReward(TOK.decode)
    assert reward(prompt("\\frac{1}{2}"), ids("so \\boxed{0.5}")) == 1.0
    assert reward(prompt("the answer is $\\boxed{42}$."), ids("\\boxed{42}")) == 1.0
    assert reward(prompt("42"), ids("\\boxed{41}")) == 0.0
    assert reward(prompt("42"), ids("")) == 0.0


def _math_verify_in(runner) -> list[float]:
    reward = MathVerifyReward(TOK.decode)
    return runner(lambda: [reward(prompt("\\frac{1}{2}"), ids("\\boxed{0.5}")), reward(prompt("2"), ids("\\boxed{3}"))])


def test_math_verify_works_in_a_thread():
    out: list = []

    def target(fn=None):
        try:
            out.append(_math_verify_in(lambda f: f()))
        except BaseException as exc:  # surfaced below: a signal error must fail the test
            out.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=60)
    assert out == [[1.0, 0.0]]


def test_math_verify_works_under_anyio_to_thread():
    async def main():
        return await anyio.to_thread.run_sync(lambda: _math_verify_in(lambda f: f()))

    assert anyio.run(main) == [1.0, 0.0]


def test_countdown_checker_accepts_valid_and_rejects_invalid():
    nums, target = [3, 7, 12, 20], 37
    assert check_countdown("(12+7)*3-20", nums, target)
    assert check_countdown(" 20+12+7-3-(3-3) ", [20, 12, 7, 3, 3, 3], 36)
    assert check_countdown("7*3+12+20-(3)", nums, 57) is False  # 3 used twice, given once
    assert check_countdown("12+7", nums, 19)  # not every number has to be used
    assert not check_countdown("12+8", nums, 20)  # 8 not given
    assert not check_countdown("(12+7", nums, 19)
    assert not check_countdown("12/0+7", [12, 0, 7], 7)
    assert not check_countdown("", nums, 0)
    assert not check_countdown("-3+40", [3, 40], 37)  # no unary minus
    assert check_countdown("7/2*2", [7, 2, 2], 7)  # exact fractions


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "1+1;2",
        "2**10",
        "1e3",
        "abs(-3)",
        "3 4",
        "(" * 100 + "1" + ")" * 100,
        "9" * 300,
    ],
)
def test_countdown_parser_rejects_everything_outside_the_grammar(text):
    with pytest.raises(ExpressionError):
        evaluate_expression(text)
    assert not check_countdown(text, [1, 2, 3, 4, 10], 1024)


def test_countdown_reward_reads_the_spec():
    reward = CountdownReward(TOK.decode)
    p = prompt("3,7,12->22")
    assert reward(p, ids("12+7+3")) == 1.0 and reward(p, ids("12*7")) == 0.0
    assert parse_spec("3,7,12->22") == ([3, 7, 12], 22)
    with pytest.raises(ValueError, match="not of the form"):
        reward(prompt("22"), ids("22"))


def test_build_reward_names_the_choices():
    assert isinstance(build_reward("math_verify", TOK.decode), MathVerifyReward)
    with pytest.raises(ValueError, match="choose one of countdown, exact, math_verify, numeric"):
        build_reward("bleu", TOK.decode)
    with pytest.raises(TypeError, match="not callable"):
        ExactMatchReward("decode")
