"""Speed, side by side: the trainer against keras.Model.fit, XLA against none, step time as
the batch grows, and a sweep with one worker against two (with its peak memory).

Each comparison runs in one test, and its ways take turns round by round, so that load
from other work on the machine falls on every way alike.
"""

import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tomli_w
from conftest import NOTES, check_goal, interleave, record_samples, timed

from stability.data import load_dataset
from stability.data.graphs import batch_graphs
from stability.data.padding import budget_for, pad_batch
from stability.model.variants import get_variant
from stability.train.config import TrainConfig
from stability.train.guard import StepReport
from stability.train.step import fed, input_signature, make_train_step
from stability.train.trainer import Trainer

ROOT = Path(__file__).parent.parent
SEED_DATA = {"num_graphs": 2000, "seed": 0}  # the seed case's data set (cases/seed.toml)
BATCH = 32


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", **SEED_DATA)


def epoch_batches(data, batch_size=BATCH, seed=0):
    """One shuffled epoch of numpy batches, as the trainer builds them."""
    order = np.random.default_rng(seed).permutation(len(data.train))
    scaled = [(g.target - data.target_mean) / data.target_std for g in data.train]
    return [
        batch_graphs([data.train[i] for i in chosen], targets=np.array([scaled[i] for i in chosen]))
        for chosen in np.array_split(order, int(np.ceil(len(order) / batch_size)))
    ]


def build(data, jit_compile=False):
    """The trainer's step; with ``jit_compile``, XLA-compiled for padded batches."""
    recipe = Trainer(get_variant("raw_e"), data, TrainConfig(hidden=32)).build()
    signature = input_signature(data.num_features, "float32", padded=jit_compile)
    return recipe, make_train_step(recipe, signature, guard=True, jit_compile=jit_compile)


def trainer_epoch(step, batches):
    """What ``Trainer.run`` does per step: numpy inputs in, flags and stats read back."""
    for batch in batches:
        StepReport.of(step(batch.as_inputs(), batch.targets).numpy())


# --- the trainer against keras.Model.fit -------------------------------------------------

FIT = "Trainer against keras.Model.fit"
NOTES[FIT] = (
    "The seed's model (`raw_e`, hidden 32, Adam, learning rate 3e-2) on one epoch of the seed "
    "case's data set (1800 training graphs, 57 batches of 32, the same batches for both ways). "
    "*trainer*: the harness's compiled step (sentinel and guard included) called with numpy "
    "batches, its flags and statistics read back every step, as `Trainer.run` does. "
    "*fit*: `keras.Model.fit(epochs=1)` of a thin `keras.Model` whose `train_step` does "
    "forward, the same loss, gradients and Adam (no sentinel), fed a "
    "`tf.data.Dataset.from_generator` of the same numpy batches with `prefetch(2)`. "
    "Goal: fit / trainer >= 1.0."
)


class FitModel(keras.Model):
    """A plain Keras wrapper around the seed's model: what a user would write for fit."""

    def __init__(self, inner, loss_fn):
        super().__init__()
        self.inner, self.loss_fn = inner, loss_fn

    def call(self, inputs):
        return self.inner(inputs)

    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(targets, self.inner(inputs, training=True))
        gradients = tape.gradient(loss, self.inner.trainable_variables)
        self.optimizer.apply(gradients, self.inner.trainable_variables)
        return {"loss": loss}


def fit_dataset(data, batches):
    inputs, targets = input_signature(data.num_features, "float32")
    generator = lambda: ((b.as_inputs(), b.targets.astype(np.float32)) for b in batches)  # noqa: E731
    dataset = tf.data.Dataset.from_generator(generator, output_signature=(inputs, targets))
    return dataset.prefetch(2)  # batches are built on the host while the step runs


