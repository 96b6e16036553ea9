"""Build a run's components from its ``RunConfig``: engine, clock, gate, controller, reward,
learner and evaluator (``build_components``), and the orchestrator that runs them
(``build_orchestrator``). The only module that chooses concrete classes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.gates.registry import build_gate
from controller.noop import NoopController
from controller.prompts import PromptPool
from controller.reference import ReferenceScreen
from controller.reference_fit import ReferenceCalibration
from pipeline.clock import LockstepClock, VirtualClock, WallClock
from pipeline.config.build import ConfigError
from pipeline.core.decisions import NullSink
from pipeline.core.lifecycles import Episodes, SingleTurn
from pipeline.engines.replay import ReplayEngine
from pipeline.envs.render import renderer_for
from pipeline.protocols import Controller, DecisionSink, Gate, Scorer
from pipeline.replay.learner import NoLearner
from pipeline.replay.order import ReplayOrder
from pipeline.replay.reward import RecordedReward, ServedRewards
from pipeline.seeding import derive_seed
from pipeline.shells.orchestrator import Orchestrator
from pipeline.shells.parts import RunOutputs, RunParts
from pipeline.sim.engine import SimEngine
from pipeline.sim.learner import SimLearner
from pipeline.sim.world import SimAnswerScorer, SimEvaluator, SimWorld
from pipeline.store.grouplog import GroupLog, GroupLogError, read_group_log
from pipeline.tasks.rewards.health import RewardsFailing
from pipeline.tasks.rewards.scoring import ScoringService
from pipeline.types import Prompt
from railgate.config import RunConfig
from railgate.episodic import EnvironmentReward, env_parts, is_episodic
from railgate.preflight import preflight
from railgate.replay.gate_parts import build_replay_gate, not_replayable


def build_components(
    cfg: RunConfig, progress: bool = True, sink: DecisionSink | None = None, run_id: str | None = None
) -> RunParts:
    """The run's parts (``pipeline.shells.parts.RunParts``): its reward under ``cfg.orchestrator``'s
    timeout, threads and first-failures check. ``sink`` receives the controller's decisions (the
    run's TraceLog; none: not logged), which carry ``run_id`` (default ``cfg.name``; a training
    run passes its own, ``railgate.runid``). The simulator's world is ``parts.engine.world``."""
    preflight(cfg)  # before any warm start or model load
    guidance = None  # the task's reference prefixes, when RAIL's guidance arms need them
    if cfg.engine.kind == "sim":
        components = _build_sim(cfg)
    elif cfg.engine.kind in ("torch", "vllm", "ray"):
        components, guidance = _build_torch(cfg, progress)
    elif cfg.engine.kind == "replay":
        components = _build_replay(cfg)
    else:
        raise ConfigError(f"engine.kind={cfg.engine.kind!r} must be one of sim, torch, vllm, ray, replay")
    components.controller = build_controller(cfg, sink, components.clock, run_id, guidance)
    return components


def build_orchestrator(
    cfg: RunConfig,
    parts: RunParts,
    outputs: RunOutputs | None = None,
    *,
    run_id: str | None = None,
) -> Orchestrator:
    """The orchestrator that runs ``parts`` under ``cfg`` (train and every benchmark use this).

    A caller that wraps a part (a gate probe, a recording engine) or runs without evaluation
    passes ``dataclasses.replace(parts, gate=..., evaluator=None)``. ``outputs`` says where the
    run writes (nothing by default; its checkpoints every ``log.checkpoint_every`` steps unless
    it sets its own ``checkpoint_every``); ``run_id`` names the run in trace records (default
    ``cfg.name``).
    """
    outputs = outputs if outputs is not None else RunOutputs()
    if outputs.checkpoint is not None and not outputs.checkpoint_every:
        outputs.checkpoint_every = cfg.log.checkpoint_every
    return Orchestrator(
        parts, cfg.orchestrator, outputs, seed=cfg.seed, run_id=run_id if run_id is not None else cfg.name
    )


