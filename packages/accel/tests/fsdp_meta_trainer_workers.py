"""Worker: transformers' Trainer under FSDP2 with ``cpu_ram_efficient_loading`` on accel.

A tiny Llama (tied embeddings, rotary ``inv_freq`` non-persistent buffers) saved once; each run
loads it in both ranks, trains a few steps with the Trainer, and returns the gathered weights.
"""

from __future__ import annotations

import os
from typing import Any

import torch

STEPS = 3


def _config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )


def save_model(folder: str) -> None:
    """The tiny Llama, seeded, written with ``save_pretrained``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(_config()).save_pretrained(folder)


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.rows = torch.randint(0, 64, (16, 12), generator=generator)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


def _train(folder: str, out: str, efficient: bool, meta_on_rank1: bool) -> dict[str, Any]:
    from transformers import LlamaForCausalLM, Trainer, TrainingArguments
    from transformers.integrations import is_fsdp_enabled

    fsdp_config = {
        "version": 2,
        "cpu_ram_efficient_loading": efficient,
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        "state_dict_type": "FULL_STATE_DICT",
    }
    args = TrainingArguments(
        output_dir=out,
        fsdp="full_shard",
        fsdp_config=fsdp_config,
        per_device_train_batch_size=2,
        max_steps=STEPS,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    rank = int(os.environ["LOCAL_RANK"])
    if meta_on_rank1 and rank == 1:
        # What transformers' from_pretrained gives the other ranks under
        # FSDP_CPU_RAM_EFFICIENT_LOADING when it skips their weights: the model on meta.
        with torch.device("meta"):
            model = LlamaForCausalLM(_config())
    else:
        model = LlamaForCausalLM.from_pretrained(folder)
    loaded_on_meta = [name for name, p in model.named_parameters() if p.is_meta]
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
    trainer.train()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True))
    inner = trainer.accelerator.unwrap_model(trainer.model)
    return {
        "fsdp_enabled_for_transformers": is_fsdp_enabled(),
        "loaded_on_meta": loaded_on_meta,
        "parameters": len(list(model.parameters())),
        "losses": [row["loss"] for row in trainer.state.log_history if "loss" in row],
        "weights": {name: value.detach().clone() for name, value in weights.items()},
        "inv_freq": inner.model.rotary_emb.inv_freq.detach().cpu().clone(),
        "tied": inner.lm_head.weight is inner.model.embed_tokens.weight,
    }


def trainer_job(folder: str, out: str) -> dict[str, Any]:
    """Plain run, efficient run with rank 1 on meta, efficient run with from_pretrained everywhere."""
    import accel

    accel.install_as_accelerate()
    from accel_state import reset_state

    results = {}
    for name, efficient, meta in (
        ("plain", False, False),
        ("meta", True, True),
        ("from_pretrained", True, False),
    ):
        reset_state(stop_process_group=False)
        results[name] = _train(folder, os.path.join(out, name), efficient, meta)
    return results
