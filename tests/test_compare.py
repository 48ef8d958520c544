"""compare: a baseline passes against itself and fails when a verdict is changed on purpose."""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_cli import stability

from stability.core.errors import StabilityError
from stability.report.compare import Tolerances, _fraction, compare_results, load_results_dir

ROOT = Path(__file__).parent.parent
#: Rows without an environment (tests/test_old_csv.py), so compared across environments: the
#: tolerances below are what these tests exercise.
BASELINE = ROOT / "tests" / "data" / "old_baseline"


@pytest.fixture(scope="module")
def baseline() -> pd.DataFrame:
    """The seed case's accepted rows (one row per variant and setting)."""
    frame = load_results_dir(BASELINE)
    return frame[frame["case"] == "seed"].reset_index(drop=True)


def _finite_and_nan_variants(frame: pd.DataFrame) -> tuple[str, str]:
    nan = frame.groupby("variant")["first_nan_epoch"].count()
    return nan[nan == 0].index[0], nan[nan > 0].index[0]


def test_identical_results_change_no_verdict(baseline):
    table = compare_results(baseline.copy(), baseline)
    assert not table["changed"].any(), table.to_string()
    assert set(table["status"]) == {"ok"}


def test_a_finite_variant_that_now_hits_nan_changes_its_verdict(baseline):
    finite, _ = _finite_and_nan_variants(baseline)
    new = baseline.copy()
    new.loc[new["variant"] == finite, "first_nan_epoch"] = 5
    table = compare_results(new, baseline).set_index("variant")
    assert table.loc[finite, "status"] == "now hits NaN"
    assert table["changed"].sum() == 1


def test_a_nan_variant_that_now_stays_finite_changes_its_verdict(baseline):
    _, failing = _finite_and_nan_variants(baseline)
    new = baseline.copy()
    new.loc[new["variant"] == failing, "first_nan_epoch"] = None
    table = compare_results(new, baseline).set_index("variant")
    assert table.loc[failing, "status"] == "now stays finite"


@pytest.mark.parametrize(("factor", "changed"), [(1.10, False), (1.30, True), (0.70, True)])
def test_first_nan_epoch_moves_against_its_tolerance(baseline, factor, changed):
    _, failing = _finite_and_nan_variants(baseline)
    new = baseline.copy()
    rows = new["variant"] == failing
    new.loc[rows, "first_nan_epoch"] = new.loc[rows, "first_nan_epoch"] * factor
    table = compare_results(new, baseline, Tolerances(nan_epoch=0.2)).set_index("variant")
    assert table.loc[failing, "changed"] == changed, table.loc[failing, "status"]


@pytest.mark.parametrize(("factor", "changed"), [(1.05, False), (1.20, True), (0.50, False)])
def test_only_a_worse_mae_beyond_its_tolerance_changes_the_verdict(baseline, factor, changed):
    finite, _ = _finite_and_nan_variants(baseline)
    new = baseline.copy()
    rows = new["variant"] == finite
    new.loc[rows, "final_mae"] = new.loc[rows, "final_mae"] * factor
    table = compare_results(new, baseline, Tolerances(mae=0.1)).set_index("variant")
    assert table.loc[finite, "changed"] == changed, table.loc[finite, "status"]


def test_a_variant_missing_from_the_new_results_changes_the_verdict(baseline):
    finite, _ = _finite_and_nan_variants(baseline)
    table = compare_results(baseline[baseline["variant"] != finite], baseline)
    assert table.set_index("variant").loc[finite, "status"] == "missing from new results"
    assert table["changed"].sum() == 1


def test_empty_folder_is_bad_input(tmp_path):
    with pytest.raises(StabilityError, match="no results CSVs"):
        load_results_dir(tmp_path)


