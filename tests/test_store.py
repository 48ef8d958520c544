"""Durable result files without training: atomic writes, appends, refusing to overwrite."""

import csv
import math

import pytest

from stability.core.errors import StabilityError
from stability.core.files import TEMP_SUFFIX, atomic_write_text, atomic_writer
from stability.core.results import RESULT_FIELDS, RunResult
from stability.sweep import store as store_module
from stability.sweep.store import RunStore, store_path


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


def test_rows_are_durable_at_once_and_finish_renders_them_sorted(tmp_path):
    store = RunStore(tmp_path, "tiny")
    for seed in (2, 0, 1):
        store.add(result(seed, best_mae=float(seed)))
    # Another writer sees every added run in the database before any render.
    other = RunStore(tmp_path, "tiny", resume=True)
    assert {key[2] for key in other.done} == {"0", "1", "2"}
    other.close()
    store.add(result(0, best_mae=9.0))  # a run another process finished meanwhile
    store.finish()
    written = rows(tmp_path / "tiny.csv")
    assert [r["seed"] for r in written] == ["0", "1", "2"]
    assert [r["best_mae"] for r in written] == ["0.0", "1.0", "2.0"]
    assert tuple(written[0]) == RESULT_FIELDS


def test_a_render_falls_due_while_runs_are_added(tmp_path, monkeypatch):
    store = RunStore(tmp_path, "tiny")
    store.add(result(1))
    assert rows(tmp_path / "tiny.csv") == [], "rendered only every RENDER_SECONDS"
    monkeypatch.setattr(store_module, "RENDER_SECONDS", 0.0)
    monkeypatch.setattr(store_module, "RENDER_SHARE", 0.0)
    store.add(result(0))
    assert [r["seed"] for r in rows(tmp_path / "tiny.csv")] == ["0", "1"]
    store.close()


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


def test_a_csv_without_a_store_is_taken_in_on_resume_and_its_cut_line_dropped(tmp_path):
    """A CSV written before the database existed (or whose database was deleted), its last
    line cut short by a crash of the old appender."""
    store = RunStore(tmp_path, "tiny")
    store.add(result(0))
    store.finish()
    whole = (tmp_path / "tiny.csv").read_bytes()
    history = (tmp_path / "tiny.history.csv").read_bytes()
    store_path(tmp_path, "tiny").unlink()
    with (tmp_path / "tiny.csv").open("a") as handle:
        handle.write("tiny,raw_e,1,d,16")  # no newline: the writer died here
    with pytest.raises(StabilityError, match="already holds 1 run"):
        RunStore(tmp_path, "tiny")
    assert not store_path(tmp_path, "tiny").exists(), "a refused sweep writes nothing"
    resumed = RunStore(tmp_path, "tiny", resume=True)
    assert len(resumed.done) == 1
    resumed.finish()
    assert (tmp_path / "tiny.csv").read_bytes() == whole
    assert (tmp_path / "tiny.history.csv").read_bytes() == history
    resumed = RunStore(tmp_path, "tiny", resume=True)
    resumed.add(result(1))
    resumed.finish()
    assert [r["seed"] for r in rows(tmp_path / "tiny.csv")] == ["0", "1"]


def test_the_csvs_have_the_bytes_of_the_rows_as_rendered_before(tmp_path):
    """The bytes of the CSVs a sweep wrote before the database: csv's default dialect,
    "\\n" line ends, empty cells for None and NaN."""
    store = RunStore(tmp_path, "tiny")
    store.add(result(0, first_nan_epoch=2, best_mae=math.nan, final_mae=0.5))
    store.finish()
    head = ",".join(RESULT_FIELDS)
    assert (tmp_path / "tiny.csv").read_text() == (
        # The last nine cells: the columns issues 14, 21, 25 and 26 appended, empty here.
        f"{head}\ntiny,raw_e,0,d,16,0.01,2,float32,2,,,,,,0.5,,,,0.0,0.0,,,,,,,,,,\n"
    )


def test_two_stores_write_into_one_case_at_once(tmp_path):
    first, second = RunStore(tmp_path, "tiny"), RunStore(tmp_path, "tiny", resume=True)
    for seed in range(6):
        (first if seed % 2 else second).add(result(seed))
    first.add(result(3))
    second.finish()
    first.finish()
    assert [r["seed"] for r in rows(tmp_path / "tiny.csv")] == [str(s) for s in range(6)]


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


def test_a_csv_of_an_older_version_is_taken_in_with_the_new_columns_empty(tmp_path):
    store = RunStore(tmp_path, "tiny")
    store.add(result(0, best_mae=0.5))
    store.finish()
    store_path(tmp_path, "tiny").unlink()
    old = rows(tmp_path / "tiny.csv")
    with (tmp_path / "tiny.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_FIELDS[:-1], lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: v for k, v in row.items() if k in RESULT_FIELDS[:-1]} for row in old)
    RunStore(tmp_path, "tiny", resume=True).finish()
    assert rows(tmp_path / "tiny.csv") == [{**old[0], RESULT_FIELDS[-1]: ""}]


def test_rewrite_replaces_the_rows_it_holds_and_refuses_a_run_it_does_not(tmp_path):
    store = RunStore(tmp_path, "tiny")
    for seed in (0, 1):
        store.add(result(seed, best_mae=0.5))
    changed = [{**row, "best_mae": "0.25"} for row in store.rows()]
    store.rewrite(changed[:1])
    assert [r["best_mae"] for r in rows(tmp_path / "tiny.csv")] == ["0.25", "0.5"]
    assert [r["best_mae"] for r in store.rows()] == ["0.25", "0.5"]
    unknown = {**changed[1], "seed": "7"}
    with pytest.raises(StabilityError, match="holds no run"):
        store.rewrite([{**changed[1], "best_mae": "0.125"}, unknown])
    assert [r["best_mae"] for r in store.rows()] == ["0.25", "0.5"], "nothing is written"
    assert list(store.histories()) == []  # these runs have no epochs
    store.finish()
