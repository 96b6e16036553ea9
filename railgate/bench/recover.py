"""Is a failed trajectory worth branching from? RAIL's premise, measured on a fixed base model.

``python run.py bench recover --config configs/default.yaml --set task.arithmetic.scratchpad=true
--set orchestrator.max_tokens=64 --set model.max_len=96``

1. **Groups.** The warm-started base model (``OUT/base_model``, or ``model.path``) samples a
   group of ``group_size`` responses for each of ``prompts`` held-out prompts on the torch
   engine, at temperature 1: step-0 accuracy, tokens per response, and per difficulty level
   the share of all-fail, mixed and all-pass groups.
2. **Branches.** Up to ``failed_per_prompt`` failed responses per prompt are branched from
   three cut points, ``branches`` continuations each (a ``BranchSpec`` prefix, as RAIL's
   branch arm sends it): *early*, the first quarter of the response's tokens; *mid*, half of
   them; *entropy*, every token before the response's highest-entropy token (the policy's
   entropy when it sampled that token; the first token is left out so that a prefix is never
   empty); *reference*, the longest prefix that agrees with the task's reference solution
   (on scratchpad arithmetic, whose solution is unique, every token before the first wrong
   one: the cut a perfect step checker would choose; on Countdown, where other solutions
   exist, the point where the response leaves the reference's path). A branch succeeds when
   its completed response scores above the success threshold.
3. **Fresh.** The same prompts get as many fresh samples (new seeds) as one cut's branches
   (``branches`` per failed response taken): the success rate a branch has to beat. Rates are also given on the prompts whose group was all-fail,
   the groups a branch would have to turn mixed.

Every rate comes with its count and a 95% Wilson interval. Samples of one prompt are
correlated, so the intervals are narrower than those of independent prompts: read a
difference as real only when it is well outside both intervals.

Every request has its own seed (``SamplingParams.seed``, derived from the run seed and the
request's id; engine seed from the run seed):
the same config, prompts and seed give the same table up to float rounding of batch shapes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.seeding import derive_seed
from pipeline.types import BranchSpec, Prompt, SampleFinished, SampleRequest, SamplingParams, TokenDelta
from railgate.bench.rates import Rate, rate_cell
from railgate.report import markdown_table

if TYPE_CHECKING:
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.policy.models import BaseModel
    from pipeline.tasks.base import Task
    from railgate.config import RunConfig

CUTS = ("early", "mid", "entropy", "reference")


@dataclass(frozen=True)
class Trajectory:
    """One sampled response: its tokens (prefix included), log-probs, entropies per response
    token (``nan`` for a branch prefix's tokens) and reward."""

    prompt_index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    entropies: tuple[float, ...]
    reward: float
    success: bool


@dataclass
class LevelStats:
    """What one difficulty level measured."""

    prompts: int = 0
    accuracy: Rate = field(default_factory=Rate)
    all_fail: int = 0
    mixed: int = 0
    all_pass: int = 0
    tokens: int = 0
    fresh: Rate = field(default_factory=Rate)
    fresh_all_fail: Rate = field(default_factory=Rate)
    branch: dict[str, Rate] = field(default_factory=lambda: {c: Rate() for c in CUTS})
    branch_all_fail: dict[str, Rate] = field(default_factory=lambda: {c: Rate() for c in CUTS})
    prefix_tokens: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CUTS})
    recovered_groups: dict[str, int] = field(
        default_factory=lambda: {c: 0 for c in CUTS}
    )  # all-fail groups a branch turned mixed
    fresh_recovered_groups: int = 0


