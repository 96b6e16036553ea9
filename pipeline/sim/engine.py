"""The ``sim`` engine: streams simulated rollouts of a ``SimWorld`` policy, in engine time.

A request's whole trajectory is sampled when it starts (seeded by the world seed and the
request's ``params.seed``, so a sample does not depend on scheduling); its tokens are then
released chunk by chunk at the engine times a decoder of ``decode_tokens_per_s`` would
produce them, on a ``VirtualClock`` (fast, exact ordering) or a ``WallClock`` (real sleeps).

>>> import anyio
>>> from pipeline.config.sections import SimConfig
>>> from pipeline.sim.world import SimWorld
>>> from pipeline.types import Prompt, SampleRequest, SamplingParams, SampleFinished
>>> engine = SimEngine(SimWorld(SimConfig(num_prompts=8, num_eval_prompts=8)))
>>> req = SampleRequest("r0", group_id=0, sample_index=0, prompt=engine.prompt(3),
...                     params=SamplingParams(max_tokens=512, seed=1))
>>> async def main():
...     return [ev async for ev in engine.stream(req)]
>>> events = anyio.run(main)
>>> isinstance(events[-1], SampleFinished), engine.open_requests
(True, 0)
"""

from __future__ import annotations

import collections
import random
import zlib
from typing import Any

import anyio

from pipeline.clock import VirtualClock, WallClock
from pipeline.engines.base import EngineBase
from pipeline.sim.mux import SimMux
from pipeline.sim.response import Rendered, SimEngineFault, TokenTables
from pipeline.sim.world import SimPolicyState, SimWorld, Trajectory
from pipeline.types import FinishReason, Prompt, RolloutEvent, SampleFinished, SampleRequest, TokenDelta

__all__ = ["SimEngine", "SimEngineFault"]  # the fault lives in pipeline.sim.response, shared with the multiplexer

# Finished trajectories kept for branching (least recently used are dropped).
_BRANCH_MEMORY = 16384


class SimEngine(EngineBase):
    """Simulated inference engine over a ``SimWorld``; see the module docstring."""

    name = "sim"

    def __init__(
        self,
        world: SimWorld,
        state: SimPolicyState | None = None,
        clock: VirtualClock | WallClock | None = None,
        fail_every: int = 0,
    ):
        super().__init__()
        self.world = world
        self.clock = clock if clock is not None else VirtualClock()
        self._state = state if state is not None else world.initial_state()
        self._fail_every = fail_every
        self._started = 0
        self._finished: collections.OrderedDict[str, Trajectory] = collections.OrderedDict()
        self._tables = TokenTables(world.config.vocab_size, world.config.seed)

    # --- Engine protocol (policy_version, open_requests, aclose: EngineBase) ---------------

    @property
    def state(self) -> SimPolicyState:
        return self._state

    def stream(self, request: SampleRequest) -> _SimStream:
        rid, fail = self._begin(request)
        s = _SimStream(self, request, fail)
        self._open[rid] = s
        return s

    async def abort(self, request_id: str) -> None:
        s = self._open.get(request_id)
        if s is not None:
            s.abort()  # a stream, or a multiplexer's entry

    def multiplexer(self) -> SimMux:
        """Every request started through it driven by one consumer (``pipeline.sim.mux``)."""
        return SimMux(self)

    async def update_weights(self, weights: Any) -> int:
        if not isinstance(weights, SimPolicyState):
            raise TypeError(f"the sim engine takes SimPolicyState weights, got {type(weights).__name__}")
        self._state = weights.copy()
        self._version += 1
        return self._version

    def _abort_on_close(self, record: Any) -> None:
        record.close()  # a stream, or a multiplexer's entry

    # --- helpers, shared by the streams and the multiplexer --------------------------------

    def _begin(self, request: SampleRequest) -> tuple[str, bool]:
        """Admit ``request``: its id, and whether ``fail_every`` makes it fail."""
        rid = self._admit(request)
        self._started += 1
        return rid, self._fail_every > 0 and self._started % self._fail_every == 0

    def prompt(self, prompt_id: int) -> Prompt:
        """The ``Prompt`` of training prompt ``prompt_id`` (its tokens are a stand-in)."""
        if not 0 <= prompt_id < len(self.world.difficulty):
            raise IndexError(f"sim prompt_id={prompt_id} is outside the pool of {len(self.world.difficulty)} prompts")
        return Prompt(
            prompt_id=prompt_id,
            text=f"sim-prompt-{prompt_id}",
            token_ids=(3 + prompt_id % 250, 4),
            answer="1",
            difficulty=float(self.world.difficulty[prompt_id]),
        )

    def _remember(self, request_id: str, traj: Trajectory) -> None:
        self._finished[request_id] = traj
        if len(self._finished) > _BRANCH_MEMORY:
            self._finished.popitem(last=False)

    def _render_request(self, req: SampleRequest, state: SimPolicyState) -> Rendered:
        """Sample ``req``'s whole trajectory under ``state`` and render its tokens (seeded by the
        world seed, the request's seed and its id: independent of scheduling)."""
        world = self.world
        cfg = world.config
        rng = random.Random((cfg.seed << 64) ^ (req.params.seed << 32) ^ zlib.crc32(req.request_id.encode()))
        prefix_tokens: tuple[int, ...] = ()
        prefix_lps: tuple[float, ...] = ()
        source = None
        if req.branch is not None and req.branch.guided:
            raise ValueError(
                f"request {req.request_id!r} is guided (guide_level={req.branch.guide_level}): the sim engine has no "
                "reference responses to continue; use engine.kind=torch (or vllm, ray) or set gate.sara.guidance=0"
            )
        if req.branch is not None:
            source = self._trajectory_of(req.branch.source_request_id)
            if source is None:
                raise ValueError(
                    f"cannot branch from {req.branch.source_request_id!r}: the sim engine does not remember it "
                    f"(it keeps the last {_BRANCH_MEMORY} finished samples)"
                )
            prefix_tokens = tuple(req.branch.prefix_token_ids)
            prefix_lps = tuple(req.branch.prefix_logprobs)
        p = world.success_probability(state, req.prompt.prompt_id)
        traj = world.sample_trajectory(
            rng,
            p,
            req.params.temperature,
            req.params.max_tokens,
            prefix=source,
            prefix_len=req.prefix_len,
        )
        start_pos = min(req.prefix_len, traj.length)
        if len(prefix_tokens) != start_pos:
            prefix_tokens = tuple(range(3, 3 + start_pos))  # stand-in tokens when the caller sent none
            prefix_lps = (0.0,) * start_pos
        tokens, lps, ents = self._tables.render(rng, traj, start_pos, world)
        return Rendered(
            req.request_id, traj, tuple(tokens), tuple(lps), tuple(ents), prefix_tokens, prefix_lps, start_pos
        )

    def _trajectory_of(self, request_id: str) -> Trajectory | None:
        s = self._open.get(request_id)
        if s is not None and s.trajectory is not None:
            return s.trajectory
        return self._finished.get(request_id)


