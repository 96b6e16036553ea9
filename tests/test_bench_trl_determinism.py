"""The same ``bench trl`` run twice writes the same figures (issue 53, item 1): two runs of
``run_trl_bench`` with the same spec, on the project's CPU model, give identical ``trl.json``
accuracies, intervals, rollout and token counts, optimiser steps, step logs and gate counters;
only the CPU- and wall-seconds differ. The smallest run that trains both trainers at least two
steps: 2 prompts x 4 completions a step, a budget of 16 rollouts, 8 held-out prompts sampled
twice. ``gate_defaults``: the gated trainer probes and abandons groups (SARA's probing rule and
its calibrated reference), the path with the most seeded draws."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from railgate.bench.trl import TrlBenchSpec, run_trl_bench  # noqa: E402

SPEC = TrlBenchSpec(
    model="cpu",
    seeds=1,
    budget=16,
    prompts_per_step=2,
    group_size=4,
    gate_defaults=True,
    eval_every=8,
    eval_prompts=8,
    eval_samples=2,
)


def timeless(x):
    """``x`` (a ``trl.json`` document) without the figures that measure time: every key naming
    CPU- or wall-seconds (``cpu_s``, ``wall_s``, ``eval_cpu_s``, the summary's ``cpu_*``)."""
    if isinstance(x, dict):
        return {k: timeless(v) for k, v in x.items() if "cpu" not in k and "wall" not in k}
    if isinstance(x, list):
        return [timeless(v) for v in x]
    return x


def _run(out) -> dict:
    import torch

    threads = torch.get_num_threads()
    try:
        run_trl_bench(SPEC, out, progress=False)  # sets torch's threads to SPEC.threads
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / SPEC.label / "trl.json").read_text())


@pytest.mark.slow
def test_the_same_bench_trl_run_twice_writes_the_same_figures(tmp_path):
    first, second = _run(tmp_path / "a"), _run(tmp_path / "b")
    runs = {r["trainer"]: r for r in first["runs"]}
    assert set(runs) == {"grpo", "gated"}
    for run in runs.values():  # both trained, and were evaluated before, during and after
        assert run["steps"] >= 2 and len(run["points"]) >= 2
        assert all(s["grad_norm"] is not None and s["grad_norm"] > 0 for s in run["step_logs"])
    # the gate's probing rule chose (whole groups: a run this short never earns the licence to probe)
    assert runs["gated"]["gate"]["railgate/gate/probing_whole"] > 0
    assert timeless(first) == timeless(second)


def test_both_trainers_of_a_seed_start_from_the_same_random_state_whatever_ran_before(tmp_path):
    """What makes the runs above repeat, checked fast on a tiny model: building a trainer reseeds
    Python, NumPy and torch with its seed, so draws made before (another seed's run, another
    trainer) do not reach it."""
    import random

    import numpy as np
    import torch
    from trl_fixtures import model_dir

    from railgate.bench.trl import build_trainer
    from railgate.bench.trl_tasks import TrlTask, last_number_reward

    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "reference": str(2 * i)} for i in range(8)]
    task = TrlTask("tiny", rows, rows[:2], last_number_reward, 4, reference_exact=False, reference_skip=0.45)
    spec = TrlBenchSpec(budget=16, prompts_per_step=2, group_size=4)
    states = []
    for trainer, seed in (("grpo", 3), ("gated", 3), ("grpo", 4), ("gated", 3)):
        random.random(), np.random.rand(), torch.rand(3)  # what a previous run might have drawn
        build_trainer(trainer, seed, spec, task, model_dir(tmp_path), tmp_path)
        states.append((torch.random.get_rng_state().tolist(), random.getstate(), np.random.get_state()[1].tolist()))
    first, same, other_seed, again = states
    assert first == same == again  # torch, Python and NumPy: the seed's state, whatever ran before
    assert first[0] != other_seed[0] and first[1] != other_seed[1]  # and each seed has its own
