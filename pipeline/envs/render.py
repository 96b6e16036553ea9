"""How an episode becomes tokens, per tokenizer.

An episode's token sequence is built incrementally and never re-rendered, so the policy is
trained on exactly the tokens it generated (on-policy even for chat templates that rewrite
earlier turns)::

    prompt_ids(conversation)            the initial context, ending with the generation prompt
    + turn 1                            the model's tokens, ending with the stop token
    + observation_ids(observations 1)   what the env said, then the next generation prompt
    + turn 2 ...

``action_text(turn_ids)`` is a turn as text for ``env.step`` (stop token stripped);
``action_ids(text)`` the tokens of a turn written out (demonstrations for the warm start).
``conversation_ids(messages)`` renders a whole conversation at once: for a well-formed
template, the incremental sequence equals it (the tests check this).

Two renderers:

* ``ChatRenderer``: a Hugging Face tokenizer's chat template. The observation tokens are a
  *delta*: render a fixed placeholder exchange (``user: . / assistant: .``) without and then
  with the observations and the generation prompt appended, and keep what the second adds.
  This only works when the template has the prefix property (rendering more messages extends
  the text), which the renderer checks at construction and on every call, and when an
  assistant turn ends with the tokenizer's ``eos_token`` (the stop token the engines use):
  what the template writes after it (``\\n`` in ChatML) opens the observation tokens.
* ``PlainRenderer``: the project's character tokenizer, which has no chat template. A fixed
  plain format inside the task's alphabet: ``<bos>``, then each message's content; an
  assistant turn ends with ``<eos>``, which is also the turn separator the model learns;
  consecutive non-assistant messages are joined by ``separator``; the generation prompt is
  empty (an environment ends its text where the answer starts, e.g. ``3+4=``).

>>> from pipeline.policy.tokenizer import CharTokenizer
>>> r = PlainRenderer(CharTokenizer("0123456789+-*=no<>?"))
>>> ids = r.prompt_ids([{"role": "user", "content": "3+4="}]) + r.action_ids("8")
>>> ids += r.observation_ids([{"role": "user", "content": "no<3+4="}])
>>> r.tokenizer.decode(ids, skip_special=False)
'<bos>3+4=8<eos>no<3+4='
>>> r.action_text(r.action_ids("7"))
'7'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pipeline.envs.protocol import message_problem

Messages = Sequence[dict]
PLACEHOLDER = "."
_BASE = ({"role": "user", "content": PLACEHOLDER}, {"role": "assistant", "content": PLACEHOLDER})


class RenderError(ValueError):
    """A conversation or template cannot be rendered as asked; the message names the fix."""


class Renderer(Protocol):
    """What the core needs to turn an episode into tokens (see the module docstring)."""

    stop_ids: tuple[int, ...]

    def prompt_ids(self, conversation: Messages | str) -> list[int]: ...

    def observation_ids(self, observations: Messages) -> list[int]: ...

    def action_text(self, turn_ids: Sequence[int]) -> str: ...

    def action_ids(self, text: str) -> list[int]: ...

    def conversation_ids(self, messages: Messages) -> list[int]: ...


def as_messages(conversation: Messages | str) -> list[dict]:
    """Chat messages; a plain string is one user message."""
    if isinstance(conversation, str):
        return [{"role": "user", "content": conversation}]
    problem = message_problem(conversation, "the conversation")
    if problem:
        raise RenderError(f"{problem}; pass chat messages")
    return [dict(m) for m in conversation]


class ChatRenderer:
    """A Hugging Face tokenizer's chat template (see the module docstring).

    Parameters
    ----------
    tokenizer
        A ``transformers`` tokenizer with a chat template, or ``pipeline.policy.hf_tokenizer.HFTokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        tok = (
            tokenizer.to_hf()
            if hasattr(tokenizer, "to_hf") and not hasattr(tokenizer, "apply_chat_template")
            else tokenizer
        )
        self.tokenizer = tok
        if not getattr(tok, "chat_template", None):
            raise RenderError(
                "the tokenizer has no chat template; give the model directory one (tokenizer_config.json "
                "chat_template) or use a model with a chat template for multi-turn environments"
            )
        if tok.eos_token_id is None:
            raise RenderError(
                "the tokenizer has no eos_token, so a turn could not end; set eos_token in its "
                "tokenizer_config.json to the end-of-turn token"
            )
        self.stop_ids = (int(tok.eos_token_id),)
        self._base = self._render(list(_BASE), generation_prompt=False)
        after = self._base[self._base.rindex(PLACEHOLDER) + len(PLACEHOLDER) :]
        eos = tok.eos_token
        if not after.startswith(eos):
            raise RenderError(
                f"the chat template ends an assistant turn with {after!r}, not with the tokenizer's "
                f"eos_token {eos!r}; set eos_token to the template's end-of-turn token"
            )
        self._after_stop = after[len(eos) :]  # what the template writes after the stop token (ChatML: "\n")
        self.observation_ids([{"role": "user", "content": PLACEHOLDER}])  # the prefix property, checked now

    def prompt_ids(self, conversation: Messages | str) -> list[int]:
        return self._encode(self._render(as_messages(conversation), generation_prompt=True))

    def observation_ids(self, observations: Messages) -> list[int]:
        full = self._render(
            list(_BASE) + as_messages(observations) if observations else list(_BASE), generation_prompt=True
        )
        if not full.startswith(self._base):
            raise RenderError(
                "the chat template does not extend a conversation when messages are added (rendering "
                f"more messages changed the text before them: {self._base[-40:]!r} became "
                f"{full[len(self._base) - 40 : len(self._base)]!r}); multi-turn episodes need a template "
                "with this prefix property"
            )
        return self._encode(self._after_stop + full[len(self._base) :])

    def action_text(self, turn_ids: Sequence[int]) -> str:
        ids = _strip_stop(turn_ids, self.stop_ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def action_ids(self, text: str) -> list[int]:
        return self._encode(text) + [self.stop_ids[0]]

    def conversation_ids(self, messages: Messages) -> list[int]:
        return self._encode(self._render(as_messages(messages), generation_prompt=True))

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as exc:  # jinja raises its own types (a template that refuses these roles)
            roles = ", ".join(m["role"] for m in messages)
            raise RenderError(
                f"the chat template cannot render messages with roles [{roles}] "
                f"({type(exc).__name__}: {str(exc)[:160]}); give the env's messages roles it accepts"
            ) from None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class PlainRenderer:
    """The plain format for ``pipeline.policy.tokenizer.CharTokenizer`` (see the module docstring).

    Parameters
    ----------
    tokenizer
        The character tokenizer; every character rendered must be in its alphabet.
    separator
        Joins consecutive non-assistant messages (must be in the alphabet when used).
    """

    def __init__(self, tokenizer: Any, separator: str = "") -> None:
        self.tokenizer = tokenizer
        self.separator = separator
        self.stop_ids = (int(tokenizer.eos_id),)

    def prompt_ids(self, conversation: Messages | str) -> list[int]:
        return [self.tokenizer.bos_id] + self._messages(as_messages(conversation))

    def observation_ids(self, observations: Messages) -> list[int]:
        return self._messages(as_messages(observations)) if observations else []

    def action_text(self, turn_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(_strip_stop(turn_ids, self.stop_ids))

    def action_ids(self, text: str) -> list[int]:
        return self._encode(text) + [self.stop_ids[0]]

    def conversation_ids(self, messages: Messages) -> list[int]:
        return self.prompt_ids(messages)

    def _messages(self, messages: list[dict]) -> list[int]:
        ids: list[int] = []
        previous = "assistant"
        for m in messages:
            if m["role"] == "assistant":
                ids += self.action_ids(m["content"])
            else:
                ids += self._encode((self.separator if previous != "assistant" else "") + m["content"])
            previous = m["role"]
        return ids

    def _encode(self, text: str) -> list[int]:
        try:
            return self.tokenizer.encode(text)
        except ValueError as exc:
            raise RenderError(
                f"{exc}; the env's text must stay inside the tokenizer's alphabet (the task's alphabet)"
            ) from None


def renderer_for(tokenizer: Any) -> Renderer:
    """``ChatRenderer`` for a tokenizer with a chat template (``HFTokenizer``, a ``transformers``
    tokenizer), ``PlainRenderer`` for the character tokenizer. Told apart by what they can do, so
    that envs/ does not import policy/ (which imports tasks/, which imports envs/)."""
    if hasattr(tokenizer, "render") or hasattr(tokenizer, "apply_chat_template"):
        return ChatRenderer(tokenizer)
    return PlainRenderer(tokenizer)


def _strip_stop(ids: Sequence[int], stop_ids: tuple[int, ...]) -> list[int]:
    out = [int(i) for i in ids]
    while out and out[-1] in stop_ids:
        out.pop()
    return out
