"""A robustness map: where each variant fails over the distances the ``generated`` data set
draws, on a grid of (distribution, scale) cells and by bisection over the scale.

A map case is an ordinary case (variants, seeds, epochs, ``num_datasets`` = K data sets
per cell, ``[model]``, ``[dataset]`` of the ``generated`` data set) plus a ``[map]``
table (``MAP_KEYS``). Its runs are ordinary runs in the ordinary store of the case
(``<map>.runs.sqlite``, ``<map>.csv``), so ``--resume``, ``--workers`` and
``--executor ray`` work as for ``run``, and a point the bisection shares with the grid is
trained once: its runs have the same store key.

**Scale** is the largest distance a draw can have: ``max_distance`` for ``uniform``,
``log_uniform`` and the ``clustered`` spreads (all distances lie in
``[min_distance, scale]``), ``max_outlier`` for ``outliers`` (distances in
``[min_distance, max_distance]`` and rare outliers up to the scale).

A cell (variant, distribution, scale) **fails** when at least ``fail_fraction`` of its runs
(K data sets x seeds) failed within the epoch budget, silent failures
(``stability.core.failures``) included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stability.core.errors import CaseError
from stability.core.failures import failed
from stability.data.generated import drawn_with, generated_key
from stability.data.strategies import NAMED_DISTRIBUTIONS
from stability.explore.bisection import Bisection, Boundary, bisect
from stability.sweep.cases import (
    Case,
    apply_override,
    case_from_doc,
    parse_toml,
    read_case_text,
)
from stability.sweep.runner import (
    build_variants,
    case_datasets,
    config_key,
    execute_runs,
    run_configs,
)
from stability.sweep.store import RunStore
from stability.train.threads import can_train_here

if TYPE_CHECKING:
    from stability.sweep.ray_executor import RayCluster

#: The data set a map draws from.
DATASET = "generated"

#: [map] key -> what is accepted (checked in ``_map_settings``).
MAP_KEYS = {
    "distributions": f"a non-empty list of {', '.join(NAMED_DISTRIBUTIONS)}",
    "scales": "a non-empty list of numbers, each >= dataset.min_distance",
    "bracket": "[lo, hi] with dataset.min_distance <= lo < hi",
    "steps": "an integer from 0 to 30, the bisection's rounds after the two ends",
    "fail_fraction": "a number in (0, 1]",
}
DEFAULT_STEPS = 4
DEFAULT_FAIL_FRACTION = 0.5
MAX_STEPS = 30

#: The dtype a policy computes in: a larger distance is not even a finite input there.
_COMPUTE_DTYPES = {"float32": np.float32, "float64": np.float64, "mixed_float16": np.float16}

#: Where a cell's rows come from: (variant, distribution, scale).
Cell = tuple[str, str, float]


@dataclass(frozen=True)
class MapCase:
    """A validated map: the base ``case`` and its grid and bisection settings."""

    case: Case
    distributions: tuple[str, ...]
    scales: tuple[float, ...]
    bracket: tuple[float, float]
    steps: int = DEFAULT_STEPS
    fail_fraction: float = DEFAULT_FAIL_FRACTION

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def runs_per_cell(self) -> int:
        """Runs of one variant at one (distribution, scale): K data sets x seeds."""
        return self.case.num_datasets * len(self.case.seeds)

    @property
    def grid_runs(self) -> int:
        return (
            len(self.case.variants)
            * len(self.distributions)
            * len(self.scales)
            * (self.runs_per_cell)
        )


def _params(m: MapCase, distribution: str, scale: float) -> dict[str, Any]:
    """The ``generated`` parameters at (distribution, scale). Without outliers,
    ``max_outlier`` goes up with the scale too: it is unused then, but must be >=
    ``max_distance``."""
    params = {**m.case.dataset_params, "distribution": distribution}
    if distribution == "outliers":
        return {**params, "max_outlier": float(scale)}
    return {**params, "max_distance": float(scale), "max_outlier": float(scale)}


def point_case(m: MapCase, distribution: str, scale: float, variants: Sequence[str]) -> Case:
    """The ordinary case of ``variants`` at one (distribution, scale)."""
    return replace(m.case, variants=tuple(variants), dataset_params=_params(m, distribution, scale))


def point_keys(m: MapCase, distribution: str, scale: float) -> list[str]:
    """The keys (the ``dataset`` column) of the K data sets at (distribution, scale)."""
    params = _params(m, distribution, scale)
    base = params.get("seed", 0)
    return [generated_key({**params, "seed": base + k}) for k in range(m.case.num_datasets)]


def grid_cells(m: MapCase) -> list[Cell]:
    return [(v, d, s) for v in m.case.variants for d in m.distributions for s in m.scales]


def as_drawn(m: MapCase, rows: Sequence[Mapping[str, object]]) -> MapCase:
    """``m`` with the Hypothesis version its rows were drawn with, where it leaves the
    version to the installed one and every row names the same one.

    A cell's rows are found by their data sets' keys, and a key names the Hypothesis version
    that drew it. Without this, a report rebuilt from committed rows on a machine with
    another Hypothesis release looks for keys nobody wrote and finds no runs. Rows of
    several versions (a store resumed across an upgrade) are left to the installed one.
    """
    if m.case.dataset_params.get("hypothesis"):
        return m
    versions = {drawn_with(str(row["dataset"])) for row in rows} - {None}
    if len(versions) != 1:
        return m
    params = {**m.case.dataset_params, "hypothesis": versions.pop()}
    return replace(m, case=replace(m.case, dataset_params=params))


class MapRows:
    """The result rows of a map, found by cell."""

    def __init__(self, m: MapCase, rows: Iterable[Mapping[str, object]]):
        rows = list(rows)
        self.map = as_drawn(m, rows)
        self._by_key: dict[tuple[str, str], list[Mapping[str, object]]] = {}
        for row in rows:
            self._by_key.setdefault((str(row["variant"]), str(row["dataset"])), []).append(row)

    def cell(self, variant: str, distribution: str, scale: float) -> list[Mapping[str, object]]:
        """The rows of ``variant`` at (distribution, scale): one per data set and seed."""
        keys = point_keys(self.map, distribution, scale)
        return [row for key in keys for row in self._by_key.get((variant, key), [])]

    def fails(self, variant: str, distribution: str, scale: float) -> bool:
        """Whether the cell fails (``fail_fraction`` of its runs); every run must be there."""
        rows = self.cell(variant, distribution, scale)
        if len(rows) < self.map.runs_per_cell:
            raise CaseError(
                f"{self.map.name}: {variant} at {distribution} scale {scale:g} has "
                f"{len(rows)} of its {self.map.runs_per_cell} runs in the results"
            )
        return sum(map(failed, rows)) >= self.map.fail_fraction * len(rows)


def boundaries(m: MapCase, rows: MapRows) -> dict[tuple[str, str], Boundary]:
    """Each (variant, distribution)'s boundary, replayed from the rows (the same rule the
    map ran by, so the report needs nothing but the rows)."""
    lo, hi = m.bracket
    return {
        (v, d): bisect(lambda s, v=v, d=d: rows.fails(v, d, s), lo, hi, m.steps)
        for v in m.case.variants
        for d in m.distributions
    }


# --- loading ------------------------------------------------------------------------------


def load_map(path: str | Path, overrides: Sequence[str] = ()) -> MapCase:
    """Read and validate the map case at ``path`` (``--set`` ``overrides`` first; they may
    name ``map.*`` keys too)."""
    path = Path(path)
    return parse_map(read_case_text(path), str(path), path.stem, path.parent, overrides)


def parse_map(
    text: str,
    source: str = "<map>",
    default_name: str = "map",
    base_dir: Path | None = None,
    overrides: Sequence[str] = (),
) -> MapCase:
    """Parse and validate map case TOML ``text`` (see ``load_map``)."""
    doc = parse_toml(text, source)
    for override in overrides:
        apply_override(doc, override)
    table = doc.pop("map", None)
    if not isinstance(table, dict):
        raise CaseError(
            f"{source}: a map case needs a [map] table with {', '.join(MAP_KEYS)} "
            "(docs/map.md); `python -m stability run` runs a case without one"
        )
    dataset = doc.setdefault("dataset", {})
    if isinstance(dataset, dict):
        dataset.setdefault("name", DATASET)
    case = case_from_doc(doc, source, default_name, base_dir, overrides)
    if case.dataset != DATASET:
        raise CaseError(
            f"{source}: dataset.name = {case.dataset!r}; a map draws its data, so it needs "
            f"dataset.name = {DATASET!r}"
        )
    for key, values in (("batch_sizes", case.batch_sizes), ("learning_rates", case.learning_rates)):
        if len(values) != 1:
            raise CaseError(
                f"{source}: {key} = {list(values)}; a map cell is one training setting, "
                f"so a map takes one value in {key}"
            )
    return _map_settings(source, table, case)


def _map_settings(source: str, table: dict[str, Any], case: Case) -> MapCase:
    unknown = sorted(set(table) - set(MAP_KEYS))
    if unknown:
        raise CaseError(
            f"{source}: unknown key map.{unknown[0]!r}. Valid keys: {', '.join(MAP_KEYS)}."
        )
    for key in ("distributions", "scales", "bracket"):
        if key not in table:
            raise CaseError(f"{source}: map.{key} is missing; expected {MAP_KEYS[key]}")
    distributions = _distributions(source, table["distributions"])
    low = _lowest_scale(case, distributions)
    top = float(np.finfo(_COMPUTE_DTYPES[case.dtype]).max)
    scales = _scales(source, table["scales"], low, top)
    bracket = _bracket(source, table["bracket"], low, top)
    steps = table.get("steps", DEFAULT_STEPS)
    if not (isinstance(steps, int) and not isinstance(steps, bool) and 0 <= steps <= MAX_STEPS):
        raise CaseError(
            f"{source}: map.steps = {steps!r} is not valid; expected {MAP_KEYS['steps']}"
        )
    fraction = table.get("fail_fraction", DEFAULT_FAIL_FRACTION)
    if not (_number(fraction) and 0 < fraction <= 1):
        raise CaseError(
            f"{source}: map.fail_fraction = {fraction!r} is not valid; expected "
            f"{MAP_KEYS['fail_fraction']}"
        )
    return MapCase(case, distributions, scales, bracket, steps, float(fraction))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _distributions(source: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise CaseError(
            f"{source}: map.distributions = {value!r} is an empty grid; expected "
            f"{MAP_KEYS['distributions']}"
        )
    for name in value:
        if name not in NAMED_DISTRIBUTIONS:
            raise CaseError(
                f"{source}: map.distributions: {name!r} is not a distribution; accepted: "
                f"{', '.join(NAMED_DISTRIBUTIONS)}"
            )
    return tuple(dict.fromkeys(value))


def _lowest_scale(case: Case, distributions: Sequence[str]) -> tuple[float, str]:
    """The smallest scale the map may try, and why: the smallest distance, or for
    ``outliers`` the top of the uniform range (the smallest outlier)."""
    params = {**_generated_defaults(), **case.dataset_params}
    low = (float(params["min_distance"]), f"dataset.min_distance = {params['min_distance']:g}")
    if "outliers" in distributions and params["max_distance"] > low[0]:
        low = (
            float(params["max_distance"]),
            f"dataset.max_distance = {params['max_distance']:g} (with outliers, the scale is "
            "the largest outlier, which is at least max_distance)",
        )
    return low


def _generated_defaults() -> dict[str, Any]:
    from stability.data import dataset_parameters

    return dataset_parameters(DATASET)


def _scales(source: str, value: Any, low: tuple[float, str], top: float) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise CaseError(
            f"{source}: map.scales = {value!r} is an empty grid; expected {MAP_KEYS['scales']}"
        )
    for scale in value:
        _check_scale(source, "map.scales", scale, low, top)
    return tuple(sorted({float(s) for s in value}))


def _check_scale(source: str, key: str, scale: Any, low: tuple[float, str], top: float) -> None:
    if not _number(scale):
        raise CaseError(f"{source}: {key}: {scale!r} is not a finite number")
    if scale < low[0]:
        raise CaseError(
            f"{source}: {key}: {scale:g} is below the smallest distance the map can draw, "
            f"{low[1]}; every scale must be >= {low[0]:g}"
        )
    if scale > top:
        raise CaseError(f"{source}: {key}: {scale:g} is above the dtype's largest number {top:g}")


def _bracket(source: str, value: Any, low: tuple[float, str], top: float) -> tuple[float, float]:
    if not (isinstance(value, list) and len(value) == 2 and all(map(_number, value))):
        raise CaseError(f"{source}: map.bracket = {value!r} is not valid; expected [lo, hi]")
    lo, hi = value
    if lo >= hi:
        raise CaseError(
            f"{source}: map.bracket = {value!r} does not bracket: expected [lo, hi] with lo < hi"
        )
    for scale in (lo, hi):
        _check_scale(source, "map.bracket", scale, low, top)
    return float(lo), float(hi)


# --- running ------------------------------------------------------------------------------


class _MapRunner:
    """Trains batches of cells into the map's store, each run once."""

    def __init__(self, m: MapCase, store: RunStore, run: Callable[..., Any]):
        self.map, self.store, self.run = m, store, run
        self.batches = 0

    def train(self, cells: Iterable[Cell], desc: str) -> MapRows:
        """Train every run of ``cells`` not in the store yet; the store's rows after."""
        by_point: dict[tuple[str, float], list[str]] = {}
        for variant, distribution, scale in sorted(set(cells)):
            by_point.setdefault((distribution, scale), []).append(variant)
        configs, datasets = [], []
        for (distribution, scale), variants in by_point.items():
            case = point_case(self.map, distribution, scale, variants)
            for dataset in case_datasets(case):
                datasets.append(dataset)
                configs += [
                    (dataset, variant, config)
                    for variant, config in run_configs(case)
                    if config_key(variant, config, dataset) not in self.store.done
                ]
        if configs:
            self.batches += 1
            self.run(configs, datasets, desc)
        return MapRows(self.map, self.store.rows())


