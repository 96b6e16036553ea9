"""The ``vllm`` engine: vLLM's ``AsyncLLM`` (v1) behind the Engine protocol.

**Requests.** Every sample is one vLLM request (``n=1``), so group members are aborted one by
one. Prompts go in as token ids (``skip_tokenizer_init=True``: the project's character
tokenizer is not needed by vLLM); outputs stream as ``RequestOutputKind.DELTA``. A stream
submits its request on the first read (``add_request``) and reads vLLM's per-request
collector, which merges deltas while the reader is away, so a slow reader gets bigger deltas
and nothing queues without bound. Every await belongs to a consumer's task.

**Log-probs** are vLLM's ``raw_logprobs`` (``ModelConfig.logprobs_mode``): the log-softmax of
the model's logits before temperature, top-p or any logits processor, i.e. the policy's
log-probs at temperature 1, which is what the learner scores (``processed_logprobs`` would
give those of the tempered, truncated sampling distribution). ``logprobs=0`` returns just the
sampled token's. ``entropies=True`` asks for the whole distribution (``logprobs=-1``) and
reports each token's entropy at temperature 1: cheap for a character vocabulary, costly for a
large one.

**Branches** send prompt + prefix as the new prompt with ``max_tokens`` less the prefix (the
prefix counts towards ``max_tokens``, as in the torch engine). Prefix caching reuses the
source's KV blocks; every request carries the cache salt of the current policy version, so
KV computed under older weights is never reused. The prefix's log-probs are the caller's
(``BranchSpec.prefix_logprobs``, those of the policy that sampled it); if the caller sent
none, vLLM scores the prefix (``prompt_logprobs``, which bypasses the cache for that request).

**Weights.** ``update_weights`` writes the state dict to ``cache_dir/weights/model.safetensors``
and has the worker reload it in place between two engine steps
(``collective_rpc("reload_weights", weights_path=...)``), then frees the prefix cache. A
model directory (``save_pretrained``) may be passed instead of a state dict; it goes through
the same file, which carries the tied output head that ``save_pretrained`` leaves out (vLLM's
reload keeps the old head without it). Requests in
flight continue under the new weights; a sample's ``policy_version`` is the version it
started with.

**Draws.** With an engine seed, each request's sampler is seeded from (engine seed,
``params.seed``, group id, sample index) (``torch_sampling.stream_key``), never from the
request's name, so an evaluation draws the same random numbers at every step and in every run
of a seed. Where vLLM cannot make it exact: its kernels' floating-point results depend on the
batch a request shares (batch size, chunked prefill, prefix-cache hits), so a token whose
probability sits at a sampling boundary can flip between two evaluations of the same weights.

**Limits.** asyncio only (anyio's asyncio backend), one event loop per engine (vLLM's client
binds to the loop that first uses it); construct it before the pipeline starts: start-up
blocks for 17 s (idle machine) to 90 s (loaded). Greedy below temperature 1e-5.

>>> FINISH_REASONS["length"], FINISH_REASONS["abort"]
(<FinishReason.LENGTH: 1>, <FinishReason.ABORTED: 2>)

A saved model (``tests/test_vllm_engine.py`` runs it)::

    engine = VllmEngine("runs/x/base_model", cache_dir="runs/x/cache")
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from pipeline.engines.base import EngineBase, EngineError
from pipeline.engines.request import RequestStream, check_request, final_event
from pipeline.engines.torch_sampling import stream_key
from pipeline.engines.vllm_setup import (
    check_cpu_head_size,
    check_model_dir,
    configure_environment,
    import_vllm,
    model_context,
    read_weights,
    write_weights,
)
from pipeline.types import FinishReason, RolloutEvent, SampleRequest, TokenDelta

FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORTED}
_SEED_MASK = (1 << 63) - 1


class _Request:
    """Engine-side state of one open request (event loop only)."""

    __slots__ = (
        "request",
        "vid",
        "prompt",
        "prefix",
        "prefix_logprobs",
        "tokens",
        "logprobs",
        "entropies",
        "delivered",
        "finish",
        "error",
        "version",
        "end_time",
        "queue",
        "submitted",
        "live",
        "final_sent",
    )

    def __init__(self, request: SampleRequest, vid: str, prefix: tuple[int, ...]):
        self.request = request
        self.vid = vid  # vLLM's request id: unique even when a closed request id is reused
        self.prompt = tuple(request.prompt.token_ids)
        self.prefix = prefix
        b = request.branch
        self.prefix_logprobs = (
            tuple(b.prefix_logprobs) if b is not None and len(b.prefix_logprobs) == len(prefix) else None
        )
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.entropies: list[float] = []
        self.delivered = 0
        self.finish: FinishReason | None = None
        self.error = ""
        self.version = 0
        self.end_time = 0.0
        self.queue: Any = None  # vLLM's RequestOutputCollector
        self.submitted = False
        self.live = False  # vLLM holds it (submitted, not finished or aborted there)
        self.final_sent = False


class VllmEngine(EngineBase):
    """vLLM ``AsyncLLM`` behind the Engine protocol; see the module docstring.

    Parameters
    ----------
    model_dir : a model directory written by ``save_pretrained`` (``pipeline.policy.models.save_model``).
    cache_dir : where vLLM's and torch inductor's caches and the weight files of
        ``update_weights`` go (inside the run directory).
    eos_id : the token that ends a sample; ``"config"``: the model config's
        ``eos_token_id``; None: only ``max_tokens`` ends samples (benchmarks).
    seed : engine seed; each request's sampler is seeded from (seed, ``params.seed``, group
        id, sample index), as in the torch engine, never from the request's name. None:
        unseeded (vLLM's shared generator).
    max_batch : vLLM's ``max_num_seqs``.
    kv_cache_gib : memory of the KV cache.
    dtype : model dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
    max_context : vLLM's ``max_model_len``; default the model's position range.
    entropies : report per-token entropies (asks vLLM for the whole distribution).
    log_level : ``VLLM_LOGGING_LEVEL`` unless already set.
    engine_args : further ``AsyncEngineArgs`` fields (override the ones set here).
    """

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        cache_dir: str | Path,
        *,
        eos_id: int | None | str = "config",
        seed: int | None = 0,
        max_batch: int = 256,
        kv_cache_gib: float = 1.0,
        dtype: str = "float32",
        max_context: int | None = None,
        entropies: bool = False,
        log_level: str = "WARNING",
        engine_args: Mapping[str, Any] | None = None,
    ):
        super().__init__()  # self._open: request id -> _Request, until its stream closes
        self.model_dir = Path(model_dir)
        self.cache_dir = Path(cache_dir)
        config = check_model_dir(self.model_dir)
        if eos_id == "config":
            eos = config.get("eos_token_id")
            eos_id = eos[0] if isinstance(eos, list) and eos else eos
        if eos_id is not None and not isinstance(eos_id, int):
            raise ValueError(f"eos_id={eos_id!r} must be a token id, None or 'config'")
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib={kv_cache_gib} must be > 0")
        self.eos_id = eos_id
        self.seed = seed
        self.entropies = entropies
        self.vocab_size = int(config.get("vocab_size", 0))
        self._tied = bool(config.get("tie_word_embeddings", True))  # transformers' default
        self.max_context = max_context if max_context is not None else model_context(config)
        import torch

        if not torch.cuda.is_available():
            check_cpu_head_size(self.model_dir, config)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        configure_environment(self.cache_dir, log_level)
        import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM

        self._tokens_input, self._sampling_params, self._delta = tokens_input, SamplingParams, RequestOutputKind.DELTA
        args = dict(
            model=str(self.model_dir),
            skip_tokenizer_init=True,
            enforce_eager=True,
            enable_prefix_caching=True,
            dtype=dtype,
            max_model_len=self.max_context,
            logprobs_mode="raw_logprobs",
            seed=seed or 0,
            max_num_seqs=max_batch,
            kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
            disable_log_stats=True,
            generation_config="vllm",  # stop tokens are ours (eos_id), not generation_config.json's
            max_logprobs=-1,  # entropies need the whole distribution; the flag may change at run time
        )
        args.update(engine_args or {})
        t0 = time.perf_counter()
        try:
            self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        except Exception as exc:
            raise EngineError(
                f"vLLM could not start on model directory {self.model_dir}: {type(exc).__name__}: {exc}; check that "
                "vLLM supports the model's architecture and head size (see the log above for the root cause)"
            ) from exc
        self.start_seconds = time.perf_counter() - t0
        self.last_reload_seconds = 0.0
        self._serials = itertools.count()
        self._update_lock = anyio.Lock()
        self._t0 = time.monotonic()

    # --- Engine protocol (policy_version, open_requests, aclose: EngineBase) ---------------

    @property
    def llm(self):
        """The underlying ``AsyncLLM`` (benchmarks, diagnostics)."""
        return self._llm

    def unfinished_in_vllm(self) -> int:
        """Requests vLLM itself still holds (0 once every stream ended or was aborted)."""
        return 0 if self._llm is None else self._llm.get_num_unfinished_requests()

    def stream(self, request: SampleRequest) -> RequestStream:
        rid = self._admit(request)
        prefix = check_request(request, vocab_size=self.vocab_size, max_context=self.max_context, eos_id=self.eos_id)
        req = _Request(request, f"{rid}#{next(self._serials)}", prefix)
        req.version = self._version
        self._open[rid] = req
        return RequestStream(self, req)

    async def abort(self, request_id: str) -> None:
        req = self._open.get(request_id)
        if req is None or req.finish is not None:
            return
        self._end(req, FinishReason.ABORTED)
        if req.live:
            req.live = False
            with anyio.CancelScope(shield=True):
                await self._llm.abort(req.vid)  # also wakes a reader waiting on the request's collector

    async def update_weights(self, weights: Any) -> int:
        import torch

        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict()
        if not isinstance(weights, (Mapping, str, Path)):
            raise TypeError(f"the vllm engine takes a state_dict or a model directory, got {type(weights).__name__}")
        async with self._update_lock:
            with anyio.CancelScope(shield=True):
                t0 = time.perf_counter()
                if not isinstance(weights, Mapping):
                    check_model_dir(weights)
                    weights = await anyio.to_thread.run_sync(read_weights, Path(weights))
                path = await anyio.to_thread.run_sync(write_weights, weights, self.cache_dir / "weights", self._tied)
                await self._llm.collective_rpc(
                    "reload_weights", kwargs={"weights_path": str(path), "is_checkpoint_format": True}
                )
                self._version += 1  # new requests carry the new cache salt from here on
                await self._llm.reset_prefix_cache()  # frees stale blocks; the salt already keeps them unused
                self.last_reload_seconds = time.perf_counter() - t0
        return self._version

    def _abort_on_close(self, req: _Request) -> None:
        if req.finish is None:
            self._end(req, FinishReason.ABORTED)

    async def _close_resources(self) -> None:
        live = []
        for req in self._open.values():
            if req.live:
                req.live = False
                live.append(req.vid)
        with anyio.CancelScope(shield=True):
            if live:
                await self._llm.abort(live)  # readers waiting on vLLM wake before its loop stops
            await anyio.sleep(0)
            # Stopping the processes blocks for seconds; dropping the last reference here (not at
            # interpreter exit, when vLLM's __del__ fails) ends the client while modules exist.
            llm, self._llm = self._llm, None
            await anyio.to_thread.run_sync(llm.shutdown)
            del llm

    # --- requests ------------------------------------------------------------------------

    def _params(self, req: _Request):
        p = req.request.params
        seed = (
            None
            if self.seed is None
            else stream_key(self.seed, p.seed, req.request.group_id, req.request.sample_index) & _SEED_MASK
        )
        return self._sampling_params(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens - len(req.prefix),
            seed=seed,
            logprobs=-1 if self.entropies else 0,
            prompt_logprobs=0 if req.prefix and req.prefix_logprobs is None else None,
            output_kind=self._delta,
            detokenize=False,
            skip_special_tokens=False,
            stop_token_ids=[self.eos_id] if self.eos_id is not None else None,
            ignore_eos=self.eos_id is None,
        )

    async def _submit(self, req: _Request) -> None:
        req.submitted = req.live = True
        req.version = self._version
        prompt = self._tokens_input(list(req.prompt + req.prefix), cache_salt=f"railgate-policy-v{self._version}")
        try:
            req.queue = await self._llm.add_request(req.vid, prompt, self._params(req))
        except Exception as exc:  # rejected by vLLM's validation, or the engine is dead
            self._fail(req, "refused", exc)
            return
        if req.finish is not None and req.live:  # aborted while it was being submitted
            req.live = False
            await self._llm.abort(req.vid)

    def _end(self, req: _Request, reason: FinishReason, error: str = "") -> None:
        req.finish, req.error, req.end_time = reason, error, time.monotonic() - self._t0

    def _fail(self, req: _Request, what: str, exc: Exception) -> None:
        """vLLM no longer holds ``req``; it ends in an error saying what vLLM did (unless it had ended)."""
        req.live = False
        if req.finish is None:
            self._end(
                req, FinishReason.ERROR, f"vLLM {what} request {req.request.request_id!r}: {type(exc).__name__}: {exc}"
            )

    async def _release(self, req: _Request) -> None:
        """The consumer is done with the stream (final event read, closed, or cancelled)."""
        self._forget(req.request.request_id, req)
        if req.finish is None:
            self._end(req, FinishReason.ABORTED)
        if req.live and not self._closed:
            req.live = False
            with anyio.CancelScope(shield=True):
                await self._llm.abort(req.vid)
        if req.queue is not None:
            req.queue.close()

    async def _next_event(self, req: _Request) -> RolloutEvent:
        while True:
            event = self._pop_event(req)
            if event is not None:
                return event
            if not req.submitted:
                await self._submit(req)
                continue
            try:
                out = req.queue.get_nowait() or await req.queue.get()
            except Exception as exc:  # the engine died or failed this request
                self._fail(req, "failed", exc)
                continue
            self._absorb(req, out)

    def _absorb(self, req: _Request, out) -> None:
        if out.finished:
            req.live = False
        if req.finish is not None:  # aborted: what vLLM produced since is dropped
            return
        if req.prefix and req.prefix_logprobs is None and out.prompt_logprobs:
            scored = out.prompt_logprobs[-len(req.prefix) :]
            req.prefix_logprobs = tuple(d[t].logprob for d, t in zip(scored, req.prefix))
        c = out.outputs[0]
        lps = c.logprobs or ()
        for tok, dist in zip(c.token_ids, lps):
            req.tokens.append(tok)
            req.logprobs.append(dist[tok].logprob)
            if self.entropies:
                req.entropies.append(-sum(lp.logprob * math.exp(lp.logprob) for lp in dist.values()))
        if len(lps) != len(c.token_ids):
            self._end(req, FinishReason.ERROR, f"vLLM returned {len(c.token_ids)} tokens but {len(lps)} log-probs")
        elif out.finished:
            reason = FINISH_REASONS.get(c.finish_reason)
            self._end(
                req,
                reason if reason is not None else FinishReason.ERROR,
                "" if reason is not None else f"vLLM finished with reason {c.finish_reason!r}",
            )

    def _pop_event(self, req: _Request) -> RolloutEvent | None:
        i = req.delivered
        if i < len(req.tokens):
            req.delivered = len(req.tokens)
            return TokenDelta(
                request_id=req.request.request_id,
                token_ids=tuple(req.tokens[i:]),
                logprobs=tuple(req.logprobs[i:]),
                entropies=tuple(req.entropies[i:]) if self.entropies else None,
                position=len(req.prefix) + i,
            )
        if req.finish is None or req.final_sent:
            return None
        req.final_sent = True
        prefix_lps = req.prefix_logprobs if req.prefix_logprobs is not None else (0.0,) * len(req.prefix)
        return final_event(req, prefix_lps)
