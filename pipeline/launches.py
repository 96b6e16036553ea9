"""The request a queued sample becomes when it starts.

The tracker queues every launch a gate or controller asks for in its sample table
(``pipeline.samples``) and starts them in order while fewer than
``orchestrator.max_concurrent_samples`` samples run. A start makes the ``SampleRequest``:
request id ``g<group>-s<index>``, the group's next sample index, the sampling parameters (the
run's defaults or the action's) with a seed derived from the run seed, the group and the index
(``pipeline.seeding.sample_seed``), the engine time of the launch and the decision that caused it.

>>> from pipeline.config.sections import OrchestratorConfig
>>> from pipeline.group import GroupRun
>>> from pipeline.samples import Samples
>>> from pipeline.types import Prompt
>>> requests = Requests(OrchestratorConfig(temperature=0.7), seed=0)
>>> table = Samples(capacity=2)
>>> table.queue(GroupRun(3, Prompt(0, "", (1,)), target_size=4, opened_step=0), 1)
>>> request = requests.make(table.next_queued(), index=5)
>>> request.request_id, request.params.temperature
('g3-s5', 0.7)
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.config.sections import OrchestratorConfig
from pipeline.samples import Sample
from pipeline.seeding import sample_seed
from pipeline.types import SampleRequest, SamplingParams


class Requests:
    """Makes the request of each sample the tracker starts (module docstring)."""

    def __init__(self, config: OrchestratorConfig, seed: int, now: Callable[[], float] = lambda: 0.0):
        self.seed, self.now = seed, now
        self._default = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens)

    def make(self, sample: Sample, index: int) -> SampleRequest:
        """The request of ``sample``, sample ``index`` of its group."""
        group = sample.group
        base = sample.params or self._default
        params = SamplingParams(
            base.temperature, base.top_p, base.max_tokens, sample_seed(self.seed, group.group_id, index)
        )
        return SampleRequest(
            request_id=f"g{group.group_id}-s{index}",
            group_id=group.group_id,
            sample_index=index,
            prompt=group.prompt,
            params=params,
            branch=sample.branch,
            launch_time=self.now(),
            origin=sample.origin,
        )
