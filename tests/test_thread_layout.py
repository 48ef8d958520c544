"""One thread layout for every run: the rows do not depend on the executor or the core count.

The case below is one where the intra-op thread count moves the numbers (with op determinism
on): stable_softmax, hidden 64, seed 0, on 300 synthetic graphs for 8 epochs ends at another
final MAE on 2 threads than on 1 (at hidden 32 it did on an AVX2 EPYC, not on an AVX-512
one). ``test_another_layout_moves_this_case`` keeps that true, so that the
equalities after it are not vacuous. Every other way of training it (in this process, in two
workers, in a process whose TensorFlow already started on 8 threads, under
TF_NUM_INTRAOP_THREADS) must give the rows of the 1 x 1 layout. tests/test_ray.py checks a
local Ray on the same case.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from stability.core.environment import parse
from stability.core.errors import StabilityError
from stability.core.results import TIMING_FIELDS
from stability.model.variants import get_variant
from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case, run_configs
from stability.train.threads import current, require
from stability.train.trainer import Trainer

ROOT = Path(__file__).parent.parent

# Under pytest-xdist this file's tests share their module fixtures in one worker.
pytestmark = pytest.mark.xdist_group("thread_layout")

THREADS_CASE = """
name = "threads"
variants = ["stable_softmax"]
seeds = [0]
batch_sizes = [32]
learning_rates = [0.01]
epochs = 8
# float32 whatever STABILITY_DTYPE says: the rounding that 2 threads move is float32's.
dtype = "float32"

[model]
hidden = 64

[dataset]
name = "synthetic"
num_graphs = 300
min_nodes = 6
max_nodes = 15
attend = "nearest"
"""


def case():
    return parse_case(THREADS_CASE, source="threads")


def rows(folder: Path) -> pd.DataFrame:
    """The results without timing, and without the environment (compared on its own)."""
    frame = pd.read_csv(folder / "threads.csv")
    return frame.drop(columns=[*TIMING_FIELDS, "environment"])


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    """The case trained in this process, which tests/conftest.py pinned to 1 x 1."""
    out = tmp_path_factory.mktemp("serial")
    run_case(case(), out, progress=False)
    return out


def test_this_process_trains_on_the_fixed_layout(serial):
    assert current() == (1, 1)
    (environment,) = pd.read_csv(serial / "threads.csv")["environment"]
    assert parse(environment)["threads"] == "1x1"


@pytest.mark.slow  # the premise of the tests below, not a promise; THREADS_CASE is fixed
def test_another_layout_moves_this_case(serial, tmp_path):
    run_case(replace(case(), threads=2), tmp_path, progress=False)
    other, base = rows(tmp_path), rows(serial)
    assert parse(pd.read_csv(tmp_path / "threads.csv")["environment"][0])["threads"] == "2x1"
    assert (other["final_mae"] != base["final_mae"]).any(), (
        "2 threads no longer move this case: pick a case where they do, or the tests "
        "below prove nothing"
    )


def test_two_workers_give_the_rows_of_this_process(serial, tmp_path):
    """Seeds 0 and 1 in two workers: the rows of this process, in its order (seed 0 is the
    module's serial run, seed 1 is trained here on its own)."""
    run_case(replace(case(), seeds=(1,)), tmp_path / "seed1", progress=False)
    run_case(replace(case(), seeds=(0, 1)), tmp_path / "workers", progress=False, workers=2)
    here = pd.concat([rows(serial), rows(tmp_path / "seed1")], ignore_index=True)
    assert list(here["seed"]) == [0, 1]
    pd.testing.assert_frame_equal(rows(tmp_path / "workers"), here)


STARTED_ON_8 = """
import sys
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(8)
tf.constant(0.0)  # TensorFlow starts here, on 8 intra-op threads, for good

from stability.sweep.cases import parse_case
from stability.sweep.runner import run_case

run_case(parse_case(sys.argv[1], source="threads"), sys.argv[2], progress=False)
"""


def test_a_process_started_on_8_threads_trains_the_same_rows(serial, tmp_path):
    """run_case from Python, in a process whose TensorFlow runs 8 threads: it trains in a
    worker of the fixed layout instead."""
    done = subprocess.run(
        [sys.executable, "-c", STARTED_ON_8, THREADS_CASE, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pd.testing.assert_frame_equal(rows(tmp_path), rows(serial))


def test_the_command_line_ignores_tf_num_intraop_threads(serial, tmp_path):
    path = tmp_path / "threads.toml"
    path.write_text(THREADS_CASE)
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "stability", "run", str(path), "--out", str(tmp_path)]
    done = subprocess.run(
        [*command, "--no-progress"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pd.testing.assert_frame_equal(rows(tmp_path), rows(serial))


def test_a_trainer_in_a_process_of_another_layout_refuses_in_one_line(tiny_dataset):
    """Trainer.run itself cannot move to a worker: it says why instead of training rows that
    depend on the machine."""
    config = next(run_configs(replace(case(), threads=3)))[1]
    trainer = Trainer(get_variant("stable_softmax"), tiny_dataset, config)
    with pytest.raises(StabilityError, match=r"already started on 1x1.*trains on 3x1") as info:
        trainer.run()
    assert "\n" not in str(info.value)
    require(1, 1)  # this process's own layout still holds