def build_controller(
    cfg: RunConfig, sink: DecisionSink | None, clock: Any, run_id: str | None = None, guidance: Any = None
) -> Controller:
    """The run's controller; ``guidance``: the references RAIL's guidance arms continue from
    (``controller.rail.guide_levels``; ``_guidance`` builds them)."""
    if cfg.controller.kind == "none":
        return NoopController()
    from controller.rail.controller import RailController
    from pipeline.types import SamplingParams

    o = cfg.orchestrator
    if cfg.controller.rail.guide_levels and guidance is None:
        raise ConfigError(
            f"controller.rail.guide_levels={list(cfg.controller.rail.guide_levels)} continue all-failed groups from "
            f"the prompt's reference response, which engine.kind={cfg.engine.kind} has none of; use engine.kind=torch "
            "(or vllm, ray) with a task that has solutions, or set controller.rail.guide_levels=[]"
        )
    rail = RailController(
        cfg.controller.rail,
        sink=sink if sink is not None else NullSink(),
        default_params=SamplingParams(temperature=o.temperature, top_p=o.top_p, max_tokens=o.max_tokens),
        seed=derive_seed(cfg.seed, "controller"),
        run_id=run_id if run_id is not None else cfg.name,
        clock=clock.now,
    )
    if guidance is not None:
        rail.attach_guidance(guidance)
    return rail


def _build_torch(cfg: RunConfig, progress: bool) -> tuple[RunParts, Any]:
    """A real language model: the task, its base policy (warm-started and cached in the run
    directory on first use, or loaded from model.path), the torch engine on a copy of it and
    the learner on the original."""
    import copy

    import torch

    from learner.torch_learner import TorchLearner
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.evaluation import SamplingEvaluator
    from pipeline.policy.models import ensure_base_model
    from pipeline.tasks import build_task

    task = build_task(cfg.task, context_chars=_prompt_char_limit(cfg))
    # the task's own scoring (warm start, reference checks) follows the run's reward settings
    task.reward_timeout_s, task.reward_check_first = (
        cfg.orchestrator.reward_timeout_s,
        cfg.orchestrator.reward_check_first,
    )
    episodic = is_episodic(task)
    if not cfg.model.path:  # fail before a warm start, with the tokenizer it would build
        from pipeline.policy.tokenizer import CharTokenizer

        chars = CharTokenizer.for_tasks(task)
        _prompts(cfg, task, renderer_for(chars).prompt_ids if episodic else chars.encode_prompt)
    base = ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=progress, task=task)
    tokenizer = base.tokenizer
    context = base.context_length if cfg.model.path else None  # a user's model: its config decides
    env = env_parts(cfg, task, tokenizer, context) if episodic else None  # episodes: rendered, stepped, ended
    encode = env.renderer.prompt_ids if env is not None else tokenizer.encode_prompt
    train_problems, train_prompts, eval_prompts = _prompts(cfg, task, encode, context)
    torch.set_num_threads(max(cfg.torch_engine.threads, cfg.learner.num_threads or 1))
    if cfg.engine.kind == "vllm":
        from pipeline.engines.vllm_engine import VllmEngine

        engine = VllmEngine(base.path, Path(cfg.run_dir) / "vllm_cache", **_vllm_kwargs(cfg, tokenizer.eos_id, context))
    elif cfg.engine.kind == "ray":
        engine = _ray_engine(cfg, base.path, tokenizer.eos_id, context)
    else:
        engine = TorchEngine(
            copy.deepcopy(base.model),
            tokenizer.eos_id,
            **_torch_kwargs(cfg, context),
            lockstep=cfg.orchestrator.deterministic,
        )
    pool = PromptPool(train_prompts, seed=derive_seed(cfg.seed, "prompts"))
    gate = _build_gate(cfg, pool)
    scorer = EnvironmentReward() if env is not None else task.scorer(tokenizer.decode)
    evaluator = SamplingEvaluator(
        engine,
        eval_prompts,
        scorer,
        samples_per_prompt=cfg.data.eval_samples,
        temperature=cfg.data.eval_temperature,
        max_tokens=cfg.orchestrator.max_tokens,
        seed=derive_seed(cfg.seed, "eval"),
        reward_timeout_s=cfg.orchestrator.reward_timeout_s,
        check_rewards=cfg.orchestrator.reward_check_first > 0,
        episodes=env.service if env is not None else None,
        inline_rewards=True if cfg.orchestrator.deterministic else None,
    )
    learner = TorchLearner(base.model, cfg.learner, pad_id=tokenizer.pad_id)
    reference = None if env is not None else _reference_screen(cfg, task, tokenizer, gate, train_problems)
    guidance = _guidance(cfg, task, tokenizer, train_problems, episodic=env is not None)
    if guidance is not None and cfg.gate.sara.guidance:
        gate.attach_guidance(guidance)
    parts = RunParts(
        engine=engine,
        gate=gate,
        controller=NoopController(),
        scoring=_scoring(cfg, scorer),
        learner=learner,
        clock=LockstepClock() if cfg.orchestrator.deterministic else WallClock(),
        evaluator=evaluator,
        reference=reference,
        lifecycle=Episodes(env.service.settings) if env is not None else SingleTurn(),
        episodes=env.service if env is not None else None,
    )
    return parts, guidance


