"""The report of a robustness map (``stability.explore.map``): ``<map>.md`` and two heatmaps.

- ``<map>.md``: the boundary of every variant x distribution (replayed from the rows by
  the map's own bisection rule), the run counts of the grid and of the bisections, and a
  table of every grid cell. Every sentence is computed from the rows.
- ``<map>.failure_rate.png`` and ``<map>.mae.png``: one panel per variant, distributions
  down, scales across.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display: works headless and in CI

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm, Normalize

from stability.core.failures import NO_FAILURE, failure_cause, is_silent
from stability.core.files import atomic_write_text, atomic_writer
from stability.explore.bisection import FAILS_AT_LOW, FAILS_FROM, NEVER_FAILS, Boundary
from stability.explore.map import MapCase, MapRows, boundaries, grid_cells

#: The heatmaps: file suffix -> (CellStats attribute, title, colour map, value range).
HEATMAPS = {
    "failure_rate": ("rate", "failure rate (failed runs / runs)", "Reds", (0.0, 1.0)),
    "mae": ("mae", "median final MAE (log colour scale)", "viridis", None),
}

Row = Mapping[str, object]


def _number(value: object) -> float:
    """A CSV cell as a float; NaN when empty."""
    if value is None or value == "":
        return math.nan
    return float(value)


class CellStats:
    """What one grid cell's runs came to."""

    def __init__(self, rows: Sequence[Row]):
        causes = [failure_cause(row) for row in rows]
        failures = [(row, c) for row, c in zip(rows, causes, strict=True) if c != NO_FAILURE]
        self.runs = len(rows)
        self.failed = len(failures)
        self.silent = sum(is_silent(c) for _, c in failures)
        self.nan = self.failed - self.silent
        self.rate = self.failed / self.runs if self.runs else math.nan
        epochs = [_number(r["first_nan_epoch"]) for r, _ in failures]
        epochs = [e for e in epochs if not math.isnan(e)]
        self.epoch = statistics.median(epochs) if epochs else math.nan
        maes = [m for m in (_number(r["final_mae"]) for r in rows) if not math.isnan(m)]
        self.mae = statistics.median(maes) if maes else math.nan
        # Ties go to the name first in sorted order, so the cell reads the same every time.
        counts = Counter(c for _, c in failures)
        self.cause = min(counts, key=lambda c: (-counts[c], c)) if counts else "-"
        self.cause_count = counts[self.cause] if counts else 0


def cell_stats(m: MapCase, rows: MapRows) -> dict[tuple[str, str, float], CellStats]:
    return {cell: CellStats(rows.cell(*cell)) for cell in grid_cells(m)}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _g(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}g}"


def _settings(m: MapCase) -> list[str]:
    case = m.case
    base = [f"{k}={v!r}" for k, v in case.dataset_params.items() if k != "distribution"]
    lines = [
        "| setting | value |",
        "| --- | --- |",
        f"| variants | {', '.join(case.variants)} |",
        f"| distributions | {', '.join(m.distributions)} |",
        f"| scales (grid) | {', '.join(f'{s:g}' for s in m.scales)} |",
        f"| data sets per cell (K) | {case.num_datasets} |",
        f"| seeds | {', '.join(map(str, case.seeds))} |",
        f"| epochs (budget) | {case.epochs} |",
        f"| batch size, learning rate | {case.batch_sizes[0]}, {case.learning_rates[0]:g} |",
        f"| dtype | {case.dtype} |",
        f"| bisection bracket, rounds | [{m.bracket[0]:g}, {m.bracket[1]:g}], {m.steps} |",
        f"| a cell fails at | >= {m.fail_fraction:g} of its runs failed |",
        f"| other `generated` settings | {', '.join(base) or '-'} |",
    ]
    return lines


def _rule(m: MapCase) -> str:
    lo, hi = m.bracket
    return (
        f"A cell fails when at least {m.fail_fraction:g} of its {m.runs_per_cell} runs "
        f"({_count(m.case.num_datasets, 'data set')} x {_count(len(m.case.seeds), 'seed')}) "
        "failed within "
        f"{m.case.epochs} epochs, silent failures included. Each boundary is a bisection over "
        f"the scale in log space: both ends of [{lo:g}, {hi:g}] first, then up to {m.steps} "
        "geometric midpoints (3 significant digits), keeping the half that goes from passing "
        'to failing. "fails from X [lo-hi]": fails at X, the smallest scale seen failing, '
        "and passes at lo."
    )


def _boundary_table(m: MapCase, found: dict[tuple[str, str], Boundary]) -> list[str]:
    lines = [
        "| variant | " + " | ".join(m.distributions) + " |",
        "| --- | " + " | ".join("---" for _ in m.distributions) + " |",
    ]
    for v in m.case.variants:
        lines.append(
            f"| {v} | " + " | ".join(found[(v, d)].words() for d in m.distributions) + " |"
        )
    return lines


