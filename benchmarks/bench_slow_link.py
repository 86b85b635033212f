"""Two machines joined by a slow link: DDP vs replica groups vs DiLoCo vs streaming DiLoCo.

Two test hosts (network namespaces joined by a bridge, ``scripts/test_hosts.py``; needs root,
iproute2 and ``tc``) with host 1's link limited to ``--mbit`` Mbit/s (a token bucket at both of
its ends). The diloco example's language model (``--width 256``: 0.8 M parameters) trains the
same samples in each mode, one process per host (``benchmarks/slow_link_worker.py``):

* ``raw``: hand-written DDP across the hosts (the baseline of the time ratios);
* ``ddp``: the Accelerator, DDP across the hosts;
* ``ft``: per-step replica groups, one per host (the gradients cross the link every step);
* ``diloco-50``, ``diloco-100``: ``LocalSGD(..., diloco=DiLoCoSettings())``, an outer sync every
  50 or 100 steps;
* ``streaming``: streaming DiLoCo, sync every 50 steps in 2 fragments, each overlapped with
  the next step (``fragment_sync_delay=1``); with ``--quantize`` (CUDA only: torchft's
  quantized all-reduce needs triton) its exchange is int8.

For each mode: the mean time per optimizer step (host 0, first step excluded, syncs included),
the bytes that crossed host 1's link (both ways, headers included) in all and per step, and the
final evaluation loss on held-out text, beside the ratios against ``raw`` (time) and ``ddp``
(loss). Rounds alternate the modes; medians over rounds are reported.

Run (as root): ``python benchmarks/bench_slow_link.py [--mbit 100] [--rounds 1]
[--modes raw ddp ft diloco-50 diloco-100 streaming]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts"))

from test_hosts import TestHost, TestHosts, job_env, stop_process_tree  # noqa: E402

WORKER = HERE / "slow_link_worker.py"
RENDEZVOUS_PORT = 29500
LIGHTHOUSE_PORT = 29510
JOB_TIMEOUT_SECONDS = 1200.0
MODES: dict[str, list[str]] = {
    "raw": ["--mode", "raw"],
    "ddp": ["--mode", "ddp"],
    "ft": ["--mode", "ft"],
    "diloco-50": ["--mode", "diloco", "--sync_every", "50"],
    "diloco-100": ["--mode", "diloco", "--sync_every", "100"],
    "streaming": [
        "--mode",
        "diloco",
        "--sync_every",
        "50",
        "--fragments",
        "2",
        "--fragment_sync_delay",
        "1",
    ],
}


def accel_command() -> list[str]:
    """``accel launch`` from this interpreter's environment."""
    return [str(Path(sys.executable).with_name("accel")), "launch", "--cpu"]


def host_command(hosts: TestHosts, host: TestHost, mode: str, worker: list[str]) -> list[str]:
    """The launcher of ``host`` for ``mode``."""
    if mode in ("raw", "ddp"):
        command = [*accel_command(), "--num_machines", "2", "--num_processes", "2"]
        command += ["--main_process_ip", hosts[0].address]
        command += ["--main_process_port", str(RENDEZVOUS_PORT), "--rdzv_backend", "static"]
        command += ["--machine_rank", str(host.index)]
    else:
        command = [*accel_command(), "--num_processes", "1", "--ft_replicas", "2"]
        command += ["--ft_replica_id", str(host.index)]
        command += ["--ft_lighthouse", f"{hosts[0].address}:{LIGHTHOUSE_PORT}"]
    return [*command, str(WORKER), *worker]


def run_mode(hosts: TestHosts, mode: str, extra: list[str], folder: Path) -> dict[str, float]:
    """One job of ``mode`` over both hosts; its figures."""
    out = folder / mode
    worker = [*MODES[mode], "--out", str(out), *extra]
    if mode == "streaming" and "--quantize" in extra:
        worker.append("--quantize")
    lighthouse = None
    if mode not in ("raw", "ddp"):
        binary = Path(sys.executable).with_name("torchft_lighthouse")
        bind = f"{hosts[0].address}:{LIGHTHOUSE_PORT}"
        lighthouse = hosts[0].popen(
            [str(binary), "--min_replicas", "2", "--bind", bind],
            env=job_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    before = hosts.link_bytes(hosts[1])
    logs = [(folder / f"{mode}-{host.index}.log").open("w") for host in hosts]
    jobs = [
        host.popen(
            host_command(hosts, host, mode, worker),
            env=job_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for host, log in zip(hosts, logs, strict=True)
    ]
    try:
        codes = [job.wait(timeout=JOB_TIMEOUT_SECONDS) for job in jobs]
    finally:
        for job in jobs:
            stop_process_tree(job)
        if lighthouse is not None:
            stop_process_tree(lighthouse)
        for log in logs:
            log.close()
    crossed = hosts.link_bytes(hosts[1]) - before
    if any(codes):
        tails = "\n".join((folder / f"{mode}-{i}.log").read_text()[-3000:] for i in range(2))
        raise RuntimeError(f"{mode}: exit codes {codes}\n{tails}")
    records = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    times = records[0]["step_times"]
    steps = len(times)
    return {
        "step_s": (times[-1] - times[0]) / max(steps - 1, 1),
        "steps": steps,
        "link_mb": crossed.total / 1e6,
        "link_kb_per_step": crossed.total / 1e3 / steps,
        "eval_loss": statistics.mean(record["eval_loss"] for record in records),
    }


def report(results: dict[str, list[dict[str, float]]], mbit: float) -> None:
    """Medians over rounds, as a markdown table."""
    median = {
        mode: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        for mode, rounds in results.items()
    }
    base_time = median.get("raw", next(iter(median.values())))["step_s"]
    base_loss = median.get("ddp", next(iter(median.values())))["eval_loss"]
    print(f"\nTwo test hosts, host 1's link at {mbit:g} Mbit/s; medians of "
          f"{len(next(iter(results.values())))} round(s)\n")  # fmt: skip
    print("| mode | steps | s/step | vs raw DDP | link MB | link kB/step | eval loss | vs ddp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, figures in median.items():
        print(
            f"| {mode} | {figures['steps']:.0f} | {figures['step_s']:.3f} | "
            f"{figures['step_s'] / base_time:.2f}x | {figures['link_mb']:.1f} | "
            f"{figures['link_kb_per_step']:.1f} | {figures['eval_loss']:.4f} | "
            f"{100 * (figures['eval_loss'] / base_loss - 1):+.2f}% |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Make the hosts, limit the link, run every mode each round, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--samples", type=int, default=6400)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--quantize", action="store_true", help="streaming: int8 (CUDA only)")
    args = parser.parse_args(argv)
    extra = ["--samples", str(args.samples), "--width", str(args.width)]
    if args.quantize:
        extra.append("--quantize")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    with TestHosts(2) as hosts, tempfile.TemporaryDirectory(prefix="slow-link-") as tmp:
        hosts.limit_rate(hosts[1], args.mbit)
        for round_index in range(args.rounds):
            order = (
                args.modes[round_index % len(args.modes) :]
                + args.modes[: round_index % len(args.modes)]
            )
            for mode in order:
                folder = Path(tmp) / f"round{round_index}"
                folder.mkdir(exist_ok=True)
                figures = run_mode(hosts, mode, extra, folder)
                results[mode].append(figures)
                print(f"round {round_index} {mode}: {json.dumps(figures)}", flush=True)
    report(results, args.mbit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
