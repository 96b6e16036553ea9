"""``run.py record --trl-task``: record the groups ``bench trl`` would sample at its base model.

``python run.py bench trl --model smollm --task word|questions|mixed`` trains on a TRL task of
``railgate.bench.trl_tasks`` (chat-message prompts, a TRL reward function, a reference column);
this module makes one of those tasks the source of a recording (``railgate.record``), so the log
holds what a bench trl run's first step would sample from the same rows:

* rows: the task built as bench trl builds it (``train_prompts``, ``eval_prompts``, task seed 0,
  the ``reward``), in the order every trainer of bench seed ``seed`` meets them
  (``railgate.bench.trl.paired_order``), the first P of them. Group g is the g-th row of that
  order (the TRL dataset index a gated run gives it); its ``prompt_id`` is the row's position in
  the task's own ``train_rows`` (the same question whatever the seed);
* prompts: the messages rendered by the model's chat template with the generation prompt
  (``apply_chat_template(..., add_generation_prompt=True)``, tokenized without added special
  tokens, as TRL's ``GRPOTrainer`` renders conversational prompts);
* sampling: bench trl's temperature and top_p (``matched_args``) and the task's
  ``max_completion_length``, stopping at TRL's end-of-sequence token (the torch engine takes one:
  a model whose generation config names several is refused);
* rewards: the task's TRL reward function on the completion as TRL hands it over (the tokens
  decoded without special tokens, as one assistant message), with the row's other columns as
  keyword arguments;
* ``reference_logprob``: the model's teacher-forced log-likelihood of the row's ``reference``
  as ``railgate.trl.reference.ReferenceScorer`` scores it: the text's tokens (no special
  tokens), then, for a task whose reference is exact, TRL's first end-of-sequence token, after
  the rendered prompt, at temperature 1;
  null where the reference does not earn the reward (the scorer drops it);
* ``difficulty``: the row's level where the task has one: ``mixed``'s ``operations``, the word
  problem's operations (read off its template: one, or two for "gets ... then gives away");
  null for ``questions`` (one operation each: no levels).

>>> source = TrlRecordSource("mixed", train_prompts=30, eval_prompts=6)
>>> task = source.task()
>>> rows = source.rows(task, seed=0, count=4)
>>> [(i, row["operations"]) for i, row in rows] == [(i, task.train_rows[i]["operations"]) for i, _ in rows]
True
>>> [difficulty_of("word", {"prompt": [{"role": "user", "content": t}]}) for t in (
...     "Ava has 3 coins. Ava gets 2 more coins. How many coins does Ava have now? Reply ...",
...     "Ben has 4 books, gets 2 more, then gives away 1. How many books does Ben have now? Reply ...",
...     "What is 2 + 3?")]
[1, 2, None]
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.reference import reference_tokens
from pipeline.types import Prompt
from railgate.bench.trl import TASKS, TrlBenchSpec, matched_args, paired_order
from railgate.bench.trl_rewards import REWARDS
from railgate.bench.trl_tasks import TEMPLATES, TrlTask, arithmetic_questions, mixed_questions, word_problems
from railgate.build import SamplerParts, _scoring, _torch_kwargs
from railgate.config import RunConfig
from railgate.record_manifest import RecordError

TRL_TASKS = TASKS["smollm"]
"""The chat tasks of ``bench trl`` a recording can take (``--trl-task``)."""

TASK_SEED = 0
"""The seed bench trl builds its tasks with (``model_and_task``: the rows are the same for every
bench seed; the seed orders them)."""

_MAKERS: dict[str, Callable[..., TrlTask]] = {
    "word": word_problems,
    "questions": arithmetic_questions,
    "mixed": mixed_questions,
}


@dataclass(frozen=True)
class TrlRecordSource:
    """A ``bench trl`` chat task as the source of a recording (see the module docstring)."""

    name: str
    """``word``, ``questions`` or ``mixed`` (``--trl-task``)."""
    reward: str = "last"
    """The task's grading (``--trl-reward``): ``last`` or ``marker`` (``railgate.bench.trl_rewards``)."""
    train_prompts: int = TrlBenchSpec.train_prompts
    """bench trl's ``--train-prompts``: the training rows the task is built with."""
    eval_prompts: int = TrlBenchSpec.eval_prompts
    """bench trl's ``--eval-prompts``: the held-out rows, which decide which rows are training rows
    (``questions`` has 351 in all: bench trl runs it with ``--eval-prompts 64``)."""

    def __post_init__(self) -> None:
        if self.name not in _MAKERS:
            raise RecordError(f"--trl-task {self.name!r} is not one of {', '.join(TRL_TASKS)}; pick one of them")
        if self.reward not in REWARDS:
            raise RecordError(f"--trl-reward {self.reward!r} is not one of {', '.join(REWARDS)}; pick one of them")

    def task(self) -> TrlTask:
        """The task as bench trl builds it; ``RecordError`` when its sizes leave no training row."""
        try:
            return _MAKERS[self.name](self.train_prompts, self.eval_prompts, seed=TASK_SEED, reward=self.reward)
        except ValueError as exc:
            raise RecordError(f"--trl-task {self.name}: {exc} (--eval-prompts)") from None

    def rows(self, task: TrlTask, seed: int, count: int) -> list[tuple[int, dict[str, Any]]]:
        """The first ``count`` training rows in bench seed ``seed``'s order, each with its index in
        ``task.train_rows``; ``RecordError`` when the task has fewer."""
        if count > len(task.train_rows):
            raise RecordError(
                f"--prompts {count}: --trl-task {self.name} has {len(task.train_rows)} training rows "
                f"(--train-prompts {self.train_prompts}, --eval-prompts {self.eval_prompts}); ask for fewer"
            )
        return paired_order(list(enumerate(task.train_rows)), seed)[:count]

    def sampling(self, task: TrlTask, seed: int) -> dict[str, Any]:
        """bench trl's sampling settings for this task: temperature, top_p, max_tokens."""
        matched = matched_args(TrlBenchSpec(model="smollm", task=self.name), task, "grpo", seed, Path("."))
        return {
            "temperature": float(matched["temperature"]),
            "top_p": float(matched["top_p"]),
            "max_tokens": int(matched["max_completion_length"]),
        }

    def manifest_task(self, cfg: RunConfig) -> dict[str, Any]:
        """What ``record.json`` records as the task: this source's settings."""
        return {
            "trl_task": self.name,
            "reward": self.reward,
            "train_prompts": self.train_prompts,
            "eval_prompts": self.eval_prompts,
            "task_seed": TASK_SEED,
        }

    def manifest_data(self, cfg: RunConfig) -> dict[str, Any]:
        """What decides the rows' order: bench trl's ``paired_order`` of the run seed."""
        return {"order": "bench-trl paired_order", "seed": cfg.seed}

    def build(self, cfg: RunConfig, num_prompts: int, progress: bool = True) -> SamplerParts:
        """The parts that sample, score and reference-score the first ``num_prompts`` rows on the
        torch engine over ``cfg.model.path``; ``cfg``'s sampling must be this task's (``sampling``)."""
        return build_trl_sampler(cfg, self, num_prompts)


