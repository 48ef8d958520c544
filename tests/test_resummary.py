"""Recomputing a run's summary from its history (``run_summary.resummarize``) is the run's
own computation: on every committed case it gives back the committed summary columns, but
where issue 26 changed their definition, and ``report --resummarize`` rewrites a CSV and
its run store with it."""

from __future__ import annotations

import csv
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from stability import cli
from stability.core.results import RESULT_FIELDS
from stability.sweep.cases import parse_toml
from stability.sweep.store import run_key, store_path
from stability.train.run_summary import SUMMARY_FIELDS, resummarize

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
#: Runs the zoo keeps under reports/zoo/ (.gitignore): rebuilt by ``python -m stability
#: zoo``, never committed, so not a committed case.
UNCOMMITTED = REPORTS / "zoo"

#: Every committed case with a history: its results CSV beside it.
CASES = sorted(
    path.with_name(path.name.removesuffix(".history.csv") + ".csv")
    for path in REPORTS.rglob("*.history.csv")
    if UNCOMMITTED not in path.parents
)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def case_file(results: Path) -> Path:
    """The case a committed CSV was run from: in cases/, or beside it (a hunt's found case);
    a doctor's rerun (``<case>.doctor/<case>__<remedy>.csv``) from the doctored case."""
    case = read_rows(results)[0]["case"]
    if results.parent.name.endswith(".doctor"):
        case = results.parent.name.removesuffix(".doctor")
    for path in (ROOT / "cases" / f"{case}.toml", results.with_name(f"{case}.toml")):
        if path.exists():
            return path
    raise AssertionError(f"no case file for {results}")


def recomputed(results: Path) -> list[tuple[dict[str, str], dict[str, str], list[dict]]]:
    """(committed row, recomputed row, its history) for every row of ``results``."""
    histories = defaultdict(list)
    for row in read_rows(results.with_name(results.stem + ".history.csv")):
        histories[run_key(row)].append(row)
    jit = parse_toml(case_file(results).read_text(encoding="utf-8")).get("jit_compile", False)
    return [
        (row, resummarize(row, histories[run_key(row)], jit), histories[run_key(row)])
        for row in read_rows(results)
    ]


def old_best_mae(history: list[dict[str, str]]) -> str:
    """best_mae before issue 26: the least finite validation MAE of every epoch."""
    maes = [float(h["val_mae"]) for h in history if h["val_mae"] not in ("", "nan")]
    return repr(min(maes)) if maes else ""


def test_every_committed_case_with_a_history_is_checked():
    names = {path.relative_to(REPORTS).as_posix() for path in CASES}
    assert {"seed.csv", "seed_xla.csv", "map.csv", "hunt/seed_hunt_raw_e.csv"} <= names
    assert all(path.exists() for path in CASES)


@pytest.mark.parametrize("results", CASES, ids=lambda p: p.relative_to(REPORTS).as_posix())
def test_recomputing_the_summary_gives_back_the_committed_columns(results):
    committed_columns = read_rows(results)[0].keys()
    for old, new, history in recomputed(results):
        for name in SUMMARY_FIELDS:
            if name not in committed_columns or old[name] == new[name]:
                continue
            where = f"{results.name} {run_key(old)}: {name} {old[name]!r} -> {new[name]!r}"
            if name == "best_mae":
                # The one definition changed: the committed value was the old one, a MAE of
                # the failing epoch or after it, lower than any epoch before it.
                assert old["first_nan_epoch"], where
                assert old[name] == old_best_mae(history), where
                assert new[name] == "" or float(new[name]) > float(old[name]), where
            elif name == "warning":
                # The divergence sentence, appended to the committed headroom warning.
                assert new["diverged_epoch"], where
                assert new[name].startswith(old[name]) and "diverged at epoch" in new[name], where
            else:
                pytest.fail(where)


@pytest.mark.parametrize("results", CASES, ids=lambda p: p.relative_to(REPORTS).as_posix())
def test_the_new_best_mae_is_the_least_mae_of_the_epochs_before_the_failure(results):
    for old, new, history in recomputed(results):
        first = int(old["first_nan_epoch"]) if old["first_nan_epoch"] else None
        kept = [
            float(h["val_mae"])
            for h in history
            if (first is None or int(h["epoch"]) < first) and h["val_mae"] != ""
        ]
        assert new["best_mae"] == (repr(min(kept)) if kept else ""), run_key(old)


def copy_case(name: str, tmp_path: Path) -> Path:
    """The committed case ``name``'s CSV and history, copied; returns the CSV's path."""
    for suffix in (".csv", ".history.csv"):
        shutil.copy(REPORTS / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    return tmp_path / f"{name}.csv"


def write_rows(path: Path, rows: list[dict[str, str]], columns) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: row.get(c, "") for c in columns} for row in rows)


def test_report_resummarize_rewrites_the_csv_and_its_store(tmp_path):
    path = copy_case("farthest", tmp_path)
    expected = [new for _, new, _ in recomputed(REPORTS / "farthest.csv")]
    stale = [{**row, "best_mae": "9.5", "warning": "stale"} for row in read_rows(path)]
    # An older CSV: without the column issue 26 appended, its summary cells stale.
    write_rows(path, stale, RESULT_FIELDS[:-1])
    args = ["report", str(path), "--case", str(ROOT / "cases" / "farthest.toml")]
    assert cli.main([*args, "--resummarize"]) == 0
    rewritten = read_rows(path)
    assert list(rewritten[0]) == list(RESULT_FIELDS)
    assert rewritten == [{c: row.get(c, "") for c in RESULT_FIELDS} for row in expected]
    with sqlite3.connect(store_path(tmp_path, "farthest")) as db:
        held = [
            dict(zip(RESULT_FIELDS, r, strict=True)) for r in db.execute("SELECT * FROM results")
        ]
    assert sorted(map(run_key, held)) == sorted(map(run_key, rewritten))
    assert {run_key(r): r for r in held} == {run_key(r): r for r in rewritten}
    assert (tmp_path / "farthest.md").exists()


def test_report_resummarize_rewrites_the_rows_the_store_holds(tmp_path):
    path = copy_case("farthest", tmp_path)
    args = ["report", str(path), "--case", str(ROOT / "cases" / "farthest.toml")]
    assert cli.main([*args, "--resummarize"]) == 0
    first = path.read_text(encoding="utf-8")
    with sqlite3.connect(store_path(tmp_path, "farthest")) as db:
        db.execute("UPDATE results SET best_mae = '7.25'")  # the store is the truth
    assert "7.25" not in first
    assert cli.main([*args, "--resummarize"]) == 0
    assert path.read_text(encoding="utf-8") == first


def test_resummarize_needs_the_case_file(tmp_path, capsys):
    path = copy_case("farthest", tmp_path)
    assert cli.main(["report", str(path), "--resummarize"]) == 2
    assert "--resummarize needs --case" in capsys.readouterr().err
    assert not store_path(tmp_path, "farthest").exists()


def test_a_map_case_gets_its_map_report_back_unchanged(tmp_path):
    # map.md reads the failures and final MAEs, which the summary's new rules leave alone.
    path = copy_case("map", tmp_path)
    args = ["report", str(path), "--case", str(ROOT / "cases" / "map.toml"), "--resummarize"]
    assert cli.main(args) == 0
    assert (tmp_path / "map.md").read_text() == (REPORTS / "map.md").read_text()
