"""TensorFlow's C++ log stays off stderr where it would only repeat the harness: a replay's
``check_numerics`` error (``stability.core.quiet``), in a user's own process, where no
``TF_CPP_MIN_LOG_LEVEL`` hides it."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent

#: A line of TensorFlow's C++ log: severity and date, time, thread, file:line].
TF_LOG = re.compile(r"[IWEF]\d{4} [\d:.]+\s+\d+ [\w/.-]+\.(cc|h):\d+\]")

#: raw_e on edge distances up to 1000: exp overflows in the first step's forward pass, and
#: the replay names the op. In float32: under mixed_float16, TensorFlow itself logs once per
#: process, at its first float16 op, that oneDNN "supports DT_HALF only on platforms with
#: AVX-512" (seen on this AVX-512 CPU in the py312-tflatest-mixed_float16 cell), a notice of
#: its own that repeats nothing the harness says.
FAILING_CASE = """
name = "failing"
variants = ["raw_e"]
seeds = [0]
batch_sizes = [16]
epochs = 1
dtype = "float32"

[model]
hidden = 8

[dataset]
name = "generated"
num_graphs = 32
distribution = "outliers"
max_outlier = 1000.0
"""

#: What a user's script or test does (``stability.pin_threads()`` first, as docs/testing.md
#: says, so the run trains in this process), with TensorFlow started before a marker line on
#: stderr: its start-up notices are TensorFlow's import, not the harness's.
TRAIN = """
import sys

import stability
from stability.core.quiet import stderr_silenced

with stderr_silenced():
    import tensorflow as tf

    from stability.sweep.cases import load_case
    from stability.sweep.runner import run_case

    stability.pin_threads()
    tf.constant(0.0)
print("started", file=sys.stderr, flush=True)
[result] = run_case(load_case(sys.argv[1]), progress=False)
print(result.first_nan_where, result.first_nan_op)
"""


def test_a_replay_writes_no_tensorflow_log_to_stderr(tmp_path):
    case = tmp_path / "failing.toml"
    case.write_text(FAILING_CASE)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, str(case)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where, _, op = done.stdout.strip().partition(" ")
    assert where == "forward" and op != "None", done.stdout  # the replay ran and named an op
    after_start = done.stderr.split("started\n", 1)[1]
    assert not TF_LOG.search(after_start), after_start[:2000]
    assert "Detected Infinity or NaN" not in after_start, after_start[:2000]
