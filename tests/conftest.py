import os
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from stability.data import Dataset, load_dataset
from stability.testing.profiles import register_profiles
from stability.train.threads import pin

# The thread layout every run trains on (1 x 1), set before any test starts TensorFlow, so
# that the tests' in-process trainings are the rows the command line makes in its workers.
# tests/test_thread_layout.py checks that a process started on another layout trains the
# same rows through a worker.
assert pin(), "TensorFlow started before tests/conftest.py could pin its thread layout"

# The Hypothesis profiles, chosen with STABILITY_HYPOTHESIS_PROFILE (default "ci"): "ci" is
# 200 examples, derandomized, "thorough" 5000 with fresh randomness; stability.testing.profiles
# defines them once, for these tests and the conformance suite alike. Training tests set
# their own smaller max_examples on top of either.
register_profiles()

#: A small data set of the seed's kind: a few seconds of training at most.
TINY_DATA = {"num_graphs": 48, "min_nodes": 3, "max_nodes": 7, "seed": 0}

TINY_CASE = """
name = "tiny"
variants = ["raw_e", "stable_softmax"]
seeds = [0]
batch_sizes = [16]
learning_rates = [0.01]
epochs = 2

[model]
hidden = 8

[dataset]
name = "synthetic"
num_graphs = 48
min_nodes = 3
max_nodes = 7
"""


@pytest.fixture(scope="session")
def tiny_dataset() -> Dataset:
    return load_dataset("synthetic", **TINY_DATA)


@pytest.fixture
def isolated_registries(monkeypatch):
    """Registries and imported modules as they were before the test: a plugin a test loads
    in this process registers nothing that another test sees (``stability list``,
    "Known: ..." messages), and importing it again registers it again."""
    import sys

    from stability.core import plugins
    from stability.data import registry
    from stability.model import logit_transforms, remedy, softmax, variants

    for module, name in [
        (variants, "_variants"),
        (softmax, "_softmaxes"),
        (logit_transforms, "_transforms"),
        (registry, "_datasets"),
        (remedy, "_remedies"),
    ]:
        monkeypatch.setattr(module, name, getattr(module, name).copy())
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(sys, "path", list(sys.path))
    from pathlib import Path

    before = set(sys.modules)
    yield
    # Only the test's own plugin files: a library or stability module imported for the
    # first time during the test stays imported (a second copy would register twice).
    keep = (str(Path(__file__).resolve().parent.parent / "stability"), sys.prefix, sys.base_prefix)
    for added in set(sys.modules) - before:
        origin = getattr(sys.modules[added], "__file__", None) or ""
        if origin and not origin.startswith(keep):
            del sys.modules[added]


def jit_agreement() -> float:
    """How far, relatively, a jit run's MAE may sit from the plain run's under the dtype
    policy of this test run (``STABILITY_DTYPE``): XLA fuses ops and pads batches, so the two
    round differently. A few roundings of the dtype the model computes in (float16 under
    mixed_float16: one rounding is 9.8e-4), and never less than 1e-4, what a few float32
    epochs of drift stay within."""
    import numpy as np

    from stability.train.config import default_dtype

    compute = default_dtype().removeprefix("mixed_")
    return max(1e-4, 4 * float(np.finfo(compute).eps))


def run_cli(*args: str, cwd: os.PathLike) -> subprocess.CompletedProcess:
    """``python -m stability *args`` run in this process, from ``cwd``: its exit code and
    what it printed, as ``subprocess.run`` gives them. A bad-input test needs no process of
    its own (one that starts TensorFlow costs seconds): ``cli.main`` is what ``python -m
    stability`` runs, and an exception it let out fails the test here as a traceback would
    there. ``tests/test_cli.py`` keeps one bad input through a real process."""
    import contextlib
    import io

    from stability import cli

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse refusing a flag
                code = exc.code
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
