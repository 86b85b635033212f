"""Small training fixtures: a linear-regression dataset and model, and mocked data loaders.

The regression data follow y = a * x + b; the mocked sentence-pair and language-model loaders
are built locally (no download, no tokenizer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from accel_state.types import DistributedType


class RegressionDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """``length`` samples ``{"x": x, "y": a * x + b + noise}`` with float32 numpy scalars.

    Args:
        a: Slope.
        b: Intercept.
        length: Number of samples.
        seed: Seed of the generator drawing ``x`` and the noise (None: unseeded).
    """

    def __init__(
        self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None
    ) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        noise = rng.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + noise).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """``forward(x) = x * a + b`` with scalar parameters ``a`` and ``b``."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(float(a)))
        self.b = torch.nn.Parameter(torch.tensor(float(b)))
        self.double_output = double_output

    def forward(self, x: torch.Tensor | None = None) -> Any:
        """The prediction (twice, as a tuple, with ``double_output``)."""
        if x is None:
            raise ValueError("RegressionModel.forward(x=None): pass the input batch as x.")
        out = x * self.a + self.b
        return (out, out) if self.double_output else out


#: Token ids of the mocked data: BERT's special tokens, and words drawn from a 1000-id range.
PAD_ID, CLS_ID, SEP_ID, EOS_ID = 0, 101, 102, 2
_WORDS = (1000, 2000)
#: Rows per split, as in Accelerate's MRPC sample files.
MOCKED_ROWS = 6


def _sentence(generator: torch.Generator, low: int = 5, high: int = 14) -> list[int]:
    length = int(torch.randint(low, high, (1,), generator=generator))
    return [int(t) for t in torch.randint(*_WORDS, (length,), generator=generator)]


def _sentence_pairs(seed: int) -> list[dict[str, Any]]:
    """MRPC-shaped rows: two sentences and whether the second paraphrases the first.

    An equivalent pair's second sentence is the first with about one word in four replaced;
    a non-equivalent pair's is unrelated. Labels alternate 1, 0, ... so both classes appear.
    """
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for index in range(MOCKED_ROWS):
        first = _sentence(generator)
        label = 1 - index % 2
        if label:
            second = [
                int(torch.randint(*_WORDS, (1,), generator=generator))
                if float(torch.rand((), generator=generator)) < 0.25
                else token
                for token in first
            ]
        else:
            second = _sentence(generator)
        rows.append({"sentence1": first, "sentence2": second, "label": label})
    return rows


def _pair_features(row: dict[str, Any]) -> dict[str, Any]:
    """What a BERT tokenizer makes of a pair: [CLS] a [SEP] b [SEP], segment ids, mask, label."""
    first, second = row["sentence1"], row["sentence2"]
    input_ids = [CLS_ID, *first, SEP_ID, *second, SEP_ID]
    token_type_ids = [0] * (len(first) + 2) + [1] * (len(second) + 1)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": row["label"],
    }


def _pad_to(values: list[int], length: int, fill: int) -> list[int]:
    return values + [fill] * (length - len(values))


