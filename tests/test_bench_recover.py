"""bench recover: branches from failed responses' prefixes against fresh samples, on the torch engine."""

import json

import pytest

from configs import CONFIG_DIR
from pipeline.policy.models import build_model, save_model
from pipeline.policy.tokenizer import CharTokenizer
from pipeline.tasks import build_task
from railgate.bench.rates import wilson
from railgate.bench.recover import CUTS, cut_position, measure_recoverability, reference_agreement, render
from railgate.cli import main
from railgate.config import load_config

SCRATCH = [
    "task.arithmetic.scratchpad=true",
    "orchestrator.max_tokens=64",
    "model.max_len=96",
    "task.arithmetic.max_digits=3",
    "torch_engine.threads=1",
]


def _tiny_model_dir(tmp_path, cfg):
    task = build_task(cfg.task)
    tok = CharTokenizer.for_tasks(task)
    model = build_model(tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_len=cfg.model.max_len, seed=0)
    return save_model(model, tok, tmp_path / "model")


@pytest.mark.slow  # two measurements on the torch engine: about 40 s on the loaded 2-core machine
def test_branches_and_fresh_samples_are_counted_per_cut(tmp_path):
    cfg = load_config(CONFIG_DIR / "default.yaml", SCRATCH)
    path = _tiny_model_dir(tmp_path, cfg)
    cfg = load_config(CONFIG_DIR / "default.yaml", SCRATCH + [f"model.path={path}", "orchestrator.group_size=4"])
    report = measure_recoverability(cfg, tmp_path / "out", prompts=6, branches=2, failed_per_prompt=2, progress=False)
    total = report["all"]
    assert total["prompts"] == 6 and total["accuracy"]["trials"] == 24
    assert total["all_fail"] + total["mixed"] + total["all_pass"] == 6
    # an untrained model fails almost everything: every prompt with a failure gets fresh samples
    assert total["fresh"]["trials"] > 0 and total["fresh"]["trials"] % 2 == 0
    for cut in CUTS:
        assert total["branch"][cut]["trials"] <= total["fresh"]["trials"]
        assert total["branch"][cut]["trials"] % 2 == 0
    assert 0 < total["mean_prefix_tokens"]["early"] <= total["mean_prefix_tokens"]["mid"]
    assert sum(s["prompts"] for s in report["levels"].values()) == 6
    assert json.loads((tmp_path / "out" / "recover.json").read_text())["all"]["prompts"] == 6
    assert "| all |" in render(report) and (tmp_path / "out" / "recover.md").is_file()
    again = measure_recoverability(cfg, tmp_path / "again", prompts=6, branches=2, failed_per_prompt=2, progress=False)
    assert again["all"]["accuracy"] == total["accuracy"]  # seeded


def test_cut_points_and_intervals():
    ents = tuple(float(x) for x in (0, 1, 5, 2, 0, 0, 0, 0, 0, 0, 0, 0))
    assert [cut_position(c, ents) for c in CUTS] == [3, 6, 2, 0]  # nothing agrees with the reference: no branch
    assert cut_position("reference", ents, agreed=4) == 4
    lo, hi = wilson(0, 20)
    assert lo == 0 and 0.1 < hi < 0.2
    assert wilson(5, 10)[0] < 0.5 < wilson(5, 10)[1]


def test_cli_refuses_the_simulator(capsys):
    assert main(["bench", "recover", "--config", str(CONFIG_DIR / "sim.yaml")]) == 2
    assert "needs a real model" in capsys.readouterr().err


def test_the_reference_cut_keeps_a_scratchpad_up_to_its_first_wrong_token():
    cfg = load_config(CONFIG_DIR / "default.yaml", SCRATCH)
    task = build_task(cfg.task)
    tok = CharTokenizer.for_tasks(task)
    problem = task.eval_problems(1, seed=0)[0]
    right = problem.solution
    wrong_at = right.index(",") + 3  # a digit of the second step
    wrong = right[:wrong_at] + ("1" if right[wrong_at] != "1" else "2") + right[wrong_at + 1 :]
    assert reference_agreement(tuple(tok.encode(wrong)), right, tok.decode) == wrong_at
    assert reference_agreement(tuple(tok.encode(right)), right, tok.decode) == len(right)
