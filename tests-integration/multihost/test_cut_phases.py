"""A machine cut off in any phase of a step: the other machine ends in time and names it.

Two test hosts, 2 processes each, static rendezvous, ``--collective_timeout 20``. node1 stops in
one phase of the everyday loop (``cut_phase.py``: forward on step 2, backward, optimizer step,
data loading, ``save_state``, the evaluation's gather, between epochs) and its link is cut there;
node0's ranks wait for it in whatever collective comes next: DDP's bucket rebuild or gradient
all-reduce, FSDP's all-gather or reduce-scatter, accel's gather, the checkpoint's barrier.
Whichever it is, node0 must end within the collective timeout + 30 s, with its launcher naming
node1 and its ranks as silent, its workers' errors naming them too (gloo's raw timeout
translated), and no local rank called the first failure for having waited.

The cases run a few at a time (each on its own pair of hosts): once a job stops in its phase it
only waits.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Finished, launch_command, outputs, start, wait_all
from cut_phase import PHASES
from test_hosts import TestHosts, stop_process_tree

HERE = Path(__file__).parent
CUT_SCRIPT = HERE / "cut_phase.py"
COLLECTIVE_TIMEOUT = 20
#: Cases at a time: a job stopped in its phase only waits, so several fit on 2 cores.
AT_ONCE = 4


def _cut_in_phase(hosts: TestHosts, phase: str, strategy: str, folder: Path) -> Finished:
    """Run the job on ``hosts``, cut node1 once it is in ``phase``; node0's launcher's end."""
    out = folder / phase
    out.mkdir(parents=True)
    flags = ["--collective_timeout", str(COLLECTIVE_TIMEOUT)]
    args = [str(CUT_SCRIPT), str(out), "--phase", phase, "--strategy", strategy]
    jobs = {}
    for host in hosts:
        log = folder / f"{phase}-{host.hostname}.log"
        command = [*launch_command(hosts, host, 2, "static", flags), *args]
        jobs[host.hostname] = (host, start(host, command, log), log)
    try:
        deadline = time.monotonic() + 300
        while not (out / "at-phase").exists():
            ended = [name for name, (_, process, _) in jobs.items() if process.poll() is not None]
            if ended or time.monotonic() > deadline:
                logs = "\n".join(
                    f"=== {n}\n{log.read_text()[-3000:]}" for n, (_, _, log) in jobs.items()
                )
                raise AssertionError(f"{phase}: node1 never reached the phase ({ended=}):\n{logs}")
            time.sleep(0.1)
        cut_at = time.monotonic()
        hosts.cut(hosts[1])
        return wait_all({"node0": jobs["node0"]}, cut_at, COLLECTIVE_TIMEOUT + 120)["node0"]
    finally:
        for _, process, _ in jobs.values():
            stop_process_tree(process, grace=2.0)


@pytest.mark.timeout(1500)  # hang guard only
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_machine_cut_in_any_phase_is_named_and_the_other_ends_in_time(
    strategy, make_hosts, tmp_path
):
    results: dict[str, Finished] = {}
    with ThreadPoolExecutor(AT_ONCE) as pool:
        for first in range(0, len(PHASES), AT_ONCE):
            chunk = PHASES[first : first + AT_ONCE]
            pairs = [make_hosts(2) for _ in chunk]
            try:
                futures = {
                    phase: pool.submit(_cut_in_phase, hosts, phase, strategy, tmp_path)
                    for phase, hosts in zip(chunk, pairs, strict=True)
                }
                results.update({phase: future.result() for phase, future in futures.items()})
            finally:
                for hosts in pairs:
                    hosts.stop()
    failures = []
    for phase in PHASES:
        end = results[phase]
        line = next((text for text in end.output.splitlines() if "silent for" in text), "(no line)")
        where = next(
            (text for text in end.output.splitlines() if text.startswith("Where the ranks were")),
            "",
        )
        print(f"MEASURED cut {strategy} {phase}: node0 ended {end.seconds:.1f} s after the cut")
        print(f"  {line}\n  {where}")
        problems = []
        if end.returncode != 1:
            problems.append(f"exit {end.returncode}, not 1")
        if end.seconds >= COLLECTIVE_TIMEOUT + 30:
            problems.append(f"ended {end.seconds:.1f} s after the cut")
        if not re.search(r"machine 1 \(node1 198\.18\.0\.11; ranks 2, 3\) silent for", end.output):
            problems.append("the launcher did not name node1 as silent")
        if "(first failure)" in end.output:
            problems.append("a local rank was called the first failure")
        if not re.search(r"Silent: ranks 2, 3 on node1 \(198\.18\.0\.11\)", end.output):
            problems.append("no worker error named the silent ranks")
        if re.search(r"^(RuntimeError|torch\.distributed\.DistBackendError): ", end.output, re.M):
            problems.append("a raw gloo error reached the output untranslated")
        if problems:
            failures.append(f"{phase}: {'; '.join(problems)}\n{outputs({'node0': end})}")
    assert not failures, "\n\n".join(failures)
