"""TRL's ``SFTTrainer`` (optionally with a PEFT LoRA adapter) on a tiny Llama built from a config.

Runs unchanged on real Accelerate and on accel (``accel launch --as-accelerate``); writes the
logged losses to OUT/result.json and checks the saved output loads back.

    python sft_job.py OUT [--lora]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import name_use_recorder  # noqa: F401 - records Accelerate names in use
from datasets import Dataset
from tiny_models import counting_texts, tiny_llama, word_tokenizer
from trl import SFTConfig, SFTTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
        )
    config = SFTConfig(
        output_dir=str(out / "sft"),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="epoch",
        save_strategy="epoch",
        seed=0,
        data_seed=0,
        report_to=[],
        use_cpu=True,
        max_length=16,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=tiny_llama(),
        args=config,
        train_dataset=Dataset.from_dict({"text": counting_texts(32, seed=1)}),
        eval_dataset=Dataset.from_dict({"text": counting_texts(16, seed=2)}),
        processing_class=word_tokenizer(),
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    trainer.accelerator.wait_for_everyone()
    saved = sorted(path.name for path in (out / "final").iterdir())
    if trainer.accelerator.is_main_process:
        result = {
            "history": trainer.state.log_history,
            "saved_files": saved,
            "num_processes": trainer.accelerator.num_processes,
            "accelerate_version": __import__("accelerate").__version__,
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
