"""Two DeepSpeed plugins in one Accelerator, as Accelerate's ``test_ds_multiple_model.py``.

A student MLP trains under the ``"training"`` plugin (ZeRO-2, torch AdamW) to match a teacher
that runs inference under the ``"inference"`` plugin (ZeRO-3, no optimizer). Writes facts and
losses as JSON to ``--out`` (rank 0).
"""

import argparse
import copy
import json

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, AcceleratorConfigError, DeepSpeedPlugin
from accel.utils.deepspeed import get_active_deepspeed_plugin

BATCH, STEPS = 4, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()

    training = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 2},
        }
    )
    inference = DeepSpeedPlugin(
        hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}
    )
    accelerator = Accelerator(deepspeed_plugin={"training": training, "inference": inference})
    state = accelerator.state
    facts = {
        "first_selected": get_active_deepspeed_plugin(state) is training,
        "flags": [training.selected, inference.selected],
        "names": list(state.deepspeed_plugins),
        "lookup": state.get_deepspeed_plugin("inference") is inference,
        "distributed_type": accelerator.distributed_type.value,
    }
    errors = {}
    try:
        training.select()
    except AcceleratorConfigError as error:
        errors["select_directly"] = str(error)
    try:
        state.select_deepspeed_plugin("missing")
    except AcceleratorConfigError as error:
        errors["unknown_name"] = str(error)

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    student = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference_teacher = copy.deepcopy(teacher)
    data = TensorDataset(torch.randn(64, 4))
    loader = DataLoader(data, batch_size=BATCH, shuffle=False)
    optimizer = torch.optim.AdamW(student.parameters(), lr=0.05)
    eval_loader = DataLoader(data, batch_size=BATCH // 2)
    # is_train_batch_min (default True): "auto" micro batch = the smaller loader's (2, not 4).
    student, optimizer, loader, eval_loader = accelerator.prepare(
        student, optimizer, loader, eval_loader
    )

    state.select_deepspeed_plugin("inference")
    facts["switched"] = [training.selected, inference.selected]
    teacher = accelerator.prepare(teacher)
    teacher.eval()
    state.select_deepspeed_plugin("training")

    losses, teacher_errors = [], []
    for step, (inputs,) in enumerate(loader):
        if step == STEPS:
            break
        with torch.no_grad():
            target = teacher(inputs)
            expected = reference_teacher(inputs)
        teacher_errors.append(float((target - expected).abs().max()))
        loss = torch.nn.functional.mse_loss(student(inputs), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))

    student.eval()
    with torch.no_grad():
        (inputs,) = next(iter(eval_loader))
        evaluation = float(torch.nn.functional.mse_loss(student(inputs), teacher(inputs)))
    accelerator.save_state(args.checkpoint)
    saved = {k: v.clone() for k, v in accelerator.unwrap_model(student).state_dict().items()}
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(1.0)
    accelerator.load_state(args.checkpoint)
    restored = accelerator.unwrap_model(student).state_dict()
    report = {
        **facts,
        "errors": errors,
        "losses": losses,
        "teacher_max_error": max(teacher_errors),
        "evaluation": evaluation,
        "stages": [student.zero_optimization_stage(), teacher.zero_optimization_stage()],
        "classes": [type(student).__name__, type(teacher).__name__],
        "configs": [
            training.deepspeed_config["zero_optimization"]["stage"],
            inference.deepspeed_config["zero_optimization"]["stage"],
        ],
        "micro_batches": [
            student.train_micro_batch_size_per_gpu(),
            teacher.train_micro_batch_size_per_gpu(),
        ],
        "restored": all(torch.equal(saved[k], restored[k]) for k in saved),
    }
    if accelerator.is_main_process:
        with open(args.out, "w") as handle:
            json.dump(report, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
