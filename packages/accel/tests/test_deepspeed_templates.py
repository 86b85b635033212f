"""Accelerate's DeepSpeed config templates (``zero_stage{1,2,3}[_offload]_config.json``) under accel.

``data/deepspeed_templates/`` holds our own copies of the five templates' keys and ``"auto"``
values. Here every ``"auto"`` they hold is checked in-process (no deepspeed, no processes) to
be filled with Accelerate's value; the real training run of each template on 2 CPU/gloo
processes is one job of ``test_deepspeed.py``'s launch waves (``test_each_template_trains``).
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from accel.errors import AcceleratorConfigError
from accel.strategies.deepspeed.config import KnownValues, model_hidden_size, resolve_config
from accel.utils.deepspeed import DeepSpeedPlugin, DummyOptim, DummyScheduler

TEMPLATES = Path(__file__).resolve().parent / "data" / "deepspeed_templates"
NAMES = sorted(path.name for path in TEMPLATES.glob("*.json"))
HIDDEN, LR, WEIGHT_DECAY, TOTAL, WARMUP = 64, 3e-4, 0.01, 101, 10
KNOWN = KnownValues(
    micro_batch_size=4, gradient_accumulation_steps=2, mixed_precision="no", world_size=2
)


class HiddenSizeModel(torch.nn.Module):
    """A model with a Transformers-style ``config`` (``hidden_size`` or ``hidden_sizes``)."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(**config)
        self.layer = torch.nn.Linear(4, 4)


def _resolve(
    name: str,
    known: KnownValues = KNOWN,
    model: Any = None,
    scheduler_kwargs: dict[str, Any] | None = None,
    **plugin_fields: Any,
) -> dict[str, Any]:
    model = HiddenSizeModel(hidden_size=HIDDEN) if model is None else model
    optimizer = DummyOptim(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    kwargs = {"total_num_steps": TOTAL, "warmup_num_steps": WARMUP, **(scheduler_kwargs or {})}
    scheduler = DummyScheduler(optimizer, **kwargs)
    plugin = DeepSpeedPlugin(hf_ds_config=str(TEMPLATES / name), **plugin_fields)
    return resolve_config(plugin, known, optimizer, scheduler, model=model)


def test_the_five_templates_are_there() -> None:
    assert NAMES == [
        "zero_stage1_config.json",
        "zero_stage2_config.json",
        "zero_stage2_offload_config.json",
        "zero_stage3_config.json",
        "zero_stage3_offload_config.json",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_every_auto_of_a_template_gets_accelerates_value(name: str) -> None:
    original = json.loads((TEMPLATES / name).read_text())
    config = _resolve(name)
    assert "auto" not in json.dumps(config)
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 4 * 2 * 2
    assert config["gradient_clipping"] == 1.0  # Accelerate's value for "auto"
    # On the CPU (no mixed precision) "auto" turns both off; the other fp16 keys stay.
    assert config["fp16"]["enabled"] is False and config["bf16"] == {"enabled": False}
    assert config["fp16"]["initial_scale_power"] == 16
    assert config["optimizer"]["params"]["lr"] == LR
    assert config["optimizer"]["params"]["weight_decay"] == WEIGHT_DECAY
    assert config["scheduler"] == {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0,
            "warmup_max_lr": LR,
            "warmup_num_steps": WARMUP,
            "total_num_steps": math.ceil(TOTAL / 2),  # each engine's steps: 51 of 101
        },
    }
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == HIDDEN * HIDDEN
    stage = original["zero_optimization"]["stage"]
    assert zero["stage"] == stage
    if stage == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * HIDDEN * HIDDEN)
        assert zero["stage3_param_persistence_threshold"] == 10 * HIDDEN
        assert zero["stage3_gather_16bit_weights_on_model_save"] is False
    else:  # keys a template does not hold are not added
        assert "stage3_prefetch_bucket_size" not in zero
    # Everything that was not "auto" is kept as written.
    assert config["steps_per_print"] == 2000 and config["wall_clock_breakdown"] is False
    assert zero.get("offload_optimizer") == original["zero_optimization"].get("offload_optimizer")
    assert zero.get("offload_param") == original["zero_optimization"].get("offload_param")


@pytest.mark.parametrize(
    ("known", "total"),
    [
        (KNOWN, 51),  # ceil(101 / 2): the count is over the whole dataset
        (KnownValues(4, 2, "no", 2, split_batches=True), 101),  # already per process
        (KnownValues(4, 2, "no", 1), 101),
        (KnownValues(4, 2, "no", 4), 26),
    ],
)
def test_total_num_steps_is_divided_between_processes_unless_batches_are_split(
    known: KnownValues, total: int
) -> None:
    config = _resolve("zero_stage2_config.json", known)
    assert config["scheduler"]["params"]["total_num_steps"] == total


def test_warmup_num_steps_is_at_least_one_and_precision_follows_the_accelerator() -> None:
    # DummyScheduler's default warmup (0) is rejected by DeepSpeed >= 0.19.6.
    config = _resolve("zero_stage1_config.json", scheduler_kwargs={"warmup_num_steps": 0})
    assert config["scheduler"]["params"]["warmup_num_steps"] == 1
    fp16 = _resolve("zero_stage1_config.json", KnownValues(4, 2, "fp16", 2))
    assert fp16["fp16"]["enabled"] is True and fp16["bf16"]["enabled"] is False
    assert fp16["fp16"]["loss_scale_window"] == 1000
    bf16 = _resolve("zero_stage3_config.json", KnownValues(4, 2, "bf16", 2))
    assert bf16["bf16"]["enabled"] is True and bf16["fp16"]["enabled"] is False


