"""GatedGRPOTrainer on TRL's vLLM server mode, against a fake server: the probe and the rest of
a step's groups go out as separate requests (n = probe size, n = the rest), each naming every
prompt once, and the completions the server sends back are the ones TRL trains on.

TRL's own server-mode code runs (``VLLMGeneration.generate``: gathering, one request per call,
``n`` completions per prompt, broadcasting, slicing); only the HTTP client is a fake, because on
a CPU machine the real one stops at TRL's weight-sync setup (it needs CUDA for NCCL; docs/trl.md).
"""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")
pytest.importorskip("vllm")

import trl.generation.vllm_generation as vllm_generation  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl_fixtures import MATCHED, model_dir, outcome_rows  # noqa: E402

from railgate.trl import GatedGRPOConfig, GatedGRPOTrainer  # noqa: E402


class FakeServer:
    """The vLLM server behind TRL's ``VLLMClient``: completion j of every prompt is the digit j
    then end-of-sequence; it records each request's prompts and ``n``."""

    requests: list[tuple[list[tuple[int, ...]], int]] = []
    syncs = 0
    digits: dict[int, int] = {}
    eos = 0

    def __init__(self, *args, **kwargs):
        pass

    def init_communicator(self, device=None):
        return None

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": "processed_logprobs"}, "weight_transfer_config": {"backend": "nccl"}}

    def generate(self, prompts, features=None, n=1, logprobs=0, **kwargs):
        FakeServer.requests.append(([tuple(p) for p in prompts], n))
        completions = [[self.digits[j % 10], self.eos] for _ in prompts for j in range(n)]
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": completions,
            "logprobs": [[[-0.5]] * len(c) for c in completions],
            "logprob_token_ids": [[[t] for t in c] for c in completions],
        }

    def update_named_params(self, metadata, params):
        FakeServer.syncs += 1
        for _ in params:
            pass

    def reset_prefix_cache(self):
        return None


def parity(prompts, completions, kind, **kwargs):
    """easy: 1, hard: 0, coin: 1 for an even digit (so a probe of completions 0, 1, 2 is mixed)."""
    return [1.0 if k == "easy" else 0.0 if k == "hard" else float(int(c) % 2 == 0) for c, k in zip(completions, kind)]


def test_probe_and_rest_are_separate_requests_and_their_completions_train(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_generation, "VLLMClient", FakeServer)
    FakeServer.requests, FakeServer.syncs = [], 0
    # Groups of 5, probes of 3 (an all-same probe: P_eff = 2/6 <= 0.45, abandoned), 2 groups a step.
    settings = {**MATCHED, "num_generations": 5, "per_device_train_batch_size": 10, "max_steps": 2}
    args = GatedGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_vllm=True,
        vllm_mode="server",
        gate_probe_size=3,
        gate_reference_prior=False,
        gate_probe_when="always",  # every group probed (the default launches the first groups whole)
        **settings,
    )
    rows = outcome_rows(60)
    trainer = GatedGRPOTrainer(
        model=model_dir(tmp_path), reward_funcs=parity, args=args, train_dataset=Dataset.from_list(rows)
    )
    tok = trainer.processing_class
    FakeServer.digits = {d: tok(text=str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)}
    FakeServer.eos = trainer.eos_token_ids[0]
    trainer.train()

    sizes = [n for _, n in FakeServer.requests]
    assert set(sizes) == {3, 2} and sizes[0] == 3  # probes (n=3), rests of committed groups (n=5-3)
    assert all(len(set(prompts)) == len(prompts) for prompts, _ in FakeServer.requests)  # each prompt once a request
    m = trainer.gate.metrics()
    assert sum(len(p) * n for p, n in FakeServer.requests) == m["railgate/rollouts_generated"]
    rests = sum(len(p) for p, n in FakeServer.requests if n == 2)
    assert rests == m["railgate/groups_committed"] == 2 * 2  # a rest request per committed group, 2 groups a step
    assert m["railgate/rollouts_generated"] == 3 * m["railgate/groups_abandoned"] + 5 * m["railgate/groups_committed"]
    # What trained: coin prompts, each group the probe's digits 0-2 then the rest's 0-1.
    kinds = {r["prompt"]: r["kind"] for r in rows}
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    assert {kinds[p] for p in prompts} == {"coin"}
    groups = [completions[i : i + 5] for i in range(0, len(completions), 5)]
    assert len(groups) == 2 and all(g == ["0", "1", "2", "0", "1"] for g in groups)  # TRL keeps the last step's
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert all("sampling/importance_sampling_ratio/mean" in h for h in steps)  # the server's log-probs reached TRL
    assert FakeServer.syncs == 2  # weights pushed once a step, not once a request
