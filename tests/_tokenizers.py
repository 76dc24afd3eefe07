"""Small Hugging Face tokenizers built offline, in memory, for tests (no hub access needed)."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style: any text round-trips through encode/decode) trained on ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
