"""Durable result files without training: atomic writes, appends, refusing to overwrite."""

import csv

import pytest

from stability.core.errors import StabilityError
from stability.core.files import TEMP_SUFFIX, atomic_write_text, atomic_writer
from stability.core.results import RESULT_FIELDS, RunResult
from stability.sweep.store import RunStore


def result(seed, **changes):
    return RunResult(
        case="tiny",
        variant="raw_e",
        seed=seed,
        dataset="d",
        batch_size=16,
        learning_rate=0.01,
        epochs=2,
        dtype="float32",
        **changes,
    )


def rows(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "report.md"
    atomic_write_text(path, "old\n")
    with pytest.raises(RuntimeError), atomic_writer(path) as handle:
        handle.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_rows_are_appended_and_finish_sorts_them(tmp_path):
    store = RunStore(tmp_path, "tiny")
    for seed in (2, 0, 1):
        store.add(result(seed, best_mae=float(seed)))
    assert [r["seed"] for r in rows(tmp_path / "tiny.csv")] == ["2", "0", "1"]
    store.add(result(0, best_mae=9.0))  # a run another process finished meanwhile
    store.finish()
    written = rows(tmp_path / "tiny.csv")
    assert [r["seed"] for r in written] == ["0", "1", "2"]
    assert [r["best_mae"] for r in written] == ["0.0", "1.0", "2.0"]
    assert tuple(written[0]) == RESULT_FIELDS


def test_without_resume_a_csv_with_runs_is_kept_and_refused(tmp_path):
    RunStore(tmp_path, "tiny").add(result(0))
    before = (tmp_path / "tiny.csv").read_text()
    with pytest.raises(StabilityError, match=r"tiny.csv already holds 1 run\(s\); pass --resume"):
        RunStore(tmp_path, "tiny")
    assert (tmp_path / "tiny.csv").read_text() == before
    assert RunStore(tmp_path, "tiny", overwrite=True).done == set()
    assert rows(tmp_path / "tiny.csv") == []
    RunStore(tmp_path, "tiny").add(result(0))
    assert RunStore(tmp_path, "tiny", resume=True).done == {
        ("tiny", "raw_e", "0", "d", "16", "0.01")
    }


def test_a_row_cut_short_by_a_crash_is_dropped(tmp_path):
    store = RunStore(tmp_path, "tiny")
    store.add(result(0))
    with (tmp_path / "tiny.csv").open("a") as handle:
        handle.write("tiny,raw_e,1,d,16")  # no newline: the writer died here
    resumed = RunStore(tmp_path, "tiny", resume=True)
    assert len(resumed.done) == 1
    resumed.add(result(1))
    assert [r["seed"] for r in rows(tmp_path / "tiny.csv")] == ["0", "1"]


def test_stale_temp_files_are_removed_on_the_next_sweep(tmp_path):
    stale = tmp_path / f".tiny.md.abc{TEMP_SUFFIX}"
    stale.write_text("half")
    RunStore(tmp_path, "tiny")
    assert not stale.exists()


def test_resume_refuses_rows_of_other_settings(tmp_path):
    RunStore(tmp_path, "tiny").add(result(0))
    with pytest.raises(
        StabilityError, match="holds runs with epochs = 2, this case has epochs = 5"
    ):
        RunStore(tmp_path, "tiny", resume=True, settings={"epochs": 5})
    assert RunStore(tmp_path, "tiny", resume=True, settings={"epochs": 2, "dtype": "float32"})
