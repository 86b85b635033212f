"""Functions run inside spawned worker processes (importable by module name)."""

from __future__ import annotations

import torch
from data_helpers import SizedStream, Stream, numbers, values
from torch.utils.data import DataLoader

from accel_data import prepare_data_loader, set_seed, synchronize_rng_states
from accel_state import GradientState, PartialState


def length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable dataset without __len__
        return None


def run_epochs(loader, count: int) -> list[dict]:
    """Per epoch: the batches' values, the end flags seen with each, the last remainder, len()."""
    gradient_state = GradientState()
    results = []
    for _ in range(count):
        batches, ends = [], []
        for batch in loader:
            batches.append(values(batch))
            ends.append(gradient_state.end_of_dataloader)
        results.append(
            {
                "batches": batches,
                "ends": ends,
                "remainder": gradient_state.remainder if ends else None,
                "len": length(loader),
            }
        )
    return results


def sharding_job(configs: list[dict]) -> dict:
    """Shuffled and sequential sharding, twice with the same seeds, plus raw RNG synchronisation."""
    state = PartialState()
    out: dict = {"configs": []}
    for config in configs:
        runs = []
        for _ in range(2):
            # Each process starts from another seed: only the synchronisation makes them agree.
            set_seed(config.get("seed", 0), device_specific=True)
            loader = DataLoader(
                numbers(config["size"]),
                batch_size=config["batch_size"],
                shuffle=config["shuffle"],
                drop_last=config["drop_last"],
            )
            prepared = prepare_data_loader(
                loader,
                split_batches=config["split"],
                even_batches=config["even"],
                use_seedable_sampler=config.get("seedable", False),
            )
            runs.append(run_epochs(prepared, 2))
        out["configs"].append(runs)
    set_seed(state.process_index)
    generator = torch.Generator().manual_seed(state.process_index)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    out["torch_draw"] = float(torch.rand(1))
    out["generator_draw"] = float(torch.rand(1, generator=generator))
    return out


def dispatch_job(configs: list[dict]) -> list:
    """Process 0 reads and dispatches map-style and iterable datasets."""
    results = []
    for config in configs:
        if config["kind"] == "map":
            dataset = numbers(config["size"])
        elif config["kind"] == "sized_stream":
            dataset = SizedStream(config["size"])
        else:
            dataset = Stream(config["size"])
        loader = DataLoader(dataset, batch_size=config["batch_size"], drop_last=config["drop_last"])
        prepared = prepare_data_loader(
            loader,
            put_on_device=True,
            dispatch_batches=True if config["kind"] == "map" else None,
            split_batches=config["split"],
            even_batches=config["even"],
        )
        results.append(run_epochs(prepared, 1)[0] | {"type": type(prepared).__name__})
    return results


# DataLoader worker processes are covered in test_resume.py: spawn_workers starts daemonic
# processes, which may not have children.
RESUME_MODES = {
    "shuffle": lambda: (DataLoader(numbers(29), batch_size=2, shuffle=True), {}),
    "seedable": lambda: (
        DataLoader(numbers(29), batch_size=2, shuffle=True),
        {"use_seedable_sampler": True},
    ),
    "split": lambda: (DataLoader(numbers(29), batch_size=6, shuffle=True), {"split_batches": True}),
    "iterable_shard": lambda: (
        DataLoader(SizedStream(29, shuffle=True), batch_size=2),
        {"dispatch_batches": False},
    ),
    "dispatch": lambda: (
        DataLoader(numbers(29), batch_size=2, shuffle=True),
        {"dispatch_batches": True, "put_on_device": True},
    ),
    "dispatch_stream": lambda: (
        DataLoader(Stream(29, shuffle=True), batch_size=2),
        {"put_on_device": True},
    ),
}


def build_for_resume(mode: str, seed: int):
    set_seed(seed, device_specific=True)
    loader, options = RESUME_MODES[mode]()
    return prepare_data_loader(loader, **options)


def scenario_job(sharding: list[dict], dispatch: list[dict]) -> dict:
    """Both scenario lists in one job (each spawn costs seconds)."""
    return {"sharding": sharding_job(sharding), "dispatch": dispatch_job(dispatch)}


def resume_phase_one(modes: list[str], stop: int) -> dict:
    """The uninterrupted run (2 epochs), then a run stopped after ``stop`` batches and its state."""
    out = {}
    for mode in modes:
        reference = [[values(b) for b in loader] for loader in [build_for_resume(mode, 5)] * 2]
        interrupted = build_for_resume(mode, 5)
        for step, _ in enumerate(interrupted):
            if step + 1 == stop:
                break
        out[mode] = {
            "reference": reference,
            "state": interrupted.state_dict(),
            "rng": torch.get_rng_state(),  # what save_state keeps next to the loader's state
        }
    return out


def resume_phase_two(modes: list[str], states: list[dict]) -> dict:
    """In a fresh process: load the state and run the rest of the epoch and the next one."""
    rank = PartialState().process_index
    out = {}
    for mode in modes:
        loader = build_for_resume(mode, 1000)
        loader.load_state_dict(states[rank][mode]["state"])
        torch.set_rng_state(states[rank][mode]["rng"])
        out[mode] = [[values(b) for b in loader] for _ in range(2)]
    return out


def mesh_job(sharding: list[dict], dispatch: list[dict]) -> dict:
    """The scenarios again under an active dp_shard 2 x tp 2 mesh (accel-state's ParallelMesh)."""
    from accel_state import ParallelismConfig
    from accel_state.device_mesh import ParallelMesh, activate

    PartialState()  # starts the process group the mesh is built on
    mesh = ParallelMesh(ParallelismConfig(dp_shard_size=2, tp_size=2), "cpu")
    activate(mesh)
    try:
        return scenario_job(sharding, dispatch) | {"dp_index": mesh.data_parallel_rank}
    finally:
        activate(None)
