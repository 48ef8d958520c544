"""What the fixed thread layout (1 intra-op x 1 inter-op, issue 25) costs a serial run, and
what a sweep gets back by training runs side by side.

Before, a serial run took every core as intra-op threads, and its rows depended on the core
count. Now every run trains on 1 x 1. Three ways train the same 4-run case, each a fresh
``python -m stability run`` (the ways take turns, round by round):

- serial on 1 x 1, the fixed layout;
- serial on <cores> x 1, what a serial run did before (``--threads <cores>``);
- ``--workers <cores>``, each worker on 1 x 1.

The per-step time comes from the rows' ``steps_per_second`` (training only, no start-up);
the sweep's time is the command's wall time. Goal: the workers' sweep takes no longer than
the old serial sweep on every core (ratio <= 1), so the fixed layout costs a sweep nothing.
"""

import os
import subprocess
import sys
import time

import pandas as pd
from conftest import NOTES, check_goal, record_samples

SECTION = "The fixed thread layout: a serial run's cost, a sweep's speed"
CORES = os.cpu_count() or 1
ROUNDS = 2
CASE = """
name = "layout"
variants = ["stable_softmax"]
seeds = [0, 1, 2, 3]
batch_sizes = [32]
learning_rates = [0.01]
epochs = 8

[model]
hidden = 32

[dataset]
name = "synthetic"
num_graphs = 300
min_nodes = 6
max_nodes = 15
attend = "nearest"
"""
NOTES[SECTION] = (
    f"stable_softmax, seeds 0-3, 300 synthetic graphs, 8 epochs, batch 32, hidden 32: 4 runs, "
    f"each way a fresh `python -m stability run` on this machine's {CORES} cores, {ROUNDS} "
    "rounds. *ms per step*: from the rows' steps_per_second (training only); *s per sweep*: "
    "the command's wall time, with its start-up."
)


def sweep(folder, *flags: str) -> tuple[float, float]:
    """(wall seconds, median ms per step) of one ``stability run`` of the case."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "layout.toml"
    path.write_text(CASE)
    command = [sys.executable, "-m", "stability", "run", str(path), "--out", str(folder)]
    started = time.perf_counter()
    subprocess.run(
        [*command, "--overwrite", "--no-progress", *flags],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    wall = time.perf_counter() - started
    rows = pd.read_csv(folder / "layout.csv")
    return wall, float((1e3 / rows["steps_per_second"]).median())


def test_the_fixed_layout_costs_a_sweep_nothing(tmp_path):
    ways = {
        "serial, 1x1 (the fixed layout)": ("--threads", "1"),
        f"serial, {CORES}x1 (every core, as before)": ("--threads", str(CORES)),
        f"--workers {CORES}, 1x1 each": ("--workers", str(CORES)),
    }
    walls = {way: [] for way in ways}
    steps = {way: [] for way in ways}
    for round_ in range(ROUNDS):
        for k, (way, flags) in enumerate(ways.items()):
            wall, ms = sweep(tmp_path / f"{round_}-{k}", *flags)
            walls[way].append(wall)
            steps[way].append(ms)
    for way in ways:
        record_samples(
            SECTION, way, walls[way], 1, unit="s per sweep", **{"min ms per step": min(steps[way])}
        )
    serial_old = f"serial, {CORES}x1 (every core, as before)"
    workers = f"--workers {CORES}, 1x1 each"
    ratio = sorted(walls[workers])[0] / sorted(walls[serial_old])[0]
    check_goal(SECTION, f"--workers {CORES} sweep / old serial sweep (min s)", ratio, "<=", 1.0)
