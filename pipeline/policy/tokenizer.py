"""A character-level tokenizer for the synthetic tasks, stored inside a model directory.

Every character of a task's alphabet is one token; three special tokens come first:
``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2). A prompt is encoded as ``<bos>`` + its
characters, a response as its characters + ``<eos>``: the model learns to stop.

Why characters: the tasks' strings are short (under 40 characters), and one token per
digit lets a 0.4M-parameter model learn digit-wise algorithms (carrying in addition)
without first learning what a multi-digit BPE token means.

The tokenizer is standalone (pure Python: ``encode`` and ``decode`` are list lookups, cheap
enough for reward threads). ``save`` also writes the same vocabulary as a Hugging Face
``tokenizer.json``, so ``transformers.AutoTokenizer.from_pretrained(model_dir)`` (and vLLM,
which loads the tokenizer that way) gives the same ids, ``<bos>`` added to every text.

>>> tok = CharTokenizer("0123456789+=")
>>> ids = tok.encode_prompt("12+3=")
>>> ids
[1, 5, 6, 3, 7, 14]
>>> tok.decode(ids + [2])
'12+3='
>>> tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id
(15, 0, 1, 2)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from pipeline.config.build import shorten

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
VOCAB_FILE = "railgate_tokenizer.json"
FORMAT_VERSION = 1


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed, or a text holds a character outside the vocabulary."""


class CharTokenizer:
    """One token per character of ``alphabet``, after ``<pad>``, ``<bos>``, ``<eos>``.

    Parameters
    ----------
    alphabet
        The characters the tokenizer can encode; duplicates are ignored and the order is
        sorted, so the same set of characters always gives the same ids.

    Examples
    --------
    >>> tok = CharTokenizer("ab ")
    >>> tok.encode("ab a")
    [4, 5, 3, 4]
    >>> tok.decode([1, 4, 5, 2, 0])
    'ab'
    >>> tok.encode("abc")
    Traceback (most recent call last):
    ...
    pipeline.policy.tokenizer.TokenizerError: character 'c' (at 2 in 'abc') is not in the tokenizer's vocabulary ' ab'; build the tokenizer from an alphabet that contains it (CharTokenizer.for_tasks)
    """

    def __init__(self, alphabet: Iterable[str]) -> None:
        chars = sorted(set(alphabet))
        for ch in chars:
            if len(ch) != 1:
                raise TokenizerError(
                    f"alphabet entry {ch!r} is not a single character; pass a string or single characters"
                )
        self.alphabet = "".join(chars)
        self._itos: list[str] = list(SPECIAL_TOKENS) + chars
        self._stoi: dict[str, int] = {ch: i for i, ch in enumerate(self._itos) if i >= len(SPECIAL_TOKENS)}

    @classmethod
    def for_tasks(cls, *tasks) -> CharTokenizer:
        """The tokenizer over the union of the tasks' alphabets (``task.alphabet``)."""
        return cls("".join(task.alphabet for task in tasks))

    # -- ids ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters (no special tokens)."""
        stoi = self._stoi
        try:
            return [stoi[ch] for ch in text]
        except KeyError:
            pos = next(i for i, ch in enumerate(text) if ch not in stoi)
            where = (
                repr(text)
                if len(text) <= 80
                else f"...{text[max(0, pos - 30) : pos + 30]!r}... of {len(text)} characters"
            )
            raise TokenizerError(
                f"character {text[pos]!r} (at {pos} in {where}) is not in the tokenizer's vocabulary "
                f"{shorten(self.alphabet, 200)}; build the tokenizer from an alphabet that contains it (CharTokenizer.for_tasks)"
            ) from None

    def encode_prompt(self, text: str) -> list[int]:
        """``<bos>`` followed by the ids of ``text``: how prompts enter the model."""
        if not isinstance(text, str):
            raise TokenizerError(
                f"prompt {str(text)[:60]!r} is not text: chat-message prompts need a model with a chat template; "
                "set model.path to a Hugging Face chat model directory"
            )
        return [self.bos_id] + self.encode(text)

    def encode_response(self, text: str) -> list[int]:
        """The ids of ``text`` followed by ``<eos>``: a complete response (the SFT target)."""
        return self.encode(text) + [self.eos_id]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of ``ids``; special tokens are dropped unless ``skip_special`` is False.

        Ids outside the vocabulary raise: an engine emitting one has a different tokenizer.
        """
        itos = self._itos
        n_special = len(SPECIAL_TOKENS)
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(itos):
                raise TokenizerError(
                    f"token id {i} is outside the vocabulary (size {len(itos)}); the model and the tokenizer do not match"
                )
            if i >= n_special or not skip_special:
                out.append(itos[i])
        return "".join(out)

    def __call__(self, text: str) -> list[int]:
        return self.encode_prompt(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other._itos == self._itos

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self.alphabet!r})"

    # -- files -------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``railgate_tokenizer.json`` (and the Hugging Face files) into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / VOCAB_FILE
        payload = {"format": "railgate-char", "version": FORMAT_VERSION, "tokens": self._itos}
        path.write_text(json.dumps(payload, indent=1) + "\n")
        self._save_hf(d)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        """Read the tokenizer that ``save`` wrote into ``directory``."""
        path = Path(directory) / VOCAB_FILE
        if not path.is_file():
            raise TokenizerError(
                f"{path} does not exist; a model directory needs the tokenizer saved by CharTokenizer.save"
            )
        try:
            payload = json.loads(path.read_text())
            tokens = payload["tokens"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise TokenizerError(f"{path} is not a railgate tokenizer file ({exc}); save the tokenizer again") from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(f"{path}: 'tokens' must be a list of strings; save the tokenizer again")
        head = tuple(tokens[: len(SPECIAL_TOKENS)])
        if head != SPECIAL_TOKENS:
            missing = [t for t in SPECIAL_TOKENS if t not in tokens]
            what = f"lacks special tokens {missing}" if missing else f"starts with {list(head)}"
            raise TokenizerError(
                f"{path} {what}; the first tokens must be {list(SPECIAL_TOKENS)} (ids 0, 1, 2); "
                "rebuild it with CharTokenizer(alphabet).save(dir)"
            )
        chars = tokens[len(SPECIAL_TOKENS) :]
        tok = cls(chars)
        if tok._itos != tokens:
            raise TokenizerError(
                f"{path}: characters must be single, unique and sorted; rebuild it with CharTokenizer(alphabet).save(dir)"
            )
        return tok

    def _core(self):
        """The vocabulary as a ``tokenizers.Tokenizer`` (one token per character, ``<bos>`` prepended)."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

        vocab = {tok: i for i, tok in enumerate(self._itos)}
        core = Tokenizer(models.WordLevel(vocab, unk_token=None))
        core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        core.decoder = decoders.Fuse()
        core.add_special_tokens(list(SPECIAL_TOKENS))
        core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, self.bos_id)])
        return core

    def _save_hf(self, d: Path) -> None:
        # Written with the small `tokenizers` package, not transformers: saving stays cheap.
        self._core().save(str(d / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")

    def to_hf(self):
        """The same vocabulary as a ``transformers`` fast tokenizer (adds ``<bos>`` to each text)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self._core(), bos_token=BOS, eos_token=EOS, pad_token=PAD)