def _scoring(cfg: RunConfig, scorer: Scorer) -> ScoringService:
    """The run's reward service: ``scorer`` under ``orchestrator.reward_timeout_s``, on
    ``reward_threads`` workers, stopping the run when each of the first ``reward_check_first`` fails."""
    o = cfg.orchestrator
    return ScoringService(
        scorer, o.reward_timeout_s, o.reward_threads, o.reward_check_first, inline=True if o.deterministic else None
    )


CHARS_PER_TOKEN_MAX = 64
"""No tokenizer spells a token of more characters than this (BPE vocabularies top out around 16-32,
a run of spaces in a code model's at 64): a prompt longer than the context times this cannot fit."""


def _prompt_char_limit(cfg: RunConfig) -> int:
    """The most prompt characters the model's context can hold, known before any model is loaded
    or any prompt tokenized (a dataset row above it is a bad row at once): the project's character
    model reads one token per character; a user's model at most ``CHARS_PER_TOKEN_MAX``."""
    from pipeline.policy.models import model_context, read_model_config

    room = cfg.model.max_len - cfg.orchestrator.max_tokens
    if not cfg.model.path:
        return max(1, room)
    context = model_context(read_model_config(cfg.model.path))
    return max(1, context - cfg.orchestrator.max_tokens) * CHARS_PER_TOKEN_MAX if context else 0


def _reference_screen(cfg: RunConfig, task: Any, tokenizer: Any, gate: Any, problems: list) -> ReferenceScreen | None:
    """``gate.sara.reference_prior``: each training problem's reference response as the model's tokens
    (the task's solution, then end-of-sequence), attached to the SARA gate. The likelihood is the
    pass rate only where the task accepts that text alone and one token sequence spells it (the
    project's character tokenizer); otherwise it is a lower bound."""
    sara = cfg.gate.sara
    if cfg.gate.kind != "sara" or not sara.reference_prior:
        return None
    from pipeline.policy.tokenizer import CharTokenizer

    references = {
        task.prompt_id(p): tuple(tokenizer.encode(p.solution)) + (tokenizer.eos_id,)
        for p in problems
        if _earns_reward(task, p)
    }
    if not references:
        raise ConfigError(
            f"gate.sara.reference_prior=true needs reference solutions the task's reward accepts; none of "
            f"{len(problems)} training problems of task {task.name!r} has one (e.g. {problems[0].solution!r}); "
            "give the data a solution column or set gate.sara.reference_prior=false"
        )
    exact = task.unique_response and isinstance(tokenizer, CharTokenizer)
    screen = ReferenceScreen(
        references,
        gate.source.peek,
        exact=exact,
        strength=sara.reference_strength,
        ahead=sara.scored_ahead(cfg.orchestrator.batch_groups),
        calibration=ReferenceCalibration() if sara.reference_calibrate else None,
    )
    gate.attach_reference(screen)
    return screen


