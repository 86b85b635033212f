"""Host memory of 4 ranks loading one model: FSDP ``cpu_ram_efficient_loading`` on accel and Accelerate.

A Llama built from a config (``--hidden`` / ``--layers``, default about 106M parameters, 423 MB in
fp32) is written once with ``save_pretrained``; each run starts 4 CPU ranks that load it with
``from_pretrained`` and train ``--steps`` steps with transformers' ``Trainer`` under FSDP2
(``TrainingArguments(fsdp="full_shard", fsdp_config={"version": 2, "cpu_ram_efficient_loading":
...})``). accel runs through ``accel launch --as_accelerate --use_fsdp``, Accelerate (when
``--accelerate-python`` names an interpreter with accelerate installed) through ``accelerate launch
--use_fsdp``. Each rank reports its peak resident set (``VmHWM`` of ``/proc/self/status``), and its
resident set after importing torch and transformers (the libraries, not the model); a row sums the
ranks, and the ratios compare the growth over that baseline with the model's size and with the
run without ``cpu_ram_efficient_loading`` in the same session.

On a machine without an accelerator Accelerate 1.15 runs these jobs with DDP (it enables FSDP
only for GPU-like devices), so its rows show the loading alone, and it has no ``--meta`` row.

``--meta`` rows: ranks other than 0 build the model on the ``meta`` device instead of reading the
file (what transformers' ``from_pretrained`` did for them under ``FSDP_CPU_RAM_EFFICIENT_LOADING``
before 5.x; transformers 5.x reads the weights on every rank and leaves only missing keys on meta).

Run: ``python benchmarks/scale_memory.py [--accelerate-python /tmp/acc115/bin/python]
[--repeats 1] [--steps 2]``. The runs of one round alternate between the tools; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MB = 1024 * 1024
RANKS = 4


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _config(hidden: int, layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def save_model(folder: Path, hidden: int, layers: int) -> int:
    """Write the seeded model with ``save_pretrained``; its size in bytes."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(hidden, layers))
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def worker(folder: str, out: str, efficient: bool, meta: bool, steps: int) -> None:
    """One rank: load the model, train ``steps`` steps with the Trainer, write its memory figures."""
    import torch
    from transformers import (
        AutoConfig,
        LlamaForCausalLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    baseline_kb = _status_kb("VmRSS")
    args = TrainingArguments(
        output_dir=os.path.join(out, "trainer"),
        fsdp="full_shard",
        fsdp_config={
            "version": 2,
            "cpu_ram_efficient_loading": efficient,
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        },
        per_device_train_batch_size=1,
        max_steps=steps,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
    )
    rank = int(os.environ["LOCAL_RANK"])
    if meta and rank != 0:
        with torch.device("meta"):
            model = LlamaForCausalLM(AutoConfig.from_pretrained(folder))
    else:
        model = LlamaForCausalLM.from_pretrained(folder)
    on_meta = any(p.is_meta for p in model.parameters())
    loaded_kb = _status_kb("VmRSS")
    rows = torch.randint(0, 32000, (8, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in rows]
    prepared: dict[str, int] = {}

    class _Prepared(TrainerCallback):  # type: ignore[misc]
        """Peak so far when training starts: loading plus the Trainer's prepare (sharding)."""

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            prepared["peak_kb"] = _status_kb("VmHWM")

    Trainer(model=model, args=args, train_dataset=data, callbacks=[_Prepared()]).train()
    record = {
        "rank": rank,
        "baseline_kb": baseline_kb,
        "loaded_kb": loaded_kb,
        "prepared_peak_kb": prepared["peak_kb"],
        "peak_kb": _status_kb("VmHWM"),
        "loaded_on_meta": on_meta,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def _command(tool: str, python: str, efficient: bool) -> list[str]:
    if tool == "accel":
        accel = str(Path(sys.executable).with_name("accel"))
        launch = [accel, "launch", "--as_accelerate", "--cpu"]
    else:
        launch = [python, "-m", "accelerate.commands.launch"]  # --use_fsdp picks torchrun
    flag = "true" if efficient else "false"
    return [
        *launch,
        "--num_processes",
        str(RANKS),
        "--use_fsdp",
        "--fsdp_version",
        "2",
        "--fsdp_cpu_ram_efficient_loading",
        flag,
        "--fsdp_sync_module_states",
        "true",
    ]


def run_once(
    tool: str, python: str, folder: Path, efficient: bool, meta: bool, steps: int
) -> dict[str, Any]:
    """One 4-rank job; the ranks' figures summed (MB)."""
    out = Path(tempfile.mkdtemp(prefix=f"scale_memory_{tool}_"))
    script = [str(Path(__file__).resolve()), "--worker", str(folder), str(out)]
    script += (
        ["--steps", str(steps)]
        + (["--efficient"] if efficient else [])
        + (["--meta"] if meta else [])
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        env.pop(name, None)
    done = subprocess.run(
        [*_command(tool, python, efficient), *script], env=env, capture_output=True, text=True
    )
    try:
        if done.returncode != 0:
            raise RuntimeError(f"{tool} job failed ({done.returncode}):\n{done.stderr[-4000:]}")
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "load_mb": sum(r["prepared_peak_kb"] - r["baseline_kb"] for r in ranks) / 1024,
        "load_mb_by_rank": [(r["prepared_peak_kb"] - r["baseline_kb"]) / 1024 for r in ranks],
        "peak_mb": sum(r["peak_kb"] for r in ranks) / 1024,
        "baseline_mb": sum(r["baseline_kb"] for r in ranks) / 1024,
        "growth_mb": sum(r["peak_kb"] - r["baseline_kb"] for r in ranks) / 1024,
        "ranks_on_meta": sum(r["loaded_on_meta"] for r in ranks),
    }


CASES = (
    ("accel", False, False),
    ("accel", True, False),
    ("accel", True, True),
    ("accelerate", False, False),
    ("accelerate", True, False),
)
# No ("accelerate", True, True): Accelerate 1.15 turns FSDP on for accelerator devices only
# (on the CPU a job is MULTI_CPU, DDP), and DDP cannot take a model on meta.


def measure(
    accelerate_python: str | None = None,
    repeats: int = 1,
    steps: int = 2,
    hidden: int = 768,
    layers: int = 8,
) -> list[dict[str, Any]]:
    """Rows: one per (tool, cpu_ram_efficient_loading, meta on ranks != 0), medians of ``repeats``.

    Each row has the summed peak, baseline and growth (MB), the growth over the model's size,
    and the growth over the same tool's run without ``cpu_ram_efficient_loading``.
    """
    folder = Path(tempfile.mkdtemp(prefix="scale_memory_model_"))
    try:
        model_mb = save_model(folder, hidden, layers) / MB
        cases = [case for case in CASES if case[0] == "accel" or accelerate_python]
        samples: dict[tuple[str, bool, bool], list[dict[str, Any]]] = {c: [] for c in cases}
        for _ in range(repeats):
            for case in cases:  # alternating tools and settings within each round
                tool, efficient, meta = case
                samples[case].append(
                    run_once(tool, accelerate_python or "", folder, efficient, meta, steps)
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for (tool, efficient, meta), runs in samples.items():
        row: dict[str, Any] = {"tool": tool, "efficient": efficient, "meta_on_others": meta}
        for key in ("load_mb", "peak_mb", "baseline_mb", "growth_mb"):
            row[key] = statistics.median(run[key] for run in runs)
        row["ranks_on_meta"] = runs[-1]["ranks_on_meta"]
        row["load_mb_by_rank"] = [
            statistics.median(run["load_mb_by_rank"][rank] for run in runs) for rank in range(RANKS)
        ]
        row["model_mb"] = model_mb
        row["load_per_model"] = row["load_mb"] / model_mb
        row["growth_per_model"] = row["growth_mb"] / model_mb
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["tool"] == row["tool"] and not r["efficient"])
        row["load_vs_plain"] = row["load_mb"] / base["load_mb"]
        row["growth_vs_plain"] = row["growth_mb"] / base["growth_mb"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "OUT_DIR"))
    parser.add_argument("--efficient", action="store_true")
    parser.add_argument("--meta", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--accelerate-python", default=None)
    options = parser.parse_args()
    if options.worker:
        model_dir, out_dir = options.worker
        worker(model_dir, out_dir, options.efficient, options.meta, options.steps)
        return
    rows = measure(
        options.accelerate_python, options.repeats, options.steps, options.hidden, options.layers
    )
    print(f"model: {rows[0]['model_mb']:.0f} MB fp32; {RANKS} ranks; MB summed over the ranks")
    print("load: peak until training starts (load + prepare) minus the libraries' baseline")
    print("growth: peak of the whole run (load, prepare, training steps) minus the baseline")
    print(
        f"{'tool':<11}{'efficient':<10}{'meta':<6}{'on meta':>8}{'load':>7}{'x model':>8}"
        f"{'x plain':>8}{'growth':>8}{'x model':>8}{'x plain':>8}{'baseline':>9}"
    )
    for row in rows:
        print(
            f"{row['tool']:<11}{row['efficient']!s:<10}{row['meta_on_others']!s:<6}"
            f"{row['ranks_on_meta']:>8}{row['load_mb']:>7.0f}{row['load_per_model']:>8.2f}"
            f"{row['load_vs_plain']:>8.2f}{row['growth_mb']:>8.0f}{row['growth_per_model']:>8.2f}"
            f"{row['growth_vs_plain']:>8.2f}{row['baseline_mb']:>9.0f}"
        )
    print("load by rank (MB):")
    for row in rows:
        ranks = " ".join(f"{value:6.0f}" for value in row["load_mb_by_rank"])
        print(
            f"  {row['tool']:<11}efficient={row['efficient']!s:<6}meta={row['meta_on_others']!s:<6}{ranks}"
        )


if __name__ == "__main__":
    main()
