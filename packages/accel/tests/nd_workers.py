"""N-D parallelism (ParallelismConfig) functions run inside spawned or launched worker processes."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from accel import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    TorchTensorParallelConfig,
)
from accel.state import AcceleratorState

VOCAB, DIM, HEADS, HIDDEN, SEQ = 32, 16, 4, 32, 8
SAMPLES, EVAL_SAMPLES, BATCH, LR, CLIP = 32, 10, 8, 1e-2, 0.5

#: The plan of :class:`TinyTransformer`: attention and MLP split Megatron-style.
PLAN = {
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.o": "rowwise",
    "blocks.*.mlp.up": "colwise",
    "blocks.*.mlp.down": "rowwise",
}
#: Parameters the plan splits over ``tp`` (row-wise biases stay whole on every tp rank).
TP_SPLIT = ("attn.q.", "attn.k.", "attn.v.", "attn.o.weight", "mlp.up.", "mlp.down.weight")

LAYOUTS: dict[str, dict[str, int]] = {
    "dp_shard2_tp2": {"dp_shard_size": 2, "tp_size": 2},
    "hsdp2x2": {"dp_replicate_size": 2, "dp_shard_size": 2},
    "tp4": {"tp_size": 4},
    "dp_shard4": {"dp_shard_size": 4},
    # FSDP settings from a plugin: each Block its own unit (inner first, then the root) with
    # activation checkpointing, after tensor parallelism.
    "blocks_ac_dp_shard2_tp2": {"dp_shard_size": 2, "tp_size": 2},
    "ddp4": {"dp_replicate_size": 4},
}


class Attention(torch.nn.Module):
    """Causal self-attention; the head count follows the (possibly split) projection width."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head = dim // heads
        self.q = torch.nn.Linear(dim, dim)
        # No key bias: attention ignores it (its gradient is rounding noise, which Adam's
        # normalised steps would turn into lr-sized differences between runs).
        self.k = torch.nn.Linear(dim, dim, bias=False)
        self.v = torch.nn.Linear(dim, dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        head = self.head

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, -1, head).transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Block(torch.nn.Module):
    """A plain pre-norm transformer block."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(torch.nn.Module):
    """Embedding, two blocks, a head; carries its tensor-parallel plan as transformers models do."""

    tp_plan = PLAN

    def __init__(self, dim: int = DIM, heads: int = HEADS, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.blocks = torch.nn.ModuleList([Block(dim, heads, hidden) for _ in range(2)])
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(**sizes: int) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(**sizes)


def dataset(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (count, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def reference(epochs: int = 2, **sizes: int) -> dict[str, Any]:
    """One process, plain torch: AdamW with clipping on whole batches, then evaluation logits."""
    model = make_model(**sizes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train, evaluation = dataset(SAMPLES, 1), dataset(EVAL_SAMPLES, 2)
    losses, norms, logits, weights = [], [], None, None
    for epoch in range(epochs):
        for start in range(0, SAMPLES, BATCH):
            loss = lm_loss(model, train[start : start + BATCH])
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        if epoch == 0:
            weights = {key: value.clone() for key, value in model.state_dict().items()}
            with torch.no_grad():
                logits = model(evaluation[:, :-1])
    assert logits is not None and weights is not None
    return {"losses": losses, "norms": norms, "eval_logits": logits, "weights": weights}


def loaders(dp_size: int) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    """Each data-parallel rank's share of the global batch of :data:`BATCH` samples."""
    share = BATCH // dp_size
    train = torch.utils.data.DataLoader(dataset(SAMPLES, 1), batch_size=share)
    evaluation = torch.utils.data.DataLoader(dataset(EVAL_SAMPLES, 2), batch_size=share)
    return train, evaluation


def fractions(model: torch.nn.Module) -> dict[str, float]:
    """Each parameter's local share of its full size on this rank."""
    from torch.distributed.tensor import DTensor

    from accel.strategies.fsdp.strategy import clean_name  # without activation-checkpoint wrappers

    out = {}
    model = getattr(model, "module", model)  # inside DDP
    for name, parameter in model.named_parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        out[clean_name(name)] = local.numel() / parameter.numel()
    return out


