"""The compare gate of the default test run: the smoke main job (`claims --smoke`) is trained
afresh and compared with the committed smoke baseline, reports/baseline/smoke/. A changed
verdict fails the run; the committed baseline is then regenerated in the same commit with
`python -m stability claims --smoke --out reports/baseline/smoke --overwrite` (its CSVs only).
"""

import shutil
from pathlib import Path

import pandas as pd

from stability import cli
from stability.claims.table import CLAIMS
from stability.report.compare import EXIT_VERDICT_CHANGED

BASELINE = Path(__file__).parent.parent / "reports" / "baseline" / "smoke"


def test_the_smoke_main_job_keeps_the_committed_verdicts(tmp_path, capsys):
    args = ["claims", "--smoke", "--cases", str(BASELINE.parent.parent.parent / "cases")]
    assert cli.main([*args, "--out", str(tmp_path), "--no-progress"]) == 0
    for case in ("seed", "batch_size", "learning_rate"):
        assert (tmp_path / f"{case}.csv").exists() and (tmp_path / f"{case}.md").exists()
    claims = (tmp_path / "claims.md").read_text()
    rows = [line.split("|")[1].strip() for line in claims.splitlines() if line.startswith("| C")]
    assert rows == list(CLAIMS)
    assert "## What this means" in claims
    code = cli.main(["compare", str(tmp_path), str(BASELINE), "--all-comparable"])
    assert code == 0, capsys.readouterr().out


def planted(tmp_path: Path, change) -> Path:
    """A copy of the baseline with ``change`` applied to its seed.csv frame."""
    folder = tmp_path / "new"
    shutil.copytree(BASELINE, folder)
    frame = pd.read_csv(folder / "seed.csv")
    change(frame)
    frame.to_csv(folder / "seed.csv", index=False)
    return folder


def test_the_gate_fails_on_a_planted_change_in_the_same_environment(tmp_path, capsys):
    def worse_mae(frame):
        frame.loc[frame["variant"] == "stable_softmax", "final_mae"] *= 1.0 + 1e-9

    folder = planted(tmp_path, worse_mae)
    assert cli.main(["compare", str(folder), str(BASELINE)]) == EXIT_VERDICT_CHANGED
    out = capsys.readouterr().out
    assert "stable_softmax" in out and "compared exactly: same environment" in out


def test_the_gate_fails_on_a_planted_change_in_another_environment(tmp_path, capsys):
    """Another environment (another TensorFlow) is compared by what holds on any machine: a
    run that now fails changes its verdict there too."""

    def elsewhere_and_failing(frame):
        frame["environment"] = frame["environment"].str.replace(
            "tensorflow ", "tensorflow 0.0.0-", regex=False
        )
        frame.loc[frame["variant"] == "stable_softmax", "first_nan_epoch"] = 2

    folder = planted(tmp_path, elsewhere_and_failing)
    assert cli.main(["compare", str(folder), str(BASELINE)]) == EXIT_VERDICT_CHANGED
    out = capsys.readouterr().out
    assert "now hits NaN" in out and "compared across environments" in out
