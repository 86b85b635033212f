"""Several DeepSpeed plugins in one process, as in Accelerate's ``test_ds_multiple_model.py``.

Three named plugins: a student MLP trains under ``"student"`` (ZeRO-2, torch AdamW, LambdaLR)
to match a frozen teacher running inference under ``"teacher"`` (ZeRO-3, no optimizer), both
prepared by the first Accelerator; a peer MLP trains on the same targets under ``"peer"``
(ZeRO-3) through a second ``Accelerator()``. One loop accumulates over 2 micro-steps for both
trained models. ``--save-at K`` saves both Accelerators' states after optimizer step K (and
goes on); ``--resume DIR`` starts from a teacher of other weights, loads both states and trains
the remaining steps. Then evaluation under ``no_grad`` and the misuses. Writes facts and losses
as JSON to ``--out`` (rank 0).
"""

import argparse
import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, AcceleratorConfigError, DeepSpeedPlugin, PreparationError
from accel.utils.deepspeed import get_active_deepspeed_plugin

BATCH, ACCUMULATION, STEPS, LR = 4, 2, 6, 0.05


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def decay(step: int) -> float:
    return 1.0 / (1.0 + 0.1 * step)


def make_plugins() -> dict[str, DeepSpeedPlugin]:
    auto = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    return {
        "student": DeepSpeedPlugin(hf_ds_config={**auto, "zero_optimization": {"stage": 2}}),
        "teacher": DeepSpeedPlugin(hf_ds_config={**auto, "zero_optimization": {"stage": 3}}),
        "peer": DeepSpeedPlugin(
            hf_ds_config={
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": ACCUMULATION,
                "zero_optimization": {"stage": 3},
            }
        ),
        "mismatched": DeepSpeedPlugin(zero_stage=1, gradient_accumulation_steps=4),
    }


