"""Which failure of a job is its cause: the first that is not a peer's transport error."""

import pytest

from accel_state.failures import RankFailure, first_failure, is_secondary_failure

GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:40001"
)


@pytest.mark.parametrize(
    "text",
    [
        GLOO_CLOSED,
        "RuntimeError: [pair.cc:534] Read error [127.0.0.1]:5: Connection reset by peer",
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0.",
        "RuntimeError: Timed out waiting 3000ms for recv operation to complete",
        "torch.distributed.DistStoreError: failed to recv, got 0 bytes",
        "DistributedCheckpointError: save failed, nothing was committed. rank 1: OSError: disk full",
    ],
)
def test_transport_errors_are_consequences(text):
    assert is_secondary_failure(text)


@pytest.mark.parametrize(
    "text", ["RuntimeError: boom", "ValueError: lr must be positive", "CUDA out of memory", ""]
)
def test_errors_of_a_ranks_own_are_causes(text):
    assert not is_secondary_failure(text)


def test_the_earliest_cause_wins_over_an_earlier_consequence():
    failures = [
        RankFailure(0, 100.0, GLOO_CLOSED),
        RankFailure(2, 100.7, "ValueError: later cause"),
        RankFailure(1, 100.5, "RuntimeError: the cause"),
    ]
    assert first_failure(failures).rank == 1


def test_only_consequences_gives_the_earliest_and_ties_go_to_the_lower_rank():
    assert (
        first_failure([RankFailure(1, 5.0, GLOO_CLOSED), RankFailure(0, 6.0, GLOO_CLOSED)]).rank
        == 1
    )
    assert first_failure([RankFailure(2, 5.0, "x"), RankFailure(1, 5.0, "y")]).rank == 1


def test_no_failures_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one failure"):
        first_failure([])


def test_reporters_describe_the_process_and_one_that_raises_is_left_out():
    from accel_state import failures

    def broken() -> str:
        raise RuntimeError("a report must not mask the failure")

    failures.register_reporter("test-position", lambda: "waits in gather #3 (train.py:9)")
    failures.register_reporter("test-broken", broken)
    failures.register_reporter("test-silent", lambda: "")
    try:
        reports = failures.failure_reports()
        assert reports["test-position"] == "waits in gather #3 (train.py:9)"
        assert "test-broken" not in reports and "test-silent" not in reports
    finally:
        for name in ("test-position", "test-broken", "test-silent"):
            failures._REPORTERS.pop(name)


def test_a_worker_stopped_by_the_launcher_is_a_consequence():
    assert is_secondary_failure("Terminated: stopped by SIGTERM (the launcher stops every worker)")