def _guidance(cfg: RunConfig, task: Any, tokenizer: Any, problems: list, episodic: bool) -> Any:
    """The references guidance continues from (``controller.guidance.Guidance``), when the SARA
    gate guides (``gate.sara.guidance``) or RAIL offers guidance arms (``controller.rail.guide_levels``);
    None otherwise. Each training problem's reference response is the task's solution as the
    model's tokens, without end-of-sequence. A solution the reward rejects is dropped with a
    warning; so is one whose longest prefix would leave no room under ``orchestrator.max_tokens``."""
    gate_level = cfg.gate.sara.guidance if cfg.gate.kind in ("sara", "sara_dps") else 0.0
    rail_levels = tuple(cfg.controller.rail.guide_levels) if cfg.controller.kind == "rail" else ()
    if not gate_level and not rail_levels:
        return None
    from controller.guidance import Guidance, guide_len

    setting = f"gate.sara.guidance={gate_level}" if gate_level else f"controller.rail.guide_levels={list(rail_levels)}"
    if gate_level and cfg.controller.kind != "none":
        raise ConfigError(
            f"{setting} with controller.kind={cfg.controller.kind!r}: two places would guide the same groups; "
            "set gate.sara.guidance=0 and give RAIL its guidance arms (controller.rail.guide_levels), or "
            "controller.kind=none"
        )
    if episodic:
        raise ConfigError(
            f"{setting} continues a group from the prompt's reference response, which an environment task "
            f"({task.name!r}) has none of; turn guidance off"
        )
    longest = max((gate_level, *rail_levels))
    references, rejected, too_long = {}, 0, 0
    for p in problems:
        if not _earns_reward(task, p):
            rejected += 1
            continue
        ids = tuple(tokenizer.encode(p.solution))
        if guide_len(len(ids), longest) >= cfg.orchestrator.max_tokens:
            too_long += 1
            continue
        references[task.prompt_id(p)] = ids
    if rejected or too_long:
        import warnings

        warnings.warn(
            f"{setting}: {rejected} of {len(problems)} reference solutions of task {task.name!r} do not earn "
            f"the reward and {too_long} leave no room under orchestrator.max_tokens={cfg.orchestrator.max_tokens}; "
            "their prompts are never guided (gate/guide_no_reference counts them)",
            stacklevel=2,
        )
    if not references:
        raise ConfigError(
            f"{setting} needs reference solutions the task's reward accepts; none of "
            f"{len(problems)} training problems of task {task.name!r} has one (e.g. {problems[0].solution!r}); "
            "give the data a solution column or turn guidance off"
        )
    return Guidance(references, gate_level or 0.5, cfg.gate.sara.guidance_anneal_step if gate_level else 0)


def _earns_reward(task: Any, problem: Any) -> bool:
    """The problem's solution is a response the task's reward counts as a success (a reference
    that does not earn it would bound nothing); a reward that raises on it counts as no."""
    prompt = task.to_prompt(problem)
    try:
        score = task.score(prompt, problem.solution) if problem.solution else None
    except RewardsFailing:
        raise  # a reward that fails on every solution: the run stops with its reason
    except Exception:  # noqa: BLE001 - a built-in reward on an odd solution; that problem just gets no reference
        return False
    return score is not None and score > prompt.success_threshold


def _torch_kwargs(cfg: RunConfig, context: int | None = None) -> dict[str, Any]:
    """``context``: the model's context length (None: ``model.max_len``, the project's model)."""
    t = cfg.torch_engine
    return dict(
        max_batch=t.max_batch,
        dtype=t.dtype,
        seed=derive_seed(cfg.seed, "engine"),
        max_context=context or cfg.model.max_len,
        delta_tokens=t.delta_tokens,
    )


def _vllm_kwargs(cfg: RunConfig, eos_id: int | None, context: int | None = None) -> dict[str, Any]:
    # vLLM seeds numpy's legacy generator, which takes 32-bit seeds only.
    return dict(
        eos_id=eos_id,
        seed=derive_seed(cfg.seed, "engine") % 2**31,
        max_batch=cfg.torch_engine.max_batch,
        max_context=context or cfg.model.max_len,
    )


