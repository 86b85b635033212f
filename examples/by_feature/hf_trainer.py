"""transformers' ``Trainer`` running on accel, without a line of accel in the script.

The script is what a transformers user writes: a model (a tiny BERT built from a config, so
nothing is downloaded), a dataset (sequences labelled by whether token 5 appears), a
``TrainingArguments`` that evaluates and checkpoints each epoch and keeps the best model. The
Trainer imports ``accelerate`` itself; ``--as-accelerate`` makes that import give accel:

    accel launch --as-accelerate --cpu --num_processes 2 examples/by_feature/hf_trainer.py
    accel launch --as-accelerate --cpu --num_processes 2 --mixed_precision bf16 <script>
    python -m accel.as_accelerate examples/by_feature/hf_trainer.py      # one process

FSDP on the CPU (which Accelerate itself cannot do) uses the same script with ``--fsdp``:

    accel launch --as-accelerate --cpu --num_processes 2 examples/by_feature/hf_trainer.py --fsdp

``--resume`` continues from the newest checkpoint in ``--output_dir``. Needs ``pip install
transformers``; prints the eval accuracy of each epoch and where the best model went.
"""

from __future__ import annotations

import argparse

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

SEQUENCE = 16


class MarkedSequences(torch.utils.data.Dataset):
    """Random token sequences; the label says whether token 5 sits at position 3."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(6, 100, (size, SEQUENCE), generator=generator)
        marked = torch.rand(size, generator=generator) < 0.5
        self.ids[marked, 3] = 5
        self.labels = marked.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def accuracy(prediction: object) -> dict[str, float]:
    """The share of eval sequences classified right (``compute_metrics`` for the Trainer)."""
    logits, labels = prediction.predictions, prediction.label_ids  # type: ignore[attr-defined]
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main() -> None:
    """Train, evaluate each epoch, keep the best checkpoint, save the final model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="hf_trainer_output")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        learning_rate=2e-3,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        save_total_limit=2,
        logging_steps=10,
        seed=0,
        report_to=[],
        disable_tqdm=True,
        fsdp="full_shard" if args.fsdp else "",
        fsdp_config=(
            {
                "version": 2,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "transformer_layer_cls_to_wrap": ["BertLayer"],
                "state_dict_type": "SHARDED_STATE_DICT",
            }
            if args.fsdp
            else None
        ),
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=MarkedSequences(512, seed=1),
        eval_dataset=MarkedSequences(128, seed=2),
        compute_metrics=accuracy,
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    for record in trainer.state.log_history:
        if "eval_accuracy" in record:
            trainer.accelerator.print(
                f"epoch {record['epoch']:.0f} eval accuracy {record['eval_accuracy']:.3f}"
            )
    trainer.save_model(f"{args.output_dir}/final")
    trainer.accelerator.print(
        f"best checkpoint {trainer.state.best_model_checkpoint}; "
        f"final model in {args.output_dir}/final; runs on accelerate "
        f"{__import__('accelerate').__version__} with {trainer.accelerator.num_processes} processes"
    )


if __name__ == "__main__":
    main()
