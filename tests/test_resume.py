"""Real processes: a sweep killed with SIGKILL (serial, and under --workers 2) and resumed,
and two sweeps writing into one folder at once, end with the rows of one uninterrupted
sweep (timing columns aside). The killed sweep is a process of its own; the resume is the
same command line run in this process (``conftest.run_cli``), which saves a TensorFlow
start and trains on the same 1 x 1 layout (tests/conftest.py pins it)."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_CASE, run_cli

from stability.core.files import LOCK_NAME
from stability.core.results import RESULT_FIELDS, TIMING_FIELDS
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case
from stability.sweep.store import store_path

ROOT = Path(__file__).parent.parent
TWO_SEEDS = TINY_CASE.replace("seeds = [0]", "seeds = [0, 1]")  # 4 runs
# Under pytest-xdist this file's tests share their module fixtures in one worker.
pytestmark = pytest.mark.xdist_group("resume")
# The run writes the plots too (issue 5): `<case>.logits.png`, `<case>.mae.png` and
# (issue 21) `<case>.grads.png`.
EXPECTED_FILES = sorted(
    [
        LOCK_NAME,
        "tiny.csv",
        "tiny.history.csv",
        "tiny.md",
        "tiny.logits.png",
        "tiny.grads.png",
        "tiny.mae.png",
        "tiny.runs.sqlite",  # the store the CSVs are rendered from (issue 17)
    ]
)


def start(case_file, out, *flags):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "stability", "run", str(case_file), "--out", str(out), *flags],
        cwd=case_file.parent,
        env=env,
        start_new_session=True,  # its own process group: a kill reaches its workers too
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process):
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return stdout


def untimed(path):
    frame = pd.read_csv(path)
    return frame.drop(columns=[c for c in TIMING_FIELDS if c in frame.columns])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted sweep, in this process."""
    out = tmp_path_factory.mktemp("reference")
    run_case(parse_case(TWO_SEEDS, source="tiny"), out, progress=False)
    return untimed(out / "tiny.csv"), pd.read_csv(out / "tiny.history.csv")


def durable_rows(out):
    """The runs committed to the store so far (read-only: never creates the database)."""
    path = store_path(out, "tiny")
    if not path.exists():
        return 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        finally:
            db.close()
    except sqlite3.OperationalError:  # the table is being created
        return 0


def kill_after_first_row(victim, out, total):
    """SIGKILL ``victim`` and its process group once a run is durable; the runs left."""
    deadline = time.monotonic() + 240
    while durable_rows(out) < 1 and victim.poll() is None:
        assert time.monotonic() < deadline, "no row landed"
        time.sleep(0.02)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate()
    left = durable_rows(out)
    assert 1 <= left < total, f"the kill must land partway, {left} of {total} runs were stored"
    return left


@pytest.mark.parametrize("flags", [(), ("--workers", "2")], ids=["serial", "workers-2"])
def test_sweep_killed_partway_then_resumed_matches_an_uninterrupted_one(tmp_path, reference, flags):
    case_file = tmp_path / "tiny.toml"
    case_file.write_text(TWO_SEEDS)
    out = tmp_path / "out"
    kill_after_first_row(start(case_file, out, "--no-progress", *flags), out, 4)

    args = ("run", str(case_file), "--out", str(out), "--no-progress", "--resume", *flags)
    resumed = run_cli(*args, cwd=case_file.parent)
    assert resumed.returncode == 0, resumed.stderr
    rows, history = reference
    pd.testing.assert_frame_equal(untimed(out / "tiny.csv"), rows)
    pd.testing.assert_frame_equal(pd.read_csv(out / "tiny.history.csv"), history)
    assert sorted(p.name for p in out.iterdir()) == EXPECTED_FILES, "partial files left"
    assert "| raw_e" in (out / "tiny.md").read_text()


def test_two_sweeps_into_one_folder_at_once(tmp_path, reference):
    """Two processes: seed 0 is a process of its own; seed 1 is this process, started once
    the other has opened the store, so that both train and write while the other does
    (not one after the other: this process needs no TensorFlow start)."""
    out = tmp_path / "out"
    parts = []
    for seed in (0, 1):  # the same case split in two, written into the same files
        case_file = tmp_path / f"part{seed}" / "tiny.toml"
        case_file.parent.mkdir()
        case_file.write_text(TINY_CASE.replace("seeds = [0]", f"seeds = [{seed}]"))
        parts.append(case_file)
    other = start(parts[0], out, "--no-progress", "--resume")
    deadline = time.monotonic() + 240
    while not store_path(out, "tiny").exists():
        assert other.poll() is None, other.communicate()[1]
        assert time.monotonic() < deadline, "the other sweep opened no store"
        time.sleep(0.02)
    args = ("run", str(parts[1]), "--out", str(out), "--no-progress", "--resume")
    here = run_cli(*args, cwd=parts[1].parent)
    assert here.returncode == 0, here.stderr
    finish(other)
    rows, history = reference
    assert tuple(pd.read_csv(out / "tiny.csv").columns) == RESULT_FIELDS
    pd.testing.assert_frame_equal(untimed(out / "tiny.csv"), rows)
    pd.testing.assert_frame_equal(pd.read_csv(out / "tiny.history.csv"), history)
    markdown = (out / "tiny.md").read_text()
    assert re.search(r"\| seeds +\| 0, 1 ", markdown), "the markdown must cover both sweeps' rows"
    assert sorted(p.name for p in out.iterdir()) == EXPECTED_FILES