class _SimStream:
    """One request's event stream. Registered with the clock from creation until closed.

    A consumer cancelled while the stream sleeps through a chunk kills the generator inside
    that sleep; the stream then keeps what the chunk was (``_cut``), so that the abort which
    follows still ends it with the tokens produced until then, as a real engine would."""

    def __init__(self, engine: SimEngine, request: SampleRequest, fail: bool):
        self._engine = engine
        self._req = request
        self._fail = fail
        self._clock = engine.clock
        self._token = self._clock.register()
        self._closed = False
        self._aborted = False
        self._cut: tuple[Rendered, int, int, float, int] | None = None  # the chunk being slept on
        self._interrupted = False
        self._gen = self._run()
        self.trajectory: Trajectory | None = None

    def __aiter__(self) -> _SimStream:
        return self

    async def __anext__(self) -> RolloutEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._interrupted:
            return self._end_interrupted()
        try:
            return await self._gen.__anext__()
        except anyio.get_cancelled_exc_class():
            if self._cut is None:
                self.close()
            else:
                self._interrupted = True
                self._clock.unregister(self._token)  # it will not sleep again
            raise
        except BaseException:
            self.close()
            raise

    def _end_interrupted(self) -> SampleFinished:
        """After a cancelled sleep: the aborted final of the chunk it was in, then nothing."""
        self._interrupted = False
        r, i, j, chunk_start, version = self._cut
        self.close()
        if not self._aborted:
            raise StopAsyncIteration
        now = self._clock.now()
        produced = i + max(0, min(j - i, int((now - chunk_start) * self._engine.world.config.decode_tokens_per_s)))
        return r.finished(produced, FinishReason.ABORTED, version, now)

    async def aclose(self) -> None:
        self.close()
        await self._gen.aclose()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._clock.unregister(self._token)
            self._engine._forget(self._req.request_id, self)

    def abort(self) -> None:
        self._aborted = True
        self._clock.wake(self._token)

    async def _run(self):
        eng, req = self._engine, self._req
        cfg = eng.world.config
        version = eng.policy_version
        state = eng.state
        start = max(self._clock.now(), req.launch_time)
        if not self._aborted:
            await self._clock.sleep_until(self._token, start + cfg.prefill_s)
        if self._fail:
            raise SimEngineFault(f"injected engine failure on request {req.request_id}")
        r = eng._render_request(req, state)
        self.trajectory = r.trajectory
        tokens_t, lps_t, ents_t = r.tokens, r.logprobs, r.entropies
        start_pos = r.start_pos
        n = len(tokens_t)
        t = self._clock.now()
        rate = cfg.decode_tokens_per_s
        chunk = cfg.chunk_tokens
        clock, token = self._clock, self._token
        rid = req.request_id
        for i in range(0, n, chunk):
            j = min(i + chunk, n)
            t_chunk_start = t
            t += (j - i) / rate
            if not self._aborted:
                self._cut = (r, i, j, t_chunk_start, version)
                await clock.sleep_until(token, t)
            if self._aborted:
                produced = int((clock.now() - t_chunk_start) * rate)
                j = i + max(0, min(j - i, produced))
                yield r.finished(j, FinishReason.ABORTED, version, clock.now())
                return
            yield TokenDelta(
                request_id=rid,
                token_ids=tokens_t[i:j],
                logprobs=lps_t[i:j],
                entropies=ents_t[i:j],
                position=start_pos + i,
            )
        eng._remember(rid, r.trajectory)
        yield r.finished(n, r.end_reason, version, clock.now())
