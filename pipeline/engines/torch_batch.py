"""The torch engine's decode batch: ragged rows over one preallocated KV cache, refilled between steps.

Everything here is synchronous torch code that runs in one worker thread at a time (the
engine guarantees it); ``DecodeBatch.step`` is the whole interface.

**Layout.** Each layer's keys and values live in one buffer ``[rows, kv_heads, capacity,
head_dim]``. All rows share the column counter ``length``; row r's tokens occupy columns
``[start[r], length)`` (its left part is padding, masked out). A decode step writes column
``length`` for every row, so rows of different lengths decode together with a 4-D additive
mask (``start[r] <= column <= length``) and per-row position ids ``length - start[r]``.
Attention reads the whole (contiguous) buffer, the mask hiding the columns not written yet: it
is built once per rebuild and each step opens one column. Models on SDPA attend with
``torch_attention``'s two matmuls; a plain GPT-2 skips ``forward()`` for ``torch_gpt2``'s lean
step on its own weights.

**A row** holds ``sequence = prompt + response``; its cache covers ``sequence[:-1]`` and the
last token is its next input. A new row therefore needs the cache of ``context[:-1]``
(``context = prompt + branch prefix``) and its first decode step produces its first token.
That cache comes from (1) a resident row whose sequence starts with the context and whose
cache was computed at the current weights (branch source, or a sibling of the same prompt):
its columns are copied; or (2) one left-padded prefill forward over the distinct contexts
joining in this step, whose rows are then copied to every member (one prefill per prompt,
however many group members arrive together).

**Rebuilds.** Rows that finished or were removed leave, and new rows join, in one rebuild at
the start of a step: a fresh buffer sized ``width + longest remaining response``, so no
decode step ever reallocates or concatenates. Leading columns that no row uses are trimmed.
A rebuild copies the whole cache once; steps in which nobody joins or leaves copy nothing
(when samples end at scattered times, most steps rebuild: the cost of one concatenation).

Limits: full-attention decoder models only (sliding-window, linear-attention or hybrid caches
are rejected), written against transformers' ``Cache`` layer API (``DynamicLayer.update``);
all rows attend over the batch's longest context (padding costs compute when a short row
decodes next to a long one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from pipeline.engines.torch_attention import use_decode_attention
from pipeline.engines.torch_gpt2 import GPT2Decode
from pipeline.engines.torch_sampling import sample_rows, uniforms
from pipeline.types import FinishReason


@dataclass(frozen=True)
class RowSpec:
    """A request joining the batch (built by the engine, consumed by ``DecodeBatch.step``)."""

    key: int  # the engine's serial number of the request (ids may be reused; serials are not)
    prompt: tuple[int, ...]
    prefix: tuple[int, ...]  # response tokens to continue from (a branch), else ()
    max_tokens: int  # response length limit, prefix included
    temperature: float
    top_p: float
    seed_key: int  # 64-bit random stream key (``torch_sampling.stream_key``)
    source: int | None = None  # key of a row whose cache a branch may copy, if still resident

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt + self.prefix


@dataclass(frozen=True)
class StepOutput:
    """One decode step: a token per row, in row order, and the prefix log-probs of new branches."""

    keys: list[int]
    tokens: list[int]
    logprobs: list[float]
    entropies: list[float]
    finished: list[FinishReason | None]
    prefix_logprobs: dict[int, tuple[float, ...]]


class _Row:
    __slots__ = ("spec", "tokens", "logprobs", "version")

    def __init__(self, spec: RowSpec, prefix_logprobs: tuple[float, ...], version: int):
        self.spec = spec
        self.tokens = list(spec.prefix)  # the response so far, prefix included
        self.logprobs = list(prefix_logprobs)
        self.version = version

    def starts_with(self, context: tuple[int, ...]) -> bool:
        p = self.spec.prompt
        n = len(context)
        if n < len(p):
            return p[:n] == context
        return (
            p == context[: len(p)]
            and len(self.tokens) >= n - len(p)
            and tuple(self.tokens[: n - len(p)]) == context[len(p) :]
        )


class _BufferLayer(DynamicLayer):
    """A full-attention cache layer that writes new keys/values into a preallocated buffer."""

    def bind(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self._kbuf, self._vbuf, self._len = keys, values, length
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._len + key_states.shape[-2]
        self._kbuf[:, :, self._len : end] = key_states
        self._vbuf[:, :, self._len : end] = value_states
        self._len = end
        self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]
        # Attention reads the whole buffer (contiguous: a slice of it would be copied per layer and
        # step); the step's mask hides the columns not written yet.
        return self._kbuf, self._vbuf


class DecodeBatch:
    """A continuous batch over ``model``; see the module docstring.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64)).eval()
    >>> batch = DecodeBatch(model, eos_id=None)
    >>> spec = RowSpec(0, prompt=(5, 6, 7), prefix=(), max_tokens=2, temperature=1.0, top_p=1.0, seed_key=1)
    >>> out = batch.step([spec], set(), version=0)
    >>> out.keys, out.finished
    ([0], [None])
    >>> batch.step([], set(), version=0).finished, batch.num_rows
    ([<FinishReason.LENGTH: 1>], 1)
    """

    def __init__(self, model: torch.nn.Module, eos_id: int | None, device: str | torch.device = "cpu"):
        self.model = model
        self.eos_id = -1 if eos_id is None else int(eos_id)
        self.device = torch.device(device)
        use_decode_attention(model)  # one-token queries: two matmuls, not SDPA's flash kernel
        self._fast = GPT2Decode(model) if GPT2Decode.supports(model) else None  # the project's model: no forward()
        self._layers, self._kv_heads, self._head_dim, self._dtype = _probe_cache(model, self.device)
        self.prefilled_contexts = 0  # distinct contexts run through a prefill forward (cumulative)
        self.copied_rows = 0  # new rows that copied a resident row's cache instead (cumulative)
        self.reset()

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_finished(self) -> int:
        """Rows that finished in the last step (they leave at the next)."""
        return len(self._done)

    def reset(self, keep_memory: bool = False) -> None:
        """Drop every row and free the cache (after an error or on shutdown; ``keep_memory``: keep
        the buffers' memory for the next rows, when the batch has merely emptied)."""
        self.rows: list[_Row] = []
        self._done: list[int] = []  # rows that finished in the last step; they leave at the next
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        # The memory of the current buffers (``_k``, ``_v``) and the spare one the next rebuild fills:
        # reused, since a freshly allocated buffer of a few MB costs a page fault per 4 KB on first touch.
        if not keep_memory:
            self._storage: torch.Tensor | None = None
            self._spare: torch.Tensor | None = None
        self._length = 0
        self._start = torch.zeros(0, dtype=torch.long, device=self.device)
        self._next = torch.zeros(0, dtype=torch.long, device=self.device)
        self._cache: DynamicCache | None = None

    # --- one step ---------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, joins: list[RowSpec], removals: set[int], version: int) -> StepOutput:
        """Remove ``removals`` and last step's finished rows, admit ``joins``, decode one token per row."""
        prefix_lps = self._admit(joins, removals, version) if (joins or removals or self._done) else {}
        if not self.rows:
            return StepOutput([], [], [], [], [], prefix_lps)
        logits = self._forward()
        tokens_t, lps_t, ents_t = self._sample(logits)
        self._next = tokens_t
        tokens, lps, ents = tokens_t.tolist(), lps_t.tolist(), ents_t.tolist()
        finished: list[FinishReason | None] = []
        self._done = []
        for i, (row, tok, lp) in enumerate(zip(self.rows, tokens, lps)):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            if tok == self.eos_id:
                finished.append(FinishReason.STOP)
            elif len(row.tokens) >= row.spec.max_tokens:
                finished.append(FinishReason.LENGTH)
            else:
                finished.append(None)
                continue
            self._done.append(i)
        return StepOutput([r.spec.key for r in self.rows], tokens, lps, ents, finished, prefix_lps)

    def _forward(self) -> torch.Tensor:
        assert self._cache is not None
        if self._length >= self._k[0].shape[2]:
            raise RuntimeError(f"KV cache overflow at column {self._length}; this is a bug in the capacity bookkeeping")
        # Every row sees column ``length`` from this step on (its start is at most the rebuild's width).
        self._mask[:, :, :, self._length] = 0.0
        if self._fast is not None:
            logits = self._fast(self._next, self._length - self._start, self._k, self._v, self._length, self._mask)
            self._length += 1
            return logits
        for layer, k, v in zip(self._cache.layers, self._k, self._v):
            layer.bind(k, v, self._length)
        positions = (self._length - self._start)[:, None]
        out = self.model(
            input_ids=self._next[:, None],
            attention_mask=self._mask,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._length += 1
        return out.logits[:, -1, :]

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        u = torch.from_numpy(uniforms(self._seed_keys, np.fromiter((len(r.tokens) for r in self.rows), np.int64)))
        return sample_rows(
            logits,
            self._temperature,
            self._top_p,
            u.to(self.device),
            unit_temperature=self._unit_temperature,
            use_top_p=self._use_top_p,
        )

    # --- joining and leaving ---------------------------------------------------------------

    def _admit(self, joins: list[RowSpec], removals: set[int], version: int) -> dict[int, tuple[float, ...]]:
        # 1) Find a resident cache for each join before anything leaves (a source may be leaving).
        copies: dict[int, tuple[int, int]] = {}  # join index -> (resident row, columns to copy)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i, row in enumerate(self.rows):
            by_prompt.setdefault(row.spec.prompt, []).append(i)
        index = {row.spec.key: i for i, row in enumerate(self.rows)}
        for j, spec in enumerate(joins):
            candidates = [index[spec.source]] if spec.source in index else []
            candidates += by_prompt.get(spec.prompt, [])
            for i in candidates:
                row = self.rows[i]
                if row.version == version and row.starts_with(spec.context):
                    copies[j] = (i, len(spec.context) - 1)
                    break
        # 2) One prefill over the distinct contexts that found no cache.
        fresh = [j for j in range(len(joins)) if j not in copies]
        prefill = None
        if fresh:
            longest_prefix = max(len(joins[j].prefix) for j in fresh)
            prefill = _Prefill.run(self.model, [joins[j].context for j in fresh], longest_prefix, self.device)
            self.prefilled_contexts += len(prefill.row_of)
        self.copied_rows += len(copies)
        # 3) New rows and where their caches come from; prefix log-probs from the source or the prefill.
        new_rows: list[_Row] = []
        sources: list[tuple[str, int, int]] = []  # ("row", resident row, ncols) | ("prefill", prefill row, 0)
        prefix_lps: dict[int, tuple[float, ...]] = {}
        for j, spec in enumerate(joins):
            k = len(spec.prefix)
            if j in copies:
                i, ncols = copies[j]
                lps = tuple(self.rows[i].logprobs[:k])
                sources.append(("row", i, ncols))
            else:
                assert prefill is not None
                p = prefill.row_of[spec.context]
                lps = prefill.prefix_logprobs(p, spec.prefix)
                sources.append(("prefill", p, 0))
            new_rows.append(_Row(spec, lps, version))
            if k:
                prefix_lps[spec.key] = lps
        # 4) One rebuild: survivors, then the new rows.
        leaving = set(self._done) | {i for i, r in enumerate(self.rows) if r.spec.key in removals}
        keep = [i for i in range(len(self.rows)) if i not in leaving]
        self._rebuild(keep, new_rows, sources, prefill)
        self._done = []
        return prefix_lps

    def _zeroed_buffers(self, shape: tuple[int, ...]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed key and value buffers of ``shape`` per layer, in the spare memory (grown when too small)."""
        numel = 2 * self._layers * shape[0] * shape[1] * shape[2] * shape[3]
        if self._spare is None or self._spare.numel() < numel:
            # A quarter more than asked for, so that a batch growing a little does not reallocate each time.
            self._spare = torch.empty(numel + numel // 4, dtype=self._dtype, device=self.device)
        flat = self._spare[:numel].zero_().view(2, self._layers, *shape)
        return list(flat[0].unbind(0)), list(flat[1].unbind(0))

    def _rebuild(
        self, keep: list[int], new_rows: list[_Row], sources: list[tuple[str, int, int]], prefill: _Prefill | None
    ) -> None:
        rows = [self.rows[i] for i in keep] + new_rows
        if not rows:
            self.reset(keep_memory=True)
            return
        # Each new row's cache as (layer tensors, first column, width) in a source tensor.
        old_start = self._start.tolist()
        spans: list[tuple[str, int, int, int]] = []  # (kind, index, first column, width)
        for i in keep:
            spans.append(("row", i, old_start[i], self._length - old_start[i]))
        for kind, i, ncols in sources:
            if kind == "row":
                spans.append(("row", i, old_start[i], ncols))
            else:
                assert prefill is not None
                first = prefill.start[i]
                spans.append(("prefill", i, first, prefill.width - first))
        width = max(w for _, _, _, w in spans)
        remaining = max(r.spec.max_tokens - len(r.tokens) for r in rows)
        capacity = width + remaining + 1
        shape = (len(rows), self._kv_heads, capacity, self._head_dim)
        new_k, new_v = self._zeroed_buffers(shape)
        # Kept rows end at the old length and prefill rows at the prefill's width, padding (zeros)
        # included: one copy each per layer. A row copying a resident row's cache: a copy per row.
        n_keep = len(keep)
        keep_cols = min(width, self._length)
        keep_rows = None if keep == list(range(len(self.rows))) else torch.tensor(keep, device=self.device)
        prefill_dst = [dst for dst, span in enumerate(spans) if span[0] == "prefill" and span[3]]
        if prefill_dst:
            assert prefill is not None
            prefill_dst_t = torch.tensor(prefill_dst, device=self.device)
            prefill_src = torch.tensor([spans[dst][1] for dst in prefill_dst], device=self.device)
        copies = [
            (dst, i, first, w) for dst, (kind, i, first, w) in enumerate(spans) if dst >= n_keep and kind == "row"
        ]
        for layer in range(self._layers):
            for old, new, pre in (
                (self._k[layer] if self._k else None, new_k[layer], prefill.keys if prefill is not None else None),
                (self._v[layer] if self._v else None, new_v[layer], prefill.values if prefill is not None else None),
            ):
                if n_keep:
                    kept = old[:, :, self._length - keep_cols : self._length]
                    new[:n_keep, :, width - keep_cols : width] = kept if keep_rows is None else kept[keep_rows]
                if prefill_dst:
                    pw = prefill.width
                    new[:, :, width - pw : width].index_copy_(0, prefill_dst_t, pre[layer].index_select(0, prefill_src))
                for dst, i, first, w in copies:
                    if w:
                        new[dst, :, width - w : width] = old[i, :, first : first + w]
        self._k, self._v, self._length = new_k, new_v, width
        self._spare, self._storage = self._storage, self._spare  # the old buffers' memory serves the next rebuild
        self._start = torch.tensor([width - w for _, _, _, w in spans], dtype=torch.long, device=self.device)
        # The decode steps' additive mask over the whole buffer: a row sees [start, width) now, and
        # each step opens one more column (``_forward``).
        cols = torch.arange(capacity, device=self.device)
        visible = (cols[None, :] >= self._start[:, None]) & (cols[None, :] < width)
        self._mask = torch.zeros(len(rows), 1, 1, capacity, dtype=self._dtype, device=self.device)
        self._mask.masked_fill_(~visible[:, None, None, :], torch.finfo(self._dtype).min)
        old_next = self._next.tolist()
        nxt = [old_next[i] for i in keep] + [r.spec.context[-1] for r in new_rows]
        self._next = torch.tensor(nxt, dtype=torch.long, device=self.device)
        self.rows = rows
        self._cache = DynamicCache()
        self._cache.layers = [_BufferLayer() for _ in range(self._layers)]
        specs = [r.spec for r in rows]
        self._temperature = torch.tensor([[s.temperature] for s in specs], dtype=torch.float32, device=self.device)
        self._top_p = torch.tensor([s.top_p for s in specs], dtype=torch.float32, device=self.device)
        self._unit_temperature = all(s.temperature == 1.0 for s in specs)
        self._use_top_p = any(s.top_p < 1.0 for s in specs)
        self._seed_keys = np.array([s.seed_key for s in specs], dtype=np.uint64)


class _Prefill:
    """One left-padded forward over distinct contexts, minus their last token."""

    def __init__(self, keys, values, start, width, row_of, logp, contexts):
        self.keys, self.values, self.start, self.width = keys, values, start, width
        self.row_of, self._logp, self._contexts = row_of, logp, contexts

    @classmethod
    def run(
        cls, model: torch.nn.Module, contexts: list[tuple[int, ...]], longest_prefix: int, device: torch.device
    ) -> _Prefill:
        distinct = list(dict.fromkeys(contexts))
        row_of = {c: i for i, c in enumerate(distinct)}
        inputs = [c[:-1] for c in distinct]
        width = max(len(x) for x in inputs)
        start = [width - len(x) for x in inputs]
        if width == 0:  # every context is a single token: nothing to prefill
            return cls([], [], start, 0, row_of, None, distinct)
        ids = torch.zeros(len(inputs), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(inputs), width, dtype=torch.long, device=device)
        for r, x in enumerate(inputs):
            if x:
                ids[r, width - len(x) :] = torch.tensor(x, dtype=torch.long)
                mask[r, width - len(x) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache()
        # Only a branch prefix needs prefill logits: the last k positions predict its k tokens.
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=max(1, longest_prefix),
        )
        pad = mask[:, None, :, None] == 0
        keys = [layer.keys.masked_fill(pad, 0) for layer in cache.layers]
        values = [layer.values.masked_fill(pad, 0) for layer in cache.layers]
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        return cls(keys, values, start, width, row_of, logp, distinct)

    def prefix_logprobs(self, row: int, prefix: tuple[int, ...]) -> tuple[float, ...]:
        """Log-probs (T = 1) of a branch prefix, teacher-forced by the prefill."""
        if not prefix:
            return ()
        assert self._logp is not None
        k = len(prefix)
        # The last k input positions predict the k prefix tokens.
        lp = self._logp[row, -k:].gather(1, torch.tensor(prefix, device=self._logp.device)[:, None])[:, 0]
        return tuple(lp.tolist())


def _probe_cache(model: torch.nn.Module, device: torch.device) -> tuple[int, int, int, torch.dtype]:
    """(layers, kv heads, head dim, dtype) of ``model``'s KV cache, from a one-token forward.

    Also rejects models whose cache is not plain full attention: the batch's masks and
    column bookkeeping assume every layer keeps every past token.
    """
    for layer in DynamicCache(config=model.config).layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"the torch engine supports full-attention models only; {type(model).__name__} has a "
                f"{type(layer).__name__} cache layer; use the vllm engine for sliding-window or hybrid models"
            )
    cache = DynamicCache()
    with torch.inference_mode():
        probe = torch.zeros(1, 1, dtype=torch.long, device=device)
        # The mask keeps transformers from warning that token 0 (often the pad id) may be padding.
        model(input_ids=probe, attention_mask=torch.ones_like(probe), past_key_values=cache, use_cache=True)
    k = cache.layers[0].keys
    return len(cache.layers), k.shape[1], k.shape[3], k.dtype
