"""Plain ``torchrun`` (no accel launcher) on a CPU-only machine trains as one job."""

import json
import textwrap

from accel_state.testing import run_torchrun

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from torch.utils.data import DataLoader, TensorDataset
    from accel import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(accelerator.process_index)  # different init per rank: DDP must broadcast rank 0's
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.arange(48.0).reshape(16, 3) / 48, torch.ones(16, 1))
    loader = DataLoader(data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        batches += 1
    weights = [round(v, 6) for v in accelerator.unwrap_model(model).weight.flatten().tolist()]
    sys.stdout.write("RESULT " + json.dumps({
        "rank": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "type": accelerator.distributed_type.value,
        "batches": batches,
        "weights": weights,
    }) + "\\n")  # one write per line: print's separate newline lets ranks interleave
    sys.stdout.flush()
    accelerator.end_training()
    """
)


def test_plain_torchrun_trains_one_two_process_job(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = run_torchrun([str(script)], nproc_per_node=2, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [
        json.loads(line.removeprefix("RESULT "))
        for line in result.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["num_processes"] for r in reports} == {2}
    assert {r["type"] for r in reports} == {"MULTI_CPU"}
    assert {r["batches"] for r in reports} == {4}  # 16 samples / (batch 2 x 2 processes)
    assert reports[0]["weights"] == reports[1]["weights"]


EXIT_SCRIPT = textwrap.dedent(
    """
    import atexit, gc, sys, weakref
    import torch
    import torch.distributed as dist

    groups = []

    def report():  # registered first, so it runs after accel's own exit hooks
        gc.collect()
        sys.stdout.write(f"EXIT freed={groups[0]() is None} initialized={dist.is_initialized()}\\n")
        sys.stdout.flush()

    atexit.register(report)
    from accel import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(4, 3)).sum())
    optimizer.step()
    groups.append(weakref.ref(dist.group.WORLD))
    gathered = accelerator.gather_for_metrics(torch.tensor([accelerator.process_index]))
    if "END" in sys.argv:
        accelerator.end_training()
    # The DDP wrapper stays referenced here until the interpreter shuts down.
    """
)


def test_exit_frees_the_group_held_by_a_ddp_wrapper(tmp_path):
    # A group kept alive past interpreter shutdown keeps gloo threads that may need the GIL then,
    # which aborts the process; accel destroys the group and detaches DDP from it at exit.
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    for extra in ([], ["END"]):
        result = run_torchrun([str(script), *extra], nproc_per_node=2, timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("EXIT freed=True initialized=False") == 2, (
            extra,
            result.stdout,
            result.stderr[-2000:],
        )
