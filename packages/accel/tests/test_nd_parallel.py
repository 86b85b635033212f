"""N-D parallelism (``ParallelismConfig``): HSDP, tensor parallelism and FSDP2 on one device mesh.

Real jobs of 4 CPU processes over gloo, compared with one plain process on the same data: through
``Accelerator(parallelism_config=...)`` (one spawned job checks every layout, the cross-layout
resume and the refusals) and through ``accel launch --parallelism_config_*`` (the everyday loop:
train, evaluate, save_state in one launch, resume in a fresh launch on another layout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import nd_workers
import pytest
import torch
from torch_support import torchao_skip_reason

from accel import (
    Accelerator,
    AcceleratorConfigError,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from accel.strategies.mesh.tensor_parallel import parse_style, resolve_plan
from accel_state import ParallelismConfigError
from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these 4-process jobs may take minutes.
pytestmark = [pytest.mark.timeout(900), pytest.mark.torch_feature("device_mesh")]

TESTS = Path(__file__).resolve().parent
WORLD = 4
STEPS = nd_workers.SAMPLES // nd_workers.BATCH  # optimizer steps per epoch


@pytest.fixture(scope="module")
def reference() -> dict:
    return nd_workers.reference()


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nd") / "checkpoint"


@pytest.fixture(scope="module")
def layouts(checkpoint_dir) -> list[dict]:
    return spawn_workers(nd_workers.layouts_job, WORLD, args=(str(checkpoint_dir),), timeout=900)


def test_every_layout_trains_like_one_process(layouts, reference):
    """dp_shard 2 x tp 2, dp_replicate 2 x dp_shard 2, tp 4, dp_shard 4 (and per-block FSDP
    with activation checkpointing on dp_shard 2 x tp 2, and DDP through dp_replicate 4): same
    losses, same clipped gradient norms (taken over every mesh dimension), same evaluation
    outputs."""
    for name in nd_workers.LAYOUTS:
        for rank in layouts:
            run = rank[name]
            assert nd_workers.close(run["losses"], reference["losses"][:STEPS]), name
            assert nd_workers.close(run["norms"], reference["norms"][:STEPS]), name
            # gather_for_metrics over the data-parallel ranks: exactly the 10 evaluation samples
            assert run["eval_logits"].shape == reference["eval_logits"].shape, name
            torch.testing.assert_close(
                run["eval_logits"], reference["eval_logits"], atol=1e-5, rtol=1e-5
            )
            assert nd_workers.close([run["next"]], [reference["losses"][STEPS]]), name


def test_a_model_its_library_split_trains_after_an_unwrapped_prepare(layouts, reference):
    """transformers' Trainer order for a tp_plan model: the model is split by transformers,
    prepared with ``evaluation_mode=True``, and its optimizer prepared afterwards on its own."""
    for rank in layouts:
        run = rank["split_by_its_library"]
        assert nd_workers.close(run["losses"], reference["losses"][:STEPS])
        assert nd_workers.close(run["norms"], reference["norms"][:STEPS])


def test_strategy_mesh_and_ranks_follow_the_layout(layouts):
    expected = {
        "dp_shard2_tp2": ("FSDP", ["dp_shard", "tp"], 2, "N-D parallel (DeviceMesh)"),
        "hsdp2x2": ("FSDP", ["dp_replicate", "dp_shard"], 4, "N-D parallel (DeviceMesh)"),
        "tp4": ("MULTI_CPU", ["tp"], 1, "N-D parallel (DeviceMesh)"),
        "dp_shard4": ("FSDP", ["dp_shard"], 4, "N-D parallel (DeviceMesh)"),
        "ddp4": ("MULTI_CPU", ["dp_replicate"], 4, "DistributedDataParallel"),
    }
    for index, rank in enumerate(layouts):
        for name, (kind, mesh, dp_size, strategy) in expected.items():
            run = rank[name]
            assert (run["type"], run["mesh"], run["dp_size"]) == (kind, mesh, dp_size), name
            assert run["strategy"] == strategy, name
            assert run["composable"] is (name != "ddp4")
            assert run["cp_rank"] == 0
        assert layouts[index]["ddp4"]["dp_rank"] == index
        # Ranks are laid out row-major: the last dimension varies fastest.
        assert layouts[index]["dp_shard2_tp2"]["tp_rank"] == index % 2
        assert layouts[index]["dp_shard2_tp2"]["dp_shard_rank"] == index // 2
        assert layouts[index]["dp_shard2_tp2"]["dp_index"] == index // 2
        assert layouts[index]["hsdp2x2"]["dp_rank"] == index // 2
        assert layouts[index]["hsdp2x2"]["dp_shard_rank"] == index % 2
        assert layouts[index]["hsdp2x2"]["dp_index"] == index
        assert layouts[index]["tp4"]["tp_rank"] == index
        assert layouts[index]["tp4"]["dp_index"] == 0


def test_fsdp_units_and_activation_checkpointing_after_tensor_parallelism(layouts):
    """Without FSDP settings the root is the one unit; with a plugin's transformer-based wrap
    each Block is its own unit, checkpointed, inside the root unit."""
    assert layouts[0]["dp_shard2_tp2"]["units"] == ["FSDPTinyTransformer"]
    units = layouts[0]["blocks_ac_dp_shard2_tp2"]["units"]
    assert units.count("FSDPBlock") == 2 and units.count("FSDPTinyTransformer") == 1
    assert units.count("CheckpointWrapper") == 2


def test_each_rank_holds_the_expected_fraction_of_each_weight(layouts, reference):
    for name, sizes in nd_workers.LAYOUTS.items():
        for rank in layouts:
            held = rank[name]["fractions"]
            assert set(held) == set(reference["weights"]), name
            for parameter, fraction in held.items():
                want = nd_workers.expected_fraction(parameter, sizes)
                assert fraction == pytest.approx(want), (name, parameter)


def test_plain_transformer_trained_with_a_tp_plan_equals_the_unsplit_model(layouts, reference):
    """The model's own ``tp_plan`` (tp 4) and a plan in TorchTensorParallelConfig (dp_shard 2 x
    tp 2): after an epoch, get_state_dict gives the full weights of the plain one-process model."""
    for name in ("tp4", "dp_shard2_tp2"):
        full = layouts[0][name]["full_state"]
        assert set(full) == set(reference["weights"])
        for key, value in reference["weights"].items():
            assert not hasattr(full[key], "device_mesh"), key  # plain tensors, full size
            torch.testing.assert_close(full[key], value, atol=1e-5, rtol=1e-5)


def test_save_model_writes_the_full_weights(layouts, checkpoint_dir, reference):
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint_dir.parent / "checkpoint_model" / "model.safetensors"))
    assert set(saved) == set(reference["weights"])
    for key, value in reference["weights"].items():
        torch.testing.assert_close(saved[key], value, atol=1e-5, rtol=1e-5)


def test_checkpoint_saved_on_2x2_resumes_on_4x1_and_1x4(layouts, reference):
    """save_state of DTensors on dp_shard 2 x tp 2, load_state on dp_shard 4 and on tp 4: the
    next step's loss is the one the uninterrupted run gets."""
    for rank in layouts:
        for resumed in ("resumed_dp_shard4", "resumed_tp4"):
            assert nd_workers.close([rank[resumed]], [reference["losses"][STEPS]]), resumed


