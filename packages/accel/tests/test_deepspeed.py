"""DeepSpeed ZeRO 0-3 through ``accel launch`` on 2 CPU/gloo processes, against the same DDP run.

The launched jobs (``deepspeed_script.py``) run once per module: DDP, ZeRO-0 with the optimizer
from a config file (DummyOptim), ZeRO-1 from a config file of ``"auto"`` values, ZeRO-2 and
ZeRO-3 from launcher flags (both saving their state mid-run), the two resumed runs, and a run of
each of Accelerate's config templates (``data/deepspeed_templates``). Config resolution and error
messages are checked in-process without deepspeed (the templates' in ``test_deepspeed_templates``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from launched_jobs import Jobs, finish, run_waves, start

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.strategies.deepspeed.config import KnownValues, accumulation_steps, resolve_config
from accel.utils.deepspeed import DeepSpeedPlugin, import_deepspeed
from accel_state.contract import LaunchContract

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "deepspeed_script.py"
EXAMPLE_CONFIG = HERE.parents[2] / "examples" / "deepspeed" / "zero_auto.json"
TEMPLATES = HERE / "data" / "deepspeed_templates"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install 'accel[deepspeed]')"
)
KNOWN = KnownValues(
    micro_batch_size=4, gradient_accumulation_steps=2, mixed_precision="no", world_size=2
)
DUMMY_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 0},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": 0.01, "torch_adam": True},
    },
}


# ---------------------------------------------------------------------- config resolution
def test_auto_values_are_filled_from_what_the_accelerator_knows() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config=str(EXAMPLE_CONFIG), gradient_clipping=0.5)
    config = resolve_config(plugin, KNOWN)
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 4 * 2 * 2
    assert config["gradient_clipping"] == 0.5
    assert config["fp16"] == {"enabled": False} and config["bf16"] == {"enabled": False}
    assert config["zero_optimization"]["stage"] == 1
    bf16 = resolve_config(plugin, KnownValues(4, 2, "bf16", 2))
    assert bf16["bf16"] == {"enabled": True} and bf16["fp16"] == {"enabled": False}


@pytest.mark.parametrize(
    ("file", "plugin_fields", "known", "words"),
    [
        (
            {"train_micro_batch_size_per_gpu": 8},
            {},
            KNOWN,
            ["train_micro_batch_size_per_gpu=8", "4"],
        ),
        ({"zero_optimization": {"stage": 3}}, {"zero_stage": 2}, KNOWN, ["stage=3", "zero_stage"]),
        ({"fp16": {"enabled": True}}, {}, KNOWN, ["fp16.enabled=True", "mixed_precision='no'"]),
        ({"train_batch_size": 64}, {}, KNOWN, ["train_batch_size=64", "16"]),
        ({"gradient_clipping": 1.0}, {"gradient_clipping": 2.0}, KNOWN, ["1.0", "2.0"]),
    ],
)
def test_a_value_set_twice_differently_is_an_error_naming_both(
    file: dict[str, Any], plugin_fields: dict[str, Any], known: KnownValues, words: list[str]
) -> None:
    plugin = DeepSpeedPlugin(hf_ds_config=file, **plugin_fields)
    with pytest.raises(AcceleratorConfigError) as caught:
        resolve_config(plugin, known)
    for word in words:
        assert word in str(caught.value)


def test_accumulation_steps_from_three_places() -> None:
    assert accumulation_steps(DeepSpeedPlugin(), 4) == 4
    assert accumulation_steps(DeepSpeedPlugin(gradient_accumulation_steps=3), 1) == 3
    assert (
        accumulation_steps(DeepSpeedPlugin(hf_ds_config={"gradient_accumulation_steps": 5}), 1) == 5
    )
    with pytest.raises(AcceleratorConfigError, match=r"gradient_accumulation_steps=4.*=8"):
        accumulation_steps(DeepSpeedPlugin(hf_ds_config={"gradient_accumulation_steps": 8}), 4)


def test_unfillable_auto_and_missing_batch_size_are_reported() -> None:
    with pytest.raises(AcceleratorConfigError, match=r"zero_optimization\.reduce_bucket_size"):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"reduce_bucket_size": "auto"}}),
            KNOWN,
        )
    with pytest.raises(AcceleratorConfigError, match=r"same accelerator\.prepare call"):
        resolve_config(DeepSpeedPlugin(zero_stage=2), KnownValues(None, 1, "no", 2))
    with pytest.raises(AcceleratorConfigError, match="DummyOptim"):
        resolve_config(DeepSpeedPlugin(hf_ds_config=DUMMY_CONFIG), KNOWN)


def test_bad_config_files_and_fields_are_clear(tmp_path: Path) -> None:
    broken = tmp_path / "ds.json"
    broken.write_text('{"zero_optimization": {"stage": 2,}}')
    with pytest.raises(AcceleratorConfigError, match=r"ds.json.*not valid JSON.*line 1"):
        _ = DeepSpeedPlugin(hf_ds_config=str(broken)).config_file
    with pytest.raises(AcceleratorConfigError, match="no such file"):
        _ = DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json")).config_file
    with pytest.raises(AcceleratorConfigError, match="zero_stage=4"):
        DeepSpeedPlugin(zero_stage=4)
    with pytest.raises(AcceleratorConfigError, match="offload_param_device='gpu'"):
        DeepSpeedPlugin(offload_param_device="gpu")


def test_launcher_settings_become_a_plugin() -> None:
    env = {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCEL_DEEPSPEED_CONFIG": json.dumps(
            {
                "zero_stage": 3,
                "offload_param_device": "cpu",
                "gradient_accumulation_steps": 4,
                "deepspeed_config_file": "ds.json",
                "zero3_init_flag": True,
            }
        ),
    }
    contract = LaunchContract.from_env(env)
    assert contract.use_deepspeed
    plugin = DeepSpeedPlugin.from_launch_config(contract.deepspeed_config)
    assert (plugin.zero_stage, plugin.offload_param_device, plugin.hf_ds_config) == (
        3,
        "cpu",
        "ds.json",
    )
    assert plugin.zero3_init_flag and plugin.gradient_accumulation_steps is None


def test_missing_deepspeed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what Python does for a missing module
    with pytest.raises(UnsupportedFeatureError, match=r"accel\[deepspeed\]"):
        import_deepspeed()


def test_accelerator_without_deepspeed_installed_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accel import Accelerator

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(UnsupportedFeatureError, match=r"pip install 'accel\[deepspeed\]'"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))


def test_import_accel_does_not_import_deepspeed() -> None:
    code = (
        "import sys, accel, accel.utils\n"
        "from accel import Accelerator, DeepSpeedPlugin\n"
        "from accel.utils import DummyOptim, DummyScheduler\n"
        "import accel.strategies\n"
        "sys.exit('deepspeed' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# ---------------------------------------------------------------------- launched jobs
@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every launched job of this module, run once: the runs, then the resumed runs."""
    root = tmp_path_factory.mktemp("deepspeed")
    dummy = root / "dummy.json"
    dummy.write_text(json.dumps(DUMMY_CONFIG))
    clip = ["--gradient_clipping", "1.0"]
    runs: Jobs = {
        "ddp": ([], ["--save-model", str(root / "ddp_model")]),
        "zero0": (["--use_deepspeed", "--deepspeed_config_file", str(dummy)], ["--dummy"]),
        "zero1": (["--use_deepspeed", "--deepspeed_config_file", str(EXAMPLE_CONFIG), *clip], []),
        # bf16 weights, float32 batches: the engine's model casts them (DeepSpeed alone raises).
        "zero2_bf16": (["--use_deepspeed", "--zero_stage", "2", "--mixed_precision", "bf16"], []),
    }
    resumes: Jobs = {}
    for stage in (2, 3):
        flags = ["--use_deepspeed", "--zero_stage", str(stage), *clip]
        if stage == 3:
            flags += ["--zero3_init_flag", "true"]
        checkpoint = str(root / f"ckpt{stage}")
        saving = ["--save-at", "3", "--checkpoint", checkpoint]
        runs[f"zero{stage}"] = (flags, [*saving, "--save-model", str(root / f"model{stage}")])
        resumes[f"zero{stage}_resumed"] = (flags, ["--save-at", "3", "--resume", checkpoint])
    # Accelerate's five config templates, unchanged, one after the other in one job.
    resumes["templates"] = ([], ["--templates", str(TEMPLATES)])
    # The first run on a machine builds DeepSpeed's C++ CPU ops (minutes each; the templates job
    # builds two more: FusedAdam and CPU Adam); later runs load them.
    reports = run_waves(SCRIPT, root, [runs, resumes], timeouts={"templates": 1800})
    reports["_root"] = {"path": str(root)}
    return reports


