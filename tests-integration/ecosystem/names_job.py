"""The library code paths that reach Accelerate names no Trainer, SFT or big-model job reaches.

    python names_job.py OUT launch     # 1 process: `transformers env`, `trl env`, TRL's launcher
    python names_job.py OUT library    # 2 processes (launched): transformers and PEFT
    python names_job.py OUT one_process  # 1 process: DPO, GRPO, the tensor-parallel reference
    python names_job.py OUT parallel   # 2 processes (launched): FSDP2 and tensor parallelism
    python names_job.py OUT GROUP CASE[,CASE...]   # only these cases (to debug one)

Each case calls transformers, PEFT or TRL the way a user does (their CLIs, PEFT on an offloaded
model, a Trainer resumed mid-epoch, a Trainer whose evaluation runs out of memory, ...) and records
what came out, or the error, in ``OUT/result.json``; ``test_names.py`` compares accel's file with
Accelerate's and checks, through ``name_use_recorder``, that each case reached the names it is
there for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import name_use_recorder  # noqa: F401 - records Accelerate names in use
import torch
from big_model_job import case, llama, model_bytes, outputs
from tiny_models import counting_texts, tiny_llama, word_tokenizer

CASES: dict[str, dict[str, Callable[[Path], dict[str, Any]]]] = {
    "launch": {},
    "library": {},
    "one_process": {},
    "parallel": {},
}


def register(group: str) -> Callable[[Callable[[Path], dict[str, Any]]], Any]:
    def add(function: Callable[[Path], dict[str, Any]]) -> Callable[[Path], dict[str, Any]]:
        CASES[group][function.__name__] = function
        return function

    return add


def config_entries(text: str) -> list[str]:
    """The ``- field: value`` lines an env printout shows for the Accelerate config file."""
    entries = []
    for line in text.splitlines():
        field, _, value = line.strip().removeprefix("- ").partition(": ")
        if line.strip().startswith("- ") and field.isidentifier() and field.islower():
            entries.append(f"{field}: {value}")
    return sorted(entries)


def write_default_config() -> str:
    """A CPU config file where ``accelerate config`` would write it (under the job's HF_HOME)."""
    from accelerate.commands.config import default_config_file

    Path(default_config_file).parent.mkdir(parents=True, exist_ok=True)
    Path(default_config_file).write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\n"
        "num_machines: 1\nnum_processes: 1\nuse_cpu: true\n"
    )
    return default_config_file


@register("launch")
def env_commands(out: Path) -> dict[str, Any]:
    """``transformers env`` and ``trl env`` read the default Accelerate config file."""
    from transformers.cli.system import env
    from trl.scripts.env import print_env

    write_default_config()
    printed = {}
    for name, command in (("transformers", env), ("trl", print_env)):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            command()
        printed[name] = config_entries(buffer.getvalue())
    return printed


@register("launch")
def trl_launcher(out: Path) -> dict[str, Any]:
    """TRL's CLI launcher runs its ``env.py`` script through ``accelerate launch``."""
    from trl.cli.accelerate_launcher import launch_training_script

    write_default_config()
    log = out / "trl-launch.log"
    with log.open("w") as handle:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(handle.fileno(), 1)  # the launched process writes to this process's stdout
        try:
            launch_training_script("env.py", ["--num_processes", "1", "--cpu"], [])
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
    text = log.read_text()
    return {
        "config": config_entries(text),
        "printed_trl_version": "TRL version" in text,
        "accelerate_line": [line for line in text.splitlines() if "Accelerate version" in line],
    }


def peft_llama() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(tiny_llama(), config)


@register("library")
def peft_fsdp_wrap_policy(out: Path) -> dict[str, Any]:
    """PEFT's FSDP auto-wrap policy, built with Accelerate's FSDP plugin helpers."""
    from peft.utils.other import fsdp_auto_wrap_policy

    model = peft_llama()
    policy = fsdp_auto_wrap_policy(model)
    wrapped = [
        name
        for name, module in model.named_modules()
        if policy(module=module, recurse=False, nonwrapped_numel=1)
    ]
    return {"wrapped": wrapped}


