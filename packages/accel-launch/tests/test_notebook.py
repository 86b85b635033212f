"""notebook_launcher / debug_launcher from a plain interpreter."""

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from launch_helpers import clean_env, run

import accel_launch.notebook as notebook
from accel_launch.errors import NotebookLaunchError
from accel_state.testing import find_free_port

FUNCTION = """
import os, sys
import torch
import torch.distributed as dist
from accel_launch import debug_launcher, notebook_launcher

def train(out_dir, tag):
    from accel_state.partial_state import PartialState
    state = PartialState()
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    with open(os.path.join(out_dir, f"{tag}{state.process_index}"), "w") as handle:
        handle.write(f"{value.item()} {state.contract.mixed_precision} {state.device}")
"""


def test_notebook_launcher_forks_cpu_workers(tmp_path):
    code = (
        FUNCTION
        + f"notebook_launcher(train, args=({str(tmp_path)!r}, 'nb'), num_processes=2, mixed_precision='bf16', use_port={find_free_port()})\n"
    )
    result = run([sys.executable, "-c", code], env=clean_env(CUDA_VISIBLE_DEVICES=""), timeout=90)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["nb0", "nb1"]
    assert all(path.read_text() == "2.0 bf16 cpu" for path in tmp_path.iterdir())


def test_debug_launcher_and_failure_traceback(tmp_path):
    code = (
        FUNCTION
        + f"""
debug_launcher(train, args=({str(tmp_path)!r}, 'dbg'))
def broken():
    raise ValueError("bad idea in worker")
from accel_launch.errors import JobFailedError
try:
    debug_launcher(broken, num_processes=2)
except JobFailedError as error:
    print("CAUGHT", error)
"""
    )
    result = run([sys.executable, "-c", code], timeout=90)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dbg0", "dbg1"]
    assert "CAUGHT notebook_launcher: the job failed." in result.stdout
    assert "ValueError: bad idea in worker" in result.stdout


def test_single_process_runs_in_this_interpreter(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    seen = []
    notebook.notebook_launcher(lambda x: seen.append(x), args=(5,))
    assert seen == [5]


def test_initialised_cuda_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(NotebookLaunchError, match="CUDA was initialised"):
        notebook.notebook_launcher(lambda: None, num_processes=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mixed_precision": "fp32"}, "mixed_precision"),
        ({"node_rank": 1}, "node_rank"),
        ({"num_processes": 0}, "num_processes"),
    ],
)
def test_bad_arguments(monkeypatch, kwargs, match):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(NotebookLaunchError, match=match):
        notebook.notebook_launcher(lambda: None, **kwargs)


CONCURRENT = (
    FUNCTION
    + """
import json
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from accel_launch.errors import JobFailedError
out_dir, tag, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
notebook_launcher(train, args=(out_dir, tag), num_processes=2, **kwargs)
def broken(fail_rank):
    import os
    if int(os.environ["RANK"]) == fail_rank:
        raise ValueError("bad idea in worker")
try:
    notebook_launcher(broken, args=(1,), num_processes=2, **kwargs)
except ChildFailedError as error:
    print("CHILD", sorted(error.failures), isinstance(error, JobFailedError), error.exit_code)
    print(error)
"""
)


def test_concurrent_launches_pick_free_ports_and_failures_raise_child_failed_error(tmp_path):
    """Two notebook launches at once, neither naming a port; each then sees a worker fail."""
    jobs = {
        "a": {},
        "b": {
            "rdzv_backend": "c10d",
            "rdzv_conf": {"join_timeout": 60},
            "monitor_interval": 0.2,
            "log_line_prefix_template": "[b${local_rank}]:",
        },
    }

    def launch(tag):
        argv = [sys.executable, "-c", CONCURRENT, str(tmp_path), tag, json.dumps(jobs[tag])]
        return run(argv, env=clean_env(CUDA_VISIBLE_DEVICES=""), timeout=150)

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(jobs, pool.map(launch, jobs), strict=True))
    ports = {}
    for tag, result in results.items():
        assert result.returncode == 0, result.stderr
        ports[tag] = re.findall(r"rendezvous 127.0.0.1:(\d+)", result.stderr)
        assert "CHILD [1] True 1" in result.stdout, result.stdout
        assert "ValueError: bad idea in worker" in result.stdout
    assert len(ports["a"]) == 2 and "29500" not in ports["a"]  # a free port each time
    assert ports["b"] == ["0", "0"]  # c10d: the OS picks the port when the store binds
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a0", "a1", "b0", "b1"]
    assert all(path.read_text() == "2.0 no cpu" for path in tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rdzv_backend": "etcd"}, "rdzv_backend"),
        ({"monitor_interval": 0}, "monitor_interval"),
        ({"use_port": "http"}, "use_port"),
    ],
)
def test_bad_rendezvous_arguments(monkeypatch, kwargs, match):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(NotebookLaunchError, match=match):
        notebook.notebook_launcher(lambda: None, **kwargs)


def test_rendezvous_defaults():
    def resolve(**kwargs):
        base = {
            "rdzv_backend": "static",
            "rdzv_endpoint": "",
            "rdzv_conf": None,
            "rdzv_id": "none",
            "use_port": None,
            "master_addr": "10.0.0.1",
            "node_rank": 1,
            "num_nodes": 2,
        }
        return notebook._rendezvous(**{**base, **kwargs})

    several = resolve()
    assert several.endpoint == "10.0.0.1:29500" and several.conf == {"rank": 1}
    assert several.run_id == "none"  # shared by every machine
    given = resolve(rdzv_backend="c10d", rdzv_endpoint="h:1234", rdzv_conf={"timeout": 9})
    assert (given.endpoint, given.conf) == ("h:1234", {"timeout": 9})
    one = resolve(num_nodes=1, node_rank=0, master_addr="127.0.0.1")
    assert one.endpoint != "127.0.0.1:29500" and one.run_id != "none"
