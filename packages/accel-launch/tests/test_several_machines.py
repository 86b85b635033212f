"""Several machines: the interface the workers use, the address the rendezvous publishes, the store host.

The jobs themselves run on test hosts (network namespaces) in ``tests-integration/multihost``.
"""

import socket
import time

import pytest
from launch_helpers import SCRIPTS

from accel_launch.errors import JobFailedError
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import build_plan
from accel_launch.runners.elastic import _launch_config
from accel_launch.runners.machines import (
    MachineBoard,
    _serves_store,
    arrival_option,
    arrival_timeout,
)
from accel_state.network import CHOSEN_VARIABLES

SCRIPT = str(SCRIPTS / "plain_worker.py")


def plan_for(*flags, environ=None):
    args = build_launch_parser().parse_args(["--cpu", *flags, SCRIPT])
    return build_plan(args, None, {"CUDA_VISIBLE_DEVICES": "", **(environ or {})})


def two_machines(*flags, environ=None, host="127.0.0.1", port=29500):
    return plan_for(
        "--num_machines", "2", "--num_processes", "2", "--main_process_ip", host,
        "--main_process_port", str(port), *flags, environ=environ,
    )  # fmt: skip


def test_one_machine_publishes_the_endpoint_host_and_hosts_its_own_c10d_store(tmp_path):
    plan = plan_for("--num_processes", "2")
    assert plan.interface is None and plan.local_addr == "127.0.0.1"
    config = _launch_config(plan, str(tmp_path))
    assert config.local_addr == "127.0.0.1"
    assert config.rdzv_configs["is_host"] is True  # never torch's hostname lookup


def test_a_main_machine_over_loopback_sets_no_interface():
    plan = two_machines()
    assert plan.interface is None
    assert not any(name in plan.env for name in CHOSEN_VARIABLES)


def test_the_users_interface_wins_and_its_address_is_published():
    plan = two_machines(environ={"GLOO_SOCKET_IFNAME": "lo"})
    assert plan.interface is None and plan.local_addr == "127.0.0.1"
    assert "GLOO_SOCKET_IFNAME" not in plan.env  # the user's own variable reaches the workers


def test_c10d_on_several_machines_never_hosts_by_hostname(tmp_path):
    plan = two_machines("--rdzv_backend", "c10d")
    assert _launch_config(plan, str(tmp_path)).rdzv_configs["is_host"] is False
    # The user's is_host picks the launcher whose board serves the store; torch connects.
    mine = two_machines("--rdzv_backend", "c10d", "--rdzv_conf", "is_host=1")
    assert _launch_config(mine, str(tmp_path)).rdzv_configs["is_host"] is False
    assert _serves_store(mine, "127.0.0.1")
    assert not _serves_store(
        two_machines("--rdzv_backend", "c10d", "--rdzv_conf", "is_host=0"), "127.0.0.1"
    )


def test_the_arrival_wait_is_the_rendezvous_timeout_with_torchs_default():
    assert arrival_timeout(two_machines()) == 600
    assert arrival_timeout(two_machines("--rdzv_conf", "timeout=15")) == 15
    c10d = two_machines("--rdzv_backend", "c10d", "--rdzv_conf", "join_timeout=20")
    assert arrival_timeout(c10d) == 20
    assert arrival_option(c10d) == "--rdzv_conf join_timeout=SECONDS (default 600)"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_machine_0_serves_the_board_and_names_who_arrived_and_who_did_not():
    port = _free_port()
    main = MachineBoard(two_machines("--rdzv_conf", "timeout=5", port=port))
    main.open()
    try:
        assert main.server is not None
        assert list(main.arrivals()) == [0]
        main.opened_at = time.monotonic() - 4.6  # as if it had waited that long
        text = main.describe_missing(TimeoutError("1/2 clients joined"))
        assert (
            "failed after 5 s of waiting: machine(s) 1 never arrived (arrived: machine 0: " in text
        )
        assert "The wait allowed is 5 s: --rdzv_conf timeout=SECONDS (default 600)" in text
        other = MachineBoard(two_machines("--machine_rank", "1", port=port))
        other.open()
        assert sorted(main.arrivals()) == [0, 1]
        other.post_failure("accel launch: the job failed.\n  rank 1 exited with code 1")
        deadline = time.monotonic() + 30
        main.client.check(["x"])  # the store still answers
        key = main.key("accel/launch/{run_id}/failed")
        while not main.client.check([key]) and time.monotonic() < deadline:
            time.sleep(0.05)
        failure = main.client.get(key).decode()
        assert failure.startswith("machine 1 (") and "rank 1 exited with code 1" in failure
        other.close()
    finally:
        main.close()


def test_a_machine_that_cannot_reach_machine_0_names_the_address_and_the_wait():
    port = _free_port()  # nobody serves it
    board = MachineBoard(two_machines("--machine_rank", "1", "--rdzv_conf", "timeout=2", port=port))
    with pytest.raises(
        JobFailedError,
        match=rf"could not reach the rendezvous of machine 0 at 127.0.0.1:{port} within 2 s",
    ):
        board.open()


