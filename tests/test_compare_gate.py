"""The compare gate of the default test run: the smoke main job (`claims --smoke`) is trained
afresh and compared with the committed smoke baseline, reports/baseline/smoke/. A changed
verdict fails the run; the committed baseline is then regenerated in the same commit with
`python -m stability claims --smoke --out reports/baseline/smoke --overwrite` (its CSVs only).
"""

import shutil
from pathlib import Path

import pandas as pd

from stability import cli
from stability.report.claims import CLAIMS
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
    code = cli.main(["compare", str(tmp_path), str(BASELINE)])
    assert code == 0, capsys.readouterr().out


def test_the_gate_fails_on_a_planted_change(tmp_path, capsys):
    planted = tmp_path / "new"
    shutil.copytree(BASELINE, planted)
    frame = pd.read_csv(planted / "seed.csv")
    frame.loc[frame["variant"] == "stable_softmax", "final_mae"] *= 2.0
    frame.to_csv(planted / "seed.csv", index=False)
    assert cli.main(["compare", str(planted), str(BASELINE)]) == EXIT_VERDICT_CHANGED
    assert "stable_softmax" in capsys.readouterr().out