def run_map(
    m: MapCase,
    out_dir: Path,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    workers: int = 1,
    cluster: RayCluster | None = None,
) -> MapRows:
    """Train the map's grid, then its bisections round by round (each round of every
    (variant, distribution) in one batch), into ``out_dir``; returns the rows. ``resume``,
    ``overwrite``, ``workers`` and ``cluster`` as for ``runner.run_case``."""
    can_train_here(m.case.threads)  # pins the layout if TensorFlow has not started yet
    first = point_case(m, m.distributions[0], m.scales[0], m.case.variants)
    build_variants(first, case_datasets(first)[0])  # a bad variant fails before the store
    settings = {"epochs": m.case.epochs, "dtype": m.case.dtype}
    store = RunStore(out_dir, m.name, resume, settings, overwrite)

    def run(configs, datasets, desc):
        execute_runs(configs, datasets, progress, store.add, desc, workers, cluster)

    try:
        runner = _MapRunner(m, store, run)
        rows = runner.train(grid_cells(m), f"{m.name} grid")
        lo, hi = m.bracket
        searches = {
            (v, d): Bisection(lo, hi, m.steps) for v in m.case.variants for d in m.distributions
        }
        round_ = 0
        while any(s.result is None for s in searches.values()):
            round_ += 1
            wanted = {(v, d): s.pending() for (v, d), s in searches.items()}
            cells = [(v, d, scale) for (v, d), scales in wanted.items() for scale in scales]
            rows = runner.train(cells, f"{m.name} bisection {round_}")
            for (v, d), scales in wanted.items():
                for scale in scales:
                    searches[(v, d)].record(scale, rows.fails(v, d, scale))
        return rows
    finally:
        store.finish()  # also when interrupted: the CSVs show every finished run