def build_trl_sampler(cfg: RunConfig, source: TrlRecordSource, num_prompts: int) -> SamplerParts:
    """``SamplerParts`` for ``source``'s first ``num_prompts`` rows (see the module docstring)."""
    import torch

    from learner.torch_learner import TorchLearner
    from pipeline.engines.torch_engine import TorchEngine
    from pipeline.policy.hf_tokenizer import HFTokenizer
    from pipeline.policy.models import load_model
    from railgate.trl.config import GatedGRPOConfig

    if cfg.engine.kind != "torch":
        raise RecordError(
            f"--trl-task records on the torch engine; engine.kind={cfg.engine.kind!r}: use --engine torch"
        )
    if not cfg.model.path:
        raise RecordError(
            "--trl-task needs --model DIR: a Hugging Face chat model (e.g. SmolLM2 from run.py import-model)"
        )
    task = source.task()
    wanted = source.sampling(task, cfg.seed)
    o = cfg.orchestrator
    have = {"temperature": o.temperature, "top_p": o.top_p, "max_tokens": o.max_tokens}
    if have != wanted:
        raise RecordError(
            f"--trl-task {source.name} samples as bench trl does ({wanted}); the config has {have}: "
            "leave orchestrator.temperature, top_p and max_tokens to --trl-task"
        )
    base = load_model(cfg.model.path)
    tokenizer = base.tokenizer
    if not isinstance(tokenizer, HFTokenizer) or not tokenizer.has_chat_template:
        raise RecordError(
            f"--model {cfg.model.path} has no chat template; --trl-task's prompts are chat messages: "
            "point --model at a Hugging Face chat model"
        )
    eos = trl_eos_ids(base.model, tokenizer)
    if eos != [tokenizer.eos_id]:
        raise RecordError(
            f"--model {cfg.model.path}: TRL stops at the tokens {eos} (the tokenizer's eos_token and the generation "
            f"config's eos_token_id), the torch engine at one ({tokenizer.eos_id}); record a model with one stop token"
        )
    rows = source.rows(task, cfg.seed, num_prompts)
    by_id = {i: row for i, row in rows}
    threshold = GatedGRPOConfig.gate_success_threshold
    prompts = [
        Prompt(
            prompt_id=i,
            text=json.dumps(row["prompt"], ensure_ascii=False),
            token_ids=tuple(tokenizer.encode_prompt(row["prompt"])),
            answer=str(row["answer"]),
            success_threshold=threshold,
        )
        for i, row in rows
    ]
    context = base.context_length
    too_long = [p for p in prompts if len(p.token_ids) + o.max_tokens > context]
    if too_long:
        raise RecordError(f"{len(too_long)} prompts and {o.max_tokens} tokens exceed the model's context ({context})")
    scorer = TrlRewardScorer(task.reward, by_id, tokenizer.decode)
    references = {
        i: reference_tokens(tokenizer.encode(str(row["reference"])), eos[0], task.reference_exact)
        for i, row in rows
        if row.get("reference") is not None
        and str(row["reference"]).strip()
        and scorer.score_text(i, str(row["reference"])) > threshold
    }
    torch.set_num_threads(max(cfg.torch_engine.threads, cfg.learner.num_threads or 1))
    engine = TorchEngine(copy.deepcopy(base.model), tokenizer.eos_id, **_torch_kwargs(cfg, context))
    return SamplerParts(
        task=task,
        tokenizer=tokenizer,
        model_dir=Path(base.path),
        engine=engine,
        scoring=_scoring(cfg, scorer),
        prompts=prompts,
        references=references,
        learner=TorchLearner(base.model, cfg.learner, pad_id=tokenizer.pad_id),
        difficulties={i: difficulty_of(source.name, row) for i, row in rows},
    )