def _report(jobs: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    report = jobs[name]
    assert "failed" not in report, f"{name} job failed: {report.get('failed')}"
    return report


@needs_deepspeed
@pytest.mark.timeout(2400)  # the first test pays for the module's jobs
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_zero_stage_trains_like_ddp(jobs: dict[str, dict[str, Any]], stage: int) -> None:
    ddp, run = _report(jobs, "ddp"), _report(jobs, f"zero{stage}")
    assert ddp["distributed_type"] == "MULTI_CPU"
    assert run["distributed_type"] == "DEEPSPEED" and run["num_processes"] == 2
    assert run["model_class"] == "DeepSpeedEngine" and run["unwrapped_class"] == "Sequential"
    assert len(run["losses"]) == 6
    torch.testing.assert_close(
        torch.tensor(run["losses"]), torch.tensor(ddp["losses"]), rtol=1e-5, atol=1e-6
    )
    assert run["norms_finite"]
    # clip_grad_norm_ returns the global norm before clipping, as under DDP.
    torch.testing.assert_close(
        torch.tensor(run["norms"]), torch.tensor(ddp["norms"]), rtol=1e-4, atol=1e-6
    )
    assert run["lr"] == pytest.approx(ddp["lr"])  # the schedule moved as under DDP
    assert run["config"]["zero_optimization"]["stage"] == stage
    assert run["built_sharded"] == (stage == 3)  # zero3_init_flag: built sharded under ZeRO-3
    # Misuse under DeepSpeed is reported, not ignored.
    assert "gradient_clipping=1.0" in run["errors"]["clip"]
    assert "already holds a DeepSpeed engine" in run["errors"]["second_model"]


@needs_deepspeed
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("stage", [2, 3])
def test_gathered_parameters_make_zero3_shards_whole(
    jobs: dict[str, dict[str, Any]], stage: int
) -> None:
    found = _report(jobs, f"zero{stage}")["gathered"]
    sizes = [math.prod(shape) for shape in found["full"]]
    assert found["inside"] == found["full"]  # whole inside the block at every stage
    if stage == 3:
        assert found["outside"] == [0] * len(sizes)  # partitioned outside it
        assert found["edit_seen_by"] == 2  # rank 0's edit (modifier_rank=0) reached rank 1
    else:
        assert found["outside"] == sizes  # nothing to gather: the block is a no-op
        assert found["edit_seen_by"] == 1  # so rank 0's edit stays on rank 0


@needs_deepspeed
@pytest.mark.timeout(2400)
def test_engine_received_the_resolved_config(jobs: dict[str, dict[str, Any]]) -> None:
    report = _report(jobs, "zero1")
    assert report["engine"] == {
        "micro_batch": 4,
        "accumulation": 2,
        "train_batch": 16,
        "clipping": 1.0,
        "stage": 1,
        "fp16": False,
        "bf16": False,
        "device": "cpu",
    }
    config = report["config"]
    assert config["train_micro_batch_size_per_gpu"] == 4  # the dataloader's batch size
    assert config["gradient_accumulation_steps"] == 2  # the Accelerator's
    assert config["train_batch_size"] == 16  # 4 x 2 x 2 processes
    assert config["gradient_clipping"] == 1.0  # --gradient_clipping
    assert config["fp16"]["enabled"] is False and config["bf16"]["enabled"] is False
    assert config["zero_optimization"]["contiguous_gradients"] is True  # kept from the file
    optimizer = _report(jobs, "zero0")["config"]["optimizer"]
    assert optimizer == {
        "type": "AdamW",
        "params": {"lr": 0.02, "weight_decay": 0.01, "torch_adam": True},
    }


@needs_deepspeed
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("stage", [2, 3])
def test_resumed_run_continues_like_the_uninterrupted_one(
    jobs: dict[str, dict[str, Any]], stage: int
) -> None:
    full, resumed = _report(jobs, f"zero{stage}"), _report(jobs, f"zero{stage}_resumed")
    assert resumed["first_step"] == 3
    torch.testing.assert_close(
        torch.tensor(resumed["losses"]), torch.tensor(full["losses"][3:]), rtol=1e-6, atol=1e-7
    )
    assert resumed["lr"] == pytest.approx(full["lr"])
    checkpoint = Path(jobs["_root"]["path"]) / f"ckpt{stage}"
    assert (checkpoint / "deepspeed" / "engine").is_dir()


@needs_deepspeed
@pytest.mark.timeout(2400)
def test_zero3_saved_model_is_the_gathered_full_model(jobs: dict[str, dict[str, Any]]) -> None:
    from safetensors.torch import load_file

    run, ddp = _report(jobs, "zero3"), _report(jobs, "ddp")
    root = Path(jobs["_root"]["path"])
    saved = load_file(str(root / "model3" / "model.safetensors"))
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    plain.load_state_dict(saved)  # strict: every full-shaped weight is there
    gathered = {name: torch.tensor(value) for name, value in run["weights"].items()}
    assert saved.keys() == gathered.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, gathered[name]), name
        torch.testing.assert_close(tensor, torch.tensor(ddp["weights"][name]), rtol=1e-4, atol=1e-5)


