"""The doctor on the seed case: raw_e, one seed, two workers, within 10 minutes (issue 28).

One whole command, timed from start to exit as a user runs it: TensorFlow's import, the
original run, every remedy's check and reruns, and the report. Goal: at most 600 s on this
2-core machine.
"""

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import NOTES, check_goal, record_samples

ROOT = Path(__file__).resolve().parent.parent
SECTION = "The doctor on the seed case"
GOAL_SECONDS = 600.0
COMMAND = [
    "doctor",
    "cases/seed.toml",
    "--variant",
    "raw_e",
    "--seeds",
    "0",
    "--workers",
    "2",
    "--no-progress",
]


def test_the_seed_doctor_takes_at_most_ten_minutes(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stability", *COMMAND, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    assert done.returncode in (0, 1), done.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "seed.doctor.csv").open(encoding="utf-8")))
    trained = sum(int(r["runs"]) for r in rows)
    fixes = [r["remedy"] for r in rows if r["verdict"] == "fixes"]
    NOTES[SECTION] = (
        f"`python -m stability {' '.join(COMMAND)} --out DIR`, timed from start to exit: "
        f"the original run, {len(rows)} remedies ({trained} reruns, the rest not "
        f"applicable) and the report. Fixes found: {', '.join(fixes) or 'none'}. "
        f"Goal: at most {GOAL_SECONDS:g} s."
    )
    record_samples(SECTION, "doctor, 1 seed, 2 workers", [seconds], 1, unit="s per run")
    check_goal(SECTION, "seconds", seconds, "<=", GOAL_SECONDS)
