"""A transformers ``Trainer`` job on a tiny BERT built from a config (no downloads).

Runs unchanged on real Accelerate and on accel (``accel launch --as-accelerate``). Writes what
the job logged (losses, grad norms, eval losses), the dtype the model computed in, and checks that
``save_model`` output loads back with ``from_pretrained``.

    python trainer_job.py OUT [--bf16] [--grad-accum N] [--resume] [--fsdp-config FILE]
        [--fsdp full_shard] [--deepspeed FILE] [--auto-find-batch-size] [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SAMPLES = 64
SEQUENCE = 16


class SyntheticPairs(torch.utils.data.Dataset):
    """Token sequences whose label is whether token 5 appears in the first half (learnable)."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(6, 100, (size, SEQUENCE), generator=generator)
        marks = torch.rand(size, generator=generator) < 0.5
        self.ids[marks, 3] = 5
        self.labels = marks.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[index],
            "attention_mask": torch.ones(SEQUENCE, dtype=torch.long),
            "labels": self.labels[index],
        }


class DtypeProbe(TrainerCallback):
    """Records the dtype of the logits the first training step computes."""

    def __init__(self) -> None:
        self.dtypes: list[str] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if model is not None and not self.dtypes:
            first = next(iter(model.modules()))

            def hook(module, inputs, output):  # type: ignore[no-untyped-def]
                logits = getattr(output, "logits", None)
                if logits is not None and len(self.dtypes) < 1:
                    self.dtypes.append(str(logits.dtype))

            first.register_forward_hook(hook)


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--fsdp", default="")
    parser.add_argument("--fsdp-config", default=None)
    parser.add_argument("--deepspeed", default=None)
    parser.add_argument("--auto-find-batch-size", action="store_true")
    parser.add_argument("--best-model", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    fsdp_config = json.loads(Path(args.fsdp_config).read_text()) if args.fsdp_config else None
    training_args = TrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-3,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_steps=1,
        seed=0,
        data_seed=0,
        report_to=[],
        bf16=args.bf16,
        use_cpu=True,
        fsdp=args.fsdp,
        fsdp_config=fsdp_config,
        deepspeed=args.deepspeed,
        auto_find_batch_size=args.auto_find_batch_size,
        load_best_model_at_end=args.best_model,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    probe = DtypeProbe()
    trainer = Trainer(
        model=tiny_bert(),
        args=training_args,
        train_dataset=SyntheticPairs(SAMPLES, seed=1),
        eval_dataset=SyntheticPairs(32, seed=2),
        callbacks=[probe],
    )
    trainer.train()
    if args.resume:
        # A second run of the same job that resumes from the first epoch's checkpoint.
        checkpoints = sorted(
            (out / "trainer").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])
        )
        resumed = Trainer(
            model=tiny_bert(),
            args=training_args,
            train_dataset=SyntheticPairs(SAMPLES, seed=1),
            eval_dataset=SyntheticPairs(32, seed=2),
        )
        resumed.train(resume_from_checkpoint=str(checkpoints[0]))
        resumed_history = resumed.state.log_history
    else:
        resumed_history = []
    trainer.save_model(str(out / "final"))
    trainer.accelerator.wait_for_everyone()
    reloaded = BertForSequenceClassification.from_pretrained(str(out / "final"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    same = None
    if not (args.fsdp or args.deepspeed):
        same = all(
            torch.equal(a.detach().cpu().float(), b.detach().float())
            for a, b in zip(
                model.state_dict().values(), reloaded.state_dict().values(), strict=True
            )
        )
    deepspeed_facts = None
    if trainer.is_deepspeed_enabled:
        from transformers.integrations import is_deepspeed_zero3_enabled

        engine = trainer.model_wrapped
        deepspeed_facts = {
            "plugin_zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage,
            "zero3_enabled": is_deepspeed_zero3_enabled(),
            "engine_class": type(engine).__name__,
            "engine_zero_stage": engine.zero_optimization_stage(),
            "engine_gradient_clipping": engine.gradient_clipping(),
            "engine_micro_batch": engine.train_micro_batch_size_per_gpu(),
        }
    if trainer.accelerator.is_main_process:
        result = {
            "deepspeed": deepspeed_facts,
            "history": trainer.state.log_history,
            "resumed_history": resumed_history,
            "dtypes": probe.dtypes,
            "reloaded_equal": same,
            "num_processes": trainer.accelerator.num_processes,
            "mixed_precision": str(trainer.accelerator.mixed_precision),
            "distributed_type": str(trainer.accelerator.distributed_type),
            "is_fsdp_enabled": trainer.is_fsdp_enabled,
            "is_deepspeed_enabled": trainer.is_deepspeed_enabled,
            "train_batch_size": trainer._train_batch_size,
            "accelerate_version": __import__("accelerate").__version__,
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
