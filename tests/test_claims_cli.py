"""`python -m stability claims` from the command line (its smoke run is in test_compare_gate)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


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
