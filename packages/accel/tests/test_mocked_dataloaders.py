"""``accel.test_utils.training``'s mocked loaders: Accelerate's batch shapes, built locally."""

import torch

from accel import Accelerator
from accel.test_utils.training import (
    EOS_ID,
    mocked_dataloaders,
    mocked_dataloaders_for_autoregressive_models,
)


def test_sentence_pair_batches_have_bert_shapes_and_both_labels():
    accelerator = Accelerator(cpu=True)
    train, evaluation = mocked_dataloaders(accelerator, batch_size=16)
    batches = list(train)
    assert len(batches) == 3 and len(list(evaluation)) == 6  # batches of 2 and 1, as Accelerate
    labels = torch.cat([b["labels"] for b in batches])
    assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]
    for batch in batches:
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
        ids, mask = batch["input_ids"], batch["attention_mask"]
        assert ids.dtype == torch.long and ids.shape == mask.shape == batch["token_type_ids"].shape
        assert (ids[:, 0] == 101).all()  # [CLS]
        assert mask[:, -1].any() and torch.equal(mask.bool(), ids != 0)  # padded to the longest
    # Deterministic: the eval set is the same on every call.
    again = [b["input_ids"] for b in mocked_dataloaders(accelerator)[1]]
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(again, evaluation, strict=True))


def test_a_classifier_learns_the_mocked_pairs_through_prepare():
    accelerator = Accelerator(cpu=True)
    train, _ = mocked_dataloaders(accelerator)
    torch.manual_seed(0)
    embed = torch.nn.EmbeddingBag(2000, 16, mode="mean")
    head = torch.nn.Linear(16, 2)
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    losses = []
    for _ in range(30):
        for batch in train:
            logits = model["head"](model["embed"](batch["input_ids"]))
            loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    assert sum(losses[-3:]) < sum(losses[:3])


def test_language_model_batches_shift_labels_and_mask_padding():
    accelerator = Accelerator(cpu=True)
    train, evaluation = mocked_dataloaders_for_autoregressive_models(accelerator)
    batch = next(iter(train))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape
    # labels[t] is input_ids[t + 1]; padding (eos) positions are -100.
    real = labels != -100
    assert torch.equal(labels[:, :-1][real[:, :-1]], ids[:, 1:][real[:, :-1]])
    assert (labels[:, -1] == -100).all()  # every row was padded by at least one
    assert not (ids[mask.bool()] == EOS_ID).any()
    assert len(list(evaluation)) == 6


def test_language_model_padding_rounds_up_under_mixed_precision():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    train, _ = mocked_dataloaders_for_autoregressive_models(accelerator)
    for batch in train:
        assert (batch["input_ids"].shape[1] + 1) % 8 == 0
