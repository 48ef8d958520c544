"""`python -m stability claims` from the command line (its smoke run is in test_compare_gate)."""

from pathlib import Path

from conftest import run_cli

ROOT = Path(__file__).parent.parent


def test_claims_without_the_case_files_is_one_line(tmp_path):
    done = run_cli("claims", "--cases", str(tmp_path), "--no-run", cwd=ROOT)
    assert done.returncode == 2
    assert "seed.toml: no such case file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
