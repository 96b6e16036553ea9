"""The text-environment contract: what an environment class must offer to run an episode.

It is SkyRL-Gym's contract for text environments (skyrl-gym 0.4, ``BaseTextEnv``), written
here as a ``Protocol`` so that railgate needs nothing of skyrl-gym: its environments run
unmodified, and railgate's own (``pipeline.envs.chain``, ``pipeline.envs.wordproblems``) are
plain classes with the same methods.

=======================================  ======================================================
``Class(env_config, extras)``            ``env_config``: the ``task.env.config`` mapping;
                                         ``extras``: the dataset row without its ``prompt``
                                         (``reward_spec: {"ground_truth": ...}``,
                                         ``extra_info``, ``data_source``, ...)
``init(prompt) -> (conversation, md)``   ``prompt``: the row's chat messages; returns the
                                         conversation the model starts from and a metadata dict
``step(action) -> output``               ``action``: the assistant's turn as text; ``output``
                                         is a mapping with ``observations`` (chat messages
                                         that follow the turn), ``reward`` (a number),
                                         ``done`` (a bool) and ``metadata`` (a dict)
``close()``                              release what the instance holds (optional here)
``max_turns``                            optional attribute: the most turns it allows
``snapshot() -> state``                  optional, with ``restore``: the whole state after the
``restore(state)``                       last step, restorable into a freshly *constructed*
                                         instance (``init`` is not called on it)
=======================================  ======================================================

A chat message is ``{"role": str, "content": str}``. ``pipeline.envs.session.EnvSession``
checks every value an environment returns against this contract and turns any departure
into an error line instead of an exception.

>>> class Echo:
...     def __init__(self, env_config, extras):
...         self.target = extras["reward_spec"]["ground_truth"]
...     def init(self, prompt):
...         return prompt, {}
...     def step(self, action):
...         ok = action.strip() == self.target
...         return {"observations": [] if ok else [{"role": "user", "content": "again"}],
...                 "reward": float(ok), "done": ok, "metadata": {}}
>>> isinstance(Echo({}, {"reward_spec": {"ground_truth": "4"}}), TextEnv)
True
>>> supports_snapshot(Echo)
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypedDict, runtime_checkable

Message = dict[str, str]
"""A chat message: ``{"role": "user" | "assistant" | "system" | "tool" | ..., "content": text}``."""

Conversation = list[Message]


class StepOutput(TypedDict):
    """What ``step`` returns (a plain dict is fine; SkyRL's ``BaseTextEnvStepOutput`` is one)."""

    observations: Conversation
    reward: float
    done: bool
    metadata: dict[str, Any]


@runtime_checkable
class TextEnv(Protocol):
    """An environment instance; the class is called as ``Class(env_config, extras)``."""

    def init(self, prompt: Conversation) -> tuple[Conversation, dict[str, Any]]:
        """The conversation the model starts from, and metadata."""
        ...

    def step(self, action: str) -> Mapping[str, Any]:
        """React to the assistant's turn ``action``: a ``StepOutput``."""
        ...


@runtime_checkable
class SnapshotEnv(TextEnv, Protocol):
    """An environment that can save and restore its whole state (``state: snapshot``)."""

    def snapshot(self) -> Any:
        """The state after the last step; must not change when the instance steps on."""
        ...

    def restore(self, state: Any) -> None:
        """Put a freshly constructed instance into ``state``."""
        ...


REQUIRED_METHODS = ("init", "step")
SNAPSHOT_METHODS = ("snapshot", "restore")


def supports_snapshot(cls: type) -> bool:
    """True when ``cls`` has both ``snapshot`` and ``restore``."""
    return all(callable(getattr(cls, name, None)) for name in SNAPSHOT_METHODS)


def is_message(value: Any) -> bool:
    """True for ``{"role": str, "content": str}`` (other keys allowed, e.g. ``tool_call_id``).

    >>> is_message({"role": "user", "content": "hi"}), is_message({"role": "user", "content": 3})
    (True, False)
    """
    return isinstance(value, dict) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)


def message_problem(messages: Any, what: str) -> str:
    """Why ``messages`` is not a list of chat messages, or ``""`` when it is.

    >>> message_problem([{"role": "user", "content": "hi"}], "observations")
    ''
    >>> message_problem("hi", "observations")
    "observations is a str ('hi'), not a list of {'role', 'content'} messages"
    >>> message_problem([{"role": "user"}], "observations")
    "observations[0] is not a {'role': str, 'content': str} message ({'role': 'user'})"
    """
    if not isinstance(messages, (list, tuple)):
        return (
            f"{what} is a {type(messages).__name__} ({_short(messages)}), not a list of {{'role', 'content'}} messages"
        )
    for i, m in enumerate(messages):
        if not is_message(m):
            return f"{what}[{i}] is not a {{'role': str, 'content': str}} message ({_short(m)})"
    return ""


def content_chars(messages: Sequence[Message]) -> int:
    """Total characters of the messages' contents."""
    return sum(len(m["content"]) for m in messages)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