def catch(call) -> str:  # type: ignore[no-untyped-def]
    try:
        call()
    except (AcceleratorConfigError, PreparationError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()

    plugins = make_plugins()
    accelerator = Accelerator(deepspeed_plugins=plugins, gradient_accumulation_steps=ACCUMULATION)
    # A later Accelerator shares the state and its plugins (Accelerate's second model).
    peer_accelerator = Accelerator()
    state = accelerator.state
    facts: dict = {
        "distributed_type": accelerator.distributed_type.value,
        "num_processes": accelerator.num_processes,
        "first_selected": get_active_deepspeed_plugin(state) is plugins["student"],
        "flags": [plugin.selected for plugin in plugins.values()],
        "names": list(state.deepspeed_plugins),
        "lookup": state.get_deepspeed_plugin("teacher") is plugins["teacher"],
        "wrapped_before": [
            accelerator.deepspeed_engine_wrapped,
            peer_accelerator.deepspeed_engine_wrapped,
        ],
    }

    data = torch.randn(128, 4, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(data), batch_size=BATCH, shuffle=False)
    eval_loader = DataLoader(TensorDataset(data[:16]), batch_size=BATCH // 2)
    student = mlp(1)
    optimizer = torch.optim.AdamW(student.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    # is_train_batch_min (default True): "auto" micro batch = the smaller loader's (2, not 4).
    student, optimizer, scheduler, loader, eval_loader = accelerator.prepare(
        student, optimizer, scheduler, loader, eval_loader
    )

    # The teacher: frozen, inference only under ZeRO-3. A resumed run starts from other weights
    # that load_state must replace.
    teacher = mlp(99 if args.resume else 0).requires_grad_(False)
    reference_teacher = mlp(0)
    state.select_deepspeed_plugin("teacher")
    facts["switched"] = [plugin.selected for plugin in plugins.values()]
    facts["active_is_teacher"] = get_active_deepspeed_plugin(state) is plugins["teacher"]
    teacher = accelerator.prepare(teacher)
    teacher.eval()

    # The peer trains through the second Accelerator, under its own plugin; no dataloader in
    # its prepare call, so the micro batch comes from the student's config, as in Accelerate.
    state.select_deepspeed_plugin("peer")
    plugins["peer"].deepspeed_config["train_micro_batch_size_per_gpu"] = plugins[
        "student"
    ].deepspeed_config["train_micro_batch_size_per_gpu"]
    peer = mlp(2)
    peer_optimizer = torch.optim.AdamW(peer.parameters(), lr=LR)
    peer_scheduler = torch.optim.lr_scheduler.LambdaLR(peer_optimizer, decay)
    peer, peer_optimizer, peer_scheduler = peer_accelerator.prepare(
        peer, peer_optimizer, peer_scheduler
    )
    state.select_deepspeed_plugin("student")
    facts["wrapped_engines"] = [
        accelerator.deepspeed_engine_wrapped.engine is student,
        peer_accelerator.deepspeed_engine_wrapped.engine is peer,
    ]

    checkpoint = Path(args.checkpoint or args.resume or ".")
    start = 0
    if args.resume:
        accelerator.load_state(checkpoint / "student")
        peer_accelerator.load_state(checkpoint / "peer")
        start = args.save_at

    losses: dict[str, dict[int, float]] = {"student": {}, "peer": {}}
    teacher_errors = []
    step = start
    active = accelerator.skip_first_batches(loader, start * ACCUMULATION) if start else loader
    for (inputs,) in active:
        with accelerator.accumulate(student, peer):
            with torch.no_grad():
                target = teacher(inputs)
                teacher_errors.append(float((target - reference_teacher(inputs)).abs().max()))
            loss = torch.nn.functional.mse_loss(student(inputs), target)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            peer_loss = torch.nn.functional.mse_loss(peer(inputs), target)
            peer_accelerator.backward(peer_loss)
            peer_optimizer.step()
            peer_scheduler.step()
            peer_optimizer.zero_grad()
        for name, value in (("student", loss), ("peer", peer_loss)):
            mean = float(accelerator.reduce(value.detach(), "mean")) / ACCUMULATION
            losses[name][step] = losses[name].get(step, 0.0) + mean
        if accelerator.sync_gradients:
            step += 1
            if step == args.save_at and not args.resume:
                accelerator.save_state(checkpoint / "student")
                peer_accelerator.save_state(checkpoint / "peer")
        if step == STEPS:
            break

    # Evaluation under no_grad, both trained models against the teacher, over every process.
    student.eval()
    peer.eval()
    errors_sum = {"student": 0.0, "peer": 0.0}
    count = 0
    with torch.no_grad():
        for (inputs,) in eval_loader:
            target = teacher(inputs)
            outputs = accelerator.gather_for_metrics((student(inputs), peer(inputs), target))
            for name, output in zip(("student", "peer"), outputs[:2], strict=True):
                errors_sum[name] += float(((output - outputs[2]) ** 2).sum())
            count += outputs[2].numel()
    teacher_weights = accelerator.get_state_dict(teacher)  # gathered from the ZeRO-3 shards
    reference_weights = reference_teacher.state_dict()

    misuse = {
        "select_unknown": catch(lambda: state.select_deepspeed_plugin("missing")),
        "get_unknown": catch(lambda: state.get_deepspeed_plugin("missing")),
        "select_directly": catch(lambda: plugins["peer"].select()),
        "new_plugins": catch(lambda: Accelerator(deepspeed_plugins={"x": DeepSpeedPlugin()})),
        "second_model": catch(
            lambda: accelerator.prepare(mlp(3), torch.optim.SGD(mlp(3).parameters(), lr=0.1))
        ),
        "accumulation_argument": catch(lambda: Accelerator(gradient_accumulation_steps=3)),
    }
    facts["num_steps_after_refusal"] = accelerator.gradient_state.num_steps
    third = Accelerator()
    misuse["plugin_in_use"] = catch(
        lambda: third.prepare(mlp(4), torch.optim.SGD(mlp(4).parameters(), lr=0.1))
    )
    state.select_deepspeed_plugin("mismatched")
    misuse["mismatched_accumulation"] = catch(
        lambda: third.prepare(mlp(5), torch.optim.SGD(mlp(5).parameters(), lr=0.1))
    )
    # free_memory destroys the peer's engine and frees its plugin for another model.
    state.select_deepspeed_plugin("peer")
    peer_accelerator.free_memory()
    replacement = mlp(6)
    replacement = third.prepare(replacement, torch.optim.SGD(replacement.parameters(), lr=0.1))[0]
    facts["after_free_memory"] = [
        peer_accelerator.deepspeed_engine_wrapped is None,
        third.deepspeed_engine_wrapped.engine is replacement,
        replacement.zero_optimization_stage(),
    ]
    state.select_deepspeed_plugin("student")

    engines = {"student": student, "teacher": teacher, "peer": peer}
    report = {
        **facts,
        "misuse": misuse,
        "losses": {name: [values[s] for s in sorted(values)] for name, values in losses.items()},
        "first_step": start,
        "teacher_max_error": max(teacher_errors),
        "teacher_state_dict_error": max(
            float((teacher_weights[k] - reference_weights[k]).abs().max())
            for k in reference_weights
        ),
        "evaluation": {name: total / count for name, total in errors_sum.items()},
        "classes": {name: type(engine).__name__ for name, engine in engines.items()},
        "stages": {name: engine.zero_optimization_stage() for name, engine in engines.items()},
        "configs": {
            name: plugins[name].deepspeed_config["zero_optimization"]["stage"] for name in engines
        },
        "micro_batches": {
            name: engine.train_micro_batch_size_per_gpu() for name, engine in engines.items()
        },
        "accumulation": {
            name: engine.gradient_accumulation_steps() for name, engine in engines.items()
        },
        "global_steps": {name: engines[name].global_steps for name in ("student", "peer")},
        "learning_rates": [scheduler.get_last_lr()[0], peer_scheduler.get_last_lr()[0]],
    }
    if accelerator.is_main_process:
        with open(args.out, "w") as handle:
            json.dump(report, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
