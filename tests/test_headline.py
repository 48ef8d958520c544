"""The headline result under CI: the seed case's raw_e, seed 0, trains to the first NaN that
the committed reports/seed.csv records, and stable_softmax, seed 0, stays finite through that
epoch with the committed history.

Nothing here is a hard-coded figure: the expected rows are the committed ones. A change that
moves them fails this test, and the committed reports must then be regenerated (README's
main job) in the same commit.
"""

import csv
from dataclasses import replace
from pathlib import Path

from stability.core.results import TIMING_FIELDS
from stability.sweep.cases import load_case
from stability.sweep.runner import run_case

ROOT = Path(__file__).parent.parent
SEED_CASE = ROOT / "cases" / "seed.toml"
REPORTS = ROOT / "reports"


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def committed(name: str, variant: str, seed: int = 0) -> list[dict[str, str]]:
    return [r for r in read(REPORTS / name) if r["variant"] == variant and r["seed"] == str(seed)]


def without_timing(row: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in row.items() if k not in TIMING_FIELDS}


def trained(tmp_path: Path, variant: str, **changes) -> tuple[list[dict], list[dict]]:
    case = replace(load_case(SEED_CASE), variants=(variant,), seeds=(0,), **changes)
    run_case(case, tmp_path, progress=False)
    return read(tmp_path / "seed.csv"), read(tmp_path / "seed.history.csv")


def test_raw_e_first_nan_is_the_committed_one(tmp_path):
    (expected,) = committed("seed.csv", "raw_e")
    assert expected["first_nan_epoch"], "the committed raw_e seed 0 run has no first NaN"
    rows, history = trained(tmp_path, "raw_e")
    assert [without_timing(r) for r in rows] == [without_timing(expected)], (
        "raw_e seed 0 moved away from reports/seed.csv: regenerate the committed reports"
    )
    assert history == committed("seed.history.csv", "raw_e")


def test_stable_softmax_is_finite_through_raw_e_s_first_nan(tmp_path):
    (raw,) = committed("seed.csv", "raw_e")
    epoch = int(raw["first_nan_epoch"])
    rows, history = trained(tmp_path / "stable", "stable_softmax", epochs=epoch)
    (row,) = rows
    assert row["first_nan_epoch"] == "", (
        f"stable_softmax hit a NaN at epoch {row['first_nan_epoch']}"
    )
    expected = [
        h for h in committed("seed.history.csv", "stable_softmax") if int(h["epoch"]) <= epoch
    ]
    assert [without_timing(h) for h in history] == [without_timing(h) for h in expected]
