"""Tiny random HuggingFace models with a word-level tokenizer, saved to directories, for tests."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = (
    "the a of in is was to and on at by for with from city country capital lives born "
    "Paris France Berlin Germany Rome Italy Madrid Spain Tokyo Japan Vorn Kallit Mira Tesh "
    "Oba Lunde Sarn Queth it he she they located part"
).split()


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<bos>", "<eos>"] + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def build(family: str, seed: int = 0):
    from transformers import (
        BertConfig,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(seed)
    tok = word_tokenizer()
    v = len(tok)
    common = dict(vocab_size=v, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if family == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, **common)
        model = GPT2LMHeadModel(cfg)
    elif family == "gpt_neox":
        cfg = GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **common,
        )
        model = GPTNeoXForCausalLM(cfg)
    elif family == "llama":
        cfg = LlamaConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **common,
        )
        model = LlamaForCausalLM(cfg)
    elif family == "llama_gqa":  # grouped-query attention (Llama-3 / Qwen shapes): 4 query heads, 2 key/value heads
        cfg = LlamaConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            **common,
        )
        model = LlamaForCausalLM(cfg)
    elif family == "bert":
        cfg = BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            vocab_size=v,
            pad_token_id=0,
        )
        model = BertModel(cfg)
    else:
        raise ValueError(family)
    return model.eval(), tok


def save(family: str, root: Path) -> Path:
    model, tok = build(family)
    path = root / family
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def with_random_norms(family: str, seed: int = 1):
    """``build(family)`` with every norm's scale and shift drawn at random: at their initial values
    (1 and 0) all norms of a model are the same function, so a test could not tell one from another."""
    model, tok = build(family)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                for name, p in module.named_parameters(recurse=False):
                    p.copy_((1.0 if name == "weight" else 0.0) + 0.3 * torch.randn(p.shape, generator=gen))
    return model, tok