def _boundary_sentences(m: MapCase, found: dict[tuple[str, str], Boundary]) -> list[str]:
    """One sentence per variant: on how many distributions it fails, and where first."""
    sentences = []
    for v in m.case.variants:
        failing = [(d, found[(v, d)]) for d in m.distributions if found[(v, d)].kind != NEVER_FAILS]
        if not failing:
            sentences.append(
                f"- `{v}` does not fail on any of the {len(m.distributions)} distributions up "
                f"to scale {m.bracket[1]:g}."
            )
            continue
        first = min(failing, key=lambda item: (_first_failing(item[1]), item[0]))
        sentences.append(
            f"- `{v}` fails on {len(failing)} of {len(m.distributions)} distributions; "
            f"earliest on {first[0]}: {first[1].words()}."
        )
    return sentences


def _first_failing(boundary: Boundary) -> float:
    return boundary.lo if boundary.kind == FAILS_AT_LOW else boundary.hi


def _run_counts(m: MapCase, found: dict[tuple[str, str], Boundary]) -> list[str]:
    per = m.runs_per_cell
    points = sum(len(b.points) for b in found.values())
    off_grid = sum(s not in m.scales for b in found.values() for s in b.points)
    lines = [
        f"The grid took {m.grid_runs} runs ({len(m.case.variants)} variants x "
        f"{len(m.distributions)} distributions x {len(m.scales)} scales x {per} runs per cell). "
        f"The bisections evaluated {points} points, {points * per} runs, of which "
        f"{off_grid * per} were not on the grid (the others are the grid's runs, reused).",
    ]
    bracketed = [b for b in found.values() if b.kind == FAILS_FROM]
    if bracketed:
        ratio = min(b.hi / b.lo for b in bracketed)
        lo, hi = m.bracket
        per_search = math.ceil(math.log(hi / lo) / math.log(ratio) - 1e-9) + 1
        lines.append(
            f"A log-spaced grid as fine as the narrowest final bracket ({ratio:.3g}x between "
            f"neighbours) over [{lo:g}, {hi:g}] would need {per_search} scales, "
            f"{per_search * per * len(found)} runs for the same {len(found)} "
            "variant x distribution pairs."
        )
    return lines


def _contradicts(boundary: Boundary, scale: float, fails: bool) -> bool:
    """Whether a cell at ``scale`` that ``fails`` (or not) sits on the wrong side of
    ``boundary`` for a single crossing from passing to failing."""
    if boundary.kind == FAILS_FROM:
        return (scale >= boundary.hi and not fails) or (scale <= boundary.lo and fails)
    if boundary.kind == NEVER_FAILS:
        return scale <= boundary.hi and fails
    return scale >= boundary.lo and not fails


def _contradictions(m: MapCase, rows: MapRows, found: dict[tuple[str, str], Boundary]) -> str:
    """Grid cells on the wrong side of their boundary: the bisection assumes one crossing."""
    wrong = []
    for (v, d), boundary in found.items():
        for s in m.scales:
            fails = rows.fails(v, d, s)
            if _contradicts(boundary, s, fails):
                wrong.append(f"{v} on {d} at {s:g} ({'fails' if fails else 'passes'})")
    if not wrong:
        return (
            "Every grid cell lies on the side of its boundary that the boundary predicts "
            "(one crossing from passing to failing, as the bisection assumes)."
        )
    return (
        f"{len(wrong)} grid cell(s) lie on the other side of their boundary than one crossing "
        f"would put them, so failure is not monotone in the scale there: {'; '.join(wrong)}."
    )