def test_hidden_sizes_take_the_largest_and_plugin_fields_win_over_auto() -> None:
    model = HiddenSizeModel(hidden_sizes=[8, 32, 16])
    assert model_hidden_size(model) == 32
    config = _resolve(
        "zero_stage3_config.json",
        model=model,
        gradient_clipping=0.5,
        zero3_save_16bit_model=True,
    )
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 32 * 32
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 32 * 32)
    assert zero["stage3_param_persistence_threshold"] == 320
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["gradient_clipping"] == 0.5


@pytest.mark.parametrize(
    ("model", "found"),
    [
        (torch.nn.Linear(4, 4), "has no `config` attribute"),
        (HiddenSizeModel(vocab_size=10), "neither `hidden_size` nor `hidden_sizes`"),
    ],
)
def test_bucket_auto_without_a_hidden_size_names_the_keys_and_the_fix(
    model: torch.nn.Module, found: str
) -> None:
    with pytest.raises(AcceleratorConfigError) as caught:
        _resolve("zero_stage3_config.json", model=model)
    message = str(caught.value)
    for part in (
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "config.hidden_size",
        found,
        "with an integer",
    ):
        assert part in message
    # Integers written in the file need no hidden size.
    plugin = DeepSpeedPlugin(hf_ds_config=str(TEMPLATES / "zero_stage2_config.json"))
    plugin.deepspeed_config["zero_optimization"]["reduce_bucket_size"] = 5e8
    optimizer = DummyOptim(model.parameters())
    config = resolve_config(
        plugin, KNOWN, optimizer, DummyScheduler(optimizer, total_num_steps=10), model=model
    )
    assert config["zero_optimization"]["reduce_bucket_size"] == 5e8


def test_warmup_lr_scheduler_and_unfillable_values_are_named() -> None:
    model = HiddenSizeModel(hidden_size=HIDDEN)
    warmup = json.loads((TEMPLATES / "zero_stage2_config.json").read_text())
    warmup["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    }
    optimizer = DummyOptim(model.parameters(), lr=0.5)
    # Without total_num_steps: WarmupLR needs none, and none is added.
    scheduler = DummyScheduler(optimizer, warmup_num_steps=3)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=warmup), KNOWN, optimizer, scheduler, model=model
    )
    assert config["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 0.5,
        "warmup_num_steps": 3,
    }
    # WarmupDecayLR's total_num_steps has to come from somewhere: the error says where.
    with pytest.raises(AcceleratorConfigError, match=r"total_num_steps.*DummyScheduler\(optimizer"):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config=str(TEMPLATES / "zero_stage2_config.json")),
            KNOWN,
            optimizer,
            scheduler,
            model=model,
        )
    betas = json.loads((TEMPLATES / "zero_stage1_config.json").read_text())
    betas["optimizer"]["params"].update(betas="auto", eps="auto")
    with pytest.raises(AcceleratorConfigError, match=r"betas: pass DummyOptim\(params, betas="):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config=betas),
            KNOWN,
            optimizer,
            DummyScheduler(optimizer, total_num_steps=10),
            model=model,
        )
    filled = DummyOptim(model.parameters(), lr=0.5, betas=[0.8, 0.9], eps=1e-6)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=betas),
        KNOWN,
        filled,
        DummyScheduler(filled, total_num_steps=10),
        model=model,
    )
    assert config["optimizer"]["params"]["betas"] == [0.8, 0.9]
    assert config["optimizer"]["params"]["eps"] == 1e-6


def test_a_torch_optimizer_behind_the_dummy_scheduler_gives_warmup_max_lr() -> None:
    model = HiddenSizeModel(hidden_size=HIDDEN)
    torch_optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    dummy = DummyOptim(model.parameters(), lr=0.5)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=str(TEMPLATES / "zero_stage1_config.json")),
        KNOWN,
        dummy,
        DummyScheduler(torch_optimizer, total_num_steps=10),
        model=model,
    )
    assert config["scheduler"]["params"]["warmup_max_lr"] == 0.25


def test_accelerates_literal_fp16_true_and_accumulation_one_need_agreeing_settings() -> None:
    """Accelerate's own files write ``fp16.enabled: true`` and ``gradient_accumulation_steps: 1``.

    Under fp16 with one accumulation step they resolve as the "auto" copies do; otherwise accel
    names both values (Accelerate keeps the file's silently: docs/accelerate.md, deliberate
    differences).
    """
    literal = json.loads((TEMPLATES / "zero_stage2_config.json").read_text())
    literal["fp16"]["enabled"] = True
    literal["gradient_accumulation_steps"] = 1
    del literal["bf16"]
    model = HiddenSizeModel(hidden_size=HIDDEN)
    optimizer = DummyOptim(model.parameters(), lr=LR)
    scheduler = DummyScheduler(optimizer, total_num_steps=TOTAL)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=literal),
        KnownValues(4, 1, "fp16", 2),
        optimizer,
        scheduler,
        model=model,
    )
    assert config["fp16"]["enabled"] is True and config["train_batch_size"] == 8
    with pytest.raises(AcceleratorConfigError, match=r"fp16\.enabled=True.*mixed_precision='no'"):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config=literal),
            KnownValues(4, 1, "no", 2),
            optimizer,
            scheduler,
            model=model,
        )
