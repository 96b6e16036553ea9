"""The TRL benchmark's held-out accuracy takes its interval from ``pipeline.intervals``: one
method (Student's t over prompts) for every held-out accuracy the project reports."""

from __future__ import annotations

import pytest

from pipeline.intervals import prompt_mean

pytest.importorskip("transformers")


class _Model:
    training = True

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode


def test_the_held_out_interval_is_the_pipelines_t_interval_over_prompts():
    from railgate.bench.trl_eval import HeldOut

    rates = [1.0, 0.5, 0.0, 0.75, 0.25, 0.5]
    held_out = HeldOut(rows=[{}] * len(rates), reward=None, tokenizer=None, max_new_tokens=4, batch_prompts=4)
    held_out._batch = lambda model, rows: [rates.pop(0) for _ in rows]
    expected = prompt_mean(list(rates))
    model = _Model()
    accuracy, half = held_out(model)
    assert accuracy == expected.mean and half == pytest.approx((expected.hi - expected.lo) / 2)
    assert model.training  # put back as it was
