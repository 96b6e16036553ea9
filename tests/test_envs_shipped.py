"""The shipped environments: ChainEnv's step logic and problems, the word problems and
WordProblemEnv, SkyRL-Gym's own multi-turn GSM8K env running unmodified through EnvSession on
generated rows, and EnvTask's prompts, rows and demonstrations."""

import json
import random

import pytest

from pipeline.config.build import ConfigError
from pipeline.envs.chain import ALPHABET, ChainEnv, parse_chain, values
from pipeline.envs.config import EnvConfig
from pipeline.envs.demos import sft_pairs
from pipeline.envs.render import PlainRenderer
from pipeline.envs.rows import load_env_rows
from pipeline.envs.session import EnvRunner
from pipeline.envs.wordproblems import WordProblemEnv, make_problem, sample_row, write_dataset
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks import TaskConfig, build_task

GSM8K = "skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv"


def chain(truth, **config):
    env = ChainEnv(config, {"reward_spec": {"ground_truth": truth}})
    env.init([{"role": "user", "content": env.step_text()}])
    return env


def test_chain_right_steps_advance_and_the_last_one_succeeds():
    env = chain("5-2*3+4")
    outs = [env.step(a) for a in ("3", "9", "13")]
    assert [o["observations"][0]["content"] if o["observations"] else "" for o in outs] == ["3*3=", "9+4=", ""]
    assert [(o["reward"], o["done"]) for o in outs] == [(1.0, False), (1.0, False), (1.0, True)]
    assert outs[-1]["metadata"] == {"step": 3, "correct": True, "success": True}


def test_chain_wrong_steps_get_a_hint_and_the_same_step_and_retries_run_out():
    env = chain("5-2*3")  # 2 steps + 2 retries = 4 turns
    assert [env.step(a)["observations"][0]["content"] for a in ("4", "2", "x")] == ["no<5-2=", "no>5-2=", "no?5-2="]
    last = env.step("3")  # right, but the 4th turn: out of turns before the last step
    assert last["done"] and last["reward"] == 0.0 and not last["metadata"]["success"]
    quiet = chain("5-2*3", hint=False)
    assert quiet.step("4")["observations"][0]["content"] == "no?5-2="


def test_chain_problems_stay_in_range_and_in_the_alphabet():
    rng = random.Random(0)
    for _ in range(300):
        row = ChainEnv.sample_row(rng)
        start, ops = parse_chain(row["reward_spec"]["ground_truth"])
        assert 2 <= len(ops) <= 3 and all(0 <= v <= 99 for v in values(start, ops))
        actions = ChainEnv.demo_actions(row, rng, mistake=True)
        env = ChainEnv({}, row)
        texts = [row["prompt"][0]["content"]]
        for action, _ in actions:
            out = env.step(action)
            texts += [action] + [m["content"] for m in out["observations"]]
        assert out["done"] and out["reward"] == 1.0 and sum(not t for _, t in actions) == 1
        assert set("".join(texts)) <= set(ALPHABET)


def test_chain_settings_are_checked():
    with pytest.raises(ConfigError, match="unknown key 'task.env.config.step'"):
        ChainEnv({"step": 3}, {"reward_spec": {"ground_truth": "1+1"}})
    with pytest.raises(ConfigError, match="min_steps=3, max_steps=2"):
        ChainEnv({"min_steps": 3, "max_steps": 2}, {"reward_spec": {"ground_truth": "1+1"}})
    with pytest.raises(ValueError, match="is not a chain like"):
        ChainEnv({}, {"reward_spec": {"ground_truth": "1+"}})


def test_word_problems_are_seeded_and_their_solutions_are_right():
    rows = [sample_row(random.Random(7)) for _ in range(2)]
    assert rows[0] == rows[1]
    rng = random.Random(1)
    for _ in range(200):
        p = make_problem(rng)
        for line in p.solution.splitlines()[:-1]:
            expr, result = line.split(" = ")
            assert eval(expr.replace("/", "//")) == int(result)  # the worked steps are arithmetic
        assert p.solution.endswith(f"#### {p.answer}") and p.answer >= 0