def _ray_engine(cfg: RunConfig, model_dir: Path, eos_id: int | None, context: int | None = None) -> Any:
    """Replicas of the torch or vLLM engine over ``model_dir`` as Ray actors (``engine.ray``)."""
    from pipeline.engines.ray_engine import RayEngine
    from pipeline.engines.ray_replica import TorchEngineFactory, VllmEngineFactory

    r = cfg.engine.ray
    if r.inner == "vllm":
        factory: Any = VllmEngineFactory(
            str(Path(model_dir).resolve()),
            str((Path(cfg.run_dir) / "vllm_cache").resolve()),
            tuple(_vllm_kwargs(cfg, eos_id, context).items()),
        )
    else:
        factory = TorchEngineFactory(
            str(Path(model_dir).resolve()),
            eos_id,
            threads=cfg.torch_engine.threads,
            engine_kwargs=tuple(_torch_kwargs(cfg, context).items()),
        )
    return RayEngine(
        factory,
        replicas=r.replicas,
        address=r.address or None,
        connect_timeout_s=r.connect_timeout_s,
        num_cpus=r.num_cpus,
        num_gpus=r.num_gpus,
        torch_threads=cfg.torch_engine.threads,
    )


def _prompts(cfg: RunConfig, task: Any, encode: Any, context: int | None = None) -> tuple[list, list, list]:
    """The run's training problems (their solutions are the reference prior's references), their
    prompts and the held-out prompts; ``ConfigError`` if any prompt leaves no room to answer.
    ``context``: the model's context length (None: ``model.max_len``, the project's model)."""
    limit = context or cfg.model.max_len
    max_prompt = limit - cfg.orchestrator.max_tokens
    train_problems = task.train_problems(cfg.data.num_train_prompts, derive_seed(cfg.data.seed, "train"))
    train_prompts = [task.to_prompt(p, encode) for p in train_problems]
    eval_prompts = task.eval_prompts(cfg.data.num_eval_prompts, derive_seed(cfg.data.seed, "eval"), encode)
    too_long = [p for p in train_prompts + eval_prompts if len(p.token_ids) > max_prompt]
    if too_long:
        what = (
            f"model.max_len={limit}"
            if context is None
            else f"the context of model.path={cfg.model.path} ({limit} tokens)"
        )
        fix = "raise model.max_len (a new base model) or lower" if context is None else "shorten the prompts or lower"
        raise ConfigError(
            f"{len(too_long)} prompts are longer than {what} minus "
            f"orchestrator.max_tokens={cfg.orchestrator.max_tokens} = {max_prompt} tokens (e.g. {too_long[0].text[:80]!r}); "
            f"{fix} orchestrator.max_tokens"
        )
    return train_problems, train_prompts, eval_prompts


def _build_gate(cfg: RunConfig, pool: PromptPool, success_probability: Callable[[int], float] | None = None) -> Gate:
    """The run's gate over ``pool``, seeded from the run's seed (``success_probability``: the
    simulator's exact p, for the oracle)."""
    return build_gate(
        cfg.gate,
        pool,
        group_size=cfg.orchestrator.group_size,
        batch_groups=cfg.orchestrator.batch_groups,
        seed=derive_seed(cfg.seed, "gate"),
        success_probability=success_probability,
    )


