"""Is a failed turn worth branching from? RAIL's premise on multi-turn episodes.

``python run.py bench recover --config configs/agent.yaml --set model.path=DIR`` (selected when
``task.name=env``; ``railgate.bench.recover`` is the single-turn measurement).

1. **Groups.** The base model plays a group of ``group_size`` episodes of each of ``prompts``
   held-out prompts (the run's temperature and ``top_p``, one turn of at most
   ``orchestrator.max_tokens`` tokens, the environment stepped through the run's
   ``EnvService``, the episode rules of ``pipeline.core.episodes``): episode success, turns and
   generated tokens per episode, the share of all-fail, mixed and all-pass groups.
2. **Failed turns.** A *failed turn boundary* is a turn ``t`` of an episode whose reward is at
   most ``task.success_threshold`` (the environment said wrong) and after which the episode
   went on: the next turn sees the environment's feedback. Up to ``failed_per_prompt`` of them
   per prompt (in the order the group's episodes played them) get ``branches`` branches each:
   new episodes that continue the context after turn ``t`` and its feedback, the environment
   rebuilt in that state (``EnvService.fork``: replay or snapshot, as ``task.env.state``
   says) -- what RAIL's turn arm launches (``BranchSpec(key, prefix_len, turns=t)``).
3. **Fresh.** For every boundary taken, as many fresh episodes of the same prompt as its
   branches: the success rate a branch has to beat, on the same prompts.

Reported by the turn ``t`` branched from: success per rollout (an episode) with its count and
95% Wilson interval, and per generated token (successes per 1,000 tokens the policy wrote: a
branch writes only what follows its boundary, a fresh episode all of its turns; the interval
is the Wilson interval scaled by the mean tokens, the token count taken as fixed). *source*
is the branched episode's own outcome: its continuation after the same boundary, drawn from
the same distribution as a branch (a check of the branches' rate). The same over boundaries of
prompts whose group was all-fail (the groups a branch would have to turn mixed).

Every request has its own seed (derived from the run seed and the request's id; each later
turn's from that), so the same config, prompts and seed give the same table up to float
rounding of batch shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.episodes import EpisodeBook, episode_key
from pipeline.envs.play import play_episode
from pipeline.seeding import derive_seed
from pipeline.types import FinishReason, Prompt, SampleFinished, SampleRequest, SamplingParams, ScoredSample
from railgate.bench.rates import Rate, rate_cell
from railgate.bench.recover import base_engine, report_facts, start_measurement, write_report

FRESH_BASE = 10_000
"""Sample indices of fresh episodes start here (a group's own run from 0), branches' at twice it."""


@dataclass(frozen=True)
class Boundary:
    """A failed turn boundary: episode ``source`` of prompt ``prompt_index`` after ``turns`` turns."""

    prompt_index: int
    source: ScoredSample
    turns: int

    @property
    def prefix_len(self) -> int:
        return boundary_offset(self.source, self.turns)


def boundary_offset(scored: ScoredSample, turns: int) -> int:
    """Response tokens before the turn after ``turns``: the turns and the feedback that followed.

    >>> from pipeline.types import Turns
    >>> result = SampleFinished("g0-s0", (7, 8, 5, 6, 9), (0.0,) * 5, FinishReason.STOP, 0)
    >>> s = ScoredSample(SampleRequest("g0-s0", 0, 0, Prompt(0, "", (1,)), SamplingParams()), result, 1.0,
    ...                  turns=Turns((2, 5), (0.0, 1.0), (True, True, False, False, True)))
    >>> boundary_offset(s, 1), generated_tokens(s, boundary_offset(s, 1))
    (4, 1)
    """
    assert scored.turns is not None
    mask = scored.turns.policy_mask
    keep = scored.turns.ends[turns - 1]
    while keep < len(mask) and not mask[keep]:
        keep += 1
    return keep


def generated_tokens(scored: ScoredSample, start: int = 0) -> int:
    """Tokens the policy wrote from response offset ``start`` on."""
    assert scored.turns is not None
    return sum(scored.turns.policy_mask[start:])


def failed_boundaries(scored: ScoredSample, threshold: float) -> list[int]:
    """The turns after which ``scored`` can be branched from having just failed one: a turn whose
    reward is at most ``threshold`` and that is not the episode's last."""
    if scored.turns is None:
        return []
    rewards = scored.turns.rewards
    return [t for t in range(1, len(rewards)) if rewards[t - 1] <= threshold]


@dataclass
class Tally:
    """Successes per rollout and the tokens they cost."""

    rate: Rate = field(default_factory=Rate)
    tokens: int = 0

    def add(self, success: bool, tokens: int) -> None:
        self.rate.add(success)
        self.tokens += tokens

    def as_dict(self) -> dict[str, Any]:
        r = self.rate
        mean = self.tokens / r.trials if r.trials else float("nan")
        lo, hi = r.interval
        per_k = 1000.0 / mean if r.trials and mean > 0 else float("nan")
        return {
            "successes": r.successes,
            "trials": r.trials,
            "rate": r.rate,
            "ci95": [lo, hi],
            "tokens": self.tokens,
            "tokens_per_rollout": mean,
            "per_1k_tokens": r.rate * per_k,
            "per_1k_tokens_ci95": [lo * per_k, hi * per_k],
        }


@dataclass
class TurnStats:
    """One row: boundaries after turn ``t`` (or all of them)."""

    boundaries: int = 0
    prefix_tokens: int = 0
    fresh: Tally = field(default_factory=Tally)
    branch: Tally = field(default_factory=Tally)
    source: Tally = field(default_factory=Tally)

    def as_dict(self) -> dict[str, Any]:
        return {
            "boundaries": self.boundaries,
            "mean_prefix_tokens": self.prefix_tokens / max(1, self.boundaries),
            "fresh": self.fresh.as_dict(),
            "branch": self.branch.as_dict(),
            "source": self.source.as_dict(),
        }


async def play(
    engine: Any, service: Any, settings: Any, request: SampleRequest, boundary: Boundary | None = None
) -> ScoredSample:
    """Play the episode ``request`` starts to its end, from the prompt or (a branch) from
    ``boundary``. The environment's session stays open: a later branch may fork it."""
    book = EpisodeBook(settings)
    if boundary is None:
        turn = book.begin(request)
    else:
        source = boundary.source
        _rebuild(book, source, boundary.turns)
        key = episode_key(source.request)
        service.fork(key, boundary.turns, episode_key(request))
        turn = book.begin(request, key, boundary.turns)
    return await play_episode(engine, service, settings, request, book, close=False, first=turn)


def _rebuild(book: EpisodeBook, scored: ScoredSample, turns: int) -> None:
    """Put ``scored``'s episode into ``book`` as it stood after its first ``turns`` turns and the
    feedback to the last of them (so that ``book.begin`` can branch from it)."""
    assert scored.turns is not None
    request, result, t = scored.request, scored.result, scored.turns
    book.begin(request)
    start = 0
    for k in range(turns):
        end = t.ends[k]
        after = boundary_offset(scored, k + 1)
        finished = SampleFinished(
            request.request_id,
            result.token_ids[start:end],
            result.logprobs[start:end],
            FinishReason.STOP,
            result.policy_version,
        )
        ended = book.turn_done(request, finished, tuple(result.token_ids[end:after]), t.rewards[k], done=False)
        if ended is not None:
            raise RuntimeError(f"{request.request_id}: rebuilding turn {k + 1} of {turns} ended the episode")
        start = after


def measure_turn_recoverability(
    cfg, out: Path, prompts: int = 400, branches: int = 4, failed_per_prompt: int = 2, progress: bool = True
) -> dict[str, Any]:
    """Run the measurement of the module docstring for run config ``cfg`` (``task.name: env``);
    returns the report (also written to ``OUT/recover.json`` and ``OUT/recover.md``)."""
    import anyio

    from railgate.episodic import env_parts

    task, base, warm_s = start_measurement(cfg, out, prompts, branches, failed_per_prompt, progress, share_task=True)
    parts = env_parts(cfg, task, base.tokenizer, base.context_length if cfg.model.path else None)
    service, settings = parts.service, parts.settings
    threshold = cfg.task.success_threshold
    o = cfg.orchestrator
    engine = base_engine(cfg, base)
    seed = derive_seed(cfg.seed, "recover_turns")
    group_size = o.group_size
    plist: list[Prompt] = task.eval_prompts(prompts, derive_seed(cfg.seed, "recover"), parts.renderer.prompt_ids)

    def request(i: int, index: int) -> SampleRequest:
        params = SamplingParams(o.temperature, o.top_p, o.max_tokens, seed=derive_seed(seed, i, index))
        return SampleRequest(f"g{i}-s{index}", group_id=i, sample_index=index, prompt=plist[i], params=params)

    async def run_all(jobs: list[tuple[SampleRequest, Boundary | None]]) -> list[ScoredSample]:
        results: list[Any] = [None] * len(jobs)
        limit = anyio.Semaphore(cfg.torch_engine.max_batch)

        async def one(k: int, req: SampleRequest, boundary: Boundary | None) -> None:
            async with limit:
                results[k] = await play(engine, service, settings, req, boundary)

        async with anyio.create_task_group() as tg:
            for k, (req, boundary) in enumerate(jobs):
                tg.start_soon(one, k, req, boundary)
        return results

    def won(s: ScoredSample) -> bool:
        return s.is_valid and s.reward > threshold

    try:
        t0 = time.perf_counter()
        groups = anyio.run(run_all, [(request(i, k), None) for i in range(len(plist)) for k in range(group_size)])
        by_prompt = [groups[i * group_size : (i + 1) * group_size] for i in range(len(plist))]
        taken: list[Boundary] = []
        for i, group in enumerate(by_prompt):
            found = [Boundary(i, s, t) for s in group for t in failed_boundaries(s, threshold)]
            taken += found[:failed_per_prompt]
        fresh_jobs: list[tuple[SampleRequest, Boundary | None]] = []
        branch_jobs: list[tuple[SampleRequest, Boundary | None]] = []
        per_prompt: dict[int, int] = {}
        for b in taken:
            n = per_prompt.get(b.prompt_index, 0)
            per_prompt[b.prompt_index] = n + branches
            fresh_jobs += [(request(b.prompt_index, FRESH_BASE + n + j), None) for j in range(branches)]
            branch_jobs += [(request(b.prompt_index, 2 * FRESH_BASE + n + j), b) for j in range(branches)]
        fresh = anyio.run(run_all, fresh_jobs)
        branched = anyio.run(run_all, branch_jobs)
        sample_s = time.perf_counter() - t0
    finally:
        service.close_all()
        anyio.run(engine.aclose)

    all_fail = {i for i, group in enumerate(by_prompt) if not any(won(s) for s in group)}
    profile = {"prompts": len(plist), "all_fail": len(all_fail), "mixed": 0, "all_pass": 0}
    episode = Tally()
    turns_played = 0
    for group in by_prompt:
        wins = sum(won(s) for s in group)
        profile["mixed"] += int(0 < wins < group_size)
        profile["all_pass"] += int(wins == group_size)
        for s in group:
            episode.add(won(s), generated_tokens(s))
            turns_played += s.turns.count if s.turns is not None else 0
    rows: dict[str, TurnStats] = {}
    failures = {"fresh": sum(not s.is_valid for s in fresh), "branch": sum(not s.is_valid for s in branched)}
    for k, b in enumerate(taken):
        prefix = b.prefix_len
        names = [f"turn {b.turns}", "all"] + (["all-fail groups"] if b.prompt_index in all_fail else [])
        for name in names:
            row = rows.setdefault(name, TurnStats())
            row.boundaries += 1
            row.prefix_tokens += prefix
            row.source.add(won(b.source), generated_tokens(b.source, prefix))
            for j in range(k * branches, (k + 1) * branches):
                row.fresh.add(won(fresh[j]), generated_tokens(fresh[j]))
                row.branch.add(won(branched[j]), generated_tokens(branched[j], prefix))
    order = sorted((n for n in rows if n.startswith("turn ")), key=lambda n: int(n.split()[1]))
    order += [n for n in ("all", "all-fail groups") if n in rows]
    report = {
        "task": repr(task),
        "env": cfg.task.env.cls,
        **report_facts(cfg, out, base, warm_s, sample_s, len(plist), branches, failed_per_prompt),
        "max_tokens": o.max_tokens,
        "max_turns": settings.max_turns,
        "seed": cfg.seed,
        "episodes": len(groups) + len(fresh) + len(branched),
        "episode_failures": failures,
        "profile": profile,
        "step0": episode.as_dict(),
        "turns_per_episode": turns_played / max(1, len(groups)),
        "rows": {n: rows[n].as_dict() for n in order},
    }
    return write_report(out, report, render_turns(report))


def _per_token(a: dict[str, Any]) -> str:
    if not a["trials"]:
        return "-"
    lo, hi = a["per_1k_tokens_ci95"]
    return f"{a['per_1k_tokens']:.1f} [{lo:.1f}, {hi:.1f}] ({a['tokens_per_rollout']:.1f})"


def render_turns(report: dict[str, Any]) -> str:
    """The report as Markdown: the base model's profile, then branch against fresh by turn."""
    p, s = report["profile"], report["step0"]
    n = max(1, p["prompts"])
    lines = [
        f"{report['task']} ({report['env']}); {report['prompts']} held-out prompts, groups of "
        f"{report['group_size']}, {report['branches']} branches (and as many fresh episodes) per failed turn "
        f"boundary, up to {report['failed_per_prompt']} boundaries per prompt, seed {report['seed']}, "
        f"{report['episodes']} episodes in {report['sampling_wall_s']:.0f} s",
        "",
        "| prompts | step-0 success | all-fail | mixed | all-pass | turns/episode | tokens/episode |",
        "|---|---|---|---|---|---|---|",
        f"| {p['prompts']} | {rate_cell(s)} | {p['all_fail'] / n:.2f} | {p['mixed'] / n:.2f} | {p['all_pass'] / n:.2f} | "
        f"{report['turns_per_episode']:.2f} | {s['tokens_per_rollout']:.1f} |",
        "",
        "Success of a branch from the boundary after a failed turn (the environment's feedback in its context) "
        "against a fresh episode of the same prompts. Per rollout: rate [95% interval] (successes/trials); per "
        "token: successes per 1,000 generated tokens [95%] (mean generated tokens per rollout); source: the "
        "branched episode's own continuation:",
        "",
        "| branched after | boundaries | prefix tokens | fresh | branch | source | fresh per 1k tokens | "
        "branch per 1k tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["rows"].items():
        lines.append(
            f"| {name} | {r['boundaries']} | {r['mean_prefix_tokens']:.1f} | {rate_cell(r['fresh'])} | "
            f"{rate_cell(r['branch'])} | {rate_cell(r['source'])} | {_per_token(r['fresh'])} | {_per_token(r['branch'])} |"
        )
    return "\n".join(lines)


__all__ = ["Boundary", "failed_boundaries", "measure_turn_recoverability", "render_turns"]
