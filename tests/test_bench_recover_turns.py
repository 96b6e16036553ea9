"""bench recover on an environment task: branches from failed turns' boundaries against fresh episodes."""

import json

import anyio

from configs import CONFIG_DIR
from pipeline.engines.torch_engine import TorchEngine
from pipeline.policy.models import build_model, load_model, save_model
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks import build_task
from pipeline.types import SampleRequest, SamplingParams
from railgate.bench.recover_turns import (
    Boundary,
    boundary_offset,
    failed_boundaries,
    generated_tokens,
    play,
    render_turns,
)
from railgate.cli import main
from railgate.config import load_config
from railgate.episodic import env_parts

TINY = ["torch_engine.threads=1", "orchestrator.group_size=4"]


def _config(tmp_path):
    cfg = load_config(CONFIG_DIR / "agent.yaml", TINY)
    tok = CharTokenizer.for_tasks(build_task(cfg.task))
    model = build_model(tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_len=cfg.model.max_len, seed=0)
    path = save_model(model, tok, tmp_path / "model")
    return load_config(CONFIG_DIR / "agent.yaml", TINY + [f"model.path={path}"]), path


def test_a_branch_continues_the_failed_turns_context_in_a_forked_environment(tmp_path):
    cfg, path = _config(tmp_path)
    task = build_task(cfg.task)
    base = load_model(path)
    parts = env_parts(cfg, task, base.tokenizer)
    prompt = task.eval_prompts(1, 0, parts.renderer.prompt_ids)[0]
    engine = TorchEngine(base.model, base.tokenizer.eos_id, max_batch=8)

    def request(index):
        return SampleRequest(f"g0-s{index}", 0, index, prompt, SamplingParams(1.0, 1.0, 8, seed=index))

    async def go():
        for index in range(20):  # an untrained model fails its first turns
            source = await play(engine, parts.service, parts.settings, request(index))
            if failed_boundaries(source, 0.5):
                break
        turns = failed_boundaries(source, 0.5)[0]
        branch = await play(engine, parts.service, parts.settings, request(100), Boundary(0, source, turns))
        return source, turns, branch

    try:
        source, turns, branch = anyio.run(go)
    finally:
        parts.service.close_all()
        anyio.run(engine.aclose)
    keep = boundary_offset(source, turns)
    assert source.turns.rewards[turns - 1] == 0.0 and keep > source.turns.ends[turns - 1]  # feedback followed
    assert branch.is_valid and branch.request.request_id == "g0-s100"
    assert branch.result.token_ids[:keep] == source.result.token_ids[:keep]  # the source's context, feedback in it
    assert branch.turns.rewards[:turns] == source.turns.rewards[:turns]
    assert generated_tokens(branch, keep) == sum(branch.turns.policy_mask) - sum(source.turns.policy_mask[:keep])


def test_failed_boundaries_are_failed_turns_that_the_episode_went_on_from():
    from pipeline.types import FinishReason, Prompt, SampleFinished, ScoredSample, Turns

    result = SampleFinished("g0-s0", (1,) * 6, (0.0,) * 6, FinishReason.STOP, 0)
    request = SampleRequest("g0-s0", 0, 0, Prompt(0, "", (1,)), SamplingParams())
    mask = (True, False, True, False, True, True)
    scored = ScoredSample(request, result, 0.0, turns=Turns((1, 3, 6), (0.0, 1.0, 0.0), mask))
    assert failed_boundaries(scored, 0.5) == [1]  # turn 3 failed but ended the episode


def test_the_cli_measures_turns_on_an_environment_task(tmp_path, capsys):
    cfg, path = _config(tmp_path)
    out = tmp_path / "out"
    argv = ["bench", "recover", "--config", str(CONFIG_DIR / "agent.yaml"), "--out", str(out), "--no-progress"]
    argv += ["--prompts", "4", "--branches", "2", "--failed-per-prompt", "2"]
    for item in TINY + [f"model.path={path}"]:
        argv += ["--set", item]
    assert main(argv) == 0
    report = json.loads((out / "recover.json").read_text())
    assert report["profile"]["prompts"] == 4 and report["step0"]["trials"] == 16
    rows = report["rows"]
    total = rows["all"]
    assert total["boundaries"] <= 8 and total["branch"]["trials"] == total["fresh"]["trials"] == 2 * total["boundaries"]
    assert sum(r["boundaries"] for name, r in rows.items() if name.startswith("turn ")) == total["boundaries"]
    assert report["episode_failures"] == {"fresh": 0, "branch": 0}
    assert "branched after" in capsys.readouterr().out and "| all |" in render_turns(report)
