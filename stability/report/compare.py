"""Compare a folder of results CSVs against an accepted baseline folder, the way
pytest-benchmark's ``--benchmark-compare-fail`` compares benchmarks.

A variant's verdict (per case, learning rate, batch size and dtype) changes when:

- it stayed finite in every run of the baseline and now hits a NaN, or the other way round;
- its median first-NaN epoch moves by more than ``nan_epoch`` (a fraction of the baseline's);
- its median final MAE gets worse by more than ``mae`` (a fraction of the baseline's);
- it is in the baseline but missing from the new results.

A row whose base and new runs differ in data set (its key, which carries a file's hash),
epochs or seeds is "not comparable", said per row, and never counted as a changed verdict:
a different MAE on different data is no regression.

``python -m stability compare NEW_DIR BASELINE_DIR`` prints the diff table and exits 1 when
a verdict changed, 2 on bad input, 0 otherwise.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.core.errors import StabilityError
from stability.report.summary import settings

#: Exit code when a verdict changed (2 stays "bad input").
EXIT_VERDICT_CHANGED = 1

#: The columns a verdict is kept per.
VERDICT_KEYS = ["case", "variant", "learning_rate", "batch_size", "dtype"]


#: Row settings that must match for base and new to be compared (else "not comparable").
COMPARABLE = ("dataset", "epochs", "seed")


def _values(column: pd.Series) -> str:
    return ", ".join(str(v) for v in sorted(column.unique(), key=str))


@dataclass(frozen=True)
class Tolerances:
    """How far a median may move before the verdict counts as changed, as fractions of the
    baseline's median."""

    nan_epoch: float = 0.15
    mae: float = 0.10


def load_results_dir(folder: Path) -> pd.DataFrame:
    """Every results CSV in ``folder`` (``<case>.csv``, not ``<case>.history.csv``), stacked."""
    from stability.report.writer import read_results

    if not folder.is_dir():
        raise StabilityError(f"{folder}: no such folder of results CSVs")
    paths = sorted(p for p in folder.glob("*.csv") if not p.name.endswith(".history.csv"))
    if not paths:
        raise StabilityError(f"{folder}: no results CSVs (<case>.csv) in the folder")
    return pd.concat([read_results(p) for p in paths], ignore_index=True)


def verdicts(frame: pd.DataFrame) -> pd.DataFrame:
    """Per ``VERDICT_KEYS``: runs, runs with a NaN, median first-NaN epoch, median final MAE."""
    groups = settings(frame, VERDICT_KEYS)
    if not groups:
        return pd.DataFrame(columns=["runs", "nan_runs", "nan_epoch", "mae", *COMPARABLE])
    runs = frame.groupby(VERDICT_KEYS, sort=False)
    return pd.DataFrame(
        {
            "runs": [s.runs for _, s in groups],
            "nan_runs": [s.nan_runs for _, s in groups],
            "nan_epoch": [s.nan_epochs.median() for _, s in groups],
            "mae": [s.final_mae for _, s in groups],
            **{
                column: [_values(runs.get_group(key)[column]) for key, _ in groups]
                for column in COMPARABLE
            },
        },
        index=pd.MultiIndex.from_tuples([key for key, _ in groups], names=VERDICT_KEYS),
    )


def compare_results(
    new: pd.DataFrame, baseline: pd.DataFrame, tolerances: Tolerances = Tolerances()
) -> pd.DataFrame:
    """The diff table: one row per verdict key in either frame, with ``status`` and
    ``changed`` (True when the verdict changed)."""
    joined = (
        verdicts(baseline).add_suffix("_base").join(verdicts(new).add_suffix("_new"), how="outer")
    )
    rows = []
    for key, row in joined.iterrows():
        differs = _differs(row)
        status = f"not comparable: {differs}" if differs else _status(row, tolerances)
        rows.append(
            {
                **dict(zip(VERDICT_KEYS, key, strict=True)),
                "NaN in (base -> new)": f"{_count(row, 'base')} -> {_count(row, 'new')}",
                "first NaN epoch (base -> new)": _pair(row, "nan_epoch", "{:g}"),
                "final MAE (base -> new)": _pair(row, "mae", "{:.3f}"),
                "status": status or "ok",
                "changed": bool(status) and status != "not in baseline" and not differs,
            }
        )
    return pd.DataFrame(rows)


