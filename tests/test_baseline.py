"""reports/baseline/ is what `tox -e compare` compares the main job with: the CSVs of exactly
the cases `python -m stability claims` runs, every run those case files declare, each row
with the environment it was made in, and each case's measured rounding spread beside it.
A case file or the claim cases changed without the baseline fails here, not in a gate that
would compare the wrong rows (or none: rows on other data are "not comparable")."""

import itertools
from pathlib import Path

import pandas as pd
import pytest

from stability.claims.stats import CLAIM_CASES
from stability.core.environment import parse
from stability.report.spread import read_spread
from stability.report.writer import read_results
from stability.sweep.cases import load_case
from stability.sweep.runner import case_datasets

ROOT = Path(__file__).parent.parent
BASELINE = ROOT / "reports" / "baseline"

#: What names a run in a results row.
RUN = ["variant", "seed", "batch_size", "learning_rate", "dataset", "epochs", "dtype"]


def test_the_baseline_holds_the_main_jobs_cases_and_no_other():
    held = {p.name.removesuffix(".csv") for p in BASELINE.glob("*.csv")}
    held = {name for name in held if not name.endswith(".spread")}
    assert held == set(CLAIM_CASES)


def declared_runs(case_name: str) -> set[tuple]:
    """Every run cases/<case_name>.toml declares, as ``RUN``'s values."""
    case = load_case(ROOT / "cases" / f"{case_name}.toml")
    keys = [d.key for d in case_datasets(case)]
    return {
        (variant, seed, batch_size, learning_rate, key, case.epochs, case.dtype)
        for variant, seed, batch_size, learning_rate, key in itertools.product(
            case.variants, case.seeds, case.batch_sizes, case.learning_rates, keys
        )
    }


@pytest.mark.parametrize("case", CLAIM_CASES)
def test_the_baseline_has_every_run_of_its_case_file(case):
    frame = read_results(BASELINE / f"{case}.csv")
    held = {tuple(row) for row in frame[RUN].itertuples(index=False)}
    declared = declared_runs(case)
    assert held == declared, (
        f"runs the case declares but the baseline lacks: {sorted(declared - held)[:3]}; "
        f"runs the baseline holds that the case no longer declares: {sorted(held - declared)[:3]}"
    )


@pytest.mark.parametrize("case", CLAIM_CASES)
def test_every_baseline_row_records_its_environment_and_its_case_its_spread(case):
    frame = read_results(BASELINE / f"{case}.csv")
    facts = [parse(e) for e in frame["environment"].fillna("")]
    assert all(f.get("cpu") and f.get("threads") and f.get("tensorflow") for f in facts)
    spread = read_spread(BASELINE, case)
    assert spread is not None, f"no {case}.spread.csv beside the baseline"
    # The spread is measured against these very rows: its reference layout's runs are the
    # baseline's, so its tolerances are the ones the gate should allow them.
    stacked = pd.read_csv(BASELINE / f"{case}.spread.csv", dtype={"threads": str})
    reference = stacked[stacked["threads"] == spread.reference]
    joined = reference.merge(frame, on=["variant", "seed", "batch_size", "learning_rate"])
    assert len(joined) == len(reference) > 0
    assert (joined["environment_x"] == joined["environment_y"]).all()
    epochs = joined[["first_nan_epoch_x", "first_nan_epoch_y"]].fillna(-1)
    assert (epochs["first_nan_epoch_x"] == epochs["first_nan_epoch_y"]).all()
