"""What the ``map`` and ``hunt`` commands do once their flags are read: the maps to train
and their reports, and a hunt's files (the found case, its reproduction, its report).
``stability.commands`` holds only their parsers and the progress shown on a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stability.explore.found_case import write_found_case
from stability.explore.hunt import Hunt, Training
from stability.explore.hunt_report import write_hunt_report
from stability.explore.map import MapCase, load_map, run_map
from stability.explore.map_report import read_map_rows, write_map_report
from stability.report.description import report_description
from stability.sweep.cases import Case, load_case, parse_toml, read_case_text
from stability.sweep.runner import run_case

if TYPE_CHECKING:
    from stability.core.results import RunResult


# --- map ----------------------------------------------------------------------------------


def load_maps(
    paths: Sequence[Path], overrides: Sequence[str], threads: int, jit_compile: bool
) -> list[MapCase]:
    """Every map case, all checked before any training, on ``threads`` and, with
    ``jit_compile``, under XLA (a case that asks for XLA keeps it)."""
    maps = [load_map(path, overrides) for path in paths]
    maps = [replace(m, case=replace(m.case, threads=threads)) for m in maps]
    if jit_compile:
        maps = [replace(m, case=replace(m.case, jit_compile=True)) for m in maps]
    return maps


def map_and_report(m: MapCase, out: Path, **options: Any) -> Path:
    """Train the map into ``out`` and write its report; returns the markdown. ``options``
    are ``run_map``'s (progress, resume, overwrite, workers, cluster)."""
    rows = run_map(m, out, **options)
    return write_map_report(m, rows, out, report_description(m.case))


def rewrite_map_report(m: MapCase, csv_path: Path, out: Path) -> Path:
    """The map's report written again from its CSV; returns the markdown."""
    return write_map_report(m, read_map_rows(m, csv_path), out, report_description(m.case))


def read_case_file(path: Path, overrides: Sequence[str]) -> tuple[Case, MapCase | None]:
    """The case a file holds and, for a map case (one with a ``[map]`` table), its map."""
    if "map" in parse_toml(read_case_text(path), str(path)):
        found = load_map(path, overrides)
        return found.case, found
    return load_case(path, overrides), None


# --- hunt ---------------------------------------------------------------------------------


def write_hunt(
    found: Hunt, out: Path, plugins: Sequence[str] = (), reproduce: bool = True
) -> tuple[Path, Path]:
    """Write what the hunt found as a case, run that case as ``run`` would when it failed
    (with ``reproduce``), and write the hunt's report; returns the case and the markdown."""
    path = write_found_case(found, out, plugins)
    reproduced: RunResult | None = None
    if found.found and reproduce:
        results = run_case(load_case(path), progress=False)
        reproduced = results[0] if results else None
    return path, write_hunt_report(found, out, path, reproduced)


def training_line(training: Training) -> str:
    """One training's line under the progress bar: its move, its outcome, its margin."""
    r = training.result
    outcome = f"fails at epoch {r.first_nan_epoch}" if training.failed else "finite"
    return f"training {training.index}: {training.move}: {outcome}; {training.margin.describe()}"


def no_failure_line(found: Hunt) -> str:
    count = len(found.trainings)
    plural = "" if count == 1 else "s"
    return f"no failure of {found.variant} in {count} training{plural}"
