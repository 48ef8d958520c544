"""Run after run in one process: per-run time and memory must level off (issue 7).

The time tolerance is generous on purpose: the test shares a 2-core machine with other work.
The memory bound is tight: resident memory does not depend on the machine's load.
"""

import itertools
import os
import resource
import statistics
import sys
import time

from stability.model.variants import get_variant
from stability.train.trainer import TrainConfig, Trainer

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


def test_twenty_runs_in_one_process_do_not_slow_down_or_keep_growing(tiny_dataset):
    seconds, readings = [], []
    for seed in range(RUNS):
        config = TrainConfig(seed=seed, hidden=8, epochs=3, batch_size=16)
        started = time.perf_counter()
        Trainer(get_variant("raw_e"), tiny_dataset, config).run()
        seconds.append(time.perf_counter() - started)
        readings.append(rss_mb())
    # The first run pays one-time start-up costs; compare runs 2-4 with the last three.
    first, last = statistics.median(seconds[1:4]), statistics.median(seconds[-3:])
    assert last <= SLOWDOWN_LIMIT * first, f"runs slowed from {first:.2f} s to {last:.2f} s"
    half = RUNS // 2
    growth = growth_per_run(readings[half:])
    assert growth <= GROWTH_LIMIT_MB_PER_RUN, (
        f"RSS grew {growth:.2f} MB per run over runs {half + 1}-{RUNS}: "
        f"{[round(r, 1) for r in readings]}"
    )
