"""End-to-end jobs through the real ``accel launch`` CLI on 2 and 3 CPU processes."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    EXAMPLES,
    SCRIPTS,
    accel_command,
    find_free_port,
    launch,
    marked_lines,
    run_accel,
)

SEED_SECTIONS = [
    "main use",
    "distributed evaluation",
    "run once",
    "wait for everyone",
    "save and load model",
    "save and load state",
    "gradient clipping",
    "mixed precision",
    "gradient accumulation",
    "split batches",
    "distributed type",
]


@pytest.mark.parametrize("processes", [2, 3])
def test_seed_quick_tour_snippets_run_as_written(tmp_path, clean_env, processes):
    result = launch(SCRIPTS / "quick_tour.py", str(tmp_path), env=clean_env, processes=processes)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert marked_lines(result.stdout, "OK") == SEED_SECTIONS
    assert result.stdout.count("printed once per machine") == 1


def test_mixed_precision_flag_reaches_the_script(tmp_path, clean_env):
    result = launch(
        SCRIPTS / "quick_tour.py", str(tmp_path), env=clean_env, flags=("--mixed_precision", "bf16")
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert marked_lines(result.stdout, "OK") == SEED_SECTIONS


def test_a_script_that_never_imports_accel(clean_env):
    result = launch(SCRIPTS / "plain_torch.py", env=clean_env, processes=3)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(marked_lines(result.stdout, "PLAIN")) == [
        "rank=0 world=3 sum=3",
        "rank=1 world=3 sum=3",
        "rank=2 world=3 sum=3",
    ]


def test_a_failing_rank_ends_the_job_with_its_traceback(clean_env):
    started = time.monotonic()
    result = launch(SCRIPTS / "failing.py", env=clean_env, timeout=120)
    assert result.returncode != 0
    assert "rank 1 failed on purpose" in result.stdout + result.stderr
    assert time.monotonic() - started < 90


def test_config_file_in_the_seed_format(tmp_path, clean_env):
    config = tmp_path / "config.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\n"
        "debug: false\n"
        "distributed_type: MULTI_CPU\n"
        "downcast_bf16: 'no'\n"
        "machine_rank: 0\n"
        "main_training_function: main\n"
        "mixed_precision: bf16\n"
        "num_machines: 1\n"
        "num_processes: 2\n"
        "rdzv_backend: static\n"
        "same_network: true\n"
        "tpu_env: []\n"
        "tpu_use_cluster: false\n"
        "tpu_use_sudo: false\n"
        "use_cpu: true\n"
    )
    result = run_accel(
        [
            "launch",
            "--config_file",
            str(config),
            "--gradient_accumulation_steps",
            "3",
            str(SCRIPTS / "report_state.py"),
        ],
        env=clean_env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(marked_lines(result.stdout, "STATE")) == [
        "rank=0 num=2 type=MULTI_CPU precision=bf16 accumulation=3 sum=1",
        "rank=1 num=2 type=MULTI_CPU precision=bf16 accumulation=3 sum=1",
    ]


def _wait_for_machines(
    machines: list[subprocess.Popen[bytes]], logs: list[tuple[Path, Path]], timeout: float
) -> None:
    """Wait for every launcher; fail at once, with its stderr, when one of them fails.

    A machine whose workers finished waits in the elastic agent's exit barrier (up to 300 s) for
    the others, so a failure elsewhere has to be noticed here rather than by waiting in order.
    """
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [machine.poll() for machine in machines]
            for index, code in enumerate(codes):
                if code not in (None, 0):
                    pytest.fail(
                        f"machine {index} exited with {code}:\n"
                        + logs[index][1].read_text()[-3000:]
                    )
            if all(code == 0 for code in codes):
                return
            time.sleep(0.2)
        pytest.fail(
            f"the two machines did not finish within {timeout} s; stderr of machine 0:\n"
            + logs[0][1].read_text()[-2000:]
        )
    finally:
        for machine in machines:
            if machine.poll() is None:
                os.killpg(machine.pid, signal.SIGKILL)
                machine.wait()


def test_two_machines_on_localhost_form_one_job(clean_env, tmp_path):
    port = str(find_free_port())
    common = [
        "launch",
        "--cpu",
        "--num_machines",
        "2",
        "--num_processes",
        "4",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        port,
    ]
    logs = [(tmp_path / f"machine{rank}.out", tmp_path / f"machine{rank}.err") for rank in (0, 1)]
    machines = []
    for rank, (out, err) in enumerate(logs):
        with out.open("wb") as stdout, err.open("wb") as stderr:
            machines.append(
                subprocess.Popen(
                    [
                        *accel_command(),
                        *common,
                        "--machine_rank",
                        str(rank),
                        str(SCRIPTS / "report_state.py"),
                    ],
                    stdout=stdout,
                    stderr=stderr,
                    env=clean_env,
                    start_new_session=True,
                )
            )
    _wait_for_machines(machines, logs, timeout=240)
    outputs = [out.read_text() for out, _ in logs]
    states = sorted(line for out in outputs for line in marked_lines(out, "STATE"))
    assert [line.split()[0] for line in states] == ["rank=0", "rank=1", "rank=2", "rank=3"]
    assert all("num=4 type=MULTI_CPU" in line and "sum=6" in line for line in states)


def test_notebook_launcher_from_a_plain_interpreter(clean_env):
    import sys

    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "notebook.py")],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert marked_lines(result.stdout, "NOTEBOOK") == ["gathered=[10.0, 20.0] num=2", "done"]


def _accuracies(output: str) -> dict[int, str]:
    found = {}
    for line in output.replace("\r", "\n").splitlines():
        if line.startswith("epoch ") and "test accuracy" in line:
            epoch = int(line.split()[1].rstrip(":"))
            found[epoch] = line.split()[-1]
    return found


def test_example_gives_the_same_accuracy_on_1_2_and_3_processes(tmp_path, clean_env):
    finals = {}
    for processes in (1, 2, 3):
        result = launch(
            EXAMPLES / "train_digits.py",
            "--project_dir",
            str(tmp_path / f"p{processes}"),
            env=clean_env,
            processes=processes,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        finals[processes] = float(_accuracies(result.stdout)[10])
    assert min(finals.values()) >= 0.95, finals
    assert max(finals.values()) - min(finals.values()) <= 0.01, finals


def test_example_killed_with_sigkill_resumes_exactly(tmp_path, clean_env):
    # Small batches make an epoch last a couple of seconds, so the kill lands inside the run.
    args = ["--epochs", "5", "--batch_size", "6", "--project_dir"]
    full = launch(
        EXAMPLES / "train_digits.py", *args, str(tmp_path / "full"), env=clean_env, timeout=300
    )
    assert full.returncode == 0, full.stderr[-3000:]
    expected = _accuracies(full.stdout)
    assert sorted(expected) == [1, 2, 3, 4, 5]

    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [
            *accel_command(),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(EXAMPLES / "train_digits.py"),
            *args,
            str(run_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env,
        start_new_session=True,
    )
    third_epoch = run_dir / "checkpoints" / "checkpoint_2"
    try:
        deadline = time.monotonic() + 240
        while not third_epoch.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the launcher and its workers, during epoch 4
        job.wait(timeout=30)
    assert third_epoch.exists() and job.returncode == -signal.SIGKILL

    resumed = launch(
        EXAMPLES / "train_digits.py", *args, str(run_dir), "--resume", env=clean_env, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _accuracies(resumed.stdout)
    assert after and max(after) == 5 and min(after) >= 3
    assert {epoch: expected[epoch] for epoch in after} == after
