"""The record of Accelerate's side (reference.py): it fits this venv, and says when it does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import reference
from ecosystem_jobs import JobRunner, require_libraries

require_libraries()


def test_the_record_was_made_with_the_installed_libraries() -> None:
    """CI's own check: a pin changed without `nox -s ecosystem_reference` fails here, naming it."""
    record = reference.load()
    installed = reference.environment()
    software, _machine = reference.differences(record["environment"], installed)
    assert not software, f"run `{reference.RECORD_SESSION}`: {software}"
    assert record["environment"]["libraries"]["accelerate"] == "1.15.0"
    assert len(record["results"]) >= 10


def test_other_versions_are_refused_naming_the_session() -> None:
    record = copy.deepcopy(reference.load())
    record["environment"]["libraries"]["transformers"] = "0.0.1"
    with pytest.raises(reference.ReferenceMismatch, match="ecosystem_reference") as raised:
        reference.check_fits(record, reference.environment())
    assert "transformers: recorded 0.0.1" in str(raised.value)


def test_a_job_without_a_recorded_result_fails_naming_the_session(tmp_path: Path) -> None:
    record = reference.load()
    file = tmp_path / "record.json"
    file.write_text(json.dumps({**record, "results": {}}))
    (tmp_path / "jobs").mkdir()
    runner = JobRunner(tmp_path / "jobs", record_file=file)
    with pytest.raises(pytest.fail.Exception, match=r"no recorded Accelerate result.*ecosystem_"):
        runner.run("accelerate", "trainer_job.py", "--resume")


def test_two_records_compare_leaf_by_leaf() -> None:
    record = reference.load()
    changed = copy.deepcopy(record)
    key = next(iter(changed["results"]))
    changed["results"][key]["_names_used"] = []
    assert reference.compare_records(record, record) == []
    (line,) = reference.compare_records(record, changed)
    assert line.startswith(key) and "_names_used" in line