def _differs(row: pd.Series) -> str:
    """What base and new differ in ("data set", "epochs 5 vs 300", ...), or ""."""
    if pd.isna(row["runs_new"]) or pd.isna(row["runs_base"]):
        return ""
    names = {"dataset": "data set", "epochs": "epochs", "seed": "seeds"}
    parts = []
    for column in COMPARABLE:
        base, new = row[f"{column}_base"], row[f"{column}_new"]
        if base != new:
            verb = "differs" if column == "dataset" else "differ"
            parts.append(f"{names[column]} {verb} ({base} vs {new})")
    return "; ".join(parts)


def _status(row: pd.Series, tol: Tolerances) -> str:
    if pd.isna(row["runs_new"]):
        return "missing from new results"
    if pd.isna(row["runs_base"]):
        return "not in baseline"
    base_nan, new_nan = row["nan_runs_base"] > 0, row["nan_runs_new"] > 0
    if base_nan != new_nan:
        return "now hits NaN" if new_nan else "now stays finite"
    problems = []
    moved = _relative_change(row["nan_epoch_base"], row["nan_epoch_new"])
    if abs(moved) > tol.nan_epoch:
        problems.append(f"first NaN epoch moved {moved:+.0%} (tolerance {tol.nan_epoch:.0%})")
    worse = _relative_change(row["mae_base"], row["mae_new"])
    if worse > tol.mae:
        problems.append(f"final MAE worse by {worse:+.0%} (tolerance {tol.mae:.0%})")
    return "; ".join(problems)


def _relative_change(base: float, new: float) -> float:
    """(new - base) / base; 0 when either is missing (nothing to compare)."""
    if pd.isna(base) or pd.isna(new) or base == 0:
        return 0.0
    return (new - base) / base


def _count(row: pd.Series, side: str) -> str:
    runs = row[f"runs_{side}"]
    return "-" if pd.isna(runs) else f"{int(row[f'nan_runs_{side}'])}/{int(runs)}"


def _pair(row: pd.Series, column: str, fmt: str) -> str:
    def one(value: float) -> str:
        return "-" if pd.isna(value) else fmt.format(value)

    return f"{one(row[f'{column}_base'])} -> {one(row[f'{column}_new'])}"


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction >= 0 (e.g. 0.15 for 15%)")
    return value


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """The ``compare`` subcommand's flags."""
    compare = sub.add_parser(
        "compare",
        help="compare results CSVs against a baseline; exit 1 when a verdict changed",
    )
    compare.add_argument("new", type=Path, metavar="NEW_DIR", help="folder of new <case>.csv")
    compare.add_argument(
        "baseline", type=Path, metavar="BASELINE_DIR", help="folder of accepted <case>.csv"
    )
    compare.add_argument(
        "--nan-epoch-tolerance",
        type=_fraction,
        default=Tolerances.nan_epoch,
        metavar="FRACTION",
        help="allowed move of the median first-NaN epoch, as a fraction of the baseline's "
        f"(default: {Tolerances.nan_epoch})",
    )
    compare.add_argument(
        "--mae-tolerance",
        type=_fraction,
        default=Tolerances.mae,
        metavar="FRACTION",
        help="allowed worsening of the median final MAE, as a fraction of the baseline's "
        f"(default: {Tolerances.mae})",
    )
    compare.set_defaults(plugin=[])  # compare reads CSVs only: no variant modules to import


def compare_command(args: argparse.Namespace) -> int:
    """Print the diff table; return 1 if a verdict changed, else 0."""
    new = load_results_dir(args.new)
    baseline = load_results_dir(args.baseline)
    table = compare_results(new, baseline, Tolerances(args.nan_epoch_tolerance, args.mae_tolerance))
    changed = table["changed"]
    print(table.drop(columns="changed").to_markdown(index=False))
    apart = int(table["status"].str.startswith("not comparable").sum())
    if apart:
        print(
            f"\n{apart} row(s) not comparable: base and new ran on different data or settings "
            "(not counted as changed)"
        )
    if changed.any():
        print(f"\n{int(changed.sum())} verdict(s) changed against {args.baseline}")
        return EXIT_VERDICT_CHANGED
    print(f"\nno verdict changed against {args.baseline}")
    return 0