def test_fp8_layers_are_converted_before_tensor_parallelism_splits_them(layouts):
    """mixed_precision='fp8' (torchao) on dp_shard 2 x tp 2: the split MLP projections are
    Float8Linear with DTensor weights on the 2-D mesh, and the epoch's losses stay within 5% of
    the float32 one-process run."""
    fp8 = layouts[0]["fp8"]
    if fp8 is None:
        pytest.skip(torchao_skip_reason() or "the workers found no usable torchao")
    assert fp8["up_kind"] == "Float8Linear"
    assert fp8["up_mesh"] == ["dp_shard_cp", "tp"]  # FSDP's shard dimension x the tp split
    fp32 = nd_workers.reference(epochs=1, **nd_workers.FP8_SIZES)["losses"]
    assert nd_workers.close(fp8["losses"], fp32, tolerance=5e-2)


def test_exit_frees_every_mesh_group(layouts):
    """At exit the meshes' and FSDP2's groups are dropped after the default group is destroyed,
    so each joins its gloo threads (a live one may abort interpreter shutdown)."""
    assert [rank["groups_alive_after_exit"] for rank in layouts] == [0] * WORLD


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("product", ["dp_replicate(1) * dp_shard(3) * cp(1) * sp(1) * tp(1) = 3", "WORLD_SIZE(4)"]),
        ("fsdp1_tp", ["AcceleratorConfigError", "needs FSDP2", "fsdp_version=2"]),
        ("fsdp_replicate_only", ["plain replication, which is DDP", "dp_shard_size > 1"]),
        ("sequence_parallel", ["UnsupportedFeatureError", "UlyssesSPAttentionHF", "transformers"]),
        ("context_parallel_cpu", ["UnsupportedFeatureError", "only has CUDA kernels", "cp_size=1"]),
        ("no_plan", ["needs a tensor-parallel plan", "TorchTensorParallelConfig(plan="]),
    ],
)
def test_refusals_say_why_and_how_to_fix(layouts, case, words):
    message = layouts[0]["refusals"][case]
    for word in words:
        assert word in message, message


