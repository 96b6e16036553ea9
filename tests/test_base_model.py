"""The base policy: a tiny model learns from SFT, round-trips through a directory, and
broken directories fail with errors that name the path and what is missing."""

import json

import pytest
import torch

from pipeline.policy.config import BaseModelConfig
from pipeline.policy.models import (
    BASE_DIR_NAME,
    META_FILE,
    ModelDirError,
    build_model,
    ensure_base_model,
    load_model,
    save_model,
)
from pipeline.policy.sampling import sample_groups
from pipeline.policy.sft_rows import IGNORE
from pipeline.policy.tokenizer import VOCAB_FILE, CharTokenizer
from pipeline.policy.warmstart import measure_policy, sequence_mean_loss, sft_batch, warm_start
from pipeline.tasks import ArithmeticTask, TaskConfig

torch.set_num_threads(1)

TASK = ArithmeticTask(max_digits=2)
TOK = CharTokenizer.for_tasks(TASK)
TINY = dict(d_model=32, n_layers=1, n_heads=2, max_len=24)


def tiny_model(seed=0):
    return build_model(TOK.vocab_size, seed=seed, **TINY)


def fixed_loss(model) -> float:
    ids, mask, labels = sft_batch(TASK, TOK, TASK.train_problems(64, seed=123))
    with torch.no_grad():
        return sequence_mean_loss(model(input_ids=ids, attention_mask=mask).logits, labels).item()


def test_sft_batch_masks_the_prompt_and_padding():
    problems = [TASK.make_problem(3, "+", 4), TASK.make_problem(55, "+", 66)]
    ids, mask, labels = sft_batch(TASK, TOK, problems)
    prompt_len = len(TOK.encode_prompt("03+04="))
    assert TOK.decode(ids[0]) == "03+04=7" and TOK.decode(ids[1]) == "55+66=121"
    assert (labels[0, :prompt_len] == IGNORE).all()
    assert TOK.decode([t for t in labels[0].tolist() if t != IGNORE], skip_special=False) == "7<eos>"
    assert (labels[0][mask[0] == 0] == IGNORE).all() and mask[0].sum() < mask[1].sum()
    with pytest.raises(ValueError, match="exceeds the model's max_len=5"):
        sft_batch(TASK, TOK, problems, max_len=5)


def test_build_model_is_seeded_and_sized():
    a, b, c = tiny_model(0), tiny_model(0), tiny_model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    assert a.config.vocab_size == TOK.vocab_size and a.config.n_positions == 24
    with pytest.raises(ValueError, match="not a multiple of n_heads"):
        build_model(10, d_model=30, n_heads=4)


def test_a_few_sft_steps_reduce_the_loss():
    model = tiny_model()
    before = fixed_loss(model)
    report = warm_start(TASK, TOK, model, steps=40, batch=32, lr=3e-3, seed=0, progress=False)
    assert report.steps == 40 and report.wall_s > 0
    assert fixed_loss(model) < before - 0.3
    assert report.final_loss < report.first_loss
    assert not model.training


def test_warm_start_checks_accuracy_toward_a_target():
    model = tiny_model()
    report = warm_start(
        TASK, TOK, model, steps=4, batch=8, seed=0, progress=False, target_accuracy=0.99, check_every=2, check_prompts=8
    )
    assert [step for step, _ in report.checks] == [2, 4] and report.steps == 4
    with pytest.raises(ValueError, match="target_accuracy"):
        warm_start(TASK, TOK, model, steps=1, target_accuracy=1.5, progress=False)


def test_left_padding_does_not_change_what_is_sampled():
    model = tiny_model(5)
    with torch.no_grad():  # large random weights: the argmax then depends on the context
        for param in model.parameters():
            param.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(param.numel()))
    short, long = TOK.encode_prompt("1+2="), TOK.encode_prompt("12+34=")
    together = sample_groups(model, TOK, [short, long], group_size=1, temperature=1e-4, max_new_tokens=6)
    alone = [sample_groups(model, TOK, [p], group_size=1, temperature=1e-4, max_new_tokens=6)[0] for p in (short, long)]
    assert together == alone
    assert len(set(map(tuple, [g[0] for g in together]))) == 2  # the check is not vacuous