@needs_deepspeed
@pytest.mark.cuda
@pytest.mark.parametrize("stage", [2, 3])
def test_fp16_loss_scaling_inside_the_engine_on_gpus(tmp_path: Path, stage: int) -> None:
    processes = min(torch.cuda.device_count(), 2)
    flags = ["--use_deepspeed", "--zero_stage", str(stage), "--gradient_clipping", "1.0"]
    flags += ["--mixed_precision", "fp16"]
    out = tmp_path / "fp16.json"
    job = start(SCRIPT, flags, ["--steps", "8", "--out", str(out)], processes, cpu=False)
    run = finish(job, out)
    assert "failed" not in run, run.get("failed")
    assert run["distributed_type"] == "DEEPSPEED" and run["num_processes"] == processes
    assert run["engine"]["fp16"] and run["engine"]["device"] == "cuda"
    assert run["config"]["fp16"]["enabled"] is True and run["config"]["bf16"]["enabled"] is False
    losses = run["losses"]
    assert all(map(lambda value: value == value and abs(value) < 1e4, losses))  # finite
    assert min(losses[-3:]) < losses[0]  # it trains (the first steps may be skipped by the scaler)


@needs_deepspeed
@pytest.mark.timeout(2400)
def test_bf16_engine_takes_float32_batches(jobs: dict[str, dict[str, Any]]) -> None:
    run, ddp = _report(jobs, "zero2_bf16"), _report(jobs, "ddp")
    assert run["config"]["bf16"]["enabled"] is True and run["config"]["fp16"]["enabled"] is False
    assert run["engine"]["bf16"] is True
    assert len(run["losses"]) == 6 and run["norms_finite"]
    # bf16 weights follow the fp32 run loosely (8 bits of mantissa), and it trains.
    torch.testing.assert_close(
        torch.tensor(run["losses"]), torch.tensor(ddp["losses"]), rtol=0.05, atol=0.02
    )
    assert run["losses"][-1] < run["losses"][0]


