"""A reward function of your own, with TRL's signature, for ``task.dataset.reward``.

    python run.py --set task.name=dataset --set task.dataset.train_path=examples/data/arith.jsonl \\
        --set task.dataset.reward=examples.my_rewards:correct --set model.path=MODEL_DIR

``completions`` are strings, or ``[{"role": "assistant", "content": ...}]`` for chat-message
prompts (as TRL passes them); ``answer`` is the dataset's field, with its JSON type (an int
here). Return one float per completion, or None for "no reward" (counted, not trained on).
"""

import re

_NUMBER = re.compile(r"-?\d+")


def correct(prompts, completions, answer, **columns):
    """1.0 when the last integer in the completion is the answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        numbers = _NUMBER.findall(text)
        rewards.append(float(bool(numbers) and int(numbers[-1]) == int(gold)))
    return rewards
