"""Settings of the pipeline package: engines, the simulator, the orchestrator, on-disk logs.

Each field carries a docstring under it; ``configs/*.yaml`` mirror these sections.
``pipeline.config.build.build`` turns YAML into these classes and rejects unknown keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.build import at_most, require

MAX_TIMEOUT_S = 3600.0
"""Every timeout of the settings is at most an hour: beyond it a timeout is a typo (``1e300``)
that waits forever, or overflows the waits it is passed to."""


@dataclass(frozen=True)
class DifficultyComponent:
    """One normal component of the simulator's difficulty mixture (on the logit scale)."""

    weight: float = 1.0
    """Relative weight of this component."""
    mean: float = 0.0
    """Mean latent difficulty; a prompt's initial success logit is skill - difficulty."""
    std: float = 1.0
    """Spread of difficulty within the component."""

    def __post_init__(self) -> None:
        require(self.weight > 0, f"sim.difficulty weight={self.weight} must be > 0")
        require(self.std >= 0, f"sim.difficulty std={self.std} must be >= 0")


@dataclass(frozen=True)
class SimConfig:
    """The policy simulator (``engine.kind: sim``). Its dynamics are written out in
    ``pipeline/sim/world.py``; nothing here knows which allocation policy is running."""

    num_prompts: int = 4096
    """Prompts in the training pool."""
    num_eval_prompts: int = 2048
    """Held-out prompts, drawn from the same difficulty mixture; evaluation is exact."""
    difficulty: tuple[DifficultyComponent, ...] = (DifficultyComponent(1.0, 0.0, 2.0),)
    """Mixture of normals the prompts' latent difficulties are drawn from."""
    initial_skill: float = 0.0
    """Global skill at step 0."""
    learning_rate: float = 0.05
    """Skill gained per unit of gradient signal (see ``progress_exponent``)."""
    prompt_learning_rate: float = 0.5
    """Extra, prompt-specific skill a prompt gains from its own informative groups."""
    progress_exponent: float = 1.0
    """Training model. 1.0: progress counts the effective groups trained on (each adds its
    signal). Near 0: 'normalised steps', a step's progress barely depends on how many of its
    groups are effective. Rankings against GRPO can flip between the two (docs/design.md, "The simulator")."""
    reference_batch: int = 64
    """Groups per step the learning rate is calibrated for."""
    drift_std: float = 0.0
    """Per-step random walk of every prompt's difficulty (non-stationarity)."""
    length_success: float = 48.0
    """Mean response length (tokens) of a correct answer."""
    length_failure: float = 72.0
    """Mean response length (tokens) of a wrong answer (wrong answers ramble)."""
    length_spread: float = 0.3
    """Log-normal sigma of response lengths."""
    chunk_tokens: int = 32
    """Tokens per streamed delta."""
    vocab_size: int = 256
    """Token ids are drawn from [3, vocab_size); 1 and 2 are the correct/wrong answer tokens."""
    decode_tokens_per_s: float = 200.0
    """Per-request decode speed of the engine-time model (tokens/s)."""
    prefill_s: float = 0.02
    """Engine time of a prompt prefill."""
    realtime: bool = False
    """Sleep through engine time (for overhead benchmarks); False runs as fast as possible."""
    seed: int = 0
    """Seed of the world (difficulties); sampling noise is seeded per request."""

    def __post_init__(self) -> None:
        require(self.num_prompts >= 1, f"sim.num_prompts={self.num_prompts} must be >= 1")
        require(self.num_eval_prompts >= 1, f"sim.num_eval_prompts={self.num_eval_prompts} must be >= 1")
        require(len(self.difficulty) >= 1, "sim.difficulty needs at least one component")
        require(self.progress_exponent >= 0, f"sim.progress_exponent={self.progress_exponent} must be >= 0")
        require(self.reference_batch >= 1, f"sim.reference_batch={self.reference_batch} must be >= 1")
        require(self.length_success >= 1 and self.length_failure >= 1, "sim lengths must be >= 1 token")
        require(self.chunk_tokens >= 1, f"sim.chunk_tokens={self.chunk_tokens} must be >= 1")
        require(self.vocab_size > 3, f"sim.vocab_size={self.vocab_size} must be > 3")
        require(self.decode_tokens_per_s > 0, "sim.decode_tokens_per_s must be > 0")
        require(self.length_spread >= 0, f"sim.length_spread={self.length_spread} must be >= 0")
        require(self.prefill_s >= 0, f"sim.prefill_s={self.prefill_s} must be >= 0")
        require(self.drift_std >= 0, f"sim.drift_std={self.drift_std} must be >= 0")
        for key, limit in (
            ("num_prompts", 10**7),
            ("num_eval_prompts", 10**7),
            ("vocab_size", 1 << 24),
            ("chunk_tokens", 1 << 20),
            ("length_success", 1 << 20),
            ("length_failure", 1 << 20),
        ):
            at_most(f"sim.{key}", getattr(self, key), limit)


