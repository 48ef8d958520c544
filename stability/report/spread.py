"""The spread that rounding alone causes: a case rerun on other thread layouts, measured.

TensorFlow's kernels shard their sums by the intra-op thread count, so a run retrained on
another count rounds its sums as a run on another CPU would, with everything else (code,
libraries, data, seeds) the same. How far its first-failure epoch and final MAE move is then
the tolerance that a comparison across environments may allow (``stability.report.agreement``):
measured, not guessed. ``python -m stability spread CASE`` trains the reruns and writes
``<case>.spread.csv`` (every run on every layout, one row each) and ``<case>.spread.md``;
``compare`` and the headline test read the CSV from the baseline's folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.core.environment import parse
from stability.core.errors import StabilityError
from stability.report.agreement import FAILURE_FIELDS

#: The columns of ``<case>.spread.csv``: the run, its layout, and what a comparison reads.
SPREAD_FIELDS = (
    "case",
    "variant",
    "seed",
    "dataset",
    "batch_size",
    "learning_rate",
    "threads",
    "first_nan_epoch",
    "first_nan_step",
    *FAILURE_FIELDS,
    "final_mae",
    "environment",
)

#: The columns that name a run across layouts.
RUN = ["case", "variant", "seed", "dataset", "batch_size", "learning_rate"]


def spread_path(folder: Path, case: str) -> Path:
    return Path(folder) / f"{case}.spread.csv"


def stack_layouts(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and layout, from each layout's results frame ({``1x1``: frame})."""
    parts = []
    for threads, frame in frames.items():
        part = frame.copy()
        part["threads"] = threads
        parts.append(part[[c for c in SPREAD_FIELDS if c in part.columns]])
    return pd.concat(parts, ignore_index=True)


@dataclass(frozen=True)
class Spread:
    """What rerunning on other layouts moved, against the reference layout's runs."""

    reference: str
    layouts: tuple[str, ...]
    runs: int
    failed: int
    #: The largest |epoch move| / reference epoch, over failed runs and layouts (0 if none).
    epoch: float
    #: The largest move in epochs.
    epoch_moves: float
    #: How many reruns moved their first-failure epoch at all.
    moved: int
    #: The largest |final MAE move| / reference MAE over runs finite on both layouts.
    mae: float
    #: Reruns whose verdict (failed or not) differs from the reference's.
    verdict_flips: int
    #: Reruns whose failing stage, kind, cause or op differs from the reference's.
    how_changes: int

    @property
    def epoch_tolerance(self) -> float:
        """The tolerance a comparison across environments allows the first-failure epoch."""
        return self.epoch


def measure(frame: pd.DataFrame) -> Spread:
    """The spread of a ``<case>.spread.csv`` frame; its first layout is the reference."""
    layouts = tuple(dict.fromkeys(frame["threads"].astype(str)))
    if len(layouts) < 2:
        raise StabilityError(
            f"a spread needs runs on at least two thread layouts; the rows have {layouts}"
        )
    reference = layouts[0]
    keyed = frame.assign(threads=frame["threads"].astype(str)).set_index(RUN)
    base = keyed[keyed["threads"] == reference]
    epoch = epoch_moves = mae = 0.0
    moved = flips = how = 0
    for layout in layouts[1:]:
        other = keyed[keyed["threads"] == layout]
        joined = base.join(other, rsuffix="_other", how="inner")
        for _, row in joined.iterrows():
            e0, e1 = _num(row["first_nan_epoch"]), _num(row["first_nan_epoch_other"])
            if math.isnan(e0) != math.isnan(e1):
                flips += 1
                continue
            if not math.isnan(e0):
                move = abs(e1 - e0)
                moved += move > 0
                epoch, epoch_moves = max(epoch, move / e0), max(epoch_moves, move)
                how += any(
                    _text(row[name]) != _text(row[f"{name}_other"]) for name in FAILURE_FIELDS
                )
            m0, m1 = _num(row["final_mae"]), _num(row["final_mae_other"])
            if not (math.isnan(m0) or math.isnan(m1)) and m0 > 0:
                mae = max(mae, abs(m1 - m0) / m0)
    failed = int(base["first_nan_epoch"].notna().sum())
    return Spread(reference, layouts, len(base), failed, epoch, epoch_moves, moved, mae, flips, how)


def read_spread(folder: Path, case: str) -> Spread | None:
    """The measured spread of ``case`` beside its baseline in ``folder``, or None."""
    path = spread_path(folder, case)
    if not path.exists():
        return None
    try:
        frame = pd.read_csv(path, dtype={"threads": str})
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise StabilityError(f"{path}: not a spread CSV ({exc})") from None
    missing = [c for c in ("threads", *RUN, "first_nan_epoch", "final_mae") if c not in frame]
    if missing:
        raise StabilityError(f"{path}: not a spread CSV, it lacks {', '.join(missing)}")
    return measure(frame)


def spread_markdown(case: str, frame: pd.DataFrame, spread: Spread) -> str:
    """``<case>.spread.md``: what rerunning on other layouts moved, from the rows."""
    envs = sorted({parse(e).get("cpu", "") for e in frame["environment"].dropna()} - {""})
    others = ", ".join(spread.layouts[1:])
    lines = [
        f"# Rounding spread: {case}",
        "",
        f"Every run of `{case}` on the reference thread layout {spread.reference} "
        f"(intra x inter-op threads), rerun on {others}: {spread.runs} run(s), "
        f"{spread.failed} of which failed on the reference layout.",
        "",
    ]
    if envs:
        lines += [f"CPU: {'; '.join(envs)}.", ""]
    if spread.failed:
        lines.append(
            f"- First-failure epoch: {spread.moved} rerun(s) moved it; the largest move is "
            f"{spread.epoch_moves:g} epoch(s), {_share(spread.epoch)} of the reference epoch. "
            f"That fraction is the epoch tolerance of a comparison across environments."
        )
        lines.append(
            f"- How the runs failed (stage, kind, cause, op): {spread.how_changes} rerun(s) "
            "of a failed run changed it."
        )
    lines.append(
        f"- Verdicts: {spread.verdict_flips} rerun(s) failed where the reference stayed "
        "finite, or the other way round."
    )
    lines.append(
        f"- Final MAE: the largest move is {_share(spread.mae)} of the reference's, over runs "
        "finite on both layouts."
    )
    index = ["variant", "seed", "batch_size", "learning_rate"]
    table = (
        frame.assign(threads=frame["threads"].astype(str))
        .groupby([*index, "threads"], sort=False)["first_nan_epoch"]
        .first()
        .unstack("threads")
    )
    table = table[[t for t in spread.layouts if t in table.columns]]
    if not table.empty:
        lines += ["", "First-failure epoch per run and layout (empty: finite):", ""]
        shown = table.map(lambda v: "" if pd.isna(v) else f"{v:g}")
        lines.append(shown.reset_index().to_markdown(index=False))
    return "\n".join(lines) + "\n"


def _share(fraction: float) -> str:
    """A fraction as a percentage that a tiny one does not round to 0.00%."""
    if fraction == 0:
        return "0%"
    return f"{fraction:.2%}" if fraction >= 1e-3 else f"{fraction * 100:.2g}%"


def _num(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
