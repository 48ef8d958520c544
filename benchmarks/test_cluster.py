"""Sweeps beyond one process: a local Ray against --workers 2 on the seed sweep (with the
driver's peak memory), and the run store's append cost as it grows from 1,000 to 100,000
runs.

Each comparison's ways take turns round by round, so that load from other work on the
machine falls on every way alike.
"""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from conftest import NOTES, check_goal, interleave, record_samples
from test_speed import SWEEP_EPOCHS, seed_case_file

from stability.core.results import (
    HISTORY_FIELDS,
    RESULT_FIELDS,
    TIMING_FIELDS,
    EpochRecord,
    RunResult,
)
from stability.sweep import store as store_module
from stability.sweep.store import RunStore

ROOT = Path(__file__).parent.parent

# --- a local Ray against --workers 2 ---------------------------------------------------------

RAY = "Sweep on a local Ray against --workers 2, and the driver's peak memory"

#: Runs the CLI as `python -m stability` does, then prints this process's own peak RSS
#: (``RUSAGE_SELF``: the driver alone, not its workers or Ray's processes).
DRIVER = (
    "import atexit, resource, runpy, sys\n"
    "atexit.register(lambda: print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF)"
    ".ru_maxrss, file=sys.stderr))\n"
    "sys.argv = ['stability', *sys.argv[1:]]\n"
    "runpy.run_module('stability', run_name='__main__')\n"
)


