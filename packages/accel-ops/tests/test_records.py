"""The ring of collective records: what a process entered, where from, and how it reports it."""

import pathlib

import pytest
import torch

import accel_ops
from accel_ops import records
from accel_state.failures import failure_reports

HERE = pathlib.Path(__file__).name


@pytest.fixture(autouse=True)
def fresh_ring():
    records.reset_records()
    yield
    records.reset_records()


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (where a collective is called)."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    return next(
        number for number, text in enumerate(lines, 1) if marker in text and "_line_of" not in text
    )


def test_each_collective_is_recorded_with_its_operand_and_the_callers_line():
    accel_ops.gather(torch.ones(3, 2))  # call: gather
    accel_ops.reduce(torch.ones(4, dtype=torch.float64), reduction="sum")  # call: reduce
    accel_ops.gather_object(["a"])  # call: gather_object
    kept = records.records()
    assert [(entry.op, entry.seq, entry.state) for entry in kept] == [
        ("gather", 1, "done"),
        ("reduce", 2, "done"),
        ("gather_object", 3, "done"),
    ]
    assert kept[0].site == f"{HERE}:{_line_of('# call: gather')}"
    assert kept[1].site == f"{HERE}:{_line_of('# call: reduce')}"
    assert kept[0].describe() == f"gather #1 ({HERE}:{_line_of('# call: gather')}, float32[3, 2])"
    assert "float64[4]" in kept[1].describe()
    assert "(list" not in kept[2].describe() and "list" in kept[2].describe()


def test_a_collective_inside_a_recorded_block_is_part_of_it():
    with records.record("save_state") as outer:  # call: block
        records.annotate("Writing checkpoint")
        accel_ops.gather(torch.ones(2))
        accel_ops.broadcast_object_list([1])
    assert outer is not None
    assert [entry.op for entry in records.records()] == ["save_state"]
    assert outer.phase == "Writing checkpoint"
    assert outer.site == f"{HERE}:{_line_of('# call: block')}"


def test_position_says_waits_in_while_inside_and_last_entered_after():
    assert records.describe_position() == ""
    with records.record("gather", torch.zeros(5)):
        inside = records.describe_position()
    after = records.describe_position()
    assert inside.startswith("waits in gather #1 (") and "float32[5]" in inside
    assert after.startswith("last entered gather #1 (")
    # The launcher's failure recorder reads the same line through accel_state.failures.
    assert failure_reports()["collectives"] == after


def test_an_error_that_is_not_distributed_passes_through_unchanged():
    with pytest.raises(accel_ops.InvalidArgumentError):
        accel_ops.reduce(torch.ones(2), reduction="median")
    with pytest.raises(KeyError, match="mine"), records.record("backward"):
        raise KeyError("mine")
    assert [entry.state for entry in records.records()] == ["failed", "failed"]
    assert records.describe_position().startswith("failed in backward #2")


def test_the_ring_keeps_the_newest_records_and_numbers_on():
    for _ in range(records.RING_SIZE + 5):
        accel_ops.gather(torch.ones(1))
    kept = records.records()
    assert len(kept) == records.RING_SIZE
    assert kept[0].seq == 6 and kept[-1].seq == records.RING_SIZE + 5


def test_a_nested_tensor_operand_is_recorded_without_reading_its_shape():
    # Regression: a nested tensor has no single shape; recording pad_across_processes's
    # operand read ``.shape`` and raised "NestedTensorImpl doesn't support sizes".
    nested = torch.nested.nested_tensor([[1, 2, 3], [1], [1, 2]])
    with pytest.warns(accel_ops.CannotPadNestedTensorWarning):
        assert accel_ops.pad_across_processes(nested) is nested
    (entry,) = records.records()
    assert entry.op == "pad_across_processes" and entry.state == "done"
    assert "nested tensor of int64" in entry.describe()
