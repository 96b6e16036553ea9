"""Samples waiting for engine capacity, and the request each one becomes when it starts.

The tracker queues every launch a gate or controller asks for (``enqueue``); ``pump`` starts
them in order while fewer than ``orchestrator.max_concurrent_samples`` samples run. A start
makes the ``SampleRequest``: request id ``g<group>-s<index>``, the group's next sample index,
the sampling parameters (the run's defaults or the action's) with a seed derived from the run
seed, the group and the index (``pipeline.seeding.sample_seed``), the engine time of the launch
and the decision that caused it.

>>> from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.group import GroupRun
>>> from pipeline.metrics import Budget
>>> from pipeline.types import Prompt
>>> queue = LaunchQueue(OrchestratorConfig(group_size=2, max_concurrent_samples=2), seed=0, budget=Budget())
>>> group = GroupRun(0, Prompt(0, "", (1,)), target_size=4, opened_step=0)
>>> queue.enqueue(group, 3)
>>> [request.request_id for _, request in queue.pump()], len(queue), queue.in_flight
(['g0-s0', 'g0-s1'], 1, 2)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pipeline.config.sections import OrchestratorConfig
from pipeline.group import GroupRun
from pipeline.metrics import Budget
from pipeline.seeding import sample_seed
from pipeline.types import BranchSpec, SampleRequest, SamplingParams


class LaunchQueue:
    """Queued launches in order, and the count of samples started and not yet ended."""

    def __init__(self, config: OrchestratorConfig, seed: int, budget: Budget, now: Callable[[], float] = lambda: 0.0):
        self.config, self.seed, self.budget, self.now = config, seed, budget, now
        self._default = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens)
        self._queue: deque[tuple[GroupRun, SamplingParams | None, BranchSpec | None, int]] = deque()
        self.in_flight = 0
        """Samples started and not yet seen scored or gone (the tracker counts them down)."""

    def freed(self) -> None:
        """A started sample's engine slot is free again (it was scored, or its stream ended)."""
        self.in_flight -= 1

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue(
        self,
        group: GroupRun,
        n: int,
        params: SamplingParams | None = None,
        branch: BranchSpec | None = None,
        origin: int = -1,
    ) -> None:
        for _ in range(n):
            self._queue.append((group, params, branch, origin))
        group.queued += n

    def pump(self) -> list[tuple[GroupRun, SampleRequest]]:
        """Start queued samples while the concurrency limit allows (a closed group's are dropped):
        each one's group and request."""
        started = []
        while self._queue and self.in_flight < self.config.max_concurrent_samples:
            group, params, branch, origin = self._queue.popleft()
            group.queued -= 1
            if not group.closed:
                started.append(self._start(group, params, branch, origin))
        return started

    def _start(
        self, group: GroupRun, params: SamplingParams | None, branch: BranchSpec | None, origin: int
    ) -> tuple[GroupRun, SampleRequest]:
        index = group.launched
        base = params or self._default
        params = SamplingParams(
            base.temperature, base.top_p, base.max_tokens, sample_seed(self.seed, group.group_id, index)
        )
        request = SampleRequest(
            request_id=f"g{group.group_id}-s{index}",
            group_id=group.group_id,
            sample_index=index,
            prompt=group.prompt,
            params=params,
            branch=branch,
            launch_time=self.now(),
            origin=origin,
        )
        group.in_flight[request.request_id] = request
        group.launched += 1
        self.in_flight += 1
        self.budget.rollouts_started += 1
        if origin >= 0:
            self.budget.rollouts_intervention += 1
        return group, request