@register("library")
def lorafa_optimizer(out: Path) -> dict[str, Any]:
    """PEFT's LoRA-FA optimizer (which asks Accelerate whether bf16 is available) for 3 steps."""
    from peft.optimizers import create_lorafa_optimizer

    model = peft_llama()
    optimizer = create_lorafa_optimizer(model=model, r=4, lora_alpha=8, lr=1e-2)
    ids = torch.arange(3, 11).unsqueeze(0)
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return {"losses": losses}


@register("library")
def fp8_test_marker(out: Path) -> dict[str, Any]:
    """transformers' ``require_fp8`` test decorator asks Accelerate whether fp8 is available."""
    from transformers.testing_utils import require_fp8

    def probe() -> None:
        """A test function to decorate."""

    installed = any(
        importlib.util.find_spec(name) for name in ("torchao", "transformer_engine", "msamp")
    )
    return {
        "skipped": bool(getattr(require_fp8(probe), "__unittest_skip__", False)),
        "fp8_library_installed": installed,
    }


@register("library")
def dora_ephemeral_offload(out: Path) -> dict[str, Any]:
    """DoRA with ephemeral GPU offload asks Accelerate for an XPU before it picks CUDA."""
    from peft import LoraConfig, LoraRuntimeConfig, get_peft_model

    config = LoraConfig(
        r=4,
        target_modules=["q_proj"],
        use_dora=True,
        runtime_config=LoraRuntimeConfig(ephemeral_gpu_offload=True),
    )
    try:
        get_peft_model(tiny_llama(), config)
    except (AssertionError, RuntimeError) as error:  # no CUDA here: where PEFT went for it
        peft_frames = [f for f in traceback.extract_tb(error.__traceback__) if "peft" in f.filename]
        return {
            "moved_to_cuda_at": f"{Path(peft_frames[-1].filename).name}:{peft_frames[-1].lineno}"
        }
    return {"moved_to_cuda_at": None}


@register("library")
def mask_count_across_processes(out: Path) -> dict[str, Any]:
    """Mask2Former's loss normalizer: reduced over the processes once Accelerate's state exists."""
    from accelerate import PartialState
    from transformers.models.mask2former.modeling_mask2former import Mask2FormerLoss

    rank = int(os.environ.get("RANK", "0"))
    labels = [torch.tensor([1, 2]), torch.arange(rank + 1)]
    state = PartialState(cpu=True)
    count = Mask2FormerLoss.get_num_masks(None, labels, torch.device("cpu"))  # type: ignore[arg-type]
    return {"num_masks": float(count), "processes": state.num_processes}


@register("library")
def wandb_callbacks_import(out: Path) -> dict[str, Any]:
    """TRL's callbacks module imports wandb when Accelerate says it is available."""
    import trl.trainer.callbacks as callbacks

    installed = importlib.util.find_spec("wandb") is not None
    return {"imported_wandb": hasattr(callbacks, "wandb"), "wandb_installed": installed}