def test_cli_exit_codes_and_diff_table(tmp_path, baseline):
    same = stability("compare", str(BASELINE), str(BASELINE), cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert "| variant" in same.stdout and "no verdict changed" in same.stdout

    new = tmp_path / "new"
    shutil.copytree(BASELINE, new)
    finite, _ = _finite_and_nan_variants(baseline)
    edited = pd.read_csv(new / "seed.csv")
    edited.loc[edited["variant"] == finite, "first_nan_epoch"] = 5
    edited.to_csv(new / "seed.csv", index=False)
    failed = stability("compare", str(new), str(BASELINE), cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "now hits NaN" in failed.stdout and "1 verdict(s) changed" in failed.stdout

    bad = stability("compare", str(tmp_path / "nope"), str(BASELINE), cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"stability: error: {tmp_path / 'nope'}: no such folder of results CSVs"
    ]


@pytest.mark.parametrize("text", ["-1", "x", "nan", "inf"])
def test_a_tolerance_must_be_a_fraction(text):
    with pytest.raises(argparse.ArgumentTypeError, match="not a fraction >= 0"):
        _fraction(text)


def test_different_data_or_settings_are_said_per_row_and_not_a_regression(baseline):
    # The case: the same variants on another data set, with far worse MAE.
    new = baseline.copy()
    first = new["variant"].iloc[0]
    mine = new["variant"] == first
    new.loc[mine, "dataset"] = "synthetic(other)"
    new.loc[mine, "final_mae"] = new.loc[mine, "final_mae"] * 45
    new.loc[~mine, "epochs"] = new.loc[~mine, "epochs"] + 1
    table = compare_results(new, baseline).set_index("variant")
    assert table.loc[first, "status"].startswith("not comparable: data set differs (")
    others = table.drop(index=first)
    assert others["status"].str.startswith("not comparable: epochs differ (").all()
    assert not table["changed"].any()


def test_all_comparable_fails_a_gate_whose_baseline_is_of_other_data(tmp_path):
    new = tmp_path / "new"
    shutil.copytree(BASELINE, new)
    frame = pd.read_csv(new / "seed.csv")
    frame["dataset"] = "synthetic(other)"
    frame.to_csv(new / "seed.csv", index=False)
    args = ("compare", str(new), str(BASELINE))
    assert stability(*args, cwd=tmp_path).returncode == 0
    strict = stability(*args, "--all-comparable", cwd=tmp_path)
    assert strict.returncode == 1
    assert "--all-comparable: 9 row(s)" in strict.stdout


def test_rows_of_one_recorded_environment_are_compared_exactly(baseline):
    from stability.core.environment import describe

    here = baseline.assign(environment=describe("1x1"))
    table = compare_results(here.copy(), here)
    assert set(table["comparison"]) == {"exact"} and not table["changed"].any()
    _, failing = _finite_and_nan_variants(here)
    new = here.copy()
    rows = new["variant"] == failing
    new.loc[rows, "best_mae"] = new.loc[rows, "best_mae"] * (1 + 1e-12)
    table = compare_results(new, here).set_index("variant")
    assert table.loc[failing, "changed"], "a change within one environment must count"
    assert "best_mae" in table.loc[failing, "status"]
    assert table["changed"].sum() == 1


def test_rows_of_an_old_csv_are_compared_across_environments(baseline):
    table = compare_results(baseline.copy(), baseline)
    assert set(table["comparison"]) == {"across environments"}
    assert set(table["why"]) == {"environments differ: environment not recorded"}


def test_a_folder_with_a_spread_csv_compares_its_results_only(tmp_path):
    """reports/ holds <case>.spread.csv beside <case>.csv: compare reads it as the spread,
    never as a results CSV."""
    shutil.copy(ROOT / "reports" / "seed.csv", tmp_path / "seed.csv")
    shutil.copy(ROOT / "reports" / "seed.spread.csv", tmp_path / "seed.spread.csv")
    frame = load_results_dir(tmp_path)
    assert set(frame["case"]) == {"seed"} and len(frame) == len(pd.read_csv(tmp_path / "seed.csv"))


def test_reports_compares_with_its_baseline_among_the_other_reports_csvs(capsys):
    """reports/ holds the zoo's, the doctor's, the check's and the spread's CSVs beside the
    results: compare reads the results only, and the committed ones are the baseline's."""
    from stability import cli

    assert cli.main(["compare", str(ROOT / "reports"), str(ROOT / "reports" / "baseline")]) == 0
    out = capsys.readouterr().out
    assert "compared exactly" in out and "across environments" not in out
    assert "zoo" not in out and "no verdict changed" in out


def test_compare_starts_no_tensorflow(tmp_path):
    script = (
        "import sys; from stability import cli; "
        f"code = cli.main(['compare', {str(ROOT / 'reports')!r}, {str(BASELINE)!r}]); "
        "assert 'tensorflow' not in sys.modules, 'compare loaded TensorFlow'; sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    assert "compare loaded TensorFlow" not in done.stderr
