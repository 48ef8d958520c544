"""Under jit_compile, rows do not depend on --workers: XLA's do depend on its threads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stability.core.results import TIMING_FIELDS
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case

ROOT = Path(__file__).parent.parent

#: The seed case's data set, cut to 2 epochs: on the tiny data set XLA's loops are too
#: short to be split between threads, so both ways would agree there anyway.
CASE = """
name = "xla_threads"
variants = ["raw_e"]
seeds = [1]
batch_sizes = [32]
learning_rates = [0.01]
epochs = 2
dtype = "float32"
jit_compile = true

[dataset]
name = "synthetic"
num_graphs = 2000
attend = "nearest"
"""

TRAIN_IN_PROCESS = """
import sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
tf.config.threading.set_inter_op_parallelism_threads(1)
from stability.data import load_dataset
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer
from stability.model.variants import get_variant
data = load_dataset("synthetic", num_graphs=2000, attend="nearest")
config = TrainConfig(seed=1, batch_size=32, learning_rate=0.01, epochs=2, dtype="float32",
                     jit_compile=True)
print(repr(Trainer(get_variant("raw_e"), data, config).run().history[-1].train_loss))
"""


def train_loss_on(threads: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_IN_PROCESS, str(threads)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


# A finding, not a guarantee of the harness (the next test is that): slow, to keep the
# default run under 10 minutes. It was measured on 2026-11-29 (on that day's CPU); on an Intel Xeon
# (6/207) with TensorFlow 2.21 one and two threads gave the same loss (batches of 32, 128
# and 512), so where it does not reproduce the test says so as a skip, with the numbers.
@pytest.mark.slow
def test_xla_in_one_process_gives_other_numbers_on_one_thread_than_on_two():
    """Guards the test below: the thread count is what it pins."""
    import tensorflow as tf

    one, two = train_loss_on(1), train_loss_on(2)
    if one == two:
        pytest.skip(
            f"the finding does not reproduce here (TensorFlow {tf.__version__}): XLA's "
            f"train loss is {one} on 1 thread and on 2"
        )
    assert one != two


def test_a_jit_case_gives_the_same_rows_with_one_worker_and_with_two(tmp_path):
    case = parse_case(CASE, source="xla_threads")
    rows = []
    for workers in (1, 2):
        results = run_case(case, tmp_path / str(workers), progress=False, workers=workers)
        rows.append([{k: v for k, v in r.row().items() if k not in TIMING_FIELDS} for r in results])
        rows[-1].append([r.history_rows() for r in results])
    assert rows[0] == rows[1]