def _build_sim(cfg: RunConfig) -> RunParts:
    if cfg.gate.kind in ("sara", "sara_dps") and cfg.gate.sara.guidance:
        raise ConfigError(
            f"gate.sara.guidance={cfg.gate.sara.guidance} continues all-wrong groups from the prompt's reference "
            "response, which engine.kind=sim has none of; use engine.kind=torch (or vllm, ray) or set gate.sara.guidance=0"
        )
    if cfg.gate.kind == "sara" and cfg.gate.sara.reference_prior:
        raise ConfigError(
            "gate.sara.reference_prior=true scores the policy's likelihood of each prompt's reference "
            "response, which engine.kind=sim has neither of; use engine.kind=torch (or vllm, ray) or "
            "set gate.sara.reference_prior=false"
        )
    world = SimWorld(cfg.sim)
    clock: VirtualClock | WallClock = WallClock() if cfg.sim.realtime else VirtualClock()
    engine = SimEngine(world, clock=clock, fail_every=cfg.engine.fail_every)
    pool = PromptPool([engine.prompt(i) for i in range(cfg.sim.num_prompts)], seed=derive_seed(cfg.seed, "prompts"))
    gate = _build_gate(
        cfg, pool, success_probability=lambda prompt_id: world.success_probability(engine.state, prompt_id)
    )
    return RunParts(
        engine=engine,
        gate=gate,
        controller=NoopController(),
        scoring=_scoring(cfg, SimAnswerScorer()),
        learner=SimLearner(world, cfg.orchestrator.group_size, seed=derive_seed(cfg.seed, "learner")),
        clock=clock,
        evaluator=SimEvaluator(world, engine),
    )


def read_replay_log(cfg: RunConfig) -> GroupLog:
    """The group log ``replay.log`` names, read and checked (``pipeline.store.grouplog``); a
    ``ConfigError`` naming the setting and the fix when it cannot be replayed."""
    r = cfg.replay
    if r.format not in ("auto", "native"):
        raise ConfigError(
            f"replay.format={r.format}: a pipeline replay reads railgate's own group logs (replay.format=native or "
            f"auto); read a {r.format} log with `python run.py bench replay --format {r.format}`, or convert it "
            "to a native log first"
        )
    try:
        log = read_group_log(r.log, on_bad_row=r.on_bad_row)
    except GroupLogError as exc:
        raise ConfigError(f"replay.log={r.log}: {exc}") from exc
    if not log.groups:
        raise ConfigError(f"replay.log={r.log} holds no complete group; record some with `python run.py record`")
    return log


def _build_replay(cfg: RunConfig) -> RunParts:
    """Exact replay (``engine.kind: replay``): the recorded groups of ``replay.log`` in the order
    of ``replay.order_seed``, served by the replay engine on a virtual clock and scored with their
    recorded rewards; the learner is off (``NoLearner``) and nothing is evaluated. The gate, its
    one-pass prompt pool (the run ends when it is used up and nothing runs), the oracle's success
    probability and SARA's reference screen are ``railgate.replay.gate_parts``'s, which ``bench
    replay``'s driver builds too; so are the refusals (new text, log-probabilities, DPS, an
    uncapped HORA), here as ``ConfigError``."""
    o = cfg.orchestrator
    why = not_replayable(cfg)  # before reading the log
    if why:
        raise ConfigError(why)
    log = read_replay_log(cfg)
    if o.group_size > log.group_size:
        raise ConfigError(
            f"orchestrator.group_size={o.group_size} is above the {log.group_size} samples per group recorded in "
            f"replay.log={cfg.replay.log}; a replay cannot invent samples: set orchestrator.group_size="
            f"{log.group_size} or less, or record more samples per prompt (run.py record --samples)"
        )
    order = ReplayOrder(log, seed=cfg.replay.order_seed)
    clock = VirtualClock()
    served = ServedRewards()
    engine = ReplayEngine(order, clock=clock, rate=cfg.replay.rate, served=served)
    try:
        built = build_replay_gate(cfg, order)
    except ConfigError as exc:
        raise ConfigError(f"replay.log={cfg.replay.log}: {exc}") from exc
    pool = built.pool
    return RunParts(
        engine=engine,
        gate=built.gate,
        controller=NoopController(),
        scoring=_scoring(cfg, RecordedReward(served)),
        learner=NoLearner(),
        clock=clock,
        evaluator=None,
        prompts_left=lambda: pool.remaining,
    )