def test_a_store_error_after_every_machine_arrived_reads_as_the_main_machine_lost():
    board = MachineBoard(two_machines("--machine_rank", "1"))
    board.everyone_arrived = True  # what the watcher records once every arrival is posted
    text = board.describe_missing(RuntimeError("Connection reset by peer"))
    assert text.startswith("accel launch: lost the rendezvous store at 127.0.0.1:29500 0 s after")
    assert "(after every machine had arrived): machine 0's launcher ended or its link" in text


def test_a_store_that_stops_answering_reads_as_its_launcher_lost_with_the_real_wait():
    # An elastic (c10d) job posts no arrivals: the store's host is found gone by a probe.
    port = _free_port()
    serving = MachineBoard(two_machines("--rdzv_backend", "c10d", port=port))
    serving.open()
    joined = MachineBoard(
        two_machines("--rdzv_backend", "c10d", "--rdzv_conf", "is_host=0", port=port)
    )
    joined.open()
    assert joined.server is None and joined.store_answers()
    serving.close()
    joined.opened_at = time.monotonic() - 71.7
    text = joined.describe_missing(RuntimeError("Connection reset by peer"))
    assert text.startswith(
        f"accel launch: lost the rendezvous store at 127.0.0.1:{port} 72 s after this launcher "
        "started (gone): the launcher at 127.0.0.1 serving it ended or its link is down."
    ), text
    assert "arrived" not in text.split("[")[0]


def test_a_machine_whose_launcher_stops_beating_is_named_silent_with_its_ranks():
    port = _free_port()

    def machines(*flags):
        return plan_for(
            "--num_machines", "3", "--num_processes", "3", "--main_process_ip", "127.0.0.1",
            "--main_process_port", str(port), *flags,
        )  # fmt: skip

    boards = [MachineBoard(machines())]
    boards[0].open()
    boards += [MachineBoard(machines("--machine_rank", str(rank))) for rank in (1, 2)]
    try:
        for board in boards[1:]:
            board.open()
        for board in boards:
            board.watch()
        main, other, lost = boards
        deadline = time.monotonic() + 60
        while len(main._beats) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert main.everyone_arrived and main.silent_machines() == []  # all beat
        lost.close()  # its launcher stops beating, as a machine cut off would
        while not other.silent_machines() and time.monotonic() < deadline:
            time.sleep(0.2)
        # The store's host saw it; the other machine read the host's post.
        for board in (main, other):
            [(index, text, seconds)] = board.silent_machines()
            assert index == 2 and text.startswith(socket.gethostname()) and seconds >= 5
            line = board.describe_silent(board.silent_machines())
            assert line.startswith(f"machine 2 ({text}; rank 2) silent for ")
    finally:
        for board in reversed(boards):
            board.close()


def _child_failure(tmp_path, texts):
    """torch elastic's ChildFailedError for ranks that failed with ``texts`` (their error files)."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {}
    for rank, text in enumerate(texts):
        path = tmp_path / f"error-{rank}.json"
        extra = {"py_callstack": text, "timestamp": "100", "accel_timestamp": repr(100.0 + rank)}
        path.write_text(json.dumps({"message": {"message": text, "extraInfo": extra}}))
        failures[rank] = ProcessFailure(
            local_rank=rank, pid=1000 + rank, exitcode=1, error_file=str(path)
        )
    return ChildFailedError("train.py", failures)


WAITED = (
    "accel_ops.errors.CollectiveTimeoutError: torch Reducer._rebuild_buckets #7 (train.py:40) "
    "timed out on rank {rank} of 4 after 20.0 s: not every process entered the matching "
    "collective.\nSilent: ranks 2, 3 on node1 (198.18.0.11)."
)


def test_ranks_that_waited_for_a_silent_machine_are_not_called_the_first_failure(tmp_path):
    from accel_launch.runners.elastic import describe_failure

    error = _child_failure(tmp_path, [WAITED.format(rank=0), WAITED.format(rank=1)])
    silent = "machine 1 (node1 198.18.0.11; ranks 2, 3) silent for 26 s"
    summary, code = describe_failure(error, silent=silent)
    assert code == 1
    assert summary.startswith(f"accel launch: the job failed: {silent}: its launcher stopped")
    assert "(first failure)" not in summary
    assert summary.count("(waited for the silent machine)") == 2
    # A rank that failed for a reason of its own is still the first failure.
    error = _child_failure(tmp_path, [WAITED.format(rank=0), "ValueError: bad batch"])
    summary, _ = describe_failure(error, silent=silent)
    assert "rank 1 (local rank 1, pid 1001) exited with code 1  (first failure)" in summary
    # Without a silent machine, the earliest timeout is the first failure, as before.
    error = _child_failure(tmp_path, [WAITED.format(rank=0), WAITED.format(rank=1)])
    summary, _ = describe_failure(error)
    assert "rank 0 (local rank 0, pid 1000) exited with code 1  (first failure)" in summary
