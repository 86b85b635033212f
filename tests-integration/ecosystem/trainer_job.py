"""A transformers ``Trainer`` job on a tiny BERT built from a config (no downloads).

Runs unchanged on real Accelerate and on accel (``accel launch --as-accelerate``). Writes what
the job logged (losses, grad norms, eval losses), the dtype the model computed in, and checks that
``save_model`` output loads back with ``from_pretrained``.

    python trainer_job.py OUT [--bf16] [--grad-accum N] [--resume] [--fsdp-config FILE]
        [--fsdp full_shard] [--deepspeed FILE] [--auto-find-batch-size] [--epochs N]
        [--fsdp-full-save] [--peft-lora]

``--fsdp-full-save`` follows transformers' recipe for ``SHARDED_STATE_DICT`` training: switch the
FSDP plugin to ``FULL_STATE_DICT`` before ``save_model`` (which otherwise writes no weights), and
compare the reloaded weights with the gathered ones. ``--peft-lora`` trains LoRA adapters (PEFT)
on the same model; the final save then holds the adapters.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import name_use_recorder  # noqa: F401 - records Accelerate names in use
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
    """Records the dtype the first training step's classifier layer computes in.

    The model's own output is converted back to float32 under mixed precision, so the probe
    watches a ``Linear`` layer inside it.
    """

    def __init__(self) -> None:
        self.dtypes: list[str] = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if model is None or self.dtypes or getattr(self, "_hooked", False):
            return
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

        def hook(module, inputs, output):  # type: ignore[no-untyped-def]
            if not self.dtypes and isinstance(output, torch.Tensor):
                self.dtypes.append(str(output.dtype))

        linears[-1].register_forward_hook(hook)
        self._hooked = True


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


def lora_bert() -> torch.nn.Module:
    """The tiny BERT with LoRA adapters on its attention projections (the classifier trains too)."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8, target_modules=["query", "value"]
    )
    return get_peft_model(tiny_bert(), config)


def fsdp_checkpoint_keys(folder: Path) -> list[str]:
    """The weight names in the first checkpoint's sharded FSDP model folder, else ``[]``."""
    sharded = sorted(folder.glob("checkpoint-*/pytorch_model_fsdp_0"))
    if not sharded or not (sharded[0] / ".metadata").is_file():
        return []
    from torch.distributed.checkpoint import FileSystemReader

    return sorted(FileSystemReader(str(sharded[0])).read_metadata().state_dict_metadata)


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
    parser.add_argument("--fsdp-full-save", action="store_true")
    parser.add_argument("--peft-lora", action="store_true")
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
    build = lora_bert if args.peft_lora else tiny_bert
    trainer = Trainer(
        model=build(),
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
            model=build(),
            args=training_args,
            train_dataset=SyntheticPairs(SAMPLES, seed=1),
            eval_dataset=SyntheticPairs(32, seed=2),
        )
        resumed.train(resume_from_checkpoint=str(checkpoints[0]))
        resumed_history = resumed.state.log_history
    else:
        resumed_history = []
    gathered = None
    if args.fsdp_full_save and trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
        gathered = trainer.accelerator.get_state_dict(trainer.model)
    trainer.save_model(str(out / "final"))
    trainer.accelerator.wait_for_everyone()
    if args.peft_lora:
        from peft import PeftModel

        reloaded = PeftModel.from_pretrained(tiny_bert(), str(out / "final"))
    else:
        reloaded = BertForSequenceClassification.from_pretrained(str(out / "final"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    same = None
    saved_files = sorted(path.name for path in (out / "final").iterdir())
    checkpoint_keys = fsdp_checkpoint_keys(out / "trainer")
    if gathered is not None and trainer.accelerator.is_main_process:
        # The weights save_model wrote are the trained ones, gathered from every shard.
        reloaded_state = reloaded.state_dict()
        same = sorted(gathered) == sorted(reloaded_state) and all(
            torch.equal(value.detach().cpu().float(), reloaded_state[name].detach().float())
            for name, value in gathered.items()
        )
    elif not (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled or args.deepspeed):
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
    # Accelerate's state has no fsdp_plugin attribute unless FSDP is on.
    fsdp_plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if trainer.accelerator.is_main_process:
        result = {
            "deepspeed": deepspeed_facts,
            "history": trainer.state.log_history,
            "resumed_history": resumed_history,
            "dtypes": probe.dtypes,
            "reloaded_equal": same,
            "saved_files": saved_files,
            "checkpoint_keys": checkpoint_keys,
            "num_processes": trainer.accelerator.num_processes,
            "mixed_precision": str(trainer.accelerator.mixed_precision),
            "distributed_type": str(trainer.accelerator.distributed_type),
            "is_fsdp_enabled": trainer.is_fsdp_enabled,
            "fsdp_version": getattr(fsdp_plugin, "fsdp_version", None),
            "model_class": type(trainer.model).__name__,
            "is_deepspeed_enabled": trainer.is_deepspeed_enabled,
            "train_batch_size": trainer._train_batch_size,
            "accelerate_version": __import__("accelerate").__version__,
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
