"""transformers' ``Trainer`` under DeepSpeed ZeRO-2 and ZeRO-3 on accel, against the DDP run.

Each job is ``trainer_job.py`` launched with ``accel launch --as_accelerate --cpu
--num_processes 2`` (gloo, DeepSpeed's CPU accelerator): it trains two epochs (evaluating and
checkpointing after each), resumes a second Trainer from the first epoch's checkpoint, and saves
the model with ``save_model``. Four launches, each run once per module: DDP (the reference),
``TrainingArguments(deepspeed=<ZeRO-2 file>)``, ``deepspeed=<ZeRO-3 file>`` and the launcher's
DeepSpeed (``--use_deepspeed --zero_stage 2``: transformers builds ``DeepSpeedPlugin()`` itself).
ZeRO only partitions fp32 state, so every logged value matches DDP within 1e-5.

The first DeepSpeed launch on a machine JIT-builds DeepSpeed's shared-memory comm op (minutes);
``TORCH_EXTENSIONS_DIR`` keeps it for later runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE / "trainer_job.py"
#: A generous hard limit: the first DeepSpeed job may compile DeepSpeed's C++ op.
JOB_TIMEOUT = 1200
TOLERANCE = 1e-5
#: Logged values compared with the DDP run (timings and counters are not).
COMPARED = ("loss", "grad_norm", "learning_rate", "eval_loss", "epoch", "step")

MISSING = [name for name in ("transformers", "deepspeed") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"{' and '.join(MISSING)} not installed: the Trainer DeepSpeed jobs need "
    "transformers and deepspeed (run them in the ecosystem nox session)",
)

_AUTO_BATCH = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "zero2": {**_AUTO_BATCH, "zero_optimization": {"stage": 2}},
    "zero3": {
        **_AUTO_BATCH,
        "zero_optimization": {
            "stage": 3,
            "stage3_gather_16bit_weights_on_model_save": True,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    },
}
#: job name -> (extra launcher flags, extra trainer_job.py arguments)
JOBS: dict[str, tuple[list[str], list[str]]] = {
    "ddp": ([], []),
    "zero2": ([], ["--deepspeed", "{config}"]),
    "zero3": ([], ["--deepspeed", "{config}"]),
    "launcher_zero2": (["--use_deepspeed", "--zero_stage", "2"], []),
}
STAGES = {"zero2": 2, "zero3": 3, "launcher_zero2": 2}


def _env(root: Path) -> dict[str, str]:
    """No launcher variables from outside, no hub, one thread, DeepSpeed on the CPU."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCEL_", "ACCELERATE_", "FSDP_"))
    }
    env.update(
        HF_HOME=str(root / "hf_home"),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


class Runs:
    """Launches each job once, on first use, and keeps its ``result.json``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self.results:
            self.results[name] = self._launch(name)
        return self.results[name]

    def _launch(self, name: str) -> dict[str, Any]:
        flags, job_args = JOBS[name]
        out = self.root / name
        config = self.root / f"{name}.json"
        if name in CONFIGS:
            config.write_text(json.dumps(CONFIGS[name]))
        accel = Path(sys.executable).with_name("accel")
        command = [
            str(accel),
            "launch",
            "--as_accelerate",
            "--cpu",
            "--num_processes",
            "2",
            *flags,
            str(SCRIPT),
            str(out),
            "--resume",
            *(arg.format(config=config) for arg in job_args),
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT,
            env=_env(self.root),
            check=False,
            start_new_session=True,
        )
        assert done.returncode == 0, (
            f"{name} job failed ({done.returncode}): {' '.join(command)}\n"
            f"stdout tail:\n{done.stdout[-3000:]}\nstderr tail:\n{done.stderr[-6000:]}"
        )
        result: dict[str, Any] = json.loads((out / "result.json").read_text())
        result["_out"] = str(out)
        return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The module's jobs, launched lazily, each once."""
    return Runs(tmp_path_factory.mktemp("trainer_deepspeed"))


def _max_difference(history: list[dict[str, Any]], reference: list[dict[str, Any]]) -> float:
    """The largest difference between two logged histories, entry by entry (same keys)."""
    assert len(history) == len(reference)
    worst = 0.0
    for entry, expected in zip(history, reference, strict=True):
        keys = [key for key in COMPARED if key in expected]
        assert [key for key in COMPARED if key in entry] == keys, (entry, expected)
        for key in keys:
            worst = max(worst, abs(float(entry[key]) - float(expected[key])))
    return worst


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors weights in {folder}"
    weights: dict[str, Any] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


@pytest.mark.timeout(4 * JOB_TIMEOUT)
@pytest.mark.parametrize("name", ["zero2", "zero3", "launcher_zero2"])
def test_trainer_under_deepspeed_logs_what_ddp_logs(runs: Runs, name: str) -> None:
    ddp, run = runs["ddp"], runs[name]
    stage = STAGES[name]
    assert ddp["distributed_type"] == "DistributedType.MULTI_CPU"
    assert run["distributed_type"] == "DistributedType.DEEPSPEED"
    assert run["is_deepspeed_enabled"] and run["num_processes"] == 2
    assert "+accel." in run["accelerate_version"]  # `import accelerate` gave accel
    facts = run["deepspeed"]
    assert facts["engine_class"] == "DeepSpeedEngine"
    assert facts["engine_zero_stage"] == stage and facts["plugin_zero_stage"] == stage
    # transformers' weakref (from_pretrained, resize_token_embeddings) knows ZeRO-3 is on.
    assert facts["zero3_enabled"] == (stage == 3)
    # "auto" values filled from the TrainingArguments: batch 8, max_grad_norm 1.0.
    assert facts["engine_micro_batch"] == 8 and facts["engine_gradient_clipping"] == 1.0
    # Two epochs of 4 steps, evaluated after each: losses, norms, learning rates, eval losses.
    assert sum("eval_loss" in entry for entry in run["history"]) == 2
    assert _max_difference(run["history"], ddp["history"]) <= TOLERANCE
    # The second Trainer resumed from checkpoint-4 (DeepSpeed's engine checkpoint) and logged
    # the second epoch as the uninterrupted run did.
    assert _max_difference(run["resumed_history"], ddp["resumed_history"]) <= TOLERANCE
    out = Path(run["_out"])
    assert (out / "trainer" / "checkpoint-4" / "global_step4").is_dir()
    assert (out / "trainer" / "checkpoint-8" / "global_step8").is_dir()


@pytest.mark.timeout(4 * JOB_TIMEOUT)
@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_save_model_writes_the_full_trained_weights(runs: Runs, name: str) -> None:
    """``save_model`` (ZeRO-3: the gathered 16-bit state dict) holds DDP's final weights."""
    import torch

    ddp, run = runs["ddp"], runs[name]
    expected = _weights(Path(ddp["_out"]) / "final")
    saved = _weights(Path(run["_out"]) / "final")
    assert sorted(saved) == sorted(expected)
    for key, tensor in expected.items():
        assert saved[key].shape == tensor.shape and saved[key].dtype == torch.float32, key
        torch.testing.assert_close(saved[key], tensor, rtol=0, atol=TOLERANCE)
