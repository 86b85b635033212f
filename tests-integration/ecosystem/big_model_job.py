"""transformers' own big-model loading (``from_pretrained(device_map=...)``) on 4 architectures.

    python big_model_job.py OUT          # on Accelerate, or under ``python -m accel.as_accelerate``

Four tiny models built from configs (Llama with tied embeddings, GPT-2, BERT, T5), saved in
safetensors shards, are loaded through every big-model path transformers offers: ``device_map``
``"auto"``/``"balanced"``/``"sequential"`` with a CPU budget in bytes or as a string so part goes
to disk, bf16 with disk offload, an explicit map with ``"disk"`` entries, ``offload_buffers``, the
ignored ``offload_state_dict``, ``generate()`` on an offloaded model and a PEFT LoRA adapter loaded
onto one; and a wider Llama loaded 8-bit and 4-bit through ``BitsAndBytesConfig``. Each case
records the device map, the outputs (exact floats) and any error, in
``OUT/result.json``; ``test_big_models.py`` compares accel's file with Accelerate's.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import name_use_recorder  # noqa: F401 - records Accelerate names in use
import torch
from tiny_models import VOCAB, tiny_llama
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    T5Config,
    T5ForConditionalGeneration,
)

SHARD = "20KB"  # several safetensors shards for every model


def llama() -> PreTrainedModel:
    """The tiny Llama with 3 layers and tied embeddings (seeded, as every builder here is used)."""
    return tiny_llama(num_hidden_layers=3, tie_word_embeddings=True)


def gpt2() -> PreTrainedModel:
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=3, n_head=2, eos_token_id=2)
    )


def bert() -> PreTrainedModel:
    return BertModel(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )


def t5() -> PreTrainedModel:
    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=2,
        )
    )


ARCHITECTURES: dict[str, tuple[Callable[[], PreTrainedModel], Any]] = {
    "llama_tied": (llama, AutoModelForCausalLM),
    "gpt2": (gpt2, AutoModelForCausalLM),
    "bert": (bert, AutoModel),
    "t5": (t5, AutoModelForSeq2SeqLM),
}
GENERATES = {"llama_tied", "gpt2", "t5"}
LORA_TARGETS = {
    "llama_tied": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "bert": ["query", "value"],
    "t5": ["q", "v"],
}


def inputs(name: str) -> dict[str, torch.Tensor]:
    ids = torch.arange(3, 11).remainder(VOCAB).unsqueeze(0)
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": torch.tensor([[0, 5, 6, 7]])}
    return {"input_ids": ids}


def outputs(model: torch.nn.Module, name: str) -> list[float]:
    with torch.no_grad():
        result = model(**inputs(name))
    tensor = result.logits if hasattr(result, "logits") else result.last_hidden_state
    return [float(value) for value in tensor.float().flatten().tolist()]


def model_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def explicit_disk_map(model: torch.nn.Module) -> dict[str, str]:
    """A map a user would write: every module on the CPU but the later half of each block list.

    Tied weights (embeddings and heads) stay on the CPU: transformers saves them once.
    """
    lists: list[str] = []
    for path, module in model.named_modules():  # outermost block lists only
        is_block_list = isinstance(module, torch.nn.ModuleList) and len(module) > 1
        if is_block_list and not any(path.startswith(f"{outer}.") for outer in lists):
            lists.append(path)
    mapping: dict[str, str] = {}
    for path, _ in model.named_modules():
        if not path or any(path == p or path.startswith(f"{p}.") for p in lists):
            continue
        inside_a_list_parent = any(p.startswith(f"{path}.") for p in lists)
        if not inside_a_list_parent and not any(path.startswith(f"{k}.") for k in mapping):
            mapping[path] = "cpu"
    for path in lists:
        blocks = len(model.get_submodule(path))
        for index in range(blocks):
            mapping[f"{path}.{index}"] = "disk" if index >= blocks // 2 else "cpu"
    return mapping


def case(record: dict[str, Any], key: str, run: Callable[[], dict[str, Any]]) -> None:
    try:
        record[key] = {"ok": True, **run()}
    except Exception as error:  # noqa: BLE001 - recorded and compared between the two targets
        record[key] = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "where": traceback.format_exc().splitlines()[-12:],
        }


def run_architecture(name: str, root: Path) -> dict[str, Any]:
    build, auto_class = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = build().eval()
    saved = root / name
    model.save_pretrained(saved, max_shard_size=SHARD)
    budget = model_bytes(model) // 2  # about half fits in "memory": the rest goes to disk
    record: dict[str, Any] = {"in_memory": outputs(model, name), "budget": budget}

    def load(folder: str, **kwargs: Any) -> torch.nn.Module:
        return auto_class.from_pretrained(saved, offload_folder=str(root / folder), **kwargs).eval()

    def loaded(folder: str, **kwargs: Any) -> dict[str, Any]:
        offloaded = load(folder, **kwargs)
        return {
            "map": {k: str(v) for k, v in getattr(offloaded, "hf_device_map", {}).items()},
            "outputs": outputs(offloaded, name),
        }

    case(record, "auto_fits", lambda: loaded(f"{name}-fits", device_map="auto"))
    for strategy in ("auto", "balanced", "sequential"):
        case(
            record,
            f"{strategy}_int_budget",
            lambda s=strategy: loaded(f"{name}-{s}-int", device_map=s, max_memory={"cpu": budget}),
        )
    as_string = f"{budget / 1000:.0f}KB"

    def string_budget() -> dict[str, Any]:
        given = {"cpu": as_string}
        result = loaded(f"{name}-string", device_map="auto", max_memory=given)
        return {**result, "caller_dict_after": {k: str(v) for k, v in given.items()}}

    case(record, "auto_string_budget", string_budget)
    case(
        record,
        "bf16_disk",
        lambda: loaded(  # half the bytes in bf16: half the budget keeps part on disk
            f"{name}-bf16", device_map="auto", max_memory={"cpu": budget // 2}, dtype=torch.bfloat16
        ),
    )
    case(
        record,
        "explicit_disk_map",
        lambda: loaded(f"{name}-explicit", device_map=explicit_disk_map(model)),
    )
    case(
        record,
        "offload_buffers",
        lambda: loaded(
            f"{name}-buffers",
            device_map="auto",
            max_memory={"cpu": budget},
            offload_buffers=True,
        ),
    )
    case(
        record,
        "offload_state_dict",
        lambda: loaded(
            f"{name}-state-dict",
            device_map="auto",
            max_memory={"cpu": budget},
            offload_state_dict=True,
        ),
    )
    if name in GENERATES:

        def generated() -> dict[str, Any]:
            offloaded = load(f"{name}-generate", device_map="auto", max_memory={"cpu": budget})
            tokens = offloaded.generate(
                inputs(name)["input_ids"], max_new_tokens=6, do_sample=False, pad_token_id=0
            )
            reference = model.generate(
                inputs(name)["input_ids"], max_new_tokens=6, do_sample=False, pad_token_id=0
            )
            return {"tokens": tokens.tolist(), "in_memory_tokens": reference.tolist()}

        case(record, "generate", generated)
    case(record, "peft_adapter", lambda: peft_adapter(name, model, root, load, budget))
    return record


def peft_adapter(
    name: str,
    model: torch.nn.Module,
    root: Path,
    load: Callable[..., torch.nn.Module],
    budget: int,
) -> dict[str, Any]:
    """A seeded LoRA adapter saved from the in-memory model, loaded onto an offloaded one."""
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(1)
    config = LoraConfig(r=4, target_modules=LORA_TARGETS[name], init_lora_weights=False)
    adapted = get_peft_model(build_again(name), config).eval()
    adapter = root / f"{name}-adapter"
    adapted.save_pretrained(adapter)
    reference = outputs(adapted, name)
    offloaded = load(f"{name}-peft", device_map="auto", max_memory={"cpu": budget})
    with_adapter = PeftModel.from_pretrained(offloaded, adapter).eval()
    return {"outputs": outputs(with_adapter, name), "in_memory_outputs": reference}


def build_again(name: str) -> PreTrainedModel:
    torch.manual_seed(0)
    return ARCHITECTURES[name][0]().eval()


def wide_llama() -> PreTrainedModel:
    """A Llama wide enough for bitsandbytes' 4-bit CPU kernels (blocks of 64 values per row)."""
    return tiny_llama(hidden_size=128, intermediate_size=256)