def test_trainer_against_fit(data):
    batches = epoch_batches(data)
    recipe, _ = build(data)
    fit_model = FitModel(recipe.model, recipe.loss)
    fit_model.compile(optimizer=keras.optimizers.Adam(3e-2))
    dataset = fit_dataset(data, batches)
    _, step = build(data)
    ways = {
        "trainer": (trainer_epoch, (step, batches)),
        "fit": (lambda: fit_model.fit(dataset, epochs=1, verbose=0), ()),
    }
    interleave(ways, rounds=1)  # trace both outside the timed rounds
    measured = interleave(ways, rounds=8)
    for name, seconds in measured.items():
        record_samples(FIT, name, seconds, len(batches))
    ratio = np.median(measured["fit"]) / np.median(measured["trainer"])
    check_goal(FIT, "fit / trainer", ratio, ">=", 1.0)


# --- the step's call ------------------------------------------------------------------------

FED = "The step called through its concrete function"
NOTES[FED] = (
    "The seed's model (`raw_e`, hidden 32) on one epoch of the seed case's data set (57 "
    "batches of 32, numpy batches as the trainer builds them, flags and statistics read back "
    "every step). *tf.function*: the compiled step called with the numpy batch, so that "
    "`tf.function` binds every input to its signature on each call. *fed*: the same "
    "step's one concrete function, each input converted to its spec's dtype first "
    "(`stability.train.step.fed`, what `Trainer.run` calls). Both run the same graph: the "
    "rows are the same (`tests/test_retrace.py`). 30 rounds, the ways taking turns. "
    "Goal: fed / tf.function <= 0.95."
)


def test_the_step_called_through_its_concrete_function(data):
    batches = epoch_batches(data)
    _, step = build(data)
    signature = input_signature(data.num_features, "float32")
    ways = {
        "tf.function": (trainer_epoch, (step, batches)),
        "fed": (trainer_epoch, (fed(step, signature), batches)),
    }
    interleave(ways, rounds=1)  # the trace, outside the timed rounds
    measured = interleave(ways, rounds=30)
    for name, seconds in measured.items():
        record_samples(FED, name, seconds, len(batches))
    ratio = np.median(measured["fed"]) / np.median(measured["tf.function"])
    check_goal(FED, "fed / tf.function", ratio, "<=", 0.95)


# --- XLA ----------------------------------------------------------------------------------

JIT = "Trainer step with jit_compile (XLA, padded batches) against without"
JIT_RUN = "A whole run with jit_compile against without"
RUN_EPOCHS = 110


def test_jit_compile_per_step(data):
    batches = epoch_batches(data)
    budget = budget_for(data.train, BATCH)
    padded = [pad_batch(b, budget) for b in batches]
    shapes = {(b.num_nodes, b.num_edges) for b in batches}
    _, plain = build(data)
    _, jit = build(data, jit_compile=True)
    compile_seconds = timed(trainer_epoch, jit, padded[:1])  # the run's one compile
    trainer_epoch(plain, batches[:1])
    ways = {
        "no jit": (trainer_epoch, (plain, batches)),
        "jit_compile": (trainer_epoch, (jit, padded)),
    }
    seconds = interleave(ways, rounds=6)
    for name, samples in seconds.items():
        record_samples(JIT, name, samples, len(batches))
    saved = statistics.median(seconds["no jit"]) - statistics.median(seconds["jit_compile"])
    edges = np.mean([b.num_edges for b in batches])
    break_even = f"{compile_seconds / saved:.0f}" if saved > 0 else "never"
    NOTES[JIT] = (
        f"The harness's step for `raw_e` (hidden 32) on one epoch of the seed case's data set "
        f"({len(batches)} batches of {BATCH} graphs, {len(shapes)} distinct (nodes, edges) "
        "shapes). XLA compiles once per input shape, so with `jit_compile` every batch is "
        f"padded to the run's one budget ({budget.nodes} nodes, {budget.edges} edges, "
        f"{budget.graphs} graphs: {budget.edges / edges:.2f}x the mean batch's {edges:.0f} "
        "edges; `stability/padding.py`); *no jit* steps the batches as they are. The jit "
        f"step's one compile took {compile_seconds:.1f} s, outside the timed rounds; at the "
        f"per-epoch saving measured here it is paid back after {break_even} epochs. Both "
        "steps ran on this process's intra-op threads (all cores); a `jit_compile` case "
        "trains on one thread (`stability/workers.py`), see the whole run below."
    )


