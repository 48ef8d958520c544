"""Benchmarks: run with `python -m pytest benchmarks` (the default test run skips them).

Each comparison times its ways in turns, round by round (``interleave``), so that load from
other work falls on every way alike, and records them in ``MEASURED``; at the end of the
session the figures and their ratios are written to ``reports/bench.md``.
"""

import os
import platform
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pandas as pd
import pytest
import tensorflow as tf
from pytest_benchmark.stats import Stats

from stability.train.threads import pin

# Every run trains on the fixed thread layout (1 x 1), here as in the test suite and the
# command line; set before any benchmark starts TensorFlow.
assert pin(), "TensorFlow started before benchmarks/conftest.py could pin its thread layout"

REPORT = Path(__file__).parent.parent / "reports" / "bench.md"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers would time their ways on shared cores and write bench.md at once.
    raise pytest.UsageError("run the benchmarks in one process: python -m pytest benchmarks -n 0")


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """The default run's ``-n auto`` (pyproject's addopts) means no workers here: the
    benchmarks time their ways side by side in one process."""
    return 0


#: section -> list of rows {"way": ..., "median ms": ..., ...}, filled by the benchmarks.
MEASURED: dict[str, list[dict]] = {}
#: section -> text shown above its table (what was timed and how).
NOTES: dict[str, str] = {}


def record_samples(
    section: str, way: str, seconds: list[float], per: int, unit: str = "ms per step", **extra
) -> None:
    """Record one way of a comparison: ``seconds`` per round of ``per`` units.

    The statistics are pytest-benchmark's (``Stats``), over samples timed here round by
    round, because a comparison's ways take turns (``interleave``), which
    ``benchmark.pedantic`` cannot do. ``unit`` is "ms per step", "s per run" or
    "s per sweep"; the first column named "median ..." is the one the ratio is taken of.
    """
    stats = Stats()
    for sample in seconds:
        stats.update(sample)
    scale = 1e3 / per if unit.startswith("ms") else 1.0 / per
    MEASURED.setdefault(section, []).append(
        {
            "way": way,
            f"median {unit}": stats.median * scale,
            f"min {unit}": stats.min * scale,
            f"IQR {unit}": stats.iqr * scale,
            "rounds": stats.rounds,
            **extra,
        }
    )


def timed(fn, *args):
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def interleave(ways: dict, rounds: int, before=None) -> dict[str, list[float]]:
    """Time each way once per round, the ways taking turns; ``before()``, where given, runs
    untimed ahead of every turn (to put shared state back where the round starts)."""
    seconds = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (fn, args) in ways.items():
            if before is not None:
                before()
            seconds[name].append(timed(fn, *args))
    return seconds


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` shows them."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "unknown"


#: Goals missed in this run: (section, text). A missed goal fails the benchmark run.
MISSED: list[str] = []


def check_goal(section: str, name: str, value: float, op: str, bound: float) -> None:
    """Record the stated goal ``name op bound`` of ``section`` with its measured ``value``;
    a missed goal is noted in bench.md and fails the run at the end of the session (after
    every benchmark has been measured and written)."""
    met = value <= bound if op == "<=" else value >= bound
    verdict = "met" if met else "**missed**"
    NOTES[section] = (
        NOTES.get(section, "") + f"\n\nGoal {name} {op} {bound:g}: measured {value:.3f}, {verdict}."
    )
    if not met:
        MISSED.append(f"{section}: {name} = {value:.3f}, goal {op} {bound:g}")


def _sections(text: str) -> dict[str, str]:
    """``## heading`` -> that section's text, of an existing bench.md."""
    found, heading = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line[3:].strip()
            # The heading's own line break: the body then starts with a blank line, as a
            # section written by this run does ("\n\n" + text).
            found[heading] = "\n"
        elif heading is not None:
            found[heading] += line
    return found


@pytest.fixture(scope="session", autouse=True)
def bench_report():
    load_before = load_average()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    yield
    if not MEASURED:
        return
    run = (
        f"Measured {started} on {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.system()}, Python {platform.python_version()}, TensorFlow {tf.__version__}; "
        f"load average (1, 5, 15 min) at the start {load_before}, at the end {load_average()}."
    )
    # A run of some benchmarks only replaces their sections; the others keep the run line
    # they were measured in, so every table still says when and where it was measured.
    kept = _sections(REPORT.read_text(encoding="utf-8")) if REPORT.exists() else {}
    sections = dict(kept)
    for section, rows in MEASURED.items():
        table = pd.DataFrame(rows)
        median = next(c for c in table.columns if c.startswith("median"))
        table["ratio to first"] = table[median] / table[median].iloc[0]
        body = [run, NOTES.get(section, "").strip(), table.to_markdown(index=False, floatfmt=".3f")]
        sections[section] = "\n\n" + "\n\n".join(p for p in body if p) + "\n\n"
    parts = [
        "# Benchmarks\n\n",
        "Generated by `python -m pytest benchmarks` (or `tox -e bench`); every figure in a "
        "table was measured in the same run as the rest of its table, side by side (the ways "
        "take turns, round by round), as the median over rounds (statistics by "
        "pytest-benchmark's `Stats`). Each section says when it was measured and the load "
        "average then: a load above the core count means other work shared the cores.\n\n",
    ]
    # Every section ends in one blank line, the last kept one (read without it) too.
    parts += [f"## {heading}{body.rstrip()}\n\n" for heading, body in sections.items()]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("".join(parts).rstrip() + "\n", encoding="utf-8")
    if MISSED:
        pytest.fail("benchmark goals missed: " + "; ".join(MISSED), pytrace=False)