def run_quantized(root: Path) -> dict[str, Any]:
    """``from_pretrained(quantization_config=BitsAndBytesConfig(...))``: 8-bit and 4-bit (NF4)."""
    from transformers import BitsAndBytesConfig

    torch.manual_seed(0)
    model = wide_llama().eval()
    saved = root / "wide_llama"
    model.save_pretrained(saved, max_shard_size="100KB")
    record: dict[str, Any] = {"in_memory": outputs(model, "llama")}
    configs = {
        "8bit": BitsAndBytesConfig(load_in_8bit=True),
        "4bit_nf4": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
    }
    for name, config in configs.items():

        def quantized(config: Any = config) -> dict[str, Any]:
            loaded = AutoModelForCausalLM.from_pretrained(
                saved, quantization_config=config, device_map="auto"
            ).eval()
            layers = sorted(
                {type(m).__name__ for m in loaded.modules() if "Linear" in type(m).__name__}
            )
            return {
                "map": {k: str(v) for k, v in getattr(loaded, "hf_device_map", {}).items()},
                "layers": layers,
                "outputs": outputs(loaded, "llama"),
            }

        case(record, name, quantized)
    return record


def main() -> None:
    out = Path(sys.argv[1])
    root = out / "models"
    root.mkdir(parents=True, exist_ok=True)
    results = {name: run_architecture(name, root) for name in ARCHITECTURES}
    results["quantized"] = run_quantized(root)
    (out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
