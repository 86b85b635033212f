"""One training job for the DeepSpeed tests, run under ``accel launch`` (DDP or DeepSpeed).

Trains a small MLP with torch AdamW and a LambdaLR schedule, gradient accumulation 2 and norm
clipping 1.0, for ``--steps`` optimizer steps; writes per-step mean losses and facts about the
job as JSON to ``--out`` (rank 0). ``--save-at K`` saves the training state after step K
(and goes on); ``--resume DIR`` loads it and trains the remaining steps. ``--dummy`` takes the
optimizer from the config file (DummyOptim) and the schedule from DummyScheduler.
``--templates DIR`` instead trains under each of Accelerate's config templates in ``DIR``
(see ``deepspeed_templates_job.py``).
"""

import argparse
import contextlib
import json
import math

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, AcceleratorConfigError, PreparationError
from accel.utils import DummyOptim, DummyScheduler, GatheredParameters

BATCH, ACCUMULATION, CLIP, LR = 4, 2, 1.0, 0.02


def decay(step: int) -> float:
    """Learning-rate factor after ``step`` scheduler steps."""
    return 1.0 / (1.0 + 0.05 * step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--save-model", default=None)
    parser.add_argument("--dummy", action="store_true")
    parser.add_argument("--templates", default=None)
    args = parser.parse_args()
    if args.templates:  # Accelerate's config templates, one after the other
        from deepspeed_templates_job import run_templates

        run_templates(args.templates, args.out)
        return

    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION)
    torch.manual_seed(0)
    plugin = accelerator.state.deepspeed_plugin
    # With zero3_init_flag under ZeRO-3 the model is sharded as it is built.
    init = contextlib.nullcontext() if plugin is None else plugin.zero3_init_context_manager()
    with init:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    built_sharded = hasattr(model[0].weight, "ds_id")
    data_generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=data_generator)
    y = (x[:, :1] * 3 - x[:, 1:2]).tanh() + 0.1 * torch.randn(256, 1, generator=data_generator)
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(2),
    )
    world = accelerator.num_processes
    if args.dummy:
        optimizer = DummyOptim(model.parameters(), lr=LR)
        # The engine steps its scheduler once per optimizer step; accel's AcceleratedScheduler
        # steps a torch schedule once per process (Accelerate's rule), hence world * step.
        scheduler = DummyScheduler(
            optimizer,
            lr_scheduler_callable=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, lambda step: decay(world * step)
            ),
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    start = 0
    if args.resume:
        accelerator.load_state(args.resume)
        start = args.save_at
    losses: dict[int, float] = {}
    norms: list[float] = []
    step = start
    for epoch in range(100):
        # Accelerate's mid-epoch resume: load_state, then skip the batches already trained on.
        active = loader
        if epoch == 0 and start:
            active = accelerator.skip_first_batches(loader, start * ACCUMULATION)
        for inputs, targets in active:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total = accelerator.reduce(loss.detach(), reduction="mean")
            losses[step] = losses.get(step, 0.0) + float(total) / ACCUMULATION
            if accelerator.sync_gradients:
                step += 1
                if step == args.save_at and not args.resume:
                    accelerator.save_state(args.checkpoint)
            if step == args.steps:
                break
        if step == args.steps:
            break
    weights = accelerator.get_state_dict(model) if hasattr(accelerator, "get_state_dict") else None
    if args.save_model:
        accelerator.save_model(model, args.save_model)
    errors = {}
    if plugin is not None:  # misuse under DeepSpeed gives clear errors
        for label, call in (
            ("clip", lambda: accelerator.clip_grad_norm_(model.parameters(), 2 * CLIP)),
            (
                "second_model",
                lambda: accelerator.prepare(
                    torch.nn.Linear(2, 2),
                    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                ),
            ),
        ):
            try:
                call()
            except (AcceleratorConfigError, PreparationError) as error:
                errors[label] = f"{type(error).__name__}: {error}"
    report = {
        "distributed_type": accelerator.distributed_type.value,
        "num_processes": world,
        "losses": [losses[s] for s in sorted(losses)],
        "first_step": min(losses),
        "norms_finite": all(math.isfinite(n) for n in norms),
        "norms": norms,
        "lr": scheduler.get_last_lr()[0] if hasattr(scheduler, "get_last_lr") else None,
        "config": None if plugin is None else plugin.deepspeed_config,
        "engine": None
        if plugin is None
        else {
            "micro_batch": model.train_micro_batch_size_per_gpu(),
            "accumulation": model.gradient_accumulation_steps(),
            "train_batch": model.train_batch_size(),
            "clipping": model.gradient_clipping(),
            "stage": model.zero_optimization_stage(),
            "fp16": model.fp16_enabled(),
            "bf16": model.bfloat16_enabled(),
            "device": str(next(model.module.parameters()).device.type),
        },
        "errors": errors,
        "built_sharded": built_sharded,
        "model_class": type(model).__name__,
        "unwrapped_class": type(accelerator.unwrap_model(model)).__name__,
        "weights": None
        if weights is None
        else {name: tensor.tolist() for name, tensor in weights.items()},
    }
    # Last: it edits the weights (the report holds copies of them by now).
    report["gathered"] = gathered_parameters_facts(accelerator, model)
    if accelerator.is_main_process:
        with open(args.out, "w") as handle:
            json.dump(report, handle)
    accelerator.end_training()


def gathered_parameters_facts(accelerator: Accelerator, model: torch.nn.Module) -> dict:
    """GatheredParameters: whole parameters inside the block; under ZeRO-3 rank 0's edit spreads."""
    params = list(accelerator.unwrap_model(model).parameters())
    full = [list(getattr(p, "ds_shape", p.shape)) for p in params]
    outside = [p.numel() for p in params]
    with GatheredParameters(params, modifier_rank=0):
        inside = [list(p.shape) for p in params]
        if accelerator.is_main_process:
            with torch.no_grad():
                params[0].fill_(0.5)
    with GatheredParameters(params[0]):
        edited = float(torch.all(params[0] == 0.5))
    seen = accelerator.reduce(torch.tensor(edited), "sum").item()
    return {"full": full, "outside": outside, "inside": inside, "edit_seen_by": seen}


if __name__ == "__main__":
    main()
