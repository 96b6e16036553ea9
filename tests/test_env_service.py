"""The shell's environment service: real ChainEnv episodes stepped turn by turn, forks, faults."""

from __future__ import annotations

import anyio

from pipeline.config.sections import EpisodeSettings
from pipeline.envs.config import EnvConfig
from pipeline.envs.render import PlainRenderer
from pipeline.envs.service import EnvService
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks.env import EnvTask
from pipeline.types import FinishReason, SampleFinished, SampleRequest, SamplingParams

SETTINGS = EpisodeSettings(max_turns=5, max_episode_tokens=96, turn_tokens=8)


def setup(cls="pipeline.envs.chain:ChainEnv", **env):
    task = EnvTask(EnvConfig(cls=cls, max_turns=5, **env))
    tokenizer = CharTokenizer(task.alphabet)
    renderer = PlainRenderer(tokenizer)
    [prompt] = task.train_prompts(1, seed=0, encode=renderer.prompt_ids)
    return EnvService(task, renderer, SETTINGS), renderer, prompt


def turn(renderer, request, text, reason=FinishReason.STOP):
    ids = tuple(renderer.action_ids(text))
    return SampleFinished(request.request_id, ids, (0.0,) * len(ids), reason, 0)


def request(prompt, rid="g0-s0", index=0):
    return SampleRequest(rid, 0, index, prompt, SamplingParams(max_tokens=8))


def test_a_chain_episode_is_answered_turn_by_turn_and_ends_done():
    service, renderer, prompt = setup()
    row = service.task.row(prompt.prompt_id)
    answers = service.task.cls.demo_actions(row.extras, __import__("random").Random(0), mistake=False)
    req = request(prompt)
    played = 0
    for answer, _ in answers:
        done = anyio.run(service.step, req, turn(renderer, req, answer))
        played += 1
        assert not done.error and done.reward == 1.0
        if done.done:
            break
        assert done.observation  # the next step, rendered for the context
    assert done.done and played == len(answers)
    service.close("g0-s0")


def test_a_wrong_answer_gets_feedback_and_the_episode_goes_on():
    service, renderer, prompt = setup()
    req = request(prompt)
    answered = anyio.run(service.step, req, turn(renderer, req, "0"))
    assert not answered.done and answered.reward == 0.0
    assert renderer.action_text(answered.observation).startswith("no")


def test_a_turn_cut_at_its_token_limit_is_closed_by_a_stop_token_in_the_observation():
    service, renderer, prompt = setup()
    req = request(prompt)
    cut = tuple(renderer.action_ids("0"))[:-1]  # the answer without its stop token
    unfinished = SampleFinished(req.request_id, cut, (0.0,) * len(cut), FinishReason.LENGTH, 0)
    closed = anyio.run(service.step, req, unfinished)
    assert closed.observation[0] == renderer.stop_ids[0]
    assert renderer.action_text(closed.observation[1:]).startswith("no")
    finished = anyio.run(service.step, request(prompt, "g0-s1", 1), turn(renderer, req, "0"))
    assert finished.observation[0] != renderer.stop_ids[0]  # a turn that stopped is closed already


def test_a_branch_forks_its_source_after_its_turns_even_once_the_source_closed():
    service, renderer, prompt = setup()
    src = request(prompt)
    first = anyio.run(service.step, src, turn(renderer, src, "0"))  # wrong: "no" and the same step again
    service.fork("g0-s0", 1, "g0-s1")
    service.close("g0-s0")
    branch = request(prompt, "g0-s1", 1)
    again = anyio.run(service.step, branch, turn(renderer, branch, "0"))
    assert not again.error and again.observation == first.observation  # the same state: the same step asked


def test_an_aborted_turn_ends_the_episode_without_a_step():
    service, renderer, prompt = setup()
    req = request(prompt)
    done = anyio.run(service.step, req, turn(renderer, req, "", reason=FinishReason.ABORTED))
    assert done.done and not done.error and service.pending_forks == {}


def test_an_environment_that_raises_is_an_error_answer_naming_class_and_step(tmp_path):
    from pipeline.envs.rows import write_rows

    rows = [
        {
            "data_source": "t",
            "prompt": [{"role": "user", "content": f"{i}="}],
            "env_class": "faulty",
            "reward_spec": {"ground_truth": "1"},
        }
        for i in range(40)
    ]
    service, renderer, prompt = setup(
        "pipeline.envs.faulty:FaultyEnv",
        config={"fault": "raise", "at_step": 1},
        dataset=str(write_rows(tmp_path / "rows.jsonl", rows)),
    )
    req = request(prompt)
    done = anyio.run(service.step, req, turn(renderer, req, "1"))
    assert done.done and "FaultyEnv step 1" in done.error