def _padded_length(longest: int, multiple: int | None) -> int:
    return longest if not multiple else -(-longest // multiple) * multiple


class _PairCollator:
    """Pads a batch of pair features to its longest row (to 128 on XLA), as tensors."""

    def __init__(self, accelerator: Any) -> None:
        self.xla = getattr(accelerator, "distributed_type", None) == DistributedType.XLA

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = 128 if self.xla else max(len(e["input_ids"]) for e in examples)
        batch: dict[str, torch.Tensor] = {
            key: torch.tensor([_pad_to(e[key], length, 0) for e in examples])
            for key in ("input_ids", "token_type_ids", "attention_mask")
        }
        batch["labels"] = torch.tensor([e["labels"] for e in examples])
        return batch


class _LanguageModelCollator:
    """Next-token batches: ``labels`` are ``input_ids`` shifted by one, padding is ``-100``.

    Each row is padded (with ``EOS_ID``, as a tokenizer whose pad token is its eos) to the
    longest row plus one (128 + 1 on XLA), rounded up to a multiple of 8 under mixed precision
    (16 under fp8); then the last position is dropped from the inputs and the first from the
    labels.
    """

    def __init__(self, accelerator: Any) -> None:
        self.xla = getattr(accelerator, "distributed_type", None) == DistributedType.XLA
        precision = str(getattr(accelerator, "mixed_precision", "no"))
        self.multiple = 16 if precision == "fp8" else (8 if precision != "no" else None)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = 128 if self.xla else max(len(e["input_ids"]) for e in examples)
        length = _padded_length(longest + 1, self.multiple)
        ids = torch.tensor([_pad_to(e["input_ids"], length, EOS_ID) for e in examples])
        mask = torch.tensor([_pad_to([1] * len(e["input_ids"]), length, 0) for e in examples])
        labels = ids[:, 1:]
        return {
            "input_ids": ids[:, :-1],
            "attention_mask": mask[:, :-1],
            "labels": torch.where(labels == EOS_ID, -100, labels),
        }


def mocked_dataloaders(
    accelerator: Any, batch_size: int = 16
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """Train and eval loaders of a small MRPC-like sentence-pair classification set.

    Built locally from seeded synthetic token ids (no dataset download, no tokenizer): each
    batch is a dict of ``input_ids``, ``token_type_ids``, ``attention_mask`` (padded to the
    batch's longest row; 128 on XLA) and ``labels`` (1: the second sentence paraphrases the
    first), as Accelerate's version makes from its MRPC sample files with ``bert-base-cased``.
    Token ids lie below 2000, so a BERT-style model of vocabulary >= 2000 takes them.

    Args:
        accelerator: The ``Accelerator`` (its ``distributed_type`` chooses the padding).
        batch_size: Accepted for the signature of the examples' ``get_dataloaders`` it stands in
            for; as in Accelerate, the loaders use batches of 2 (train) and 1 (eval) so a few
            rows make several steps.

    Returns:
        ``(train_dataloader, eval_dataloader)``; the train loader shuffles.
    """
    del batch_size
    collate = _PairCollator(accelerator)
    train = [_pair_features(row) for row in _sentence_pairs(seed=0)]
    evaluation = [_pair_features(row) for row in _sentence_pairs(seed=1)]
    return (
        DataLoader(train, shuffle=True, collate_fn=collate, batch_size=2),  # type: ignore[arg-type]
        DataLoader(evaluation, shuffle=False, collate_fn=collate, batch_size=1),  # type: ignore[arg-type]
    )


def mocked_dataloaders_for_autoregressive_models(
    accelerator: Any, batch_size: int = 16
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """Train and eval loaders of next-token batches over the first sentences of the mocked set.

    Each batch is a dict of ``input_ids``, ``attention_mask`` and ``labels`` (the inputs shifted
    by one, ``-100`` on padding), padded as :class:`_LanguageModelCollator` says, the shape of
    Accelerate's version (a causal-LM tokenizer over its MRPC sample files). Built locally from
    seeded synthetic token ids below 2000, under ``accelerator.main_process_first()``.

    Args:
        accelerator: The ``Accelerator`` (its ``distributed_type`` and ``mixed_precision``
            choose the padding).
        batch_size: Accepted for the examples' signature; batches are 2 (train) and 1 (eval), as
            in Accelerate.

    Returns:
        ``(train_dataloader, eval_dataloader)``, neither shuffled.
    """
    del batch_size
    with accelerator.main_process_first():
        train = [{"input_ids": row["sentence1"]} for row in _sentence_pairs(seed=0)]
        evaluation = [{"input_ids": row["sentence1"]} for row in _sentence_pairs(seed=1)]
    collate = _LanguageModelCollator(accelerator)
    return (
        DataLoader(train, shuffle=False, collate_fn=collate, batch_size=2),  # type: ignore[arg-type]
        DataLoader(evaluation, shuffle=False, collate_fn=collate, batch_size=1),  # type: ignore[arg-type]
    )