def expected_fraction(name: str, sizes: dict[str, int]) -> float:
    """What a rank should hold of parameter ``name`` under ``sizes`` (FSDP shard x TP split)."""
    tp = sizes.get("tp_size", 1) if any(part in name for part in TP_SPLIT) else 1
    return 1.0 / (tp * sizes.get("dp_shard_size", 1))


def prepare(
    accelerator: Accelerator, epochs_done: int = 0
) -> tuple[Any, Any, Any, Any, torch.nn.Module]:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # built before prepare
    train, evaluation = loaders(accelerator.state.partial.data_parallel_size)
    prepared = accelerator.prepare(model, optimizer, train, evaluation)
    return (*prepared, model)


def run_epoch(accelerator: Accelerator, model: Any, optimizer: Any, loader: Any) -> dict[str, list]:
    losses, norms = [], []
    for tokens in loader:
        loss = lm_loss(model, tokens)
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    return {"losses": losses, "norms": norms}


def evaluate(accelerator: Accelerator, model: Any, loader: Any) -> torch.Tensor:
    model.eval()
    gathered = []
    with torch.no_grad():
        for tokens in loader:
            gathered.append(accelerator.gather_for_metrics(model(tokens[:, :-1])))
    model.train()
    return torch.cat(gathered)


def describe(accelerator: Accelerator) -> dict[str, Any]:
    mesh = accelerator.torch_device_mesh
    return {
        "type": accelerator.distributed_type.value,
        "strategy": accelerator.strategy.name,
        "mesh": None if mesh is None else list(mesh.mesh_dim_names),
        "dp_rank": accelerator.data_parallel_rank,
        "dp_shard_rank": accelerator.data_parallel_shard_rank,
        "tp_rank": accelerator.tensor_parallel_rank,
        "cp_rank": accelerator.context_parallel_rank,
        "dp_size": accelerator.state.partial.data_parallel_size,
        "dp_index": accelerator.state.partial.data_parallel_process_index,
        "composable": accelerator.is_composable_parallelism_enabled,
    }


def fresh(config: ParallelismConfig, **kwargs: Any) -> Accelerator:
    """A new Accelerator on ``config`` in this process (the process group stays)."""
    AcceleratorState._reset_state()
    return Accelerator(parallelism_config=config, **kwargs)


def layouts_job(checkpoint: str) -> dict[str, Any]:
    """Every layout through ``Accelerator(parallelism_config=...)``; the 2x2 -> 4x1 / 1x4 resume."""
    results: dict[str, Any] = {}
    for name, sizes in LAYOUTS.items():
        # dp_shard 2 x tp 2 takes its plan from TorchTensorParallelConfig, tp 4 from the model.
        handler = TorchTensorParallelConfig(plan=PLAN) if name == "dp_shard2_tp2" else None
        options: dict[str, Any] = {}
        if name.startswith("blocks_ac"):
            options["fsdp_plugin"] = FullyShardedDataParallelPlugin(
                auto_wrap_policy="transformer_based_wrap",
                transformer_cls_names_to_wrap=["Block"],
                activation_checkpointing=True,
            )
        accelerator = fresh(ParallelismConfig(**sizes, tp_handler=handler), **options)
        model, optimizer, train, evaluation, _ = prepare(accelerator)
        report = describe(accelerator)
        report["fractions"] = fractions(model)
        report.update(run_epoch(accelerator, model, optimizer, train))
        if name == "dp_shard2_tp2":
            accelerator.save_state(checkpoint)
            accelerator.save_model(model, f"{checkpoint}_model")
            report["units"] = sorted(
                type(module).__name__
                for module in model.modules()
                if type(module).__name__.startswith("FSDP")
            )
        if name.startswith("blocks_ac"):
            report["units"] = sorted(
                type(module).__name__
                for module in model.modules()
                if type(module).__name__.startswith(("FSDP", "Checkpoint"))
            )
        if name in ("dp_shard2_tp2", "tp4"):
            report["full_state"] = {
                key: value.clone() for key, value in accelerator.get_state_dict(model).items()
            }
        report["eval_logits"] = evaluate(accelerator, model, evaluation)
        report["next"] = run_epoch(accelerator, model, optimizer, train)["losses"][0]
        results[name] = report
    for name in ("dp_shard4", "tp4"):
        accelerator = fresh(ParallelismConfig(**LAYOUTS[name]))
        model, optimizer, train, _, _ = prepare(accelerator)
        accelerator.load_state(checkpoint)
        results[f"resumed_{name}"] = run_epoch(accelerator, model, optimizer, train)["losses"][0]
    results["split_by_its_library"] = split_by_its_library()
    results["fp8"] = fp8_with_tensor_parallelism()
    results["refusals"] = refusals()
    AcceleratorState._reset_state()
    results["groups_alive_after_exit"] = groups_alive_after_exit_hooks()
    return results


