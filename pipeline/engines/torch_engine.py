"""The ``torch`` engine: in-process, continuously batched sampling over any transformers causal LM.

**Design.** One decode thread (``torch_worker.DecodeWorker``) owns the model and the batch
and runs decode steps back to back while it has rows, at most two steps ahead of the event
loop. Torch never runs on the event loop. The loop side hands it joins and removals without
awaiting; a stream's consumer that needs its next event and finds nobody collecting becomes
the *collector*: it waits (in an anyio worker thread) for the step results not read yet,
hands every row's new tokens to its request and wakes that request's consumer. Other
consumers wait on their own event. Every await belongs to a consumer's task (no background
task), decoding stops once nobody reads (backpressure), and a collector cancelled while it
waits finishes handing out the step it waited for (a few milliseconds, shielded) before the
cancellation propagates.

**Batching.** New requests join between decode steps, up to ``max_batch`` rows (the rest
wait in FIFO order). Requests that arrive together with the same prompt share one prefill;
a later request whose prompt (or branch context) a resident row already holds copies that
row's cache instead (see ``torch_batch``). Aborted, closed and finished rows leave at the
next step.

**Handoff.** A request's tokens accumulate in its own state; a consumer's next event is one
``TokenDelta`` of every token produced since its last read (at least ``delta_tokens`` of
them, or the rest once the sample ends), then one ``SampleFinished``. This 1-step coalescing
handoff is unbounded by design but never holds more than the response itself, which the
final event carries anyway; a slow reader simply gets bigger deltas.

**Numbers.** Log-probs and entropies are those of the policy at temperature 1 (what the
learner scores; see ``torch_sampling``). Sampling uses one counter-based uniform per row and
token, keyed by (engine seed, ``params.seed``, group id, sample index) and never by the request's
name: a sample is reproducible whatever else runs beside it and whatever it is called, up to
floating-point differences of the logits between batch shapes (a token can flip only when its
uniform falls within ~1e-6 of a CDF boundary).

**Weights.** ``update_weights(state_dict)`` pauses the decode thread between two steps,
loads the weights in place (``load_state_dict``, off the event loop) and bumps
``policy_version``. Rows in flight continue under the new weights with the KV cache of the
old ones (in-flight updates, as in PipelineRL); each token's log-prob is that of the weights
that sampled it, and a sample's ``policy_version`` is the version current when it was handed
to the decode thread (the oldest weights it can have seen). A branch keeps the prefix
log-probs its request carries (``BranchSpec.prefix_logprobs``: those of the weights that
sampled the prefix, possibly older than the branch's ``policy_version``); a branch sent
without them gets the current weights' values. Up to ``ahead`` steps decoded
before the update may still be delivered after it. The state dict is read during the call:
pass a snapshot if a learner keeps changing its tensors meanwhile.

**Lock step** (``lockstep=True``; ``orchestrator.deterministic``). No decode thread: the
collector runs each decode step itself, on the event loop, once the loop has settled (no other
task ready to run: every sample the last step finished has been scored and decided on, and what
those decisions launched has joined), with the joins and removals the loop made until then, and
weights load on the loop too. Settling first keeps a tick's launches in one step: decoding after
a single yield instead split the CPU default's ~1,000 steps into ~16,600 of a few rows each. A step then holds the same rows whatever
the machine's timing, so with the rest of the pipeline on the loop (an inline learner and
inline rewards) a run is a function of its seed. It gives up decoding beside the loop's work.

**Limits.** Full-attention decoder models (see ``torch_batch``); one process, one device.
The engine owns ``model``: it is cast to ``dtype`` and moved to ``device`` in place, so give
it a copy if a learner trains the original. ``aclose()`` stops the decode thread. ``bfloat16`` halves memory but is about 10x
*slower* than float32 on CPUs without native bf16 (this project's AVX2 machine). A consumer
that stops reading must close its stream: cancellation inside ``__anext__`` does it; for
anything else hold the stream in ``contextlib.aclosing``. Batching is not free of Python:
each token costs the event loop a few microseconds per reader, so with many concurrent
samples of a tiny model ``delta_tokens`` of 4 or more is noticeably faster than 1.

**Speed** (``python run.py bench engine``: 16 prompts x 8 samples x 32 tokens, every sample
streamed to its own reader task, against one ``generate(do_sample=True)`` call and against
transformers' continuous batching; docs/benchmarks/engine.md). On this project's shared 2-core
CPU, per CPU-second with ``delta_tokens=4``: 1.32-1.37x ``generate`` (the better peer) on the
project's 0.41M GPT-2 and 1.33-1.43x on a 31.8M GPT-2; 1.10-1.16x with ``delta_tokens=1`` on the
small model, where the per-token wake-ups of 128 reader tasks on the event loop cost the most.
Decode steps attend with two matmuls over the whole KV buffer (``torch_attention``) and GPT-2
models skip ``forward()`` for a lean step on their own weights (``torch_gpt2``); the rest of the
lead is one prefill per prompt instead of per sample and a cache written in place instead of
concatenated every step.

>>> import anyio, torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from pipeline.types import Prompt, SampleRequest, SamplingParams
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=128))
>>> engine = TorchEngine(model, tokenizer_eos_id=2)
>>> prompt = Prompt(prompt_id=0, text="", token_ids=(5, 6, 7))
>>> req = SampleRequest("g0.s0", group_id=0, sample_index=0, prompt=prompt,
...                     params=SamplingParams(max_tokens=8, seed=1))
>>> async def main():
...     return [ev async for ev in engine.stream(req)]
>>> events = anyio.run(main)
>>> final = events[-1]
>>> sum((ev.token_ids for ev in events[:-1]), ()) == final.token_ids, engine.open_requests
(True, 0)
>>> anyio.run(engine.aclose)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import torch

from pipeline.engines.base import EngineBase
from pipeline.engines.request import RequestStream, TurnCollector, check_request
from pipeline.engines.torch_batch import DecodeBatch, RowSpec, StepOutput
from pipeline.engines.torch_requests import RequestState
from pipeline.engines.torch_sampling import stream_key
from pipeline.engines.torch_worker import DecodeWorker, StepFailed
from pipeline.types import FinishReason, RolloutEvent, SampleRequest

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchEngine(EngineBase):
    """Continuously batched sampler over a transformers causal LM; see the module docstring.

    Parameters
    ----------
    model : a transformers causal LM (``AutoModelForCausalLM``-like); the engine owns it.
    tokenizer_eos_id : the token that ends a sample (``FinishReason.STOP``); None: only
        ``max_tokens`` ends samples (for benchmarks).
    max_batch : most rows decoded together; further requests queue in arrival order.
    dtype : ``"float32"``, ``"bfloat16"`` or ``"float16"`` for the model's weights and cache.
    device : torch device of the model and cache.
    seed : engine seed, part of every request's random stream key.
    max_context : longest prompt + response allowed; default the model's
        ``max_position_embeddings`` (or ``n_positions``).
    delta_tokens : fewest tokens per ``TokenDelta`` (fewer consumer wake-ups per token).
    torch_lock : a ``threading.Lock`` (or ``Semaphore``) held for every decode step and
        weight load; share it with a learner thread that must not compute at the same time.
        Default: none (the engine's single thread is its only limit).
    ahead : decode steps the thread may run ahead of the readers.
    lockstep : decode on the event loop, one step per collection (see the module docstring).
    """

    name = "torch"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer_eos_id: int | None,
        *,
        max_batch: int = 256,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        max_context: int | None = None,
        delta_tokens: int = 1,
        torch_lock: Any = None,
        ahead: int = 2,
        lockstep: bool = False,
    ):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}; pick one of those")
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        if delta_tokens < 1:
            raise ValueError(f"delta_tokens={delta_tokens} must be >= 1")
        if torch_lock is not None and not (hasattr(torch_lock, "__enter__") and hasattr(torch_lock, "acquire")):
            raise TypeError(
                f"torch_lock must be a threading.Lock or Semaphore (held by the decode thread), got "
                f"{type(torch_lock).__name__}; an anyio CapacityLimiter cannot be taken from a plain thread"
            )
        super().__init__()  # self._open: request id -> RequestState, until its stream closes
        self.model = model.to(device=device, dtype=_DTYPES[dtype]).eval()
        self.eos_id = tokenizer_eos_id
        self.max_batch = max_batch
        self.seed = seed
        self.delta_tokens = delta_tokens
        self.max_context = max_context if max_context is not None else _model_context(model)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._torch_lock = torch_lock if torch_lock is not None else contextlib.nullcontext()
        self.lockstep = lockstep
        self._worker = DecodeWorker(
            DecodeBatch(self.model, tokenizer_eos_id, device), ahead=ahead, lock=torch_lock, inline=lockstep
        )
        self._serials = itertools.count()
        self._pending: collections.deque[RequestState] = collections.deque()  # waiting for room in the batch
        self._rows: dict[int, RequestState] = {}  # by key: handed to the decode thread, still running
        # The thread had nothing to do (a race with an abort): look again after a millisecond.
        # In lock step nothing runs beside the loop: a collection that found nothing yields once instead.
        self._turns = TurnCollector(self._collect, idle_s=0.0 if lockstep else 0.001)
        self._update_lock = threading.Lock()  # one weight update at a time
        self._loaded_version = 0  # guarded by _update_lock
        self._t0 = time.monotonic()

    # --- Engine protocol (policy_version, open_requests, aclose: EngineBase) ---------------

    def stream(self, request: SampleRequest) -> RequestStream:
        rid = self._admit(request)
        prefix = check_request(request, vocab_size=self.vocab_size, max_context=self.max_context, eos_id=self.eos_id)
        req = RequestState(request, next(self._serials), prefix, self._version)
        self._open[rid] = req
        self._pending.append(req)
        self._submit()
        return RequestStream(self, req)

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """Requests streamed inside the block join the decode batch together, at one step
        boundary (as far as ``max_batch`` has room; the rest queue in order), whatever the
        decode thread's timing: a caller that starts several groups at once gets the same
        batch, step for step, every time. The thread pauses at its next step boundary for the
        block's duration (the block should only call ``stream``)."""
        self._worker.pause()
        try:
            yield
        finally:
            self._worker.resume()

    async def abort(self, request_id: str) -> None:
        req = self._open.get(request_id)
        if req is not None and req.finish is None:
            self._end(req, FinishReason.ABORTED)
            req.wake()
            self._submit()

    async def update_weights(self, weights: Any) -> int:
        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict()
        if not isinstance(weights, Mapping):
            raise TypeError(f"the torch engine takes a state_dict (a mapping of tensors), got {type(weights).__name__}")

        def load() -> int:
            # Between two decode steps: the thread is paused while the weights change.
            with self._update_lock:
                self._worker.pause()
                try:
                    with self._torch_lock:
                        self.model.load_state_dict(weights)
                    self._loaded_version += 1
                    self._worker.set_version(self._loaded_version)
                finally:
                    self._worker.resume()
                return self._loaded_version

        if self.lockstep:  # on the loop: no decode step can run meanwhile
            version = load()
        else:
            with anyio.CancelScope(shield=True):
                version = await anyio.to_thread.run_sync(load)
        self._version = max(self._version, version)
        return version

    def _abort_on_close(self, req: RequestState) -> None:
        if req.finish is None:
            self._end(req, FinishReason.ABORTED)
            req.wake()

    async def _close_resources(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._worker.stop)

    # --- requests ------------------------------------------------------------------------

    def _row_spec(self, req: RequestState) -> RowSpec:
        params = req.request.params
        source = None
        if req.request.branch is not None:
            src = self._open.get(req.request.branch.source_request_id)
            source = src.key if src is not None else None
        return RowSpec(
            key=req.key,
            prompt=req.prompt,
            prefix=req.prefix,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed_key=stream_key(self.seed, params.seed, req.request.group_id, req.request.sample_index),
            source=source,
        )

    def _submit(self) -> None:
        """Hand queued requests to the decode thread while the batch has room (never awaits)."""
        joins: list[RowSpec] = []
        room = self.max_batch - len(self._rows)
        while room > 0 and self._pending:
            req = self._pending.popleft()
            if req.finish is not None:
                continue
            req.version = self._version
            self._rows[req.key] = req
            joins.append(self._row_spec(req))
            room -= 1
        self._worker.submit(joins, [])

    def _end(self, req: RequestState, reason: FinishReason, error: str = "") -> None:
        """Mark a request finished; an aborted or failed row leaves the batch at the next step."""
        req.finish, req.error, req.end_time = reason, error, time.monotonic() - self._t0
        if self._rows.pop(req.key, None) is not None and reason >= FinishReason.ABORTED:
            self._worker.submit([], [req.key])

    def _release(self, req: RequestState) -> None:
        """The consumer is done with the stream (final event read, closed, or cancelled)."""
        self._forget(req.request.request_id, req)
        if req.finish is None:
            self._end(req, FinishReason.ABORTED)
            self._submit()

    # --- collecting step results -------------------------------------------------------------

    async def _next_event(self, req: RequestState) -> RolloutEvent:
        return await self._turns.next_event(req, self._pop_event)

    def _pop_event(self, req: RequestState) -> RolloutEvent | None:
        return req.pop_event(self.delta_tokens)

    async def _collect(self) -> bool:
        """Wait for the decode thread's unread results and hand their tokens out (the collector's
        turn, ``TurnCollector``); whether there were any."""
        if self.lockstep:
            # Let the tasks the last step woke act first (their joins and aborts go into this
            # step), then decode it here; the order of both is the loop's, not the clock's.
            await _settle()
            results = self._worker.take()
        else:
            with anyio.CancelScope(shield=True):
                results = await anyio.to_thread.run_sync(self._worker.take)
        for out in results:
            if isinstance(out, StepFailed):  # the batch was reset: the rows it held failed
                msg = f"torch engine step failed: {type(out.error).__name__}: {out.error}"
                for key in out.keys:
                    req = self._rows.get(key)
                    if req is not None:
                        self._end(req, FinishReason.ERROR, msg)
                        req.wake()
            else:
                self._dispatch(out)
        self._submit()
        return bool(results)

    def _dispatch(self, out: StepOutput) -> None:
        for key, lps in out.prefix_logprobs.items():
            req = self._rows.get(key)
            if req is not None:
                req.prefix_logprobs = lps
        for key, tok, lp, ent, fin in zip(out.keys, out.tokens, out.logprobs, out.entropies, out.finished):
            req = self._rows.get(key)
            if req is None:  # aborted or closed while the step ran: its token is dropped
                continue
            req.append(tok, lp, ent)
            if fin is not None:
                self._end(req, fin)
                req.wake()
            elif len(req.tokens) - req.delivered >= self.delta_tokens:
                req.wake()


_SETTLE_MAX_YIELDS = 4096
"""Most yields of one settling (a loop that never settles still decodes: the bound is a count, so a run stays a function of its seed)."""


async def _settle() -> None:
    """Yield until no other task of the event loop is ready to run (lock step, before a decode step).

    Reads asyncio's run queue (``loop._ready``, the callbacks due at the next pass); on a loop
    without one (trio) it yields once. Only the loop's own order decides when the queue empties:
    a lock-step run starts no thread that could post to it.
    """
    await anyio.lowlevel.checkpoint()
    try:
        ready = getattr(asyncio.get_running_loop(), "_ready", None)
    except RuntimeError:  # not an asyncio loop
        return
    if ready is None:
        return
    for _ in range(_SETTLE_MAX_YIELDS):
        if not ready:
            return
        await anyio.lowlevel.checkpoint()


def _model_context(model: torch.nn.Module) -> int | None:
    config = model.config.get_text_config(decoder=True) if hasattr(model, "config") else None
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
