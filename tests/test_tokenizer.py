"""The character tokenizer: round trips, special tokens, files, and its Hugging Face twin."""

import json

import pytest

from pipeline.policy.tokenizer import VOCAB_FILE, CharTokenizer, TokenizerError
from pipeline.tasks import ArithmeticTask, CountdownTask


def test_roundtrip_and_special_ids():
    tok = CharTokenizer.for_tasks(ArithmeticTask(), CountdownTask())
    text = "12 7 3 to 22:(12+7)*3-20"
    assert tok.decode(tok.encode(text)) == text
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode_prompt("1+2=") + tok.encode_response("3")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "1+2=3"
    assert tok.decode(ids, skip_special=False) == "<bos>1+2=3<eos>"


def test_vocab_is_independent_of_alphabet_order():
    assert CharTokenizer("ba+") == CharTokenizer("+ab")
    assert CharTokenizer("ba+").encode("ab") == CharTokenizer("+abba").encode("ab")


def test_unknown_character_and_id_raise_clear_errors():
    tok = CharTokenizer("0123456789")
    with pytest.raises(TokenizerError, match="'x'.*not in the tokenizer's vocabulary"):
        tok.encode("12x")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([99])


def test_save_load_roundtrip(tmp_path):
    tok = CharTokenizer.for_tasks(CountdownTask())
    tok.save(tmp_path)
    again = CharTokenizer.load(tmp_path)
    assert again == tok and again.encode("3 4 to 7:") == tok.encode("3 4 to 7:")


def test_load_rejects_missing_special_tokens(tmp_path):
    (tmp_path / VOCAB_FILE).write_text(json.dumps({"tokens": ["<pad>", "<eos>", "0", "1"]}))
    with pytest.raises(TokenizerError, match=r"lacks special tokens \['<bos>'\]"):
        CharTokenizer.load(tmp_path)


def test_load_missing_or_corrupt_file(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        CharTokenizer.load(tmp_path)
    (tmp_path / VOCAB_FILE).write_text("{not json")
    with pytest.raises(TokenizerError, match="not a railgate tokenizer file"):
        CharTokenizer.load(tmp_path)


def _hf_matches(tmp_path, loader):
    tok = CharTokenizer.for_tasks(CountdownTask())
    tok.save(tmp_path)
    hf = loader(str(tmp_path))
    text = "12 7 3 to 22:"
    assert hf(text)["input_ids"] == tok.encode_prompt(text)
    assert hf.eos_token_id == tok.eos_id and hf.pad_token_id == tok.pad_id
    ids = tok.encode_prompt(text) + tok.encode_response("(12+7)*3")
    assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)


def test_hugging_face_tokenizer_gives_the_same_ids(tmp_path):
    from transformers import PreTrainedTokenizerFast

    _hf_matches(tmp_path, PreTrainedTokenizerFast.from_pretrained)


@pytest.mark.slow  # importing AutoTokenizer pulls in every tokenizer class (seconds of CPU)
def test_auto_tokenizer_loads_the_saved_directory(tmp_path):
    from transformers import AutoTokenizer

    _hf_matches(tmp_path, AutoTokenizer.from_pretrained)