def _cell_table(m: MapCase, stats: dict) -> list[str]:
    lines = [
        "| variant | distribution | scale | runs | failed: NaN / silent | failure rate | "
        "first failure epoch, median | final MAE, median | most common cause |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for (v, d, s), c in stats.items():
        cause = f"{c.cause} ({c.cause_count}/{c.failed})" if c.failed else "-"
        lines.append(
            f"| {v} | {d} | {s:g} | {c.runs} | {c.nan} / {c.silent} | {_g(c.rate, 2)} | "
            f"{_g(c.epoch)} | {_g(c.mae)} | {cause} |"
        )
    return lines


def map_markdown(m: MapCase, rows: MapRows, description: str = "") -> str:
    """The markdown of the map ``m`` from its ``rows``."""
    found = boundaries(m, rows)
    stats = cell_stats(m, rows)
    failed = sum(c.failed for c in stats.values())
    silent = sum(c.silent for c in stats.values())
    runs = sum(c.runs for c in stats.values())
    parts = [
        f"# Map `{m.name}`",
        description.strip(),
        f"Generated by `stability map` from `{m.name}.csv` (one row per training run).",
        "## Settings",
        "\n".join(_settings(m)),
        "**Scale** is the largest distance a draw can have: `max_distance` (and the unused "
        "`max_outlier`) for uniform, log_uniform and the clustered spreads, whose distances "
        "lie in [`min_distance`, scale]; `max_outlier` for outliers, whose distances lie in "
        "[`min_distance`, `max_distance`] apart from the rare outliers up to the scale.",
        "## Boundaries",
        _rule(m),
        "\n".join(_boundary_table(m, found)),
        "\n".join(_boundary_sentences(m, found)),
        "## Runs",
        "\n".join(_run_counts(m, found)),
        "## Grid",
        f"On the grid, {failed} of {runs} runs failed: {failed - silent} with a non-finite "
        f"value (NaN in the table), {silent} silently (attention weights not summing to 1, "
        "or a non-finite gradient the transform masked).",
        _contradictions(m, rows, found),
        f"![failure rate over the grid]({m.name}.failure_rate.png)",
        f"![median final MAE over the grid]({m.name}.mae.png)",
        "\n".join(_cell_table(m, stats)),
        "## How to read this",
        "- **failed: NaN / silent**: runs whose step produced a non-finite value, and runs that "
        "failed without one (`failure_kind` normalization or masked_gradient).\n"
        "- **first failure epoch**: the epoch (from 1) of the first failure, median over the "
        "cell's failed runs.\n"
        "- **final MAE**: validation MAE at the run's end, median over the runs that have one.\n"
        "- **most common cause**: the failure cause most of the cell's failed runs share "
        "(ties: the first by name), with its count.\n"
        "- docs/map.md explains the map, its bisection rule and its cost.",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def write_heatmaps(m: MapCase, rows: MapRows, out_dir: Path) -> list[Path]:
    """``<map>.failure_rate.png`` and ``<map>.mae.png`` into ``out_dir``."""
    stats = cell_stats(m, rows)
    paths = []
    for suffix, (attribute, title, cmap, limits) in HEATMAPS.items():
        variants = m.case.variants
        fig, axes = plt.subplots(
            1,
            len(variants),
            figsize=(2.4 + 0.6 * len(m.scales) * len(variants), 1.4 + 0.45 * len(m.distributions)),
            dpi=110,
            squeeze=False,
            sharey=True,
            layout="constrained",
        )
        values = np.array(
            [
                [[getattr(stats[(v, d, s)], attribute) for s in m.scales] for d in m.distributions]
                for v in variants
            ]
        )  # [variants, distributions, scales]
        finite = values[np.isfinite(values)]
        vmin, vmax = limits or ((finite.min(), finite.max()) if finite.size else (0.0, 1.0))
        # MAE spans orders of magnitude between a model that learns and one whose logits
        # saturate: a log colour scale keeps both readable.
        log = limits is None and vmin > 0 and vmax > vmin
        norm = LogNorm(vmin, vmax) if log else Normalize(vmin, vmax)
        for ax, variant, grid in zip(axes[0], variants, values, strict=True):
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm)
            ax.set_title(variant, fontsize=9)
            ax.set_xticks(range(len(m.scales)), [f"{s:g}" for s in m.scales], fontsize=7)
            ax.set_yticks(range(len(m.distributions)), m.distributions, fontsize=7)
            ax.set_xlabel("scale (largest distance)", fontsize=8)
            middle = float(norm.inverse(0.5))
            for (i, j), value in np.ndenumerate(grid):
                # light text on the dark end of the colour map, dark on the light end
                dark = value > middle if cmap == "Reds" else value < middle
                color = "white" if np.isfinite(value) and dark else "black"
                ax.text(j, i, _g(value, 2), ha="center", va="center", fontsize=6, color=color)
        fig.colorbar(image, ax=list(axes[0]), shrink=0.8)
        # sharey: only the first panel names the distributions
        fig.suptitle(f"{m.name}: {title}", fontsize=10)
        path = out_dir / f"{m.name}.{suffix}.png"
        with atomic_writer(path, "wb") as handle:  # a reader never sees half a PNG
            fig.savefig(handle, format="png")
        plt.close(fig)
        paths.append(path)
    return paths


def write_map_report(m: MapCase, rows: MapRows, out_dir: Path, description: str = "") -> Path:
    """Write ``<map>.md`` and its heatmaps into ``out_dir``; return the markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = map_markdown(m, rows, description)  # first: missing rows fail before any file
    write_heatmaps(m, rows, out_dir)
    path = out_dir / f"{m.name}.md"
    atomic_write_text(path, text)
    return path


def read_map_rows(m: MapCase, csv_path: Path) -> MapRows:
    """The rows of ``<map>.csv`` (as text, the way the store spells them)."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    return MapRows(m, frame.to_dict("records"))
