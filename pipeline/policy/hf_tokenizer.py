"""A Hugging Face tokenizer (anything ``AutoTokenizer`` loads: BPE, SentencePiece, ...) behind
the interface the pipeline uses of ``CharTokenizer``: ``encode_prompt``, ``decode``, the special
ids and ``vocab_size``.

A user's model directory (``model.path``) brings its own tokenizer; the project's tiny model
keeps the character tokenizer (``pipeline.policy.tokenizer``). Prompts are rendered in one of two ways:

* plain text: tokenized with the tokenizer's own special tokens (a Llama tokenizer adds ``<s>``);
* chat: the tokenizer's chat template with the generation prompt appended, tokenized as it
  stands (the template writes the special tokens itself). A prompt is rendered as chat when it
  is a list of ``{"role", "content"}`` messages, or when ``chat_template`` is set (the text
  becomes one user message).

Generation stops at the tokenizer's ``eos_token`` (for chat models, the end-of-turn token),
the one stop token the engines take.

>>> from tokenizers import Tokenizer, models, pre_tokenizers
>>> from transformers import PreTrainedTokenizerFast
>>> core = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "hi": 2, "there": 3, "[UNK]": 4}, unk_token="[UNK]"))
>>> core.pre_tokenizer = pre_tokenizers.Whitespace()
>>> hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
>>> hf.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}there{% endif %}"
>>> tok = HFTokenizer(hf)
>>> tok.encode_prompt("hi there"), tok.eos_id, tok.pad_id
([2, 3], 1, 0)
>>> tok.render([{"role": "user", "content": "hi"}])
'user: hi there'
>>> tok.decode([2, 3, 1])
'hi there'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.policy.tokenizer import TokenizerError
from pipeline.tasks.base import Messages, is_messages


class HFTokenizer:
    """A ``transformers`` tokenizer with the pipeline's tokenizer interface.

    Parameters
    ----------
    tokenizer
        A loaded ``transformers`` tokenizer.
    chat_template
        Render plain-text prompts through the chat template too (``task.chat_template``).
    source
        Where it was loaded from (for error messages).
    """

    def __init__(self, tokenizer: Any, chat_template: bool = False, source: str = "") -> None:
        self._tok = tokenizer
        self.source = source or "the tokenizer"
        self.chat_template = bool(chat_template)
        eos = tokenizer.eos_token_id
        if eos is None:
            raise TokenizerError(
                f"{self.source} has no eos_token, so generation could not stop; set eos_token in its tokenizer_config.json"
            )
        self.eos_id = int(eos)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id  # padding is masked; any id will do
        bos = tokenizer.bos_token_id
        self.bos_id = int(bos) if bos is not None else None
        self.vocab_size = len(tokenizer)
        if self.chat_template and not self.has_chat_template:
            raise TokenizerError(
                f"task.chat_template=true, but {self.source} has no chat template; add one to its tokenizer_config.json "
                "(chat_template) or set task.chat_template=false"
            )

    @classmethod
    def load(cls, directory: str | Path, chat_template: bool = False) -> HFTokenizer:
        """``AutoTokenizer.from_pretrained(directory)``; ``TokenizerError`` names the directory."""
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(directory))
        except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
            raise TokenizerError(
                f"model directory {directory}: AutoTokenizer cannot load its tokenizer ({type(exc).__name__}: {str(exc)[:200]}); "
                "save the model's tokenizer into it (tokenizer.save_pretrained(DIR))"
            ) from None
        return cls(tok, chat_template=chat_template, source=f"the tokenizer in {directory}")

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def render(self, prompt: str | Messages) -> str:
        """The text the model reads for ``prompt``: chat-templated (messages, or ``chat_template``) or as is."""
        if isinstance(prompt, str) and not self.chat_template:
            return prompt
        messages = prompt if is_messages(prompt) else None
        if messages is None:
            if not isinstance(prompt, str):
                raise TokenizerError(
                    f"prompt {str(prompt)[:60]!r} is neither text nor a list of chat messages "
                    "({'role': ..., 'content': ...}); fix the dataset's prompt field"
                )
            messages = [{"role": "user", "content": prompt}]
        if not self.has_chat_template:
            raise TokenizerError(
                f"chat-message prompts need a chat template, and {self.source} has none; add one to its "
                "tokenizer_config.json or give the dataset plain-text prompts"
            )
        return self._tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (no special tokens added)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode_prompt(self, prompt: str | Messages) -> list[int]:
        """How a prompt enters the model (see the module docstring)."""
        if isinstance(prompt, str) and not self.chat_template:
            return list(self._tok(prompt)["input_ids"])
        return self.encode(self.render(prompt))

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of ``ids``; special tokens (the end of turn, say) are dropped unless ``skip_special`` is False."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def save(self, directory: str | Path) -> Path:
        """Write the tokenizer files (``save_pretrained``) into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._tok.save_pretrained(str(d))
        return d

    def to_hf(self) -> Any:
        """The wrapped ``transformers`` tokenizer."""
        return self._tok

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({type(self._tok).__name__}, vocab_size={self.vocab_size}, chat_template={self.chat_template})"
        )