def run_driver(case: Path, out: Path, flags: tuple) -> tuple[float, float]:
    """Wall seconds from start to exit, and the driver's peak RSS in MB, of one sweep."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-c", DRIVER, "run", str(case), "--out", str(out)]
    command += ["--no-progress", *flags]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    stderr = done.stderr.decode()
    assert done.returncode == 0, f"{' '.join(command)} failed: {stderr[-2000:]!r}"
    peak = next(line for line in stderr.splitlines() if line.startswith("PEAK_KIB"))
    return seconds, int(peak.split()[1]) / 2**10


def untimed(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns=list(TIMING_FIELDS))


def test_ray_against_workers(tmp_path):
    case = seed_case_file(tmp_path, "sweep", epochs=SWEEP_EPOCHS)
    ways = {"--workers 2": ("--workers", "2"), "--executor ray (local)": ("--executor", "ray")}
    seconds = {way: [] for way in ways}
    peaks = {way: [] for way in ways}
    rounds = 2  # each round is two whole sweeps of the seed case
    for round_ in range(rounds):
        for index, (way, flags) in enumerate(ways.items()):
            wall, peak = run_driver(case, tmp_path / f"{index}-{round_}", flags)
            seconds[way].append(wall)
            peaks[way].append(peak)
    for round_ in range(rounds):
        pd.testing.assert_frame_equal(
            untimed(tmp_path / "0-0" / "sweep.csv"), untimed(tmp_path / f"1-{round_}" / "sweep.csv")
        )
    rows = len(pd.read_csv(tmp_path / "0-0" / "sweep.csv"))
    for index, way in enumerate(ways):
        runs = pd.concat(
            pd.read_csv(tmp_path / f"{index}-{r}" / "sweep.csv") for r in range(rounds)
        )
        record_samples(
            RAY,
            way,
            seconds[way],
            1,
            unit="s per sweep",
            **{
                "median s per run": runs["wall_seconds"].median(),
                "driver peak RSS MB": max(peaks[way]),
            },
        )
    NOTES[RAY] = (
        f"`python -m stability run SWEEP.toml --no-progress` with `--workers 2` or "
        f"`--executor ray` (a local Ray on this machine's {os.cpu_count()} cores, one CPU "
        f"per run), where SWEEP.toml is cases/seed.toml with `epochs = {SWEEP_EPOCHS}`: "
        f"{rows} runs, in a subprocess timed from start to exit (TensorFlow's import, the "
        f"data set, the workers' or Ray's start-up included), {rounds} rounds of each way, "
        "taking turns. The rows of both ways are equal, timing columns aside (checked). "
        "*median s per run* is the runs' own `wall_seconds`; *driver peak RSS* is the "
        "driver process alone (`RUSAGE_SELF`), without its workers or Ray's processes. "
        "Goal: local Ray / --workers 2 <= 1.15."
    )
    ratio = np.median(seconds["--executor ray (local)"]) / np.median(seconds["--workers 2"])
    check_goal(RAY, "local Ray / --workers 2", ratio, "<=", 1.15)


# --- the store's append cost as it grows ---------------------------------------------------

STORE = "Run store: time to add one run, at 1,000 and at 100,000 runs"
EPOCHS = 10  # history rows per run, as in the sweep above
ADDS = 200  # runs added per round and store
SIZES = (1_000, 100_000)


def run(seed: int) -> RunResult:
    history = [
        EpochRecord(epoch, 1.0 / epoch, 0.5, 3.0, 0.1, 1.0) for epoch in range(1, EPOCHS + 1)
    ]
    return RunResult(
        case="bench",
        variant="raw_e",
        seed=seed,
        dataset="synthetic-0",
        batch_size=32,
        learning_rate=0.03,
        epochs=EPOCHS,
        dtype="float32",
        final_mae=0.5,
        best_mae=0.4,
        max_abs_logit=3.0,
        wall_seconds=1.0,
        steps_per_second=100.0,
        tf_version="2.21",
        history=history,
    )


def filled_store(folder: Path, size: int) -> RunStore:
    """A store holding ``size`` runs, filled in one transaction (not the thing timed)."""
    store = RunStore(folder, "bench")
    db = store._db  # filling 100,000 runs through add would take minutes of fsyncs
    with store_module._transaction(db):
        for start in range(0, size, 10_000):
            results = [run(seed) for seed in range(start, min(size, start + 10_000))]
            rows = [r.row() for r in results]
            store_module._insert(db, "results", RESULT_FIELDS, rows)
            history = [h for r in results for h in r.history_rows()]
            store_module._insert(db, "history", HISTORY_FIELDS, history)
    store.close()
    return RunStore(folder, "bench", resume=True)  # opening renders the CSVs once


def test_store_append(tmp_path):
    stores = {size: filled_store(tmp_path / str(size), size) for size in SIZES}
    next_seed = {size: size for size in SIZES}

    def add(size):
        for _ in range(ADDS):
            stores[size].add(run(next_seed[size]))
            next_seed[size] += 1

    rounds = 5
    seconds = interleave({f"{size:,} runs": (add, (size,)) for size in SIZES}, rounds)
    for store in stores.values():
        store.close()
    for name, samples in seconds.items():
        record_samples(STORE, f"store holding {name}", samples, ADDS, unit="ms per run")
    per_run = {name: float(np.median(samples)) / ADDS for name, samples in seconds.items()}
    first, last = (f"{size:,} runs" for size in SIZES)
    NOTES[STORE] = (
        f"`RunStore.add` of one run ({EPOCHS} history rows) into a store already holding "
        f"{SIZES[0]:,} or {SIZES[1]:,} runs (with {EPOCHS} history rows each): {ADDS} adds "
        f"per round, {rounds} rounds, the two stores taking turns. Each add is one SQLite "
        "transaction, fsynced (`synchronous=FULL`), plus its share of the CSV renders "
        f"(every {store_module.RENDER_SECONDS:g} s at least and at most "
        f"1/{store_module.RENDER_SHARE:g} of the time). "
        f"The old store reread the whole CSV on every add. Goal: per-run cost at "
        f"{SIZES[1]:,} / at {SIZES[0]:,} <= 1.5."
    )
    ratio = per_run[last] / per_run[first]
    assert math.isfinite(ratio)
    check_goal(STORE, f"per-run cost at {SIZES[1]:,} / at {SIZES[0]:,}", ratio, "<=", 1.5)
