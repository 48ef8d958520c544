"""CSVs written before the failure_kind/headroom/warning columns still read everywhere."""

from pathlib import Path

from stability.core.results import ADDED_RESULT_FIELDS, RESULT_FIELDS
from stability.report.compare import compare_results, load_results_dir
from stability.report.writer import read_results, summary_table

#: The claim cases' CSVs as committed on 2026-11-29, before the failure_kind column: an old
#: baseline folder as users keep them.
BASELINE = Path(__file__).parent / "data" / "old_baseline"


def test_an_old_results_csv_reads_with_the_new_columns_empty():
    header = (BASELINE / "seed.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert "failure_kind" not in header, "the baseline is no longer an old CSV"
    frame = read_results(BASELINE / "seed.csv")
    assert list(frame.columns[: len(header)]) == header
    assert set(ADDED_RESULT_FIELDS) <= set(frame.columns)
    assert frame[list(ADDED_RESULT_FIELDS)].isna().all().all()
    assert set(RESULT_FIELDS) <= set(frame.columns)
    assert not summary_table(frame).empty


def test_compare_reads_an_old_baseline_folder_against_a_new_csv(tmp_path):
    old = load_results_dir(BASELINE)
    new = old.copy()
    new["failure_kind"] = new["first_nan_epoch"].map(lambda e: None if e != e else "nonfinite")
    table = compare_results(new, old)
    assert not table["changed"].any(), table[table["changed"]]