def cut_position(cut: str, entropies: tuple[float, ...], agreed: int = 0) -> int:
    """How many response tokens a branch at ``cut`` keeps (0: no branch possible); ``agreed``
    is how many of them agree with the reference solution (``reference_agreement``).

    >>> [cut_position(c, (0.1, 0.9, 0.2, 0.5, 0.3, 0.1, 0.0, 0.2), agreed=5) for c in CUTS]
    [2, 4, 1, 5]
    >>> cut_position("reference", (0.1, 0.2, 0.3), agreed=3)  # all of it agrees: nothing to redo
    0
    >>> cut_position("entropy", (2.0, 0.1, 0.3))  # the first token is never the cut
    2
    >>> cut_position("early", (0.5,))
    0
    """
    n = len(entropies)
    if n < 2:
        return 0
    if cut == "early":
        return max(1, n // 4)
    if cut == "mid":
        return max(1, n // 2)
    if cut == "entropy":
        return max(range(1, n), key=lambda t: (entropies[t], -t))
    if cut == "reference":
        return agreed if 0 < agreed < n else 0
    raise ValueError(f"cut={cut!r} is not one of {', '.join(CUTS)}")


def reference_agreement(ids: tuple[int, ...], solution: str, decode) -> int:
    """The most leading tokens of ``ids`` whose text is a prefix of ``solution``.

    >>> reference_agreement((ord("1"), ord("2"), ord("9")), "123", lambda t: "".join(map(chr, t)))
    2
    """
    agreed = 0
    for t in range(1, len(ids) + 1):
        if not solution.startswith(decode(ids[:t])):
            break
        agreed = t
    return agreed


async def _sample_all(
    engine, requests: list[SampleRequest], concurrency: int
) -> list[tuple[SampleFinished, tuple[float, ...]]]:
    """Stream every request through ``engine`` (at most ``concurrency`` at once); the final
    event of each, with the entropies of its generated tokens."""
    import anyio

    out: list[Any] = [None] * len(requests)
    limit = anyio.Semaphore(concurrency)

    async def one(i: int, request: SampleRequest) -> None:
        async with limit:
            entropies: list[float] = []
            async for event in engine.stream(request):
                if isinstance(event, TokenDelta):
                    entropies.extend(event.entropies or (float("nan"),) * len(event.token_ids))
                elif isinstance(event, SampleFinished):
                    out[i] = (event, tuple(entropies))

    async with anyio.create_task_group() as tg:
        for i, request in enumerate(requests):
            tg.start_soon(one, i, request)
    return out


def _response(event: SampleFinished, eos_id: int | None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ids, lps = tuple(event.token_ids), tuple(event.logprobs)
    if ids and ids[-1] == eos_id:
        ids, lps = ids[:-1], lps[:-1]
    return ids, lps


def start_measurement(
    cfg: RunConfig,
    out: Path,
    prompts: int,
    branches: int,
    failed_per_prompt: int,
    progress: bool,
    share_task: bool = False,
) -> tuple[Task, BaseModel, float]:
    """What both recover measurements begin with: the counts checked (a ``ConfigError`` unless all
    are >= 1), ``out`` made, the task built and the base model ensured (``ensure_base_model``;
    with ``share_task`` it is handed the task, else it builds its own). Returns the task, the
    base model and the seconds the base model took (a warm start, or a load)."""
    from pipeline.policy.models import ensure_base_model
    from pipeline.tasks import build_task

    if prompts < 1 or branches < 1 or failed_per_prompt < 1:
        from pipeline.config.build import ConfigError

        raise ConfigError(
            f"--prompts={prompts}, --branches={branches} and --failed-per-prompt={failed_per_prompt} must be >= 1"
        )
    out.mkdir(parents=True, exist_ok=True)
    task = build_task(cfg.task)
    started = time.perf_counter()
    base = ensure_base_model(out, cfg.task, cfg.model, progress=progress, task=task if share_task else None)
    return task, base, time.perf_counter() - started


def base_engine(cfg: RunConfig, base: BaseModel) -> TorchEngine:
    """A torch engine over a copy of ``base``'s model, with the run's engine settings (and torch
    threads); a user's model (``model.path``) brings its own context length."""
    import copy

    import torch

    from pipeline.engines.torch_engine import TorchEngine
    from railgate.build import _torch_kwargs

    torch.set_num_threads(cfg.torch_engine.threads)
    context = base.context_length if cfg.model.path else None
    return TorchEngine(copy.deepcopy(base.model), base.tokenizer.eos_id, **_torch_kwargs(cfg, context))


def report_facts(
    cfg: RunConfig,
    out: Path,
    base: BaseModel,
    warm_s: float,
    sample_s: float,
    prompts: int,
    branches: int,
    failed_per_prompt: int,
) -> dict[str, Any]:
    """The entries both recover reports have, in their order: the base model and its warm start,
    the wall times, and the counts measured with."""
    from pipeline.policy.models import BASE_DIR_NAME

    return {
        "base_model": str(cfg.model.path or out / BASE_DIR_NAME),
        "warm_start": base.meta.get("warm_start"),
        "warm_start_wall_s": warm_s,
        "sampling_wall_s": sample_s,
        "prompts": prompts,
        "group_size": cfg.orchestrator.group_size,
        "branches": branches,
        "failed_per_prompt": failed_per_prompt,
    }


def write_report(out: Path, report: dict[str, Any], markdown: str) -> dict[str, Any]:
    """Write ``report`` as ``OUT/recover.json`` and its ``markdown`` as ``OUT/recover.md``; returns the report."""
    (out / "recover.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "recover.md").write_text(markdown + "\n")
    return report


def measure_recoverability(
    cfg, out: Path, prompts: int = 400, branches: int = 4, failed_per_prompt: int = 2, progress: bool = True
) -> dict[str, Any]:
    """Run the measurement of the module docstring for run config ``cfg``; returns the report
    (also written to ``OUT/recover.json`` and ``OUT/recover.md``)."""
    import anyio

    task, base, warm_s = start_measurement(cfg, out, prompts, branches, failed_per_prompt, progress)
    tok = base.tokenizer
    scorer = task.scorer(tok.decode)
    threshold = cfg.task.success_threshold
    max_tokens = cfg.orchestrator.max_tokens
    engine = base_engine(cfg, base)
    concurrency = cfg.torch_engine.max_batch
    seed = derive_seed(cfg.seed, "recover")
    group_size = cfg.orchestrator.group_size
    problems = task.eval_problems(prompts, seed=cfg.seed)
    plist: list[Prompt] = [task.to_prompt(p, tok.encode_prompt) for p in problems]

    def request(rid: str, i: int, k: int, branch: BranchSpec | None = None) -> SampleRequest:
        # Its own seed per request: group ids and indices repeat between the groups, fresh samples
        # and branches, and an engine's draws depend on the seed, group and index, not the name.
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=derive_seed(seed, rid))
        return SampleRequest(rid, group_id=i, sample_index=k, prompt=plist[i], params=params, branch=branch)

    def run(requests: list[SampleRequest]) -> list[Trajectory]:
        results = anyio.run(_sample_all, engine, requests, concurrency)
        trajectories = []
        for req, (event, ents) in zip(requests, results):
            if event.error:
                raise RuntimeError(f"request {req.request_id} failed in the engine: {event.error}")
            ids, lps = _response(event, tok.eos_id)
            prefix = req.prefix_len
            ents = ((float("nan"),) * prefix + ents)[: len(ids)]
            reward = float(scorer(req.prompt, ids))
            trajectories.append(Trajectory(req.group_id, ids, lps, ents, reward, reward > threshold))
        return trajectories

    try:
        t0 = time.perf_counter()
        groups = run([request(f"g{i}.s{k}", i, k) for i in range(len(plist)) for k in range(group_size)])
        by_prompt: list[list[Trajectory]] = [groups[i * group_size : (i + 1) * group_size] for i in range(len(plist))]
        branch_reqs: list[tuple[str, SampleRequest]] = []
        fresh_reqs: list[SampleRequest] = []
        for i, group in enumerate(by_prompt):
            failed = [(k, t) for k, t in enumerate(group) if not t.success][:failed_per_prompt]
            if not failed:
                continue
            fresh_reqs += [request(f"f{i}.{j}", i, j) for j in range(branches * len(failed))]
            for k, traj in failed:
                agreed = reference_agreement(traj.token_ids, problems[i].solution, tok.decode)
                for cut in CUTS:
                    pos = cut_position(cut, traj.entropies, agreed)
                    if pos < 1 or pos >= max_tokens:
                        continue
                    spec = BranchSpec(f"g{i}.s{k}", pos, traj.token_ids[:pos], traj.logprobs[:pos])
                    branch_reqs += [(cut, request(f"b{i}.{k}.{cut}.{j}", i, k, spec)) for j in range(branches)]
        fresh = run(fresh_reqs)
        branched = run([r for _, r in branch_reqs])
        sample_s = time.perf_counter() - t0
    finally:
        anyio.run(engine.aclose)

    levels: dict[float, LevelStats] = {}
    total = LevelStats()
    all_fail = set()
    for i, group in enumerate(by_prompt):
        wins = sum(t.success for t in group)
        for stats in (levels.setdefault(plist[i].difficulty, LevelStats()), total):
            stats.prompts += 1
            for t in group:
                stats.accuracy.add(t.success)
                stats.tokens += len(t.token_ids)
            if wins == 0:
                stats.all_fail += 1
            elif wins == group_size:
                stats.all_pass += 1
            else:
                stats.mixed += 1
        if wins == 0:
            all_fail.add(i)
    fresh_wins: dict[int, bool] = {}
    for t in fresh:
        fresh_wins[t.prompt_index] = fresh_wins.get(t.prompt_index, False) or t.success
        for stats in (levels[plist[t.prompt_index].difficulty], total):
            stats.fresh.add(t.success)
            if t.prompt_index in all_fail:
                stats.fresh_all_fail.add(t.success)
    for i in all_fail:
        if fresh_wins.get(i):
            levels[plist[i].difficulty].fresh_recovered_groups += 1
            total.fresh_recovered_groups += 1
    branch_wins: dict[tuple[int, str], bool] = {}
    for (cut, req), t in zip(branch_reqs, branched):
        key = (t.prompt_index, cut)
        branch_wins[key] = branch_wins.get(key, False) or t.success
        for stats in (levels[plist[t.prompt_index].difficulty], total):
            stats.branch[cut].add(t.success)
            stats.prefix_tokens[cut] += req.branch.prefix_len
            if t.prompt_index in all_fail:
                stats.branch_all_fail[cut].add(t.success)
    for (i, cut), won in branch_wins.items():
        if won and i in all_fail:
            levels[plist[i].difficulty].recovered_groups[cut] += 1
            total.recovered_groups[cut] += 1

    report = {
        "task": repr(task),
        **report_facts(cfg, out, base, warm_s, sample_s, len(plist), branches, failed_per_prompt),
        "max_tokens": max_tokens,
        "seed": cfg.seed,
        "samples": len(groups) + len(fresh) + len(branched),
        "levels": {str(d): _stats_dict(s) for d, s in sorted(levels.items())},
        "all": _stats_dict(total),
    }
    return write_report(out, report, render(report))


def _stats_dict(s: LevelStats) -> dict[str, Any]:
    def rate(r: Rate) -> dict[str, Any]:
        return {"successes": r.successes, "trials": r.trials, "rate": r.rate, "ci95": list(r.interval)}

    d = asdict(s)
    d["accuracy"], d["fresh"], d["fresh_all_fail"] = rate(s.accuracy), rate(s.fresh), rate(s.fresh_all_fail)
    d["branch"] = {c: rate(r) for c, r in s.branch.items()}
    d["branch_all_fail"] = {c: rate(r) for c, r in s.branch_all_fail.items()}
    d["tokens_per_response"] = s.tokens / max(1, s.accuracy.trials)
    d["mean_prefix_tokens"] = {c: s.prefix_tokens[c] / max(1, s.branch[c].trials) for c in CUTS}
    return d


def _profile_row(name: str, s: dict[str, Any]) -> list[Any]:
    """A level's row of the base model's profile: prompts, accuracy, group outcomes, response length."""
    n = max(1, s["prompts"])
    outcomes = (f"{s[k] / n:.2f}" for k in ("all_fail", "mixed", "all_pass"))
    return [name, s["prompts"], rate_cell(s["accuracy"]), *outcomes, f"{s['tokens_per_response']:.1f}"]


def _joined(per_cut: dict[str, Any], spec: str) -> str:
    """A per-cut value for each of ``CUTS``, formatted with ``spec``, joined by " / "."""
    return " / ".join(format(per_cut[c], spec) for c in CUTS)


def render(report: dict[str, Any]) -> str:
    """The report as Markdown tables: the base model's profile, then branch against fresh."""
    rows = list(report["levels"].items()) + [("all", report["all"])]
    lines = [
        f"{report['task']}; {report['prompts']} held-out prompts, groups of {report['group_size']}, "
        f"{report['branches']} branches per cut of up to {report['failed_per_prompt']} failed responses per prompt, "
        f"seed {report['seed']}, {report['samples']} samples in {report['sampling_wall_s']:.0f} s",
        "",
        markdown_table(
            ["level", "prompts", "step-0 accuracy", "all-fail", "mixed", "all-pass", "tokens/response"],
            [_profile_row(name, s) for name, s in rows],
        ),
        "",
        "Success rate of a branch from a failed response's prefix, against a fresh sample of the same prompts "
        "(rate [95% interval] (successes/trials); prefix: mean tokens kept):",
        "",
        markdown_table(
            ["level", "fresh", *CUTS, f"prefix {'/'.join(CUTS)}"],
            [
                [
                    name,
                    rate_cell(s["fresh"]),
                    *(rate_cell(s["branch"][c]) for c in CUTS),
                    _joined(s["mean_prefix_tokens"], ".1f"),
                ]
                for name, s in rows
            ],
        ),
        "",
        "The same on prompts whose group was all-fail; groups: all-fail groups that at least one of the "
        "prompt's branches (or fresh samples) at that cut turned mixed:",
        "",
        markdown_table(
            ["level", "all-fail groups", "fresh", *CUTS, f"groups fresh / {' / '.join(CUTS)}"],
            [
                [
                    name,
                    s["all_fail"],
                    rate_cell(s["fresh_all_fail"]),
                    *(rate_cell(s["branch_all_fail"][c]) for c in CUTS),
                    f"{s['fresh_recovered_groups']} / {_joined(s['recovered_groups'], '')}",
                ]
                for name, s in rows
            ],
        ),
    ]
    return "\n".join(lines)