def seed_case_file(tmp_path: Path, name: str, **changes) -> Path:
    """cases/seed.toml with ``changes`` to its top-level keys, written as ``name``.toml."""
    doc = tomllib.loads((ROOT / "cases" / "seed.toml").read_text())
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps({**doc, "name": name, **changes}))
    return path


def test_jit_compile_whole_run(tmp_path):
    case = seed_case_file(
        tmp_path, "whole", variants=["stable_softmax"], seeds=[0], epochs=RUN_EPOCHS
    )
    seconds, maes = {"no jit": [], "jit_compile": []}, {}
    for round_ in range(2):
        for name in seconds:
            out = tmp_path / f"{name}-{round_}"
            flags = ["--jit-compile"] if name == "jit_compile" else []
            wall, _ = run_sweep(case, out, workers=1, flags=flags)
            seconds[name].append(wall)
            maes[name] = float(pd.read_csv(out / "whole.csv")["final_mae"].iloc[0])
    for name, samples in seconds.items():
        record_samples(JIT_RUN, name, samples, 1, unit="s per run", **{"final MAE": maes[name]})
    NOTES[JIT_RUN] = (
        "`python -m stability run WHOLE.toml [--jit-compile]`, where WHOLE.toml is "
        f"cases/seed.toml cut to `stable_softmax` (no NaN, so the run trains all "
        f"{RUN_EPOCHS} epochs), seed 0: one run, timed from start to exit (TensorFlow's "
        "import, the data set, the compile, padding and the per-epoch validation included). "
        "Without XLA the run trains in the main process on both cores; with it, in one "
        "worker process on one intra-op thread, because XLA's results depend on its thread "
        "count (`stability/workers.py`). The final MAE shows what XLA's arithmetic does to "
        "the result."
    )


# --- host-side prefetch ---------------------------------------------------------------------

PREFETCH = "A run with host-side prefetch against without"
PREFETCH_EPOCHS = 10


def test_prefetch(data):
    seconds = {"no prefetch": [], "prefetch 2": []}
    for _ in range(4):
        for name in seconds:
            config = TrainConfig(
                seed=0,
                batch_size=BATCH,
                learning_rate=1e-2,
                epochs=PREFETCH_EPOCHS,
                prefetch=0 if name == "no prefetch" else 2,
            )
            result = Trainer(get_variant("stable_softmax"), data, config).run()
            seconds[name].append(1 / result.steps_per_second)
    for name, samples in seconds.items():
        record_samples(PREFETCH, name, samples, 1)
    NOTES[PREFETCH] = (
        f"`Trainer.run` of `stable_softmax` on the seed case's data set for {PREFETCH_EPOCHS} "
        f"epochs (batch {BATCH}): the time per step of the epochs' loops, batch building "
        "included. *prefetch 2*: a host thread builds the next two batches while the step "
        "runs (`TrainConfig.prefetch = 2`, `stability/prefetch.py`); *no prefetch*: each "
        "batch is built when it is needed, the trainer's default."
    )


# --- step time as the batch grows ---------------------------------------------------------

EDGES = "Step time at 1x, 4x and 16x the edges per batch"
NOTES[EDGES] = (
    "The harness's step for `raw_e` (hidden 32) on batches of 32, 128 and 512 graphs of the "
    "seed case's data set (about 1x, 4x, 16x the edges; the exact counts are in the table), "
    "5 batches per round. Goal: near-linear growth, i.e. a ratio at most the edge ratio."
)


