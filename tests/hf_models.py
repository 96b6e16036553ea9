"""A user's Hugging Face model directory, built in the test: a tiny random Llama with a BPE
tokenizer trained on a few strings (``tokenizers``), wrapped in ``PreTrainedTokenizerFast``
with a chat template, all written by ``save_pretrained``. Nothing of the project's own model
format (no ``railgate_tokenizer.json``).

Head size 32: vLLM's CPU attention kernels take 32, 64, 80, ... but not 16.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]


def corpus() -> list[str]:
    """Strings the BPE is trained on: arithmetic, words, digits."""
    lines = [f"{a}+{b}={a + b}" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    lines += ["What is 12 + 30? Answer with the number only.", "user", "assistant", "The answer is 42."]
    return lines * 3


def bpe_tokenizer(vocab_size: int = 300):
    """A byte-level BPE ``PreTrainedTokenizerFast`` (encodes any text) with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus(), trainer=trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 2, context: int = 128, seed: int = 0):
    """A seeded random ``LlamaForCausalLM`` of ``pipeline.policy.models.build_model`` (head size
    hidden / heads, MLP width 2 x hidden, untied head), in eval mode."""
    from pipeline.policy.models import build_model

    return build_model(
        vocab_size, hidden, layers, heads, context, seed, None, initializer_range=0.1, arch="llama", mlp_ratio=2
    ).eval()


def save_tiny_llama(directory: str | Path, pad_vocab_to: int = 8, **kwargs) -> Path:
    """Write the tokenizer and a tiny Llama (vocabulary padded to a multiple of ``pad_vocab_to``,
    as real checkpoints often are) into ``directory``; returns it."""
    d = Path(directory)
    tok = bpe_tokenizer()
    vocab = -(-len(tok) // pad_vocab_to) * pad_vocab_to
    model = tiny_llama(vocab, **kwargs)
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(d))
    tok.save_pretrained(str(d))
    return d
