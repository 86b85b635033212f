"""Tiny models, a tokenizer and synthetic text built locally (no model hub is reachable)."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 64
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``w0`` ... ``w59`` plus four special tokens."""
    words = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    model = models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token="<unk>")
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def tiny_llama(**config: Any) -> LlamaForCausalLM:
    """A two-layer Llama with a 32-wide hidden state, seeded; ``config`` overrides its settings."""
    torch.manual_seed(0)
    settings: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    settings.update(config)
    return LlamaForCausalLM(LlamaConfig(**settings))


def counting_texts(count: int, seed: int) -> list[str]:
    """Sentences that count upward from a random start (a pattern a tiny model can learn)."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 40, (count,), generator=generator).tolist()
    return [" ".join(f"w{start + i}" for i in range(12)) for start in starts]