def test_bf16_input_cast_reaches_nested_floats_only() -> None:
    import collections

    from accel.strategies.deepspeed.inputs import to_bf16

    Pair = collections.namedtuple("Pair", "features ids")
    batch = {
        "x": torch.ones(2, dtype=torch.float32),
        "pair": Pair(torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.long)),
        "list": [torch.ones(1, dtype=torch.float16), "text"],
    }
    cast = to_bf16(batch)
    assert cast["x"].dtype == torch.bfloat16 and cast["pair"].features.dtype == torch.bfloat16
    assert isinstance(cast["pair"], Pair) and cast["pair"].ids.dtype == torch.long
    assert cast["list"][0].dtype == torch.bfloat16 and cast["list"][1] == "text"


@needs_deepspeed
@pytest.mark.timeout(2400)
@pytest.mark.parametrize(
    "name",
    [
        "zero_stage1_config",
        "zero_stage2_config",
        "zero_stage2_offload_config",
        "zero_stage3_config",
        "zero_stage3_offload_config",
    ],
)
def test_each_template_trains_unchanged(jobs: dict[str, dict[str, Any]], name: str) -> None:
    """Every "auto" of Accelerate's template is filled and a real training runs under it."""
    report = _report(jobs, "templates")
    assert report["num_processes"] == 2
    run = report["templates"][name]
    assert "error" not in run, f"{name}: {run.get('error')}\n{run.get('traceback')}"
    config, engine = run["config"], run["engine"]
    assert "auto" not in json.dumps(config)
    stage = json.loads((TEMPLATES / f"{name}.json").read_text())["zero_optimization"]["stage"]
    hidden = 16  # the job's model.config.hidden_size
    assert engine == {
        **engine,
        "stage": stage,
        "clipping": 1.0,  # "auto" -> Accelerate's 1.0
        "train_batch": 4 * 2 * 2,  # micro-batch x accumulation x processes
        "fp16": False,
        "bf16": False,
        "scheduler": "WarmupDecayLR",
        "total_num_steps": 8,  # DummyScheduler(total_num_steps=16) over 2 processes
        "warmup_num_steps": 2,
    }
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == hidden * hidden
    if stage == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * hidden * hidden)
        assert zero["stage3_param_persistence_threshold"] == 10 * hidden
    assert config["scheduler"]["params"]["warmup_min_lr"] == 0
    assert config["optimizer"]["params"]["lr"] == 0.02
    assert engine["cpu_offload"] == ("offload" in name)
    # The optimizer the template asks for: torch's AdamW ("torch_adam": true), else DeepSpeed's
    # C++ CPU Adam (offloaded) or its CPU FusedAdam (both JIT-built ops).
    assert engine["basic_optimizer"] == {
        "zero_stage3_config": "FusedAdam",
        "zero_stage3_offload_config": "DeepSpeedCPUAdam",
    }.get(name, "AdamW")
    # WarmupDecayLR decays to 0 over each engine's 8 steps: lr(5) = 0.02 * (8 - 5) / (8 - 2).
    assert run["lrs"][-1] == pytest.approx(0.01)
    assert len(run["losses"]) == 6 and all(math.isfinite(loss) for loss in run["losses"])
    # Every stage and optimizer implementation takes the same steps on the same data.
    reference = report["templates"]["zero_stage1_config"]["losses"]
    torch.testing.assert_close(
        torch.tensor(run["losses"]), torch.tensor(reference), rtol=1e-4, atol=1e-6
    )
