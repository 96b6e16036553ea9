"""Scoring a packed micro-batch under a causal LM: the log-probs (and entropies) of its
response tokens, from full prompt + response rows or with each distinct prompt run once and
its key/value cache shared by its rows (``learner.share_prompts``)."""

from __future__ import annotations

import contextlib

import torch

from learner.packing import Chunk


def response_logprobs(
    model: torch.nn.Module, chunk: Chunk, entropy: bool, dtype: str = "float32"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[b, L]`` log-probs of the response tokens (0 past each end) and, optionally, entropies.

    ``dtype`` is ``learner.dtype``: ``bfloat16`` runs the forward pass under autocast on the
    chunk's device (the learner's: ``pack`` puts every chunk there)."""
    with _autocast(dtype, chunk.targets.device):
        logits = shared_logits(model, chunk) if chunk.shared else full_logits(model, chunk)
    # Normalise only at response positions: prompt and pad rows of a large vocabulary
    # would cost a full log-softmax each for nothing.
    selected = torch.log_softmax(logits[chunk.loss_mask].float(), dim=-1)
    token_lp = selected.gather(-1, chunk.targets[chunk.loss_mask][:, None])[:, 0]
    full = torch.zeros(chunk.loss_mask.shape, dtype=torch.float32, device=token_lp.device)
    full = full.masked_scatter(chunk.loss_mask, token_lp)
    ent = None
    if entropy:
        with torch.no_grad():
            p_logp = selected.detach().exp() * selected.detach()
            ent = torch.zeros_like(full).masked_scatter(chunk.loss_mask, -p_logp.sum(-1))
    return full, ent


def _autocast(dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
    if dtype == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def full_logits(model: torch.nn.Module, chunk: Chunk) -> torch.Tensor:
    """``[b, L, V]`` logits predicting each response token, from full prompt + response rows."""
    logits = model(input_ids=chunk.input_ids, attention_mask=chunk.attention_mask, use_cache=False).logits
    index = chunk.score_positions[..., None].expand(-1, -1, logits.shape[-1])
    return logits.gather(1, index)


def shared_logits(model: torch.nn.Module, chunk: Chunk) -> torch.Tensor:
    """``[b, L, V]`` logits predicting each response token: each distinct prompt runs once,
    its cache is copied to its rows (differentiably), the responses run on top of it."""
    prompts = model(input_ids=chunk.prompt_ids, attention_mask=chunk.prompt_mask, use_cache=True)
    rows = torch.arange(len(chunk.prompt_lengths), device=chunk.prompt_ids.device)
    first = prompts.logits[rows, chunk.prompt_lengths - 1][chunk.row_prompt]  # predicts response token 0
    width = chunk.targets.shape[1]
    if width == 1:  # one-token responses: the prompts' last logits are all there is to score
        return first[:, None]
    cache = prompts.past_key_values
    if cache is None or not hasattr(cache, "batch_select_indices"):
        raise TypeError(
            f"{type(model).__name__} returned no key/value cache to share prompts with; set learner.share_prompts=false"
        )
    cache.batch_select_indices(chunk.row_prompt)
    # Every response token is attended to, an episode's observations too (they are only left out of the loss).
    attention = torch.cat([chunk.prompt_mask[chunk.row_prompt], chunk.token_mask.to(chunk.prompt_mask.dtype)], dim=1)
    positions = chunk.prompt_lengths[chunk.row_prompt][:, None] + torch.arange(width, device=rows.device)
    # The last response token predicts nothing we score: leave it out of the forward pass.
    rest = model(
        input_ids=chunk.targets[:, :-1],
        attention_mask=attention[:, :-1],
        position_ids=positions[:, :-1],
        past_key_values=cache,
        use_cache=True,
    ).logits
    return torch.cat([first[:, None], rest], dim=1)
