"""Shared pieces of the engine tests: tiny GPT-2 models and model directories (the project's
model shape, built in seconds), prompts for them, and reading many streams at once.

Head size 32: vLLM's CPU attention kernels take 32, 64, 80, ... but not 16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from pipeline.types import Prompt


def tiny_gpt2(
    vocab_size: int = 64,
    d_model: int = 64,
    n_heads: int = 2,
    n_layers: int = 2,
    max_len: int = 64,
    seed: int = 0,
    initializer_range: float = 0.02,
):
    """A seeded ``GPT2LMHeadModel`` of ``pipeline.policy.models.build_model`` (no dropout, tied
    head), in eval mode.

    ``initializer_range`` above the default 0.02 gives peaked logits whose entropy varies from
    token to token (at 0.02 every next-token distribution is nearly uniform).
    """
    from pipeline.policy.models import build_model

    model = build_model(vocab_size, d_model, n_layers, n_heads, max_len, seed=seed, initializer_range=initializer_range)
    return model.eval()


def save_tiny_gpt2(directory: str | Path, **kwargs) -> Path:
    """Build ``tiny_gpt2(**kwargs)`` and ``save_pretrained`` it into ``directory``."""
    d = Path(directory)
    tiny_gpt2(**kwargs).save_pretrained(str(d))
    return d


def module_engine_fixtures(name: str, vocab_size: int, build):
    """The fixtures of a test module whose engine loads a model from disk (vLLM, the Ray
    replicas) and is too slow to start per test: ``anyio_backend`` (asyncio, module-scoped, so
    that the engine can be), ``model_dir`` (a tiny GPT-2 saved once) and ``engine``
    (``build(model_dir)``, closed after the module's last test). Unpack them into the module:
    ``anyio_backend, model_dir, engine = module_engine_fixtures(...)``."""

    @pytest.fixture(scope="module")
    def anyio_backend():
        return "asyncio"

    @pytest.fixture(scope="module")
    def model_dir(tmp_path_factory):
        return save_tiny_gpt2(tmp_path_factory.mktemp(name) / "model", vocab_size=vocab_size, seed=3)

    @pytest.fixture(scope="module")
    async def engine(model_dir):
        eng = build(model_dir)
        try:
            yield eng
        finally:
            await eng.aclose()

    return anyio_backend, model_dir, engine


def counting_prompt(i: int, vocab_size: int) -> Prompt:
    """Prompt ``i``: a BOS token, then 3 to 6 tokens counting through the vocabulary from 3."""
    return Prompt(
        prompt_id=i, text="", token_ids=(1,) + tuple(3 + (i * 5 + j) % (vocab_size - 3) for j in range(3 + i % 4))
    )


async def read_all(engine, requests) -> dict[str, list]:
    """Every request's events, by request id, read concurrently (one task per stream)."""
    out: dict[str, list] = {}

    async def one(request):
        out[request.request_id] = [event async for event in engine.stream(request)]

    async with anyio.create_task_group() as tg:
        for request in requests:
            tg.start_soon(one, request)
    return out


def run_then_close(orchestrator: Any, engine: Any) -> Any:
    """Run ``orchestrator`` to its end under anyio and close ``engine`` whatever happens; the run's
    summary."""

    async def main() -> Any:
        try:
            return await orchestrator.run()
        finally:
            await engine.aclose()

    return anyio.run(main)
