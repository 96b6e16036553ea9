"""The policy model: building or loading it (``models``), its settings (``config``, free of torch),
tokenizers (``tokenizer`` for the character model, ``hf_tokenizer`` for a user's model) and the
supervised warm start (``warmstart``)."""