def offloaded_llama(out: Path, name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The 3-layer tied Llama saved in shards and loaded with about half of it on disk."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = llama().eval()
    saved = out / "models" / name
    model.save_pretrained(saved, max_shard_size="20KB")
    offloaded = AutoModelForCausalLM.from_pretrained(
        saved,
        device_map="auto",
        max_memory={"cpu": model_bytes(model) // 2},
        offload_folder=str(out / "models" / f"{name}-offload"),
    ).eval()
    return model, offloaded


@register("library")
def peft_modules_to_save_on_offloaded_model(out: Path) -> dict[str, Any]:
    """PEFT copies offloaded modules it trains in full, re-creating their Accelerate hooks."""
    from peft import LoraConfig, get_peft_model

    # The adapter sits on the embedding (kept in memory): LoRA layers made on an offloaded layer
    # hold uninitialised memory on Accelerate too, so their outputs would compare noise.
    config = LoraConfig(r=4, target_modules=["embed_tokens"], modules_to_save=["down_proj"])
    model, offloaded = offloaded_llama(out, "modules-to-save")
    adapted = get_peft_model(offloaded, config).eval()
    reference = get_peft_model(model, config).eval()
    return {
        "map": sorted(set(map(str, offloaded.hf_device_map.values()))),
        "outputs": outputs(adapted, "llama"),
        "in_memory_outputs": outputs(reference, "llama"),
    }


@register("library")
def peft_merge_on_offloaded_model(out: Path) -> dict[str, Any]:
    """A saved LoRA adapter loaded onto a model part on disk, then merged into it.

    PEFT onloads each offloaded layer to merge (``onload_layer``), reading the hooks' original
    devices and weights maps. Accelerate 1.15 cannot load the adapter on a CPU-only machine (the
    ``peft_adapter`` case of big_model_job.py), so there accel is compared with the in-memory model.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model, offloaded = offloaded_llama(out, "merge")
    torch.manual_seed(1)
    reference = get_peft_model(model, config).eval()
    reference.save_pretrained(out / "models" / "merge-adapter")
    adapted = PeftModel.from_pretrained(offloaded, out / "models" / "merge-adapter").eval()
    unmerged = outputs(adapted, "llama")
    merged = adapted.merge_and_unload().eval()
    return {
        "unmerged_outputs": unmerged,
        "in_memory_unmerged_outputs": outputs(reference, "llama"),
        "outputs": outputs(merged, "llama"),
        "in_memory_outputs": outputs(reference.merge_and_unload(), "llama"),
    }


@register("library")
def parameters_left_out_of_the_device_map(out: Path) -> dict[str, Any]:
    """A model that declares ``_no_placement_params`` (as Qwen4-Exp does for its huge embedding).

    transformers leaves those weights out of the device map and dispatches with Accelerate's
    ``check_device_map`` swapped for a no-op (``skip_device_map_check``).
    """
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    class EmbeddingLeftInPlace(LlamaForCausalLM):
        _no_placement_params: ClassVar[list[str]] = ["model.embed_tokens.weight"]

    torch.manual_seed(0)
    model = llama().eval()
    saved = out / "models" / "no-placement"
    model.save_pretrained(saved, max_shard_size="20KB")
    AutoModelForCausalLM.register(type(model.config), EmbeddingLeftInPlace, exist_ok=True)
    loaded = EmbeddingLeftInPlace.from_pretrained(
        saved,
        device_map="auto",
        max_memory={"cpu": model_bytes(model) // 2},
        offload_folder=str(out / "models" / "no-placement-offload"),
    ).eval()
    return {
        "map": {key: str(value) for key, value in loaded.hf_device_map.items()},
        "outputs": outputs(loaded, "llama"),
        "in_memory_outputs": outputs(model, "llama"),
    }


@register("library")
def bark_model_cpu_offload(out: Path) -> dict[str, Any]:
    """Bark's ``enable_cpu_offload`` chains Accelerate's offload hooks over its sub-models."""
    from transformers import BarkConfig, BarkModel

    small = dict(
        block_size=32,
        input_vocab_size=64,
        output_vocab_size=64,
        num_layers=1,
        num_heads=2,
        hidden_size=16,
    )
    codec = dict(
        model_type="encodec",
        num_filters=4,
        hidden_size=8,
        codebook_size=16,
        upsampling_ratios=[2, 2],
        num_lstm_layers=1,
        target_bandwidths=[1.5],
    )
    config = BarkConfig(
        semantic_config=small,
        coarse_acoustics_config=small,
        fine_acoustics_config={**small, "n_codes_total": 8, "n_codes_given": 1},
        codec_config=codec,
    )
    model = BarkModel(config)
    try:
        model.enable_cpu_offload()
    except (AssertionError, RuntimeError) as error:  # the hooks point at an accelerator
        return {"error": type(error).__name__, "hooks": hook_names(model)}
    return {"error": None, "hooks": hook_names(model)}


def hook_names(model: torch.nn.Module) -> list[str]:
    return sorted(
        f"{name}:{type(module._hf_hook).__name__}"
        for name, module in model.named_modules()
        if hasattr(module, "_hf_hook")
    )


@register("library")
def hyperparameter_search(out: Path) -> dict[str, Any]:
    """``Trainer.hyperparameter_search`` (Optuna) frees each trial's model through Accelerate."""
    from trainer_job import SyntheticPairs, tiny_bert
    from transformers import Trainer, TrainingArguments

    trainer = Trainer(
        model_init=tiny_bert,
        args=TrainingArguments(
            output_dir=str(out / "search"),
            per_device_train_batch_size=4,
            max_steps=2,
            seed=0,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            eval_strategy="no",
        ),
        train_dataset=SyntheticPairs(16, seed=0),
        eval_dataset=SyntheticPairs(8, seed=1),
    )
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-3)},
        backend="optuna",
        n_trials=2,
        direction="minimize",
        sampler=__import__("optuna").samplers.RandomSampler(seed=0),
    )
    return {"objective": best.objective, "hyperparameters": best.hyperparameters}