# ---------------------------------------------------------------------- through the launcher
HSDP_YAML = textwrap.dedent(
    """
    compute_environment: LOCAL_MACHINE
    distributed_type: MULTI_CPU
    mixed_precision: 'no'
    num_machines: 1
    num_processes: 4
    use_cpu: true
    parallelism_config:
      parallelism_config_dp_replicate_size: 2
      parallelism_config_dp_shard_size: 2
      parallelism_config_tp_size: 1
      parallelism_config_cp_size: 1
    """
)


def _launch(arguments: list[str], output: Path, home: Path, *extra: str) -> list[dict]:
    prefixes = ("ACCEL_", "PARALLELISM_CONFIG_", "ACCELERATE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(home), CUDA_VISIBLE_DEVICES="")
    output.mkdir()
    script = [str(TESTS / "nd_launch_script.py"), str(output), str(home / "checkpoint"), *extra]
    command = [sys.executable, "-m", "accel_launch.cli", "launch", *arguments, *script]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=800, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, list[dict]]:
    home = tmp_path_factory.mktemp("nd_launch")
    flags = [
        "--cpu",
        "--num_processes",
        "4",
        "--use_parallelism_config",
        "--parallelism_config_dp_shard_size",
        "2",
        "--parallelism_config_tp_size",
        "2",
    ]
    first = _launch(flags, home / "first", home)
    config = home / "hsdp.yaml"
    config.write_text(HSDP_YAML)
    resumed = _launch(["--config_file", str(config)], home / "resumed", home, "--resume")
    return {"first": first, "resumed": resumed}


def test_launcher_flags_train_evaluate_and_save_like_one_process(launched, reference):
    for rank in launched["first"]:
        assert rank["sizes"] == {"dp_replicate_size": 1, "dp_shard_size": 2, "tp_size": 2}
        assert (rank["type"], rank["mesh"]) == ("FSDP", ["dp_shard", "tp"])
        assert nd_workers.close(rank["losses"], reference["losses"][:STEPS])
        assert nd_workers.close(rank["norms"], reference["norms"][:STEPS])
        logits = torch.tensor(rank["eval_logits"])
        torch.testing.assert_close(logits, reference["eval_logits"], atol=1e-5, rtol=1e-5)
        for name, fraction in rank["fractions"].items():
            assert fraction == pytest.approx(
                nd_workers.expected_fraction(name, nd_workers.LAYOUTS["dp_shard2_tp2"])
            )


def test_fresh_launch_from_a_yaml_file_resumes_on_hsdp(launched, reference):
    """The checkpoint of the dp_shard x tp launch, loaded by an HSDP launch (config file keys):
    the second epoch continues exactly."""
    for rank in launched["resumed"]:
        assert rank["sizes"] == {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 1}
        assert (rank["type"], rank["mesh"]) == ("FSDP", ["dp_replicate", "dp_shard"])
        assert nd_workers.close(rank["losses"], reference["losses"][STEPS:])


# ---------------------------------------------------------------------- one process
def test_single_process_refuses_degrees_it_cannot_hold():
    with pytest.raises(ParallelismConfigError, match=r"tp\(2\) = 2 != WORLD_SIZE\(1\)"):
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2))


def test_a_config_of_ones_on_one_process_builds_no_mesh():
    accelerator = Accelerator(parallelism_config=ParallelismConfig())
    assert accelerator.torch_device_mesh is None
    assert accelerator.tensor_parallel_rank == 0 and accelerator.data_parallel_rank == 0
    assert accelerator.parallelism_config.total_size == 1


def test_ranks_without_a_config_say_how_to_configure():
    accelerator = Accelerator()
    with pytest.raises(RuntimeError, match="parallelism_config"):
        accelerator.tensor_parallel_rank  # noqa: B018
    with pytest.raises(RuntimeError, match="prepare_pippy"):
        accelerator.pipeline_parallel_rank  # noqa: B018


