"""The Trainer jobs under FSDP and DeepSpeed, named once, shared by the tests that use them.

The job runner runs each distinct command line once a session; tests that want the same job
(``test_trainer_fsdp.py``, ``test_trainer_deepspeed.py`` and ``test_names.py``) build it here, so
their command lines, config file paths included, are the same.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from ecosystem_jobs import JobRunner

TRAINER = "trainer_job.py"
#: The seed's FSDP settings, as TrainingArguments(fsdp_config=...) takes them.
SEED_FSDP = {
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
}
#: The seed's accelerate config file for FSDP, for a CPU run (use_cpu, fp32, BertLayer).
SEED_YAML = textwrap.dedent(
    """\
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: FSDP
    downcast_bf16: 'no'
    fsdp_config:
      fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
      fsdp_backward_prefetch_policy: BACKWARD_PRE
      fsdp_forward_prefetch: false
      fsdp_cpu_ram_efficient_loading: true
      fsdp_offload_params: false
      fsdp_sharding_strategy: FULL_SHARD
      fsdp_state_dict_type: SHARDED_STATE_DICT
      fsdp_sync_module_states: true
      fsdp_transformer_layer_cls_to_wrap: BertLayer
      fsdp_use_orig_params: true
      fsdp_version: 2
    machine_rank: 0
    main_training_function: main
    mixed_precision: 'no'
    num_machines: 1
    num_processes: 2
    rdzv_backend: static
    same_network: true
    use_cpu: true
    """
)
#: What every FSDP job does besides training (see test_trainer_fsdp.py).
FULL_RUN = ("--resume", "--best-model", "--fsdp-full-save")


def fsdp_configs(jobs: JobRunner) -> dict[str, str]:
    """The FSDP config files the jobs read: JSON for TrainingArguments, YAML for the launcher."""
    folder = jobs.root / "fsdp_configs"
    folder.mkdir(exist_ok=True)
    files = {
        "fsdp1.json": json.dumps({"version": 1, **SEED_FSDP}),
        "fsdp2.json": json.dumps({"version": 2, **SEED_FSDP}),
        "launch_fsdp2.yaml": SEED_YAML,
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    return {name: str(folder / name) for name in files}


def fsdp1_from_training_arguments(jobs: JobRunner) -> dict[str, Any]:
    """``TrainingArguments(fsdp="full_shard", fsdp_config=<FSDP1 file>)``, the full run."""
    config = fsdp_configs(jobs)["fsdp1.json"]
    return jobs.run("accel", TRAINER, "--fsdp", "full_shard", "--fsdp-config", config, *FULL_RUN)


#: A generous hard limit: the first DeepSpeed job may compile DeepSpeed's C++ op.
DEEPSPEED_JOB_TIMEOUT = 1200
TOLERANCE = 1e-5
#: ZeRO-3 partitions the parameters, so the Trainer's parameter count for its flos estimate
#: (and so ``total_flos``) sees only this process's partition; not a training value.
NOT_COMPARED = ("total_flos",)

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
    # DeepSpeed builds the optimizer from the file (torch's AdamW, the Trainer's default); the
    # Trainer hands Accelerate a DummyOptim and a DummyScheduler around its own schedule.
    "zero2_optimizer_in_config": {
        **_AUTO_BATCH,
        "zero_optimization": {"stage": 2},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": "auto",
                "betas": "auto",
                "eps": "auto",
                "weight_decay": "auto",
                "torch_adam": True,
            },
        },
    },
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
    "zero2_optimizer_in_config": ([], ["--deepspeed", "{config}"]),
    "launcher_zero2": (["--use_deepspeed", "--zero_stage", "2"], []),
}
STAGES = {"zero2": 2, "zero3": 3, "launcher_zero2": 2, "zero2_optimizer_in_config": 2}


def deepspeed_job(jobs: JobRunner, name: str) -> dict[str, Any]:
    """The ``--resume`` job ``name`` (``ddp`` is the run test_trainer.py compares with Accelerate)."""
    flags, job_args = JOBS[name]
    config = jobs.root / f"deepspeed-{name}.json"
    if name in CONFIGS and not config.exists():
        config.write_text(json.dumps(CONFIGS[name]))
    args = [arg.format(config=config) for arg in job_args]
    return jobs.run(
        "accel", TRAINER, "--resume", *args, flags=tuple(flags), timeout=DEEPSPEED_JOB_TIMEOUT
    )