def test_word_problem_env_grades_turns_like_skyrls():
    env = WordProblemEnv({}, {"reward_spec": {"ground_truth": "12"}, "extra_info": {"max_turns": 3}})
    first, second = env.step("it is twelve"), env.step("#### 11")
    assert (first["reward"], second["reward"]) == (0.0, pytest.approx(0.2 / 3))
    assert "Last try" in second["observations"][0]["content"]
    third = env.step("#### 1,2")  # '1,2' reads 12, as SkyRL's parser does
    assert third["done"] and third["reward"] == 1.0


def run_episode(runner, row, actions):
    s = runner.session({k: v for k, v in row.items() if k != "prompt"})
    started = s.start(row["prompt"])
    results = [s.step(a) for a in actions]
    s.close()
    return started, results, s


@pytest.mark.parametrize("spec", [GSM8K, "pipeline.envs.wordproblems:WordProblemEnv"])
def test_gsm8k_envs_run_unmodified_through_a_session_on_generated_rows(tmp_path, spec):
    if spec == GSM8K:
        pytest.importorskip("skyrl_gym")
    train, _ = write_dataset(tmp_path, train=20, eval=5, seed=0)
    rows, _ = load_env_rows(train)
    runner = EnvRunner(EnvConfig(cls=spec, dataset=str(train), max_turns=5))
    row = {"prompt": rows[0].prompt, **rows[0].extras}
    truth = row["reward_spec"]["ground_truth"]
    started, results, s = run_episode(runner, row, [f"I think\n#### {int(truth) + 1}", f"so\n#### {truth}"])
    assert started.conversation == tuple(row["prompt"]) and not s.failed
    assert results[0].reward == pytest.approx(0.2 / 5) and not results[0].done
    assert "#### ANSWER" in results[0].observations[0]["content"]
    assert results[1].reward == 1.0 and results[1].done
    _, results, s = run_episode(runner, row, ["no idea"] * 5)
    assert [r.done for r in results] == [False] * 4 + [True] and not s.failed and s.episode_reward == 0.0


def test_env_task_prompts_rows_and_splits_for_a_generated_env():
    task = build_task(TaskConfig(name="env"))
    train, evals = task.train_prompts(500, seed=0), task.eval_prompts(100, seed=0)
    assert {p.prompt_id for p in train}.isdisjoint({p.prompt_id for p in evals})
    assert [p.text for p in task.train_prompts(20, seed=3)] == [
        p.text for p in build_task(TaskConfig(name="env")).train_prompts(20, seed=3)
    ]
    p = evals[0]
    assert task.row(p.prompt_id).prompt == json.loads(p.text) and p.difficulty in (2.0, 3.0)
    right = str(values(*parse_chain(p.answer))[1])
    assert task.score(p, right) == 1.0 and task.score(p, right + "1") == 0.0
    assert set(task.alphabet) == set(ALPHABET)
    with pytest.raises(KeyError, match="was not made by this task"):
        task.row(12345)


def test_env_task_demonstrations_hold_corrected_mistakes_and_render_to_sft_pairs():
    task = build_task(TaskConfig(name="env", env=EnvConfig(demo_mistakes=0.5)))
    demos = task.sft_episodes(40, seed=0)
    with_mistake = [d for d in demos if not all(t.target for t in d.turns)]
    assert 10 <= len(with_mistake) <= 30 and all(d.reward == 1.0 for d in demos)
    renderer = PlainRenderer(CharTokenizer(task.alphabet))
    pairs = sft_pairs(renderer, with_mistake[0])
    tok = renderer.tokenizer
    texts = [(tok.decode(c, skip_special=False), tok.decode(t, skip_special=False)) for c, t in pairs]
    assert any("no" in context for context, _ in texts)  # a target after the env's feedback
    assert all(target.endswith("<eos>") for _, target in texts)
    assert len(task.sft_pairs(renderer, 5, seed=1)) >= 10