def training_arguments(out: Path, name: str, **overrides: Any) -> dict[str, Any]:
    """Seeded, logged every step, CPU, no trackers: the Trainer settings every case shares."""
    arguments: dict[str, Any] = dict(
        output_dir=str(out / name),
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        data_seed=0,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    arguments.update(overrides)
    return arguments


def tiny_trainer(out: Path, name: str, **arguments: Any) -> Any:
    """A transformers ``Trainer`` on the tiny BERT classification job (trainer_job.py)."""
    from trainer_job import SyntheticPairs, tiny_bert
    from transformers import Trainer, TrainingArguments

    defaults = training_arguments(out, name, per_device_train_batch_size=4, **arguments)
    return Trainer(
        model=tiny_bert(),
        args=TrainingArguments(**defaults),
        train_dataset=SyntheticPairs(32, seed=0),
        eval_dataset=SyntheticPairs(8, seed=1),
    )


def losses(history: list[dict[str, Any]]) -> list[list[float]]:
    return [[record["step"], record["loss"]] for record in history if "loss" in record]


@register("library")
def trainer_resumed_mid_epoch(out: Path) -> dict[str, Any]:
    """A checkpoint inside an epoch: the resumed run skips the batches already trained."""
    arguments = dict(num_train_epochs=1, save_steps=2, torch_empty_cache_steps=1)
    first = tiny_trainer(out, "mid-epoch", **arguments)
    first.train()
    resumed = tiny_trainer(out, "mid-epoch", **arguments)
    resumed.train(resume_from_checkpoint=str(out / "mid-epoch" / "checkpoint-2"))
    return {"first": losses(first.state.log_history), "resumed": losses(resumed.state.log_history)}


class OutOfMemoryOnRead(torch.utils.data.Dataset):
    """An evaluation set whose reads fail as a CUDA allocation that does not fit would."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


@register("library")
def trainer_evaluation_out_of_memory(out: Path) -> dict[str, Any]:
    """``auto_find_batch_size`` does not shrink the train batch for an evaluation OOM: it says so."""
    from trainer_job import SyntheticPairs, tiny_bert
    from transformers import Trainer, TrainingArguments

    trainer = Trainer(
        model=tiny_bert(),
        args=TrainingArguments(
            output_dir=str(out / "eval-oom"),
            per_device_train_batch_size=4,
            max_steps=2,
            eval_strategy="steps",
            eval_steps=1,
            auto_find_batch_size=True,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=SyntheticPairs(16, seed=0),
        eval_dataset=OutOfMemoryOnRead(),
    )
    trainer.train()
    return {"steps": trainer.state.global_step}


def trl_arguments(out: Path, name: str) -> dict[str, Any]:
    """Two steps of 2 samples per process, nothing saved (DPO, GRPO, the tensor-parallel runs)."""
    return training_arguments(
        out, name, per_device_train_batch_size=2, max_steps=2, save_strategy="no"
    )


def logged(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The logged numbers of each step, timings left out."""
    return [
        {
            key: value
            for key, value in record.items()
            if isinstance(value, (int, float))
            and not any(w in key for w in ("runtime", "_second", "time"))
        }
        for record in history
    ]


@register("one_process")
def dpo_with_precomputed_reference(out: Path) -> dict[str, Any]:
    """DPO with ``precompute_ref_log_probs``: rank 0's dataset fingerprint is broadcast first."""
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(**trl_arguments(out, "dpo"), precompute_ref_log_probs=True, max_length=16)
    trainer = DPOTrainer(
        model=tiny_llama(),
        args=config,
        train_dataset=preference_pairs(),
        processing_class=word_tokenizer(),
    )
    trainer.train()
    return {"history": logged(trainer.state.log_history)}


def preference_pairs() -> Any:
    """Prompts of 4 counting words; the next 4 in order are chosen, reversed rejected."""
    from datasets import Dataset

    texts = counting_texts(8, seed=3)
    return Dataset.from_dict(
        {
            "prompt": [" ".join(text.split()[:4]) for text in texts],
            "chosen": [" ".join(text.split()[4:8]) for text in texts],
            "rejected": [" ".join(reversed(text.split()[4:8])) for text in texts],
        }
    )


def dpo_with_reference_model(out: Path, name: str, **arguments: Any) -> dict[str, Any]:
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(**trl_arguments(out, name), max_length=16, **arguments)
    trainer = DPOTrainer(
        model=tiny_llama(),
        ref_model=tiny_llama(),
        args=config,
        train_dataset=preference_pairs(),
        processing_class=word_tokenizer(),
    )
    trainer.train()
    return {"history": logged(trainer.state.log_history)}


@register("parallel")
def dpo_reference_model(out: Path) -> dict[str, Any]:
    """DPO with a separate reference model on 2 processes (DDP): the FSDP2 run's reference."""
    return dpo_with_reference_model(out, "dpo-ddp")


@register("parallel")
def dpo_reference_model_under_fsdp2(out: Path) -> dict[str, Any]:
    """The same under FSDP2: TRL shards the reference model itself (``prepare_fsdp``)."""
    return dpo_with_reference_model(
        out,
        "dpo-fsdp2",
        fsdp="full_shard",
        fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
    )


def train_saved_llama(out: Path, name: str, **load: Any) -> dict[str, Any]:
    """Train the tiny Llama saved in ``out`` 2 steps with the Trainer, loaded with ``load``."""
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    state = PartialState(cpu=True)
    saved = out / "models" / "trained-llama"
    if state.is_main_process and not saved.exists():
        tiny_llama().save_pretrained(saved)
    state.wait_for_everyone()
    model = AutoModelForCausalLM.from_pretrained(saved, **load)
    tokenizer = word_tokenizer()
    rows = [tokenizer(text)["input_ids"] for text in counting_texts(8, seed=5)]
    data = [{"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)} for ids in rows]
    trainer = Trainer(
        model=model, args=TrainingArguments(**trl_arguments(out, name)), train_dataset=data
    )
    trainer.train()
    return {
        "tp_size": getattr(model, "tp_size", None),
        "history": logged(trainer.state.log_history),
    }


@register("parallel")
def trainer_tensor_parallel(out: Path) -> dict[str, Any]:
    """A model loaded with ``tp_plan="auto"`` on 2 processes, trained by the Trainer.

    The Trainer builds ``ParallelismConfig(tp_size=2, dp_shard_size=1)``: both processes see the
    same batches, so this logs what one process logs without tensor parallelism.
    """
    return train_saved_llama(out, "tensor-parallel", tp_plan="auto")


@register("one_process")
def trainer_tensor_parallel_reference(out: Path) -> dict[str, Any]:
    """The same training on one process, no tensor parallelism."""
    return train_saved_llama(out, "tensor-parallel-reference")


def completion_length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """A reward TRL's GRPO can compute on any text: longer completions score higher."""
    return [float(len(completion.split())) for completion in completions]


@register("one_process")
def grpo_trainer(out: Path) -> dict[str, Any]:
    """GRPO: completions generated, rewards gathered from every process, completions logged."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts = [" ".join(text.split()[:4]) for text in counting_texts(8, seed=4)]
    config = GRPOConfig(
        **trl_arguments(out, "grpo"),
        num_generations=2,
        max_completion_length=4,
        log_completions=True,
    )
    trainer = GRPOTrainer(
        model=tiny_llama(),
        reward_funcs=completion_length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=word_tokenizer(),
    )
    trainer.train()
    return {"history": logged(trainer.state.log_history)}


def main() -> None:
    out, group = Path(sys.argv[1]), sys.argv[2]
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES[group])
    record: dict[str, Any] = {}
    for name, function in CASES[group].items():
        if name not in only:
            continue
        case(record, name, lambda function=function: function(out))
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "result.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