def test_step_time_against_edges(data):
    _, step = build(data)
    ways, edges = {}, {}
    for factor in (1, 4, 16):
        batches = epoch_batches(data, batch_size=BATCH * factor)[:5]
        edges[factor] = int(np.mean([b.num_edges for b in batches]))
        ways[f"{factor}x ({BATCH * factor} graphs)"] = (trainer_epoch, (step, batches))
    interleave(ways, rounds=1)
    measured = interleave(ways, rounds=10)
    for (name, seconds), factor in zip(measured.items(), edges, strict=True):
        growth = np.median(seconds) / np.median(next(iter(measured.values())))
        check_goal(EDGES, f"time ratio at {factor}x", growth, "<=", edges[factor] / edges[1])
        record_samples(
            EDGES,
            name,
            seconds,
            5,
            **{"edges per batch": edges[factor], "edge ratio": edges[factor] / edges[1]},
        )


# --- a sweep with one worker against two ---------------------------------------------------

SWEEP = "Sweep throughput, --workers 1 against --workers 2, and peak memory"
SWEEP_EPOCHS = 10
TIME = "/usr/bin/time"


def sweep_case(tmp_path: Path) -> Path:
    return seed_case_file(tmp_path, "sweep", epochs=SWEEP_EPOCHS)


def run_sweep(case: Path, out: Path, workers: int, flags: tuple = ()) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB, the largest process) of one sweep in a subprocess.

    The peak comes from `/usr/bin/time -f %M`, not from ``os.wait4`` here: Linux starts a
    forked child's ``ru_maxrss`` at its parent's RSS, and this pytest process is large.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [TIME, "-f", "%M", sys.executable, "-m", "stability", "run", str(case)]
    command += ["--out", str(out), "--no-progress", "--workers", str(workers), *flags]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    assert done.returncode == 0, f"{' '.join(command)} failed: {done.stderr[-2000:]!r}"
    return seconds, int(done.stderr.decode().strip().splitlines()[-1]) / 2**10  # KiB


@pytest.mark.skipif(not Path(TIME).exists(), reason=f"needs {TIME} for the peak RSS")
def test_sweep_workers(tmp_path):
    case = sweep_case(tmp_path)
    seconds = {1: [], 2: []}
    peaks = {1: [], 2: []}
    for round_ in range(2):
        for workers in (1, 2):
            wall, peak = run_sweep(case, tmp_path / f"w{workers}-{round_}", workers)
            seconds[workers].append(wall)
            peaks[workers].append(peak)
    rows = (tmp_path / "w1-0" / "sweep.csv").read_text().count("\n") - 1
    for workers in (1, 2):
        runs = pd.concat(pd.read_csv(tmp_path / f"w{workers}-{r}" / "sweep.csv") for r in (0, 1))
        record_samples(
            SWEEP,
            f"--workers {workers}",
            seconds[workers],
            1,
            unit="s per sweep",
            **{
                "median s per run": runs["wall_seconds"].median(),
                "peak RSS MB (largest process)": max(peaks[workers]),
            },
        )
    NOTES[SWEEP] = (
        f"`python -m stability run SWEEP.toml --workers N --no-progress`, where SWEEP.toml is "
        f"cases/seed.toml with `epochs = {SWEEP_EPOCHS}`: the seed case's {rows} runs, each "
        "cut short, in a subprocess timed from start to exit (TensorFlow's import and the "
        "data set included); the two ways take turns. Peak RSS is `/usr/bin/time -f %M` of "
        "the sweep: for --workers 2 that is the largest of the parent and its workers, not "
        "their sum. Goal: --workers 1 / --workers 2 >= 1.6, i.e. a "
        "ratio <= 0.625 below; peak RSS of the seed case <= 2048 MB."
    )
    speedup = np.median(seconds[1]) / np.median(seconds[2])
    check_goal(SWEEP, "--workers 1 / --workers 2", speedup, ">=", 1.6)
    check_goal(SWEEP, "peak RSS MB", max(max(peaks[1]), max(peaks[2])), "<=", 2048)