def test_measure_policy_counts_groups():
    stats = measure_policy(TASK, TOK, tiny_model(), n_prompts=10, group_size=4, batch_prompts=4, max_new_tokens=4)
    assert stats.n_prompts == 10 and stats.group_size == 4
    # all-correct groups count whole toward accuracy, all-wrong ones not at all
    assert stats.all_correct <= stats.accuracy <= 1 - stats.all_wrong
    assert stats.saturated == pytest.approx(stats.all_correct + stats.all_wrong)


def test_save_load_roundtrip(tmp_path):
    model = tiny_model(3)
    save_model(model, TOK, tmp_path / "m", meta={"note": "x"})
    base = load_model(tmp_path / "m")
    assert base.tokenizer == TOK and base.meta == {"note": "x"} and base.path == tmp_path / "m"
    ids = torch.tensor([TOK.encode_prompt("12+34=")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, base.model(ids).logits, atol=1e-6)


def test_missing_or_corrupt_directory_errors_name_the_path(tmp_path):
    with pytest.raises(ModelDirError, match=f"{tmp_path / 'absent'} does not exist"):
        load_model(tmp_path / "absent")
    d = save_model(tiny_model(), TOK, tmp_path / "m")
    (d / "model.safetensors").rename(d / "weights.bak")
    with pytest.raises(ModelDirError, match=r"lacks model.safetensors or pytorch_model.bin"):
        load_model(d)
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelDirError, match=f"{d} holds a corrupt or incompatible model"):
        load_model(d)
    (d / "weights.bak").rename(d / "model.safetensors")
    (d / VOCAB_FILE).unlink()  # now a plain Hugging Face directory: its tokenizer.json twin gives the same ids
    assert load_model(d).tokenizer.encode_prompt("12+34=") == TOK.encode_prompt("12+34=")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match=f"{d}: AutoTokenizer cannot load its tokenizer"):
        load_model(d)
    CharTokenizer("0123456789+=x").save(d)  # a tokenizer of another size
    with pytest.raises(ModelDirError, match="vocab_size=.* differs from the tokenizer's"):
        load_model(d)


def test_ensure_base_model_builds_once_then_loads(tmp_path):
    task_cfg = TaskConfig(name="arithmetic")
    model_cfg = BaseModelConfig(**TINY, warm_start_steps=3, warm_start_batch=8, warm_start_target=0.0, threads=1)
    first = ensure_base_model(tmp_path, task_cfg, model_cfg, progress=False)
    assert first.path == tmp_path / BASE_DIR_NAME and (first.path / META_FILE).is_file()
    assert first.meta["warm_start"]["steps"] == 3
    assert not list(tmp_path.glob(f".{BASE_DIR_NAME}-*"))  # no temporary directory left behind
    again = ensure_base_model(tmp_path, task_cfg, model_cfg, progress=False)
    assert again.meta == json.loads((first.path / META_FILE).read_text())
    assert all(torch.equal(x, y) for x, y in zip(first.model.parameters(), again.model.parameters()))
    with pytest.raises(ModelDirError, match="built for other task settings"):
        ensure_base_model(tmp_path, TaskConfig(name="countdown"), model_cfg, progress=False)
    threads_only = BaseModelConfig(**TINY, warm_start_steps=3, warm_start_batch=8, warm_start_target=0.0, threads=2)
    assert ensure_base_model(tmp_path, task_cfg, threads_only, progress=False).meta == again.meta
    loaded = ensure_base_model(tmp_path / "other", task_cfg, BaseModelConfig(path=str(first.path)))
    assert loaded.path == first.path
    with pytest.raises(ModelDirError, match="cannot encode .* which task 'countdown' uses"):
        ensure_base_model(tmp_path / "other", TaskConfig(name="countdown"), BaseModelConfig(path=str(first.path)))
