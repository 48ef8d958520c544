"""The spread that rounding alone causes: a case rerun on other thread layouts, measured.

TensorFlow's kernels shard their sums by the intra-op thread count, so a run retrained on
another count rounds its sums as a run on another CPU would, with everything else (code,
libraries, data, seeds) the same. How far its first-failure epoch and final MAE move is then
the tolerance that a comparison across environments may allow (``stability.report.agreement``):
measured, not guessed. ``python -m stability spread CASE`` trains the reruns and writes
``<case>.spread.csv`` (every run on every layout, one row each) and ``<case>.spread.md``;
``compare`` and the headline test read the CSV from the baseline's folder.

Thread layouts are not the whole of it: another CPU picks other kernels (vector width, cache
blocking), and on some CPUs the thread count moves nothing at all. So a spread also takes the
rows of the case trained on other CPUs (``--other``, ``carried_layouts``), each of their
layouts one more layout of the spread, named ``<threads> on <cpu>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.core.environment import parse, short_cpu
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


def cpu_name(environment: str) -> str:
    """A CPU's short name from a row's environment (``environment.short_cpu``)."""
    return short_cpu(parse(environment).get("cpu", ""))


def read_rows(path: Path) -> pd.DataFrame:
    """A results or spread CSV's rows, for ``other_cpu_layouts``; one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise StabilityError(f"{path}: no such results or spread CSV")
    try:
        return pd.read_csv(path, dtype={"threads": str}, float_precision="round_trip")
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise StabilityError(f"{path}: not a results or spread CSV ({exc})") from None


def carried_layouts(
    frame: pd.DataFrame, here: str, runs: pd.DataFrame, source: str
) -> dict[str, pd.DataFrame]:
    """The layouts of ``frame``'s rows (a results or spread CSV, ``source``), as {name: rows},
    for the runs in ``runs`` (the reference's). A layout of the spread's own CPU (``here``,
    the ``cpu`` of the reference rows' environment) is named by its threads (``2x1``), one of
    another CPU by both (``1x1 on AMD EPYC 25/1/1``): rows trained elsewhere carried into the
    spread."""
    missing = [c for c in (*RUN, "environment") if c not in frame]
    if missing:
        lacks = ", ".join(missing)
        raise StabilityError(f"{source}: not a results or spread CSV, it lacks {lacks}")
    facts = frame["environment"].fillna("").map(parse)
    cpus = facts.map(lambda f: f.get("cpu", ""))
    threads = facts.map(lambda f: f.get("threads", ""))
    if (cpus == "").any() or (threads == "").any():
        raise StabilityError(
            f"{source}: every row must record its CPU and threads in its environment column"
        )
    kept = frame.assign(_cpu=cpus, _threads=threads).merge(runs[RUN].drop_duplicates(), on=RUN)
    if kept.empty:
        raise StabilityError(
            f"{source}: none of its rows is a run of the reference's (by {', '.join(RUN)})"
        )
    layouts: dict[str, pd.DataFrame] = {}
    groups = kept.groupby(["_cpu", "_threads"], sort=True)
    # This CPU's layouts first, then each other CPU's: the same order however often the
    # spread is rewritten from its own CSV.
    for (cpu, layout), rows in sorted(groups, key=lambda group: group[0][0] != here):
        name = layout if cpu == here else f"{layout} on {cpu_name(rows['environment'].iloc[0])}"
        # Two CPUs of one model that differ in flags or caches keep apart by their whole line.
        layouts[f"{layout} on {cpu}" if name in layouts else name] = rows.drop(
            columns=["_cpu", "_threads"]
        )
    return layouts


