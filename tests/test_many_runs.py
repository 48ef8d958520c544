"""Run after run in one process: per-run time and memory must not keep growing.

Tolerances are generous on purpose: the test shares a 2-core machine with other work, and
Python's allocator and TensorFlow's caches settle over the first runs.
"""

import resource
import statistics
import sys
import time

from stability.trainer import TrainConfig, Trainer
from stability.variants import get_variant

RUNS = 20
#: The last runs may take at most this many times as long as the first ones (noise on a
#: shared machine is up to about 1.5x here).
SLOWDOWN_LIMIT = 2.0
#: Peak RSS may grow by at most this much per run over the second half of the runs. Each run
#: traces new tf.functions, and TensorFlow keeps each run's traced graphs alive even after
#: clear_session() and gc.collect() (3 FuncGraphs per run stayed referenced; RSS grew about
#: 5 MB per run here, with or without clear_session), so the bound is above that, not zero.
GROWTH_LIMIT_MB_PER_RUN = 10.0


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def test_twenty_runs_in_one_process_do_not_slow_down_or_keep_growing(tiny_dataset):
    seconds, peaks = [], []
    for seed in range(RUNS):
        config = TrainConfig(seed=seed, hidden=8, epochs=3, batch_size=16)
        started = time.perf_counter()
        Trainer(get_variant("raw_e"), tiny_dataset, config).run()
        seconds.append(time.perf_counter() - started)
        peaks.append(peak_rss_mb())
    # The first run pays one-time start-up costs; compare runs 2-4 with the last three.
    first, last = statistics.median(seconds[1:4]), statistics.median(seconds[-3:])
    assert last <= SLOWDOWN_LIMIT * first, f"runs slowed from {first:.2f} s to {last:.2f} s"
    half = RUNS // 2
    growth = (peaks[-1] - peaks[half - 1]) / (RUNS - half)
    assert growth <= GROWTH_LIMIT_MB_PER_RUN, (
        f"peak RSS grew {growth:.1f} MB per run over runs {half + 1}-{RUNS}: {peaks}"
    )
