"""A word-level tokenizer for a world, usable wherever a HuggingFace tokenizer is expected.

Words are split on whitespace (the corpus writes punctuation as separate words), so every
invented name part, answer and label is one token and character offsets are exact.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIALS = ("<pad>", "<unk>", "<eos>")


def build_tokenizer(words: Iterable[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS)}
    for w in sorted(set(words) - set(SPECIALS)):
        vocab[w] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        bos_token="<eos>",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