def split_by_its_library() -> dict[str, Any]:
    """transformers' order for a ``from_pretrained(tp_plan=...)`` model, on tp 4.

    The library splits the model itself, the Trainer prepares it with ``evaluation_mode=True``
    (no wrapper) and then prepares the optimizer on its own; one epoch.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    from accel.strategies.mesh.tensor_parallel import resolve_plan

    accelerator = fresh(ParallelismConfig(tp_size=4))
    model = make_model()
    tp_mesh = accelerator.torch_device_mesh["tp"]
    parallelize_module(model, tp_mesh, resolve_plan(model, PLAN))
    model = accelerator.prepare_model(model, device_placement=False, evaluation_mode=True)
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=LR))
    train, _ = loaders(accelerator.state.partial.data_parallel_size)
    train = accelerator.prepare(train)
    return run_epoch(accelerator, model, optimizer, train)


def _mesh_groups(parallel_mesh: Any) -> list[Any]:
    """Every process group of a ``ParallelMesh``: its world mesh's registry (torch >= 2.10
    keeps them there), else each dimension's group of the world and flattened meshes."""
    world = parallel_mesh.world_mesh
    registry = getattr(world, "_pg_registry", None)
    if isinstance(registry, dict):
        return list(registry.values())
    meshes = [world, *parallel_mesh._flattened.values()]
    return [mesh.get_group(dim) for mesh in meshes for dim in range(mesh.ndim)]


def groups_alive_after_exit_hooks() -> int:
    """Run the exit hooks now: how many process groups of the job's meshes stay alive.

    Alive after the default group is destroyed, a group keeps its gloo threads until interpreter
    shutdown, where one still finishing a collective aborts the process.
    """
    import gc
    import weakref

    import torch.distributed as dist

    from accel_state import device_mesh, group_keeper, process_group

    groups = [dist.group.WORLD] + [
        group for mesh in list(device_mesh._BUILT) for group in _mesh_groups(mesh)
    ]
    refs = [weakref.ref(group) for group in groups]
    del groups
    process_group.stop_at_exit()  # what a normal interpreter exit runs
    group_keeper.free_destroyed_groups()
    gc.collect()
    return sum(ref() is not None for ref in refs)


#: Widths fp8 converts (torchao's Float8Linear needs dimensions divisible by 16).
FP8_SIZES = {"dim": 32, "heads": 2, "hidden": 64}


def fp8_with_tensor_parallelism() -> dict[str, Any] | None:
    """fp8 (torchao) on dp_shard 2 x tp 2: converted first, then split, then sharded; one epoch.

    ``None`` when fp8 through torchao cannot run here (``torchao_skip_reason``).
    """
    from torch_support import torchao_skip_reason

    if torchao_skip_reason() is not None:
        return None
    from torch.distributed.tensor import DTensor

    AcceleratorState._reset_state()
    accelerator = Accelerator(
        mixed_precision="fp8", parallelism_config=ParallelismConfig(**LAYOUTS["dp_shard2_tp2"])
    )
    model = make_model(**FP8_SIZES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train, _ = loaders(accelerator.state.partial.data_parallel_size)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    # (The model's first and last linear layers stay in high precision by default, as in
    # Accelerate; the MLP's are converted.)
    up = model.blocks[0].mlp.up
    report = {
        "up_kind": type(up).__name__,
        "up_mesh": list(up.weight.device_mesh.mesh_dim_names)
        if isinstance(up.weight, DTensor)
        else None,
        **run_epoch(accelerator, model, optimizer, train),
    }
    AcceleratorState._reset_state()
    return report


def _error(config_kwargs: dict[str, Any], **accelerator_kwargs: Any) -> str:
    AcceleratorState._reset_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Accelerator(parallelism_config=ParallelismConfig(**config_kwargs), **accelerator_kwargs)
    except Exception as error:  # noqa: BLE001 - the test reads the message
        return f"{type(error).__name__}: {error}"
    finally:
        AcceleratorState._reset_state()
    return "no error"


def refusals() -> dict[str, str]:
    """What a 4-process job refuses, each message as raised."""
    return {
        "product": _error({"dp_shard_size": 3}),
        "fsdp1_tp": _error(
            {"dp_shard_size": 2, "tp_size": 2},
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1),
        ),
        "fsdp_replicate_only": _error(
            {"dp_replicate_size": 4}, fsdp_plugin=FullyShardedDataParallelPlugin()
        ),
        "sequence_parallel": _error({"sp_size": 4}),
        "context_parallel_cpu": _error({"dp_shard_size": 2, "cp_size": 2}),
        "no_plan": _no_plan_error(),
    }


