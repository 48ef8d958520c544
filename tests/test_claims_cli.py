"""`python -m stability claims --smoke`: the whole main-job path, cut down to seconds."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_claims_smoke_writes_every_report_and_eleven_verdicts(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stability",
            "claims",
            "--smoke",
            "--no-progress",
            "--cases",
            str(ROOT / "cases"),
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    for case in ("seed", "batch_size", "learning_rate"):
        assert (tmp_path / f"{case}.csv").exists() and (tmp_path / f"{case}.md").exists()
    claims = (tmp_path / "claims.md").read_text()
    rows = [line for line in claims.splitlines() if line.startswith("| C")]
    assert [r.split("|")[1].strip() for r in rows] == [f"C{i}" for i in range(1, 12)]
    assert "## What this means" in claims


def test_claims_without_the_case_files_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "stability", "claims", "--cases", str(tmp_path), "--no-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "seed.toml: no such case file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