def trl_eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens TRL's ``GRPOTrainer`` stops at (its ``eos_token_ids``): the generation config's
    ``eos_token_id`` (one or a list), the tokenizer's ``eos_token`` first where the config lacks it.
    A reference ends with the first of them."""
    configured = model.generation_config.eos_token_id
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return ids if tokenizer.eos_id in ids else [tokenizer.eos_id, *ids]


class TrlRewardScorer:
    """A TRL reward function as the recording's ``Scorer``: a completion's tokens decoded without
    special tokens, handed over as one assistant message (conversational prompts) with the row's
    columns, as ``GRPOTrainer`` calls its reward functions."""

    runs_inline = False

    def __init__(
        self,
        reward: Callable[..., list[float]],
        rows: dict[int, dict[str, Any]],
        decode: Callable[[Sequence[int]], str],
    ) -> None:
        self.reward, self.rows, self.decode = reward, rows, decode
        self.__name__ = getattr(reward, "__name__", type(reward).__name__)  # named in reward-failure messages

    def __call__(self, prompt: Prompt, token_ids: Sequence[int]) -> float:
        return self.score_text(prompt.prompt_id, self.decode(token_ids))

    def score_text(self, prompt_id: int, text: str) -> float:
        """The reward of completion ``text`` for row ``prompt_id``."""
        row = self.rows[prompt_id]
        conversational = isinstance(row["prompt"], list)
        completion: Any = [{"role": "assistant", "content": text}] if conversational else text
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completion")}
        (reward,) = self.reward(prompts=[row["prompt"]], completions=[completion], **columns)
        return float(reward)


def _template_pattern(template: str) -> re.Pattern[str]:
    """A word-problem template as a pattern over its questions (names and items as words, numbers as digits)."""
    parts = re.split(r"(\{[a-z]\})", template)
    slots = {"{n}": r"\w+", "{x}": r"\w+", "{a}": r"\d+", "{b}": r"\d+", "{c}": r"\d+"}
    return re.compile("".join(slots.get(p, re.escape(p)) for p in parts))


_WORD_LEVELS = [(_template_pattern(t), len(set(re.findall(r"\{[abc]\}", t))) - 1) for t, _ in TEMPLATES]
"""Each word-problem template's pattern and its operations (its numbers less one)."""


def difficulty_of(task: str, row: dict[str, Any]) -> int | None:
    """The level of ``row`` of ``task``: its ``operations`` column where it has one (``mixed``), a word
    problem's operations read off its template, else None (see the module docstring)."""
    if "operations" in row:
        return int(row["operations"])
    if task != "word":
        return None
    question = row["prompt"][-1]["content"]
    levels = {level for pattern, level in _WORD_LEVELS if pattern.match(question)}
    return levels.pop() if len(levels) == 1 else None