def stack_layouts(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run and layout, from each layout's results frame ({``1x1``: frame})."""
    parts = []
    for threads, frame in frames.items():
        part = frame.copy()
        part["threads"] = threads
        parts.append(part[[c for c in SPREAD_FIELDS if c in part.columns]])
    return pd.concat(parts, ignore_index=True)


@dataclass(frozen=True)
class Moves:
    """What rerunning moved, over a set of runs (a variant's, or all of them)."""

    runs: int = 0
    failed: int = 0
    #: The largest |epoch move| / reference epoch over failed runs and layouts (0 if none).
    epoch: float = 0.0
    #: The largest move in epochs.
    epoch_moves: float = 0.0
    #: How many reruns moved their first-failure epoch at all.
    moved: int = 0
    #: The largest |final MAE move| / reference MAE over runs finite on both layouts.
    mae: float = 0.0
    #: Reruns whose verdict (failed or not) differs from the reference's.
    verdict_flips: int = 0
    #: Reruns whose failing stage, kind, cause or op differs from the reference's.
    how_changes: int = 0
    #: Which of those columns rounding changed (they do not hold across environments).
    unstable: tuple[str, ...] = ()
    #: Pairs of runs finite on both layouts, whose MAEs ``mae`` compares (0: not measured).
    mae_pairs: int = 0


@dataclass(frozen=True)
class Spread:
    """What rerunning on other layouts moved, against the reference layout's runs: over
    every run (``overall``) and per variant (``by_variant``)."""

    reference: str
    layouts: tuple[str, ...]
    overall: Moves
    by_variant: dict[str, Moves]

    def epoch_tolerance(self, variant: str | None = None) -> float:
        """The tolerance a comparison across environments allows a run's first-failure
        epoch: the spread measured on ``variant``'s runs, or on every run for a variant
        that was not measured (the widest measured, so never narrower than known)."""
        return self._moves(variant).epoch

    def mae_tolerance(self, variant: str | None = None) -> float | None:
        """The measured final-MAE spread, or None where no run stayed finite on two layouts."""
        moves = self._moves(variant)
        return moves.mae if moves.mae_pairs else None

    def unstable_fields(self, variant: str | None = None) -> tuple[str, ...]:
        """The columns of how a run failed that rounding changed on ``variant``'s runs
        (every variant's for one not measured): a comparison across environments skips them."""
        return self._moves(variant).unstable

    def _moves(self, variant: str | None) -> Moves:
        return self.by_variant.get(variant, self.overall) if variant else self.overall


def measure(frame: pd.DataFrame) -> Spread:
    """The spread of a ``<case>.spread.csv`` frame; its first layout is the reference."""
    layouts = tuple(dict.fromkeys(frame["threads"].astype(str)))
    if len(layouts) < 2:
        raise StabilityError(
            f"a spread needs runs on at least two thread layouts; the rows have {layouts}"
        )
    keyed = frame.assign(threads=frame["threads"].astype(str))
    by_variant = {
        variant: _moves(rows, layouts) for variant, rows in keyed.groupby("variant", sort=True)
    }
    return Spread(layouts[0], layouts, _moves(keyed, layouts), by_variant)


def _moves(keyed: pd.DataFrame, layouts: tuple[str, ...]) -> Moves:
    base = keyed[keyed["threads"] == layouts[0]]
    epoch = epoch_moves = mae = 0.0
    moved = flips = how = pairs = 0
    unstable: set[str] = set()
    for layout in layouts[1:]:
        other = keyed[keyed["threads"] == layout]
        joined = base.merge(other, on=RUN, suffixes=("", "_other"))
        for _, row in joined.iterrows():
            e0, e1 = _num(row["first_nan_epoch"]), _num(row["first_nan_epoch_other"])
            if math.isnan(e0) != math.isnan(e1):
                flips += 1
                continue
            if not math.isnan(e0):
                move = abs(e1 - e0)
                moved += move > 0
                epoch, epoch_moves = max(epoch, move / e0), max(epoch_moves, move)
                changed = {
                    name
                    for name in FAILURE_FIELDS
                    if _text(row[name]) != _text(row[f"{name}_other"])
                }
                how += bool(changed)
                unstable |= changed
            m0, m1 = _num(row["final_mae"]), _num(row["final_mae_other"])
            if not (math.isnan(m0) or math.isnan(m1)) and m0 > 0:
                mae, pairs = max(mae, abs(m1 - m0) / m0), pairs + 1
    failed = int(base["first_nan_epoch"].notna().sum())
    ordered = tuple(name for name in FAILURE_FIELDS if name in unstable)
    return Moves(len(base), failed, epoch, epoch_moves, moved, mae, flips, how, ordered, pairs)


def read_spread(folder: Path, case: str) -> Spread | None:
    """The measured spread of ``case`` beside its baseline in ``folder``, or None."""
    path = spread_path(folder, case)
    if not path.exists():
        return None
    try:
        frame = pd.read_csv(path, dtype={"threads": str}, float_precision="round_trip")
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise StabilityError(f"{path}: not a spread CSV ({exc})") from None
    missing = [c for c in ("threads", *RUN, "first_nan_epoch", "final_mae") if c not in frame]
    if missing:
        raise StabilityError(f"{path}: not a spread CSV, it lacks {', '.join(missing)}")
    return measure(frame)


def spread_markdown(case: str, frame: pd.DataFrame, spread: Spread) -> str:
    """``<case>.spread.md``: what rerunning on other layouts moved, from the rows."""
    moves = spread.overall
    layouts = frame.assign(threads=frame["threads"].astype(str))
    cpus = {
        layout: cpu_name(rows["environment"].dropna().iloc[0])
        for layout, rows in layouts.groupby("threads", sort=False)
        if rows["environment"].notna().any()
    }
    here = cpus.get(spread.reference, "")
    others = ", ".join(spread.layouts[1:])
    lines = [
        f"# Rounding spread: {case}",
        "",
        f"Every run of `{case}` on the reference thread layout {spread.reference} "
        f"(intra x inter-op threads), rerun on {others}: {moves.runs} run(s), "
        f"{moves.failed} of which failed on the reference layout.",
        "",
    ]
    if here:
        elsewhere = sorted(set(cpus.values()) - {here})
        lines += [
            f"The reference's CPU: {here}"
            + (f"; the other CPUs: {', '.join(elsewhere)}." if elsewhere else "."),
            "",
        ]
    if moves.failed:
        lines.append(
            f"- First-failure epoch: {moves.moved} rerun(s) moved it; the largest move is "
            f"{moves.epoch_moves:g} epoch(s), {_share(moves.epoch)} of the reference epoch. "
            "Per variant below; a variant's largest fraction is its epoch tolerance in a "
            "comparison across environments, the largest of all for a variant not measured."
        )
        lines.append(
            f"- How the runs failed (stage, kind, cause, op): {moves.how_changes} rerun(s) "
            "of a failed run changed it"
            + (
                f" ({', '.join(moves.unstable)}); a comparison across environments does not "
                "compare those columns for the variants whose reruns changed them."
                if moves.unstable
                else "."
            )
        )
    lines.append(
        f"- Verdicts: {moves.verdict_flips} rerun(s) failed where the reference stayed "
        "finite, or the other way round."
    )
    if moves.mae_pairs:
        lines.append(
            f"- Final MAE: the largest move is {_share(moves.mae)} of the reference's, over "
            f"{moves.mae_pairs} pair(s) of runs finite on both layouts."
        )
    per_variant = pd.DataFrame(
        [
            {
                "variant": variant,
                "runs": m.runs,
                "failed": m.failed,
                "reruns moved": m.moved,
                "largest move (epochs)": f"{m.epoch_moves:g}",
                "epoch tolerance": _share(m.epoch),
                "how changed": m.how_changes,
                "columns it changed": ", ".join(m.unstable) or "-",
                "verdict flips": m.verdict_flips,
                "largest MAE move": _share(m.mae) if m.mae_pairs else "-",
            }
            for variant, m in spread.by_variant.items()
        ]
    )
    lines += ["", "Per variant:", "", per_variant.to_markdown(index=False)]
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