def test_tensor_parallel_plugin_is_the_older_spelling_of_tp_size():
    plugin = TorchTensorParallelPlugin(tp_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(torch_tp_plugin=plugin)
    assert any(issubclass(w.category, FutureWarning) for w in caught)
    assert accelerator.parallelism_config.tp_size == 1
    with pytest.raises(AcceleratorConfigError, match="both given"):
        Accelerator(torch_tp_plugin=plugin, parallelism_config=ParallelismConfig())


def test_launcher_variables_build_the_config(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    accelerator = Accelerator()
    assert accelerator.parallelism_config is not None
    assert TorchContextParallelConfig().cp_comm_strategy == "alltoall"


def test_plan_patterns_expand_to_module_names_and_styles_parse():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = nd_workers.make_model()
    plan = resolve_plan(model, nd_workers.PLAN)
    assert sorted(plan) == sorted(
        f"blocks.{i}.{part}"
        for i in (0, 1)
        for part in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down")
    )
    assert isinstance(plan["blocks.0.attn.q"], ColwiseParallel)
    assert isinstance(plan["blocks.1.mlp.down"], RowwiseParallel)
    style = parse_style("x", {"style": "colwise", "output_layouts": "shard(1)"})
    assert style.output_layouts == (Shard(1),)
    assert parse_style("x", "colwise_rep").output_layouts == (Replicate(),)
    assert parse_style("x", "rowwise_rep").input_layouts == (Replicate(),)


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        ({"blocks.*.nope": "colwise"}, ["matches no module", "blocks.0.attn"]),
        ({"blocks.*.attn.q": "diagonal"}, ["'diagonal' is not supported", "colwise"]),
        ({"blocks.0.attn.q": "colwise", "blocks.*.attn.q": "rowwise"}, ["both match"]),
        ({"head": {"style": "colwise", "input_layouts": "sideways"}}, ["'sideways'", "shard("]),
        ({"head": {"style": "colwise", "gather": True}}, ["unknown option", "gather"]),
    ],
)
def test_bad_plans_name_the_key_and_the_fix(plan, words):
    with pytest.raises(AcceleratorConfigError) as caught:
        resolve_plan(nd_workers.make_model(), plan)
    for word in words:
        assert word in str(caught.value)


def test_handlers_and_async_tp_round_trip_through_to_json():
    config = ParallelismConfig(
        tp_size=2, tp_handler=TorchTensorParallelConfig(plan={"head": "colwise"})
    )
    data = config.to_json()
    assert data["tp_handler"]["plan"] == {"head": "colwise"}
    assert data["cp_handler"] is None and data["tp_size"] == 2


# ---------------------------------------------------------------------- context parallel (CUDA)
@pytest.mark.cuda(min_gpus=2)
def test_context_parallel_on_two_gpus_matches_one_process_and_shards_over_cp():
    """cp 2 on 2 GPUs: the losses of one process on whole sequences (ring attention), and FSDP2
    shards the parameters over the context-parallel ranks (dp_shard_cp joins cp)."""
    reports = spawn_workers(nd_workers.context_parallel_job, 2, timeout=600, use_cpu=False)
    single = nd_workers.context_parallel_reference()
    for report in reports:
        assert report["mesh"] == ["cp"] and report["cp_rank"] == report["rank"]
        assert nd_workers.close(report["losses"], single, tolerance=1e-3)
        assert all(fraction == pytest.approx(0.5) for fraction in report["fractions"].values())


def test_accelerator_state_takes_accelerates_plugin_arguments():
    from accel.errors import UnsupportedFeatureError
    from accel.state import AcceleratorState

    with pytest.raises(UnsupportedFeatureError, match="megatron_lm_plugin"):
        AcceleratorState(megatron_lm_plugin=object())
    plugin = TorchTensorParallelPlugin(tp_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        state = AcceleratorState(torch_tp_plugin=plugin)  # no Accelerator needed
    assert state.torch_tp_plugin is plugin
    assert state.parallelism_config.tp_size == 1
    assert plugin.torch_device_mesh is state.device_mesh
    AcceleratorState._reset_state(reset_partial_state=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        accelerator = Accelerator(torch_tp_plugin=plugin)
    assert accelerator.state.torch_tp_plugin is plugin
