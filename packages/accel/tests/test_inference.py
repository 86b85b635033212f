"""prepare_pippy: pipeline-parallel inference on torch.distributed.pipelining, 2 CPU processes."""

import inference_workers
import pytest
import torch

from accel import AcceleratorConfigError, prepare_pippy
from accel.inference import generate_split_points
from accel_state.testing import spawn_workers

pytestmark = pytest.mark.timeout(600)


def test_two_stage_pipeline_equals_the_whole_model():
    reports = spawn_workers(inference_workers.pippy_job, 2, timeout=500)
    for report in reports:
        assert report["split_points"] == ["layers.2"]  # the auto split halves the weights
        assert report["gathered"] is True  # gather_output: every process gets it
    assert reports[0]["output"] is None  # without gather_output only the last process has it
    assert reports[1]["output"] is True


def test_auto_split_points_balance_sizes_and_keep_blocks_whole():
    model, _ = inference_workers.make()
    # embed 448 B, four layers of 1088 B, head 204 B
    assert generate_split_points(model, 2) == ["layers.2"]
    assert generate_split_points(model, 3) == ["layers.1", "layers.3"]
    assert generate_split_points(model, 6) == [
        "layers.0",
        "layers.1",
        "layers.2",
        "layers.3",
        "head",
    ]
    with pytest.raises(AcceleratorConfigError, match="fewer than the 7 stages"):
        generate_split_points(model, 7)
    with pytest.raises(AcceleratorConfigError, match="0 module"):
        generate_split_points(model, 2, no_split_module_classes=["Stack"])


def test_example_inputs_are_required():
    model, _ = inference_workers.make()
    with pytest.raises(AcceleratorConfigError, match="example_args"):
        prepare_pippy(model)


def test_generate_device_map_spreads_blocks_over_the_processes():
    from accel.inference import generate_device_map

    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)])
    # Accelerate 1.15 gives the same map for this model (checked beside it).
    assert generate_device_map(model, 3) == {"0": 0, "1": 0, "2": 1, "3": 1, "4": 1, "5": 2}
    whole = generate_device_map(model, 1)
    assert set(whole) == {str(i) for i in range(6)}  # clean_result=False: every block listed
    assert set(whole.values()) == {"cpu"}


def test_find_pippy_batch_size_takes_the_first_input_with_one():
    from accel.inference import find_pippy_batch_size

    assert find_pippy_batch_size((None, torch.zeros(3, 2)), {"x": torch.zeros(5)}) == 3
    assert find_pippy_batch_size(None, {"mask": None, "x": torch.zeros(5, 1)}) == 5
    assert find_pippy_batch_size((), None) is None


def test_pippy_forward_takes_accelerates_forward_parameter():
    from accel.inference import pippy_forward

    calls = []

    def forward(x, scale=1):
        calls.append(x)
        return x * scale

    # One process: the step runs with the inputs and its output is returned.
    out = pippy_forward(forward, 1, False, torch.ones(2), scale=3)
    assert torch.equal(out, torch.full((2,), 3.0))
    assert len(calls) == 1