@dataclass(frozen=True)
class RayEngineConfig:
    """Replicas of an engine as Ray actors (``engine.kind: ray``)."""

    inner: Literal["torch", "vllm"] = "torch"
    """The engine each replica runs (``torch_engine`` settings apply to torch replicas)."""
    replicas: int = 2
    """Number of replicas; requests go to the one with the fewest outstanding."""
    address: str = ""
    """Ray cluster address (``host:6379``, ``ray://host:10001``, ``auto``); empty: a new local
    Ray instance. Every node needs the model directory at the same path."""
    num_cpus: float = 1.0
    """CPUs each replica reserves."""
    num_gpus: float = 0.0
    """GPUs each replica reserves (1 for vLLM on a GPU node)."""
    connect_timeout_s: float = 10.0
    """How long the address may take to answer before the run stops with an error."""

    def __post_init__(self) -> None:
        require(self.replicas >= 1, f"engine.ray.replicas={self.replicas} must be >= 1")
        require(self.num_cpus > 0, f"engine.ray.num_cpus={self.num_cpus} must be > 0")
        require(self.num_gpus >= 0, f"engine.ray.num_gpus={self.num_gpus} must be >= 0")
        require(
            0 < self.connect_timeout_s <= MAX_TIMEOUT_S,
            f"engine.ray.connect_timeout_s={self.connect_timeout_s} must be in (0, {MAX_TIMEOUT_S:g}] seconds, e.g. 10",
        )


@dataclass(frozen=True)
class EngineConfig:
    """Which inference engine generates rollouts."""

    kind: Literal["sim", "torch", "vllm", "ray", "replay"] = "sim"
    """``sim``: the policy simulator; ``torch``: in-process transformers model;
    ``vllm``: vLLM AsyncLLM; ``ray``: replicas of another engine as Ray actors; ``replay``:
    the samples of a recorded group log (``replay`` section), with the learner off."""
    fail_every: int = 0
    """Fault injection for tests: every n-th request raises inside the engine (0 = never)."""
    ray: RayEngineConfig = field(default_factory=RayEngineConfig)
    """``engine.kind: ray`` only."""


@dataclass(frozen=True)
class ReplayConfig:
    """Exact replay (``engine.kind: replay``): the pipeline runs unchanged over a recorded group
    log (``pipeline.store.grouplog``), each request served a recorded sample
    (``pipeline.engines.replay``), with the learner off. The task and model sections are unused."""

    log: str = ""
    """The group log: a directory of ``groups-NNNNN.arrows`` segments (``run.py record``) or a
    ``.parquet`` file. Required with ``engine.kind: replay`` (``--set replay.log=PATH``)."""
    format: Literal["auto", "native", "trl", "areal", "verl"] = "auto"
    """How to read ``log``: ``native`` (and ``auto``, which reads native logs) is railgate's own
    format; other frameworks' logs are read by ``bench replay --format``, not by the pipeline."""
    order_seed: int = 0
    """The replay order (``pipeline.replay.order.ReplayOrder``): 0 keeps the log's group order and
    each group's finishing order; another seed shuffles both, the same way for every gate."""
    rate: float = 1000.0
    """Tokens a second a replayed sample is released at, in engine time
    (``pipeline.replay.timing.DEFAULT_RATE``): a sample of n tokens takes n / rate seconds."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A group the log cannot be trusted on: ``error`` stops with the file, row and fix; ``skip``
    leaves it out and counts it."""
    reference_exact: bool = False
    """The log's ``reference_logprob`` is the prompt's pass rate (the reference is the only
    rewarded response, one token sequence spells it): SARA's reference prior takes it as exact.
    False: a lower bound, as for a model whose tokenizer can spell the reference several ways."""

    def __post_init__(self) -> None:
        require(self.rate > 0, f"replay.rate={self.rate} must be > 0 tokens a second, e.g. 1000")
        require(self.order_seed >= 0, f"replay.order_seed={self.order_seed} must be >= 0 (0: the log's order)")