@dataclass
class SamplerParts:
    """A real model's parts for sampling full groups outside training (``run.py record``): the
    same task, base model, engine, reward service, prompts and reference responses that
    ``_build_torch`` gives a training run, and the learner that scores those references."""

    task: Any
    tokenizer: Any
    model_dir: Path
    """The model directory the engine loaded (``model.path``, or the run's cached base model)."""
    engine: Any
    scoring: ScoringService
    prompts: list[Prompt]
    """The first training prompts in the task's seeded order (``Task.train_problems`` with
    ``derive_seed(data.seed, "train")``, the order a run's pool is drawn in, before the gate's
    own shuffle)."""
    references: dict[int, tuple[int, ...]]
    """Prompt id -> its reference response as token ids, end-of-sequence included (those of
    ``_reference_screen``); a prompt whose task has no solution the reward accepts has none."""
    learner: Any
    """Scores references: ``learner.logprobs`` (what a run's reference prior reads)."""
    difficulties: dict[int, float | None] | None = None
    """Prompt id -> the difficulty a recording writes (None: a level-less prompt); None: each
    prompt's own ``Prompt.difficulty`` (a source whose levels are not the task's, ``railgate.record_trl``)."""


def build_sampler(cfg: RunConfig, num_prompts: int, progress: bool = True) -> SamplerParts:
    """``SamplerParts`` for the first ``num_prompts`` training prompts of ``cfg``'s task, on
    ``cfg.engine.kind`` (torch or vllm) over ``cfg.model`` (warm-started and cached in the run
    directory on first use, exactly as a training run does, or loaded from ``model.path``)."""
    import copy

    import torch

    from learner.torch_learner import TorchLearner
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.policy.models import ensure_base_model
    from pipeline.tasks import build_task

    if cfg.engine.kind not in ("torch", "vllm"):
        raise ConfigError(
            f"engine.kind={cfg.engine.kind!r}: recording samples a real model on one engine; use --engine torch or vllm"
        )
    if num_prompts > cfg.data.num_train_prompts:
        raise ConfigError(
            f"{num_prompts} prompts asked for, but the run has data.num_train_prompts={cfg.data.num_train_prompts}; "
            f"ask for fewer, or --set data.num_train_prompts={num_prompts}"
        )
    preflight(cfg)
    task = build_task(cfg.task, context_chars=_prompt_char_limit(cfg))
    task.reward_timeout_s, task.reward_check_first = (
        cfg.orchestrator.reward_timeout_s,
        cfg.orchestrator.reward_check_first,
    )
    if is_episodic(task):
        raise ConfigError(
            f"task {task.name!r} is an environment task (multi-turn episodes); recording full groups covers "
            "single-response tasks (arithmetic, countdown, dataset); pick one of those"
        )
    if not cfg.model.path:  # fail before a warm start, with the tokenizer it would build
        from pipeline.policy.tokenizer import CharTokenizer

        _prompts(cfg, task, CharTokenizer.for_tasks(task).encode_prompt)
    base = ensure_base_model(cfg.run_dir, cfg.task, cfg.model, progress=progress, task=task)
    tokenizer = base.tokenizer
    context = base.context_length if cfg.model.path else None
    problems, prompts, _ = _prompts(cfg, task, tokenizer.encode_prompt, context)
    problems, prompts = problems[:num_prompts], prompts[:num_prompts]
    torch.set_num_threads(max(cfg.torch_engine.threads, cfg.learner.num_threads or 1))
    if cfg.engine.kind == "vllm":
        from pipeline.engines.vllm_engine import VllmEngine

        engine: Any = VllmEngine(
            base.path, Path(cfg.run_dir) / "vllm_cache", **_vllm_kwargs(cfg, tokenizer.eos_id, context)
        )
    else:
        engine = TorchEngine(copy.deepcopy(base.model), tokenizer.eos_id, **_torch_kwargs(cfg, context))
    references = {
        task.prompt_id(p): tuple(tokenizer.encode(p.solution)) + (tokenizer.eos_id,)
        for p in problems
        if _earns_reward(task, p)
    }
    return SamplerParts(
        task=task,
        tokenizer=tokenizer,
        model_dir=Path(base.path),
        engine=engine,
        scoring=_scoring(cfg, task.scorer(tokenizer.decode)),
        prompts=prompts,
        references=references,
        learner=TorchLearner(base.model, cfg.learner, pad_id=tokenizer.pad_id),
    )