def _no_plan_error() -> str:
    AcceleratorState._reset_state()
    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=4))
    try:
        accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    except Exception as error:  # noqa: BLE001 - the test reads the message
        return f"{type(error).__name__}: {error}"
    finally:
        AcceleratorState._reset_state()
    return "no error"


def launched_script(output: str, checkpoint: str, resume: bool) -> dict[str, Any]:
    """The everyday loop in a launched job: the layout comes from the launcher only.

    Without ``resume``: train an epoch, evaluate under no_grad, save_state. With it: load_state
    (saved by another launch, possibly on another layout) and train the next epoch.
    """
    accelerator = Accelerator()
    model, optimizer, train, evaluation, _ = prepare(accelerator)
    report = describe(accelerator)
    config = accelerator.parallelism_config
    report["sizes"] = (
        None
        if config is None
        else {
            key: getattr(config, key) for key in ("dp_replicate_size", "dp_shard_size", "tp_size")
        }
    )
    if resume:
        accelerator.load_state(checkpoint)
        report.update(run_epoch(accelerator, model, optimizer, train))
    else:
        report.update(run_epoch(accelerator, model, optimizer, train))
        report["eval_logits"] = evaluate(accelerator, model, evaluation).tolist()
        accelerator.save_state(checkpoint)
    accelerator.wait_for_everyone()
    report["rank"] = accelerator.process_index
    report["fractions"] = fractions(model)
    return report


# ---------------------------------------------------------------------- context parallel (CUDA)
#: Head dimension 32 and a sequence divisible by 2 * cp: what torch's load-balanced causal ring
#: attention and the memory-efficient SDPA kernel (float32) need.
CP_SIZES = {"dim": 64, "heads": 2, "hidden": 128}
CP_SEQ = 16


def _cp_batches() -> list[torch.Tensor]:
    data = torch.randint(
        0, VOCAB, (SAMPLES, CP_SEQ + 1), generator=torch.Generator().manual_seed(3)
    )
    return [data[start : start + BATCH] for start in range(0, SAMPLES, BATCH)]


def context_parallel_reference() -> list[float]:
    """One process on the CPU: the whole sequence of every batch."""
    model = make_model(**CP_SIZES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in _cp_batches():
        loss = lm_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def context_parallel_job() -> dict[str, Any]:
    """cp 2 on 2 GPUs: each rank attends over half of every sequence (ring attention)."""
    accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=2))
    model = make_model(**CP_SIZES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for tokens in _cp_batches():
        tokens = tokens.to(accelerator.device)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        with accelerator.maybe_context_parallel(
            buffers=[inputs, labels], buffer_seq_dims=[1, 1], no_restore_buffers={inputs, labels}
        ):
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    report = describe(accelerator)
    report.update(losses=losses, rank=accelerator.process_index, fractions=fractions(model))
    return report


def close(got: list[float], want: list[float], tolerance: float = 1e-5) -> bool:
    return len(got) == len(want) and all(
        math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
        for a, b in zip(got, want, strict=True)
    )


__all__ = ["layouts_job", "launched_script", "reference"]
