"""A user's Hugging Face model directory as ``model.path``: a tiny random Llama with a BPE
tokenizer built here, loaded with its own tokenizer and context length, chat template on
request, trained for two steps through the CLI with no warm start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from hf_models import save_tiny_llama
from run_helpers import sets

from pipeline.policy.hf_tokenizer import HFTokenizer
from pipeline.policy.models import ModelDirError, load_model
from pipeline.store.buffer import read_all
from railgate.cli import main


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("hf") / "llama", context=96)


def test_loads_with_its_own_tokenizer_and_context(llama_dir):
    base = load_model(llama_dir)
    tok = base.tokenizer
    assert isinstance(tok, HFTokenizer) and base.context_length == 96
    hf = tok.to_hf()
    assert tok.encode_prompt("12+30=") == hf("12+30=")["input_ids"]  # the tokenizer's own <s> first
    assert tok.encode_prompt("12+30=")[0] == hf.bos_token_id and len(tok.encode_prompt("12+30=")) < len("12+30=") + 1
    assert (tok.eos_id, tok.pad_id) == (hf.convert_tokens_to_ids("<|im_end|>"), hf.pad_token_id)
    assert base.model.config.vocab_size >= tok.vocab_size  # a padded embedding table is accepted
    chat = load_model(llama_dir, chat_template=True).tokenizer
    ids = chat.encode_prompt("12+30=")
    assert chat.decode(ids, skip_special=False) == "<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+30="}]
    assert chat.decode(tok.encode_prompt(messages), skip_special=False).startswith("<|im_start|>system\nBe brief.")


def test_broken_directories_name_the_problem(llama_dir, tmp_path):
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(llama_dir / name, no_tok / name)
    with pytest.raises(ModelDirError, match="AutoTokenizer cannot load its tokenizer"):
        load_model(no_tok)
    plain = tmp_path / "no_template"
    shutil.copytree(llama_dir, plain)
    (plain / "chat_template.jinja").unlink()
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match="task.chat_template=true, but .* has no chat template"):
        load_model(plain, chat_template=True)


ARGS = sets(
    "orchestrator.steps=2",
    "orchestrator.batch_groups=4",
    "orchestrator.group_size=4",
    "orchestrator.max_tokens=8",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
    "gate.kind=uniform",
    "orchestrator.eval_every=2",
    "log.checkpoint_every=2",
    "task.arithmetic.max_digits=2",
)


def _trained_steps(run: Path, capsys, *assignments: str) -> list[dict]:
    """Train ``ARGS`` with ``assignments`` into ``run`` (it must succeed); the metrics of its
    steps after step 0's evaluation."""
    code = main(["train", "--no-progress", "--run-dir", str(run), *sets(*assignments), *ARGS])
    assert code == 0, capsys.readouterr().err[-2000:]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]


def test_trains_two_steps_through_the_cli_with_chat_template(llama_dir, tmp_path, capsys):
    run = tmp_path / "run"
    steps = _trained_steps(run, capsys, f"model.path={llama_dir}", "task.chat_template=true")
    assert [s["step"] for s in steps] == [1, 2] and all("learner/loss" in s for s in steps)
    assert not (run / "base_model").exists()  # a user's model is used as it is: no warm start
    table: pa.Table = read_all(run / "buffer")
    tok = load_model(llama_dir, chat_template=True).tokenizer
    prompt = tok.decode(table.column("prompt_token_ids")[0].as_py(), skip_special=False)
    assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("=<|im_end|>\n<|im_start|>assistant\n")
    assert (run / "checkpoints" / "latest").is_file()


def test_the_context_length_comes_from_the_model_config(llama_dir, tmp_path, capsys):
    code = main(
        [
            "train",
            "--no-progress",
            "--run-dir",
            str(tmp_path / "run"),
            "--set",
            f"model.path={llama_dir}",
            *ARGS,
            "--set",
            "orchestrator.max_tokens=95",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "context of model.path" in err and "(96 tokens)" in err, err[-2000:]


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_the_vllm_engine_serves_a_users_model(llama_dir, tmp_path, capsys):
    run = tmp_path / "run"
    steps = _trained_steps(run, capsys, f"model.path={llama_dir}", "engine.kind=vllm", "task.chat_template=true")
    assert [s["step"] for s in steps] == [1, 2] and steps[-1]["pipeline/rollouts_finished"] > 0
    prompt = load_model(llama_dir, chat_template=True).tokenizer.decode(
        read_all(run / "buffer").column("prompt_token_ids")[0].as_py(), skip_special=False
    )
    assert prompt.startswith("<|im_start|>user\n")


def test_chat_template_without_a_chat_model_stops_at_load():
    from pipeline.config.build import ConfigError
    from railgate.config import load_config

    with pytest.raises(ConfigError, match="task.chat_template=true needs a chat model"):
        load_config(None, ["engine.kind=torch", "orchestrator.max_tokens=16", "task.chat_template=true"])
