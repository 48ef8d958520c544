"""Run after run in one process: per-run time and memory must level off (issue 7).

A benchmark, not a test: the house measures speed and memory in benchmarks, as ratios
measured side by side in one run (it was tests/test_many_runs.py until issue 21's work
needed its 22 s back in the default test run). Its goals are enforced: a missed goal fails
the benchmark run. The time tolerance is generous on purpose: the benchmark shares a 2-core
machine with other work. The memory bound is tight: resident memory does not depend on the
machine's load.
"""

import itertools
import os
import resource
import statistics
import sys
import time

from conftest import NOTES, check_goal, record_samples

from stability.data import load_dataset
from stability.model.variants import get_variant
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer

SECTION = "Twenty runs in one process: time and memory per run"
#: The test suite's tiny data set (tests/conftest.py).
TINY_DATA = {"num_graphs": 48, "min_nodes": 3, "max_nodes": 7, "seed": 0}
NOTES[SECTION] = (
    "raw_e, hidden 8, 3 epochs, batch 16, 48 tiny graphs, seeds 0-19 one after another in "
    "one process. *runs 2-4*: the seconds per run of runs 2 to 4 (run 1 pays one-time "
    "start-up costs); *runs 18-20*: the last three. Goal: the last no slower than 2x the "
    "first. The resident memory's growth per run over runs 11-20 (Theil-Sen slope) has the "
    "goal <= 1 MB a run: while TensorFlow's gradient registry kept every run's compiled step "
    "alive (see trainer.apply_update) it was 5.9 MB a run."
)

RUNS = 20
#: The last runs may take at most this many times as long as the first ones (noise on a
#: shared machine is up to about 1.5x here).
SLOWDOWN_LIMIT = 2.0
#: Resident memory may grow by at most this much per run over the second half of the runs.
#: Measured here over runs 11-20: 0.38-0.41 MB a run in three processes, still settling
#: (0.05 MB a run over runs 75-100). While TensorFlow's gradient registry kept every run's
#: compiled step alive (see trainer.apply_update) it was 5.9 MB a run, and did not level off.
GROWTH_LIMIT_MB_PER_RUN = 1.0


def rss_mb() -> float:
    """Resident memory now: on Linux from /proc; elsewhere the peak (``ru_maxrss``), which
    stops rising too once memory levels off."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def growth_per_run(readings: list[float]) -> float:
    """The median slope over all pairs of runs (Theil-Sen): a single reading that drops a
    few MB when the allocator hands memory back does not swing it, as it would the
    difference of the last and first readings."""
    pairs = itertools.combinations(enumerate(readings), 2)
    return statistics.median((b - a) / (j - i) for (i, a), (j, b) in pairs)


def test_twenty_runs_in_one_process_do_not_slow_down_or_keep_growing():
    dataset = load_dataset("synthetic", **TINY_DATA)
    seconds, readings = [], []
    for seed in range(RUNS):
        config = TrainConfig(seed=seed, hidden=8, epochs=3, batch_size=16)
        started = time.perf_counter()
        Trainer(get_variant("raw_e"), dataset, config).run()
        seconds.append(time.perf_counter() - started)
        readings.append(rss_mb())
    # The first run pays one-time start-up costs; compare runs 2-4 with the last three.
    record_samples(SECTION, "runs 2-4", seconds[1:4], 1, unit="s per run")
    record_samples(SECTION, f"runs {RUNS - 2}-{RUNS}", seconds[-3:], 1, unit="s per run")
    first, last = statistics.median(seconds[1:4]), statistics.median(seconds[-3:])
    check_goal(SECTION, "last / first seconds per run", last / first, "<=", SLOWDOWN_LIMIT)
    half = RUNS // 2
    growth = growth_per_run(readings[half:])
    check_goal(
        SECTION,
        f"RSS growth MB per run over runs {half + 1}-{RUNS}",
        growth,
        "<=",
        GROWTH_LIMIT_MB_PER_RUN,
    )