@dataclass(frozen=True)
class OrchestratorConfig:
    """The streaming loop: concurrency, batch size, staleness."""

    batch_groups: int = 64
    """Committed groups per learner step (B_train)."""
    batch_rollouts: int = 0
    """0 (the default): a learner step trains on ``batch_groups`` committed groups, however
    many rollouts the gate spent to get them. N > 0: a learner step is N rollouts generated
    instead -- it trains on the groups committed while N rollouts were spent, the rollouts of
    abandoned groups counted toward the step they were spent in -- so every gate takes the
    same number of optimiser steps for the same rollout budget. Streaming gates only
    (uniform, sara, dps, sara_dps); admission then plans for ``ceil(N / group_size)`` groups
    per step (``step_groups``). ``auto`` in a config file or ``--set`` stands for
    ``batch_groups * group_size`` with those gates and 0 with the others (resolved when the
    config is loaded: ``railgate.config.fill_step``)."""
    group_size: int = 8
    """Target samples per group (G), at least 2 for a group-relative advantage (checked here only:
    the gates and the tracker rely on it)."""
    max_tokens: int = 256
    """Response length limit per sample."""
    temperature: float = 1.0
    """Default sampling temperature."""
    top_p: float = 1.0
    """Default nucleus sampling threshold."""
    max_concurrent_samples: int = 1024
    """Samples generating at once (bounds the engine's queue and memory)."""
    max_open_groups: int = 512
    """Groups open at once (bounds gate and tracker state)."""
    max_async_steps: int = 1
    """How many batches generation may run ahead of the learner (0 = fully synchronous).
    Open groups count against it, so a sample is usually at most this many policy versions
    stale; a group opened for one batch that commits late lands in the next one, one version
    staler (the default run: mean 0.92, max 2 with 1). ``pipeline/staleness_max`` reports it."""
    stream_buffer: int = 64
    """Capacity of each bounded stream between stages."""
    deterministic: bool = False
    """Same config and seed, same run, every time (on the same machine and torch build): the
    torch engine decodes its steps on the event loop in lock step with the tracker instead of in
    a thread running ahead, each learner step is trained the moment its batch fills (no
    learning beside generation, so ``max_async_steps`` has no effect), and rewards are scored
    on the event loop in order (a reward in worker processes -- users' functions, math-verify --
    is still stopped at ``reward_timeout_s``, the loop waiting for it; the project's own rewards,
    in threads otherwise, run without one), so the order in which groups
    commit is a function of the seed rather than of thread timing. Costs the overlap of
    generation with learning and rewards (configs/default.yaml's header gives the measured
    cost). Engines other than torch: learning and rewards as above; their own sampling order
    may still vary. The simulator is reproducible either way."""
    multiplex_streams: bool = True
    """Drive every running sample from one task when the engine can multiplex its streams
    (``pipeline.engines.mux``; the sim engine can): no task, coroutine and cancel scope per
    sample. False, or an engine without it: a task per sample (``Engine.stream``)."""
    reward_timeout_s: float = 5.0
    """A reward call past this gives reward 0, is counted, and the run goes on (at most 3600)."""
    reward_threads: int = 2
    """Worker threads for reward functions."""
    reward_check_first: int = 32
    """Stop the run (``RewardsFailing``, naming the reward function and its first failure) when
    each of its first this many rewards raised, timed out or returned None: a reward that never
    works would spend the whole budget on samples that cannot train. In an environment task
    (``task.name: env``) the same count stops the run when each of the first episodes ended in
    an environment failure (``EnvironmentFailing``). 0: never stop."""
    steps: int = 200
    """Learner steps to run."""
    eval_every: int = 10
    """Evaluate held-out accuracy every this many steps (0 = only at the end)."""
    target_accuracy: float = 0.0
    """Stop early once held-out accuracy reaches this (0 = never)."""
    max_rollouts: int = 0
    """Stop once this many rollouts have been started (0 = no limit); the oracle gate's
    uncounted rollouts (benchmarks) do not count."""

    def __post_init__(self) -> None:
        require(self.batch_groups >= 1, f"orchestrator.batch_groups={self.batch_groups} must be >= 1")
        require(
            self.group_size >= 2,
            f"orchestrator.group_size={self.group_size} must be >= 2 for a group-relative advantage",
        )
        require(self.max_tokens >= 1, f"orchestrator.max_tokens={self.max_tokens} must be >= 1")
        require(
            self.max_concurrent_samples >= self.group_size,
            f"orchestrator.max_concurrent_samples={self.max_concurrent_samples} is below group_size={self.group_size}; "
            "raise max_concurrent_samples",
        )
        require(self.max_open_groups >= 1, f"orchestrator.max_open_groups={self.max_open_groups} must be >= 1")
        require(self.max_async_steps >= 0, f"orchestrator.max_async_steps={self.max_async_steps} must be >= 0")
        require(self.stream_buffer >= 1, f"orchestrator.stream_buffer={self.stream_buffer} must be >= 1")
        require(
            0 < self.reward_timeout_s <= MAX_TIMEOUT_S,
            f"orchestrator.reward_timeout_s={self.reward_timeout_s} must be in (0, {MAX_TIMEOUT_S:g}] seconds; a "
            "reward call slower than an hour is a hang: give it seconds, e.g. 5",
        )
        require(
            self.reward_check_first >= 0,
            f"orchestrator.reward_check_first={self.reward_check_first} must be >= 0 (0: never stop)",
        )
        require(self.reward_threads >= 1, f"orchestrator.reward_threads={self.reward_threads} must be >= 1")
        require(self.steps >= 1, f"orchestrator.steps={self.steps} must be >= 1")
        require(
            0 <= self.target_accuracy <= 1, f"orchestrator.target_accuracy={self.target_accuracy} must be in [0, 1]"
        )
        require(
            self.temperature > 0,
            f"orchestrator.temperature={self.temperature} must be > 0; use a small value like "
            "0.01 for near-greedy sampling",
        )
        require(0 < self.top_p <= 1, f"orchestrator.top_p={self.top_p} must be in (0, 1]; 1 = no nucleus cut")
        require(self.max_rollouts >= 0, f"orchestrator.max_rollouts={self.max_rollouts} must be >= 0 (0 = no limit)")
        require(self.eval_every >= 0, f"orchestrator.eval_every={self.eval_every} must be >= 0 (0 = only at the end)")
        require(
            self.batch_rollouts == 0 or self.batch_rollouts >= self.group_size,
            f"orchestrator.batch_rollouts={self.batch_rollouts} must be 0 (off: batch_groups groups per step) or at "
            f"least group_size={self.group_size} (one full group per step); e.g. batch_groups*group_size="
            f"{self.batch_groups * self.group_size}, or auto for that",
        )
        for key, limit in (
            ("batch_groups", 65536),
            ("batch_rollouts", 1 << 28),
            ("group_size", 4096),
            ("max_tokens", 1 << 20),
            ("steps", 10**8),
            ("max_concurrent_samples", 1 << 20),
            ("max_open_groups", 1 << 20),
            ("stream_buffer", 1 << 20),
            ("reward_threads", 1024),
        ):
            at_most(f"orchestrator.{key}", getattr(self, key), limit)

    @property
    def step_groups(self) -> int:
        """Groups per learner step that admission plans for: ``batch_groups``, or with
        ``batch_rollouts`` the full groups that fill it.

        >>> OrchestratorConfig(batch_groups=8).step_groups, OrchestratorConfig(batch_rollouts=60).step_groups
        (8, 8)
        """
        return -(-self.batch_rollouts // self.group_size) if self.batch_rollouts else self.batch_groups


@dataclass(frozen=True)
class LogConfig:
    """What is written into the run directory."""

    trace: bool = True
    """Write the decision/outcome trace log (Arrow IPC)."""
    buffer: bool = True
    """Write committed groups to the Arrow buffer files."""
    tensorboard: bool = True
    """Also write metrics to TensorBoard when it is installed."""
    progress: bool = True
    """Show a progress bar."""
    trace_flush_every: int = 256
    """Decision records per Arrow record batch (a crash loses at most this many)."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many learner steps (and at the last); 0 = never."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted)."""

    def __post_init__(self) -> None:
        require(self.trace_flush_every >= 1, f"log.trace_flush_every={self.trace_flush_every} must be >= 1")
        require(self.checkpoint_every >= 0, f"log.checkpoint_every={self.checkpoint_every} must be >= 0 (0 = never)")
        require(self.keep_checkpoints >= 1, f"log.keep_checkpoints={self.keep_checkpoints} must be >= 1")


@dataclass(frozen=True)
class TorchEngineConfig:
    """The in-process torch engine (``engine.kind: torch``)."""

    max_batch: int = 256
    """Rows decoded together (continuous batching); more requests wait in FIFO order."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype. bfloat16 is slower than float32 on CPUs without AVX-512 BF16."""
    delta_tokens: int = 4
    """Tokens per streamed delta (fewer events per sample; 1 = every token)."""
    threads: int = 1
    """torch threads of the decode thread; the learner has its own (learner.num_threads)."""

    def __post_init__(self) -> None:
        require(self.max_batch >= 1, f"torch_engine.max_batch={self.max_batch} must be >= 1")
        require(self.delta_tokens >= 1, f"torch_engine.delta_tokens={self.delta_tokens} must be >= 1")
        require(self.threads >= 1, f"torch_engine.threads={self.threads} must be >= 1")
        at_most("torch_engine.max_batch", self.max_batch, 1 << 16)
        at_most("torch_engine.threads", self.threads, 1024)


@dataclass(frozen=True)
class DataConfig:
    """How many prompts of the task are trained on and evaluated (real tasks; the sim has its own)."""

    num_train_prompts: int = 4096
    """Training prompts drawn from the task's training split."""
    num_eval_prompts: int = 512
    """Held-out prompts; 200 prompts x 16 samples is +-2-3 points of noise."""
    eval_samples: int = 4
    """Samples per held-out prompt (accuracy = their mean reward; pass@k with k = this)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation."""
    seed: int = 0
    """Seed of which problems are drawn."""

    def __post_init__(self) -> None:
        require(self.num_train_prompts >= 1, f"data.num_train_prompts={self.num_train_prompts} must be >= 1")
        require(self.num_eval_prompts >= 1, f"data.num_eval_prompts={self.num_eval_prompts} must be >= 1")
        require(self.eval_samples >= 1, f"data.eval_samples={self.eval_samples} must be >= 1")
        require(self.eval_temperature > 0, f"data.eval_temperature={self.eval_temperature} must be > 0")
        for key, limit in (("num_train_prompts", 10**7), ("num_eval_prompts", 10**7), ("eval_samples", 4096)):
            at_most(f"data.{key}", getattr(self, key), limit)


@dataclass(frozen=True)
class EpisodeSettings:
    """The rules that end an episode and the reward that trains (from ``task.env``)."""

    max_turns: int
    """Turns of the policy at most; the episode ends after this many whatever the environment says."""
    max_episode_tokens: int
    """Response tokens (turns and observations) an episode may hold: it ends when the next turn
    could overrun them."""
    turn_tokens: int
    """Tokens one turn may generate (``orchestrator.max_tokens``)."""
    reward: Literal["final", "sum"] = "final"
    """What trains: the environment's reward for the last turn, or the sum over the turns."""
    check_first: int = 0
    """Stop the run (``EnvironmentFailing``) when each of the first this many episodes ended in an
    environment failure; 0: never (``orchestrator.reward_check_first`` in a run)."""
    max_context: int = 0
    """The model's context (prompt + response tokens of one engine request); an episode whose
    next turn could not fit it ends, truncated (``Turns.truncated``); 0: no limit known."""
