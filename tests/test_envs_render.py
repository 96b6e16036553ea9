"""Renderers: an episode built turn by turn (prompt_ids + turns + observation_ids) equals the
whole conversation rendered at once, for a real HF tokenizer with a chat template built here
and for the character tokenizer; templates without the prefix property or whose turns do not
end with eos are refused."""

import pytest
from hf_models import bpe_tokenizer

from pipeline.envs.chain import ALPHABET
from pipeline.envs.render import ChatRenderer, PlainRenderer, RenderError, renderer_for
from pipeline.policy.hf_tokenizer import HFTokenizer
from pipeline.policy.tokenizer import CharTokenizer

USER = {"role": "user", "content": "What is 12 + 30? Answer with the number only."}
EPISODE = [  # (assistant turn, the env's observations after it)
    ("The answer is 41.", [{"role": "user", "content": "No. Try again."}]),
    ("42", [{"role": "tool", "content": "checked"}, {"role": "user", "content": "Now 42 + 7?"}]),
    ("49", []),
]


def incremental(renderer, conversation, episode):
    ids = renderer.prompt_ids(conversation)
    for action, observations in episode:
        ids += renderer.action_ids(action) + renderer.observation_ids(observations)
    return ids


def whole(conversation, episode):
    messages = list(conversation)
    for action, observations in episode:
        messages += [{"role": "assistant", "content": action}] + observations
    return messages


@pytest.mark.parametrize("wrap", [False, True], ids=["transformers", "HFTokenizer"])
def test_chat_template_round_trip(wrap):
    tok = bpe_tokenizer()
    r = ChatRenderer(HFTokenizer(tok) if wrap else tok)
    conversation = [{"role": "system", "content": "Be brief."}, USER]
    for n in range(1, len(EPISODE)):
        episode = EPISODE[:n]
        assert incremental(r, conversation, episode) == r.conversation_ids(whole(conversation, episode))
    # the final turn: its stop token ends the sequence, and the template's text after it is what opens the next turn
    full = incremental(r, conversation, EPISODE[:-1]) + r.action_ids(EPISODE[-1][0])  # done: no observations follow
    text = tok.apply_chat_template(whole(conversation, EPISODE), tokenize=False)
    assert tok.decode(full, skip_special_tokens=False) + "\n" == text
    assert r.stop_ids == (tok.eos_token_id,)


def test_chat_action_text_strips_the_stop_token():
    r = ChatRenderer(bpe_tokenizer())
    assert r.action_text(r.action_ids("The answer is 42.")) == "The answer is 42."
    assert r.action_text(r.action_ids("42")[:-1]) == "42"  # cut at the token cap: no stop token
    assert r.observation_ids([]) == r.prompt_ids([USER])[-len(r.observation_ids([])) :]  # just the generation prompt


def test_a_template_without_the_prefix_property_is_refused():
    tok = bpe_tokenizer()
    # writes how many messages there are first: adding messages changes the text before them
    tok.chat_template = (
        "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(RenderError, match="prefix property"):
        ChatRenderer(tok)


def test_a_template_whose_turns_do_not_end_with_eos_is_refused():
    tok = bpe_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(RenderError, match="not with the tokenizer's eos_token"):
        ChatRenderer(tok)
    tok.chat_template = None
    with pytest.raises(RenderError, match="no chat template"):
        ChatRenderer(tok)


def test_plain_round_trip_for_the_char_tokenizer():
    tok = CharTokenizer(ALPHABET + "|")
    r = PlainRenderer(tok, separator="|")
    conversation = [{"role": "user", "content": "3+4="}]
    episode = [
        ("8", [{"role": "user", "content": "no<3+4="}]),
        ("7", [{"role": "user", "content": "7*2="}]),
        ("14", []),
    ]
    ids = incremental(r, conversation, episode)
    assert ids == r.conversation_ids(whole(conversation, episode))
    assert tok.decode(ids, skip_special=False) == "<bos>3+4=8<eos>no<3+4=7<eos>7*2=14<eos>"
    two = r.observation_ids([{"role": "user", "content": "no"}, {"role": "user", "content": "3+4="}])
    assert tok.decode(two) == "no|3+4="
    assert r.action_text(tok.encode("14") + [tok.eos_id]) == "14"
    assert isinstance(renderer_for(tok), PlainRenderer)


def test_plain_text_outside_the_alphabet_is_a_render_error():
    r = PlainRenderer(CharTokenizer(ALPHABET))
    with pytest.raises(RenderError, match="inside the tokenizer's alphabet"):
        r.observation_ids([{"role": "user", "content": "wrong!"}])
    with pytest.raises(RenderError, match="not a .'role': str, 'content': str. message"):
        r.observation_ids([{"role": "user", "content": 3}])
