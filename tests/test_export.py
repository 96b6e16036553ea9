"""``run.py export``: the policy as a Hugging Face directory that transformers (and vLLM, in the
integration test) load with no railgate code, for a user's BPE Llama and for the project's
character-level model, whose exported tokenizer gives the same ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import save_tiny_llama
from run_helpers import run_outside, sets
from safetensors.torch import load_file

from pipeline.policy.models import load_model
from railgate.checkpoint import latest_checkpoint, load_checkpoint
from railgate.cli import main

SMALL = sets(
    "orchestrator.batch_groups=4",
    "orchestrator.group_size=4",
    "orchestrator.max_tokens=6",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
    "gate.kind=uniform",
    "log.checkpoint_every=1",
    "task.arithmetic.max_digits=2",
    "orchestrator.eval_every=0",
)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("export_llama")
    model = save_tiny_llama(root / "llama", context=64)
    run = root / "run"
    assert (
        main(
            [
                "train",
                "--no-progress",
                "--run-dir",
                str(run),
                *sets(f"model.path={model}", "task.chat_template=true", "orchestrator.steps=2"),
                *SMALL,
            ]
        )
        == 0
    )
    return run, model


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("export_char") / "run"
    tiny = [
        *sets(
            "model.d_model=64",
            "model.n_heads=2",
            "model.n_layers=1",
            "model.max_len=24",
            "model.warm_start_steps=3",
            "model.warm_start_target=0",
            "model.warm_start_batch=8",
        ),
    ]
    assert main(["train", "--no-progress", "--run-dir", str(run), "--set", "orchestrator.steps=1", *SMALL, *tiny]) == 0
    return run


LOAD = """
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    text = sys.argv[2]
    ids = tok(text)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True) \\
        if tok.chat_template else None
    print(json.dumps({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True), "logits": logits.tolist(),
                      "eos": tok.eos_token_id, "chat": chat, "architecture": model.config.architectures[0]}))
"""


def _logits(model_dir: Path, state: dict, ids: list[int]) -> torch.Tensor:
    base = load_model(model_dir)
    base.model.load_state_dict(state)
    with torch.no_grad():
        return base.model(torch.tensor([ids])).logits[0, -1]


def test_a_users_llama_exports_and_loads_without_project_code(llama_run, tmp_path, capsys):
    run, model_dir = llama_run
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "policy after learner step 2" in printed and "model.safetensors" in printed
    state = load_checkpoint(latest_checkpoint(run))["learner"]["model"]
    exported = load_file(str(out / "model" / "model.safetensors"))
    assert set(exported) == set(state) and all(torch.equal(exported[k], state[k]) for k in state)
    got = run_outside(LOAD, tmp_path, str(out / "model"), "12+30=")
    tok = load_model(model_dir).tokenizer
    assert got["ids"] == tok.encode_prompt("12+30=") and got["architecture"] == "LlamaForCausalLM"
    assert got["eos"] == tok.eos_id and got["chat"].endswith("<|im_start|>assistant\n")  # chat template kept
    assert torch.allclose(torch.tensor(got["logits"]), _logits(model_dir, state, got["ids"]), atol=1e-5)
    record = json.loads((out / "export.json").read_text())
    assert record["step"] == 2 and record["files"]["model/model.safetensors"] > 0


def test_the_char_model_exports_a_tokenizer_with_the_same_ids(char_run, tmp_path):
    out = tmp_path / "export"
    assert main(["export", str(char_run), "--out", str(out), "--step", "1"]) == 0
    base_dir = char_run / "base_model"
    tok = load_model(base_dir).tokenizer
    got = run_outside(LOAD, tmp_path, str(out / "model"), "12+34=")
    assert got["ids"] == tok.encode_prompt("12+34=") and got["decoded"] == "12+34="
    assert got["eos"] == tok.eos_id and got["architecture"] == "GPT2LMHeadModel"
    state = load_checkpoint(next((char_run / "checkpoints").glob("step-000001.*")))["learner"]["model"]
    assert torch.allclose(torch.tensor(got["logits"]), _logits(base_dir, state, got["ids"]), atol=1e-5)
    # step 0 is the base policy, before training
    assert main(["export", str(char_run), "--out", str(tmp_path / "base"), "--step", "0"]) == 0
    base_logits = run_outside(LOAD, tmp_path, str(tmp_path / "base" / "model"), "12+34=")["logits"]
    assert torch.allclose(
        torch.tensor(base_logits), _logits(base_dir, load_model(base_dir).model.state_dict(), got["ids"])
    )


def test_a_step_that_was_not_kept_is_one_clear_line(char_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(char_run), "--out", str(out), "--step", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--step 7" in err and "kept: 1" in err
    assert not (out / "model").exists()
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


VLLM = """
    import json, sys
    from vllm import LLM, SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch
    results = {}
    for path, text in zip(sys.argv[1::2], sys.argv[2::2]):
        llm = LLM(model=path, gpu_memory_utilization=0.3, enforce_eager=True, dtype="float32", max_model_len=24,
                  seed=0)
        out = llm.generate([text], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0].outputs[0]
        del llm
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        ids = tok(text)["input_ids"]
        greedy = []
        with torch.no_grad():
            for _ in range(4):  # argmax decoding, the end-of-sequence token included, as vLLM's ignore_eos does
                greedy.append(int(model(torch.tensor([ids + greedy])).logits[0, -1].argmax()))
        results[path] = {"vllm": list(out.token_ids), "transformers": greedy}
    print(json.dumps(results))
"""


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_vllm_serves_the_exported_models_without_project_code(llama_run, char_run, tmp_path):
    for name, run in (("llama", llama_run[0]), ("char", char_run)):
        assert main(["export", str(run), "--out", str(tmp_path / name)]) == 0
    got = run_outside(
        VLLM, tmp_path, str(tmp_path / "char" / "model"), "12+34=", str(tmp_path / "llama" / "model"), "12+30="
    )
    for path, tokens in got.items():
        assert tokens["vllm"] == tokens["transformers"], path  # greedy: the same model, the same tokens
