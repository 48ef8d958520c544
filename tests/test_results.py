"""The CSV columns come from the row types, in the order the committed reports have."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

import pytest

from stability.core.results import (
    HISTORY_FIELDS,
    NAN_FIELDS,
    RESULT_FIELDS,
    EpochRecord,
    RunResult,
)

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def header(path: Path) -> tuple[str, ...]:
    with path.open(newline="", encoding="utf-8") as handle:
        return tuple(next(csv.reader(handle)))


def test_result_columns_are_the_committed_reports():
    assert header(REPORTS / "seed.csv") == RESULT_FIELDS


def test_history_columns_are_the_committed_reports():
    assert header(REPORTS / "seed.history.csv") == HISTORY_FIELDS


@pytest.mark.parametrize(
    ("row_type", "columns"), [(RunResult, RESULT_FIELDS), (EpochRecord, HISTORY_FIELDS)]
)
def test_every_field_is_a_column(row_type, columns):
    kept = {f.name for f in fields(row_type) if f.metadata.get("column", True)}
    missing = kept - set(columns)
    assert not missing, f"{row_type.__name__} fields missing from the CSV columns: {missing}"


def test_the_history_and_the_failure_record_are_not_columns():
    names = {f.name for f in fields(RunResult) if not f.metadata.get("column", True)}
    assert names == {"history", "failure"}
    assert not names & set(RESULT_FIELDS)


def test_a_row_and_a_history_row_have_exactly_the_columns():
    result = RunResult("c", "raw_e", 0, "d", 8, 1e-3, 2, "float32", history=[EpochRecord(1)])
    assert tuple(result.row()) == RESULT_FIELDS
    assert set(result.history_rows()[0]) == set(HISTORY_FIELDS)  # the writer orders them


def test_nan_fields_run_from_the_first_nan_to_the_loss_nan():
    assert NAN_FIELDS[0] == "first_nan_epoch" and NAN_FIELDS[-1] == "loss_nan_epoch"
    assert all(name in RESULT_FIELDS for name in NAN_FIELDS)
