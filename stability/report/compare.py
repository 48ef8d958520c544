"""Compare a folder of results CSVs against an accepted baseline folder, the way
pytest-benchmark's ``--benchmark-compare-fail`` compares benchmarks.

Each variant's runs (per case, learning rate, batch size and dtype) are compared run by run
(``stability.report.agreement``), and the table says which comparison it made and why:

- **exact**, where base and new rows were made in one environment (the same libraries,
  thread layout and CPU, the rows' ``environment`` column): the rows must be identical,
  timing aside. Any difference is a change: the same run in the same environment gives the
  same row.
- **across environments** elsewhere: what rounding cannot move. A variant's verdict changes
  when a run that stayed finite now fails or the other way round, when a failed run's
  stage, kind, cause or op changes, or when its first-failure epoch moves by more than the
  rounding spread measured for the case (``<case>.spread.csv`` beside the baseline,
  ``stability.report.spread``; ``nan_epoch`` where none was measured), and, where a MAE
  tolerance is given or measured, when its final MAE worsens by more.

A variant in the baseline but missing from the new results is a change too. A row whose
base and new runs differ in data set (its key, which carries a file's hash and Hypothesis'
version), epochs or seeds is "not comparable", said per row, and never counted as a changed
verdict: a different MAE on different data is no regression.

``python -m stability compare NEW_DIR BASELINE_DIR`` prints the diff table and exits 1 when
a verdict changed (or, with ``--all-comparable``, when a row is not comparable), 2 on bad
input, 0 otherwise.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.core.errors import StabilityError
from stability.report.agreement import ACROSS, EXACT, compare_rows, kind_of
from stability.report.spread import Spread, read_spread
from stability.report.summary import settings

#: Exit code when a verdict changed (2 stays "bad input").
EXIT_VERDICT_CHANGED = 1

#: The columns a verdict is kept per.
VERDICT_KEYS = ["case", "variant", "learning_rate", "batch_size", "dtype"]


#: Row settings that must match for base and new to be compared (else "not comparable").
COMPARABLE = ("dataset", "epochs", "seed")


def _values(column: pd.Series) -> str:
    return ", ".join(str(v) for v in sorted(column.unique(), key=str))


#: The columns that pair a new run with its base run within one verdict key.
PAIR_KEYS = ["seed", "dataset"]


@dataclass(frozen=True)
class Tolerances:
    """What a comparison across environments allows, as fractions of the baseline's value:
    ``nan_epoch`` for a run's first-failure epoch where the case's rounding spread was not
    measured; ``mae`` for its final MAE (None: the MAE is compared only where its spread
    was measured). Rows of one environment are compared exactly, whatever these say."""

    nan_epoch: float = 0.15
    mae: float | None = None


def load_results_dir(folder: Path) -> pd.DataFrame:
    """Every results CSV in ``folder``, stacked: each ``<case>.csv``, not the reports that
    sit beside them (``<case>.history.csv``, ``.spread.csv``, ``.doctor.csv``,
    ``.check.csv``: a name with a kind before ``.csv``), nor a CSV of another report
    (``zoo.csv``), which does not start with a results row's run columns."""
    from stability.report.writer import read_results

    if not folder.is_dir():
        raise StabilityError(f"{folder}: no such folder of results CSVs")
    paths = sorted(p for p in folder.glob("*.csv") if "." not in p.stem and _names_runs(p))
    if not paths:
        raise StabilityError(f"{folder}: no results CSVs (<case>.csv) in the folder")
    return pd.concat([read_results(p) for p in paths], ignore_index=True)


def _names_runs(path: Path) -> bool:
    """Whether the CSV at ``path`` has a results row's first columns (``case``, ``variant``):
    a damaged results CSV still does, and is then refused by ``read_results``."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            header = handle.readline().strip().split(",")
    except OSError:
        return True  # read_results says what is wrong with it
    return header[:2] == ["case", "variant"]


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
    new: pd.DataFrame,
    baseline: pd.DataFrame,
    tolerances: Tolerances = Tolerances(),
    spreads: dict[str, Spread | None] | None = None,
) -> pd.DataFrame:
    """The diff table: one row per verdict key in either frame, with ``comparison`` (exact
    or across environments, and why), ``status`` and ``changed`` (True when the verdict
    changed). ``spreads`` holds each case's measured rounding spread, if any."""
    spreads = spreads or {}
    joined = (
        verdicts(baseline).add_suffix("_base").join(verdicts(new).add_suffix("_new"), how="outer")
    )
    base_groups = dict(list(baseline.groupby(VERDICT_KEYS, sort=False)))
    new_groups = dict(list(new.groupby(VERDICT_KEYS, sort=False)))
    rows = []
    for key, row in joined.iterrows():
        differs = _differs(row)
        kind, why = _comparison(new_groups.get(key), base_groups.get(key))
        if differs:
            status = f"not comparable: {differs}"
        else:
            spread = spreads.get(key[0])
            status = _status(row, new_groups.get(key), base_groups.get(key), tolerances, spread)
        rows.append(
            {
                **dict(zip(VERDICT_KEYS, key, strict=True)),
                "NaN in (base -> new)": f"{_count(row, 'base')} -> {_count(row, 'new')}",
                "first NaN epoch (base -> new)": _pair(row, "nan_epoch", "{:g}"),
                "final MAE (base -> new)": _pair(row, "mae", "{:.3f}"),
                "comparison": kind,
                "status": status or "ok",
                "changed": bool(status) and status != "not in baseline" and not differs,
                "why": why,
            }
        )
    return pd.DataFrame(rows)


def _comparison(new: pd.DataFrame | None, base: pd.DataFrame | None) -> tuple[str, str]:
    """(exact or across environments, why) for a verdict key's new and base rows."""
    if new is None or base is None:
        return "-", "only on one side"
    envs = {_env(v) for v in new.get("environment", pd.Series([""]))}
    envs |= {_env(v) for v in base.get("environment", pd.Series([""]))}
    if len(envs) == 1:
        (env,) = envs
        return kind_of(env, env)
    new_env = _env(new["environment"].iloc[0]) if "environment" in new else ""
    base_env = _env(base["environment"].iloc[0]) if "environment" in base else ""
    return (
        kind_of(new_env, base_env)
        if new_env != base_env
        else (ACROSS, "rows of several environments")
    )


def _env(value: object) -> str:
    return "" if pd.isna(value) else str(value)


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


def _status(
    row: pd.Series,
    new: pd.DataFrame | None,
    base: pd.DataFrame | None,
    tol: Tolerances,
    spread: Spread | None,
) -> str:
    if new is None:
        return "missing from new results"
    if base is None:
        return "not in baseline"
    base_nan, new_nan = row["nan_runs_base"] > 0, row["nan_runs_new"] > 0
    if base_nan != new_nan:
        return "now hits NaN" if new_nan else "now stays finite"
    variant = new["variant"].iloc[0]
    epoch_tol = spread.epoch_tolerance(variant) if spread is not None else tol.nan_epoch
    mae_tol = tol.mae
    if mae_tol is None and spread is not None:
        mae_tol = spread.mae_tolerance(variant)
    unstable = spread.unstable_fields(variant) if spread is not None else ()
    problems = []
    paired = base.merge(new, on=PAIR_KEYS, suffixes=("_base", "_new"))
    columns = [c for c in base.columns if c not in PAIR_KEYS]
    for _, both in paired.iterrows():
        agreement = compare_rows(
            {c: both.get(f"{c}_new") for c in columns},
            {c: both.get(f"{c}_base") for c in columns},
            epoch_tol,
            mae_tol,
            unstable,
        )
        if not agreement.ok:
            problems.append(f"seed {both['seed']}: " + ", ".join(agreement.problems))
    return "; ".join(problems)


def _count(row: pd.Series, side: str) -> str:
    runs = row[f"runs_{side}"]
    return "-" if pd.isna(runs) else f"{int(row[f'nan_runs_{side}'])}/{int(runs)}"


def _pair(row: pd.Series, column: str, fmt: str) -> str:
    def one(value: float) -> str:
        return "-" if pd.isna(value) else fmt.format(value)

    return f"{one(row[f'{column}_base'])} -> {one(row[f'{column}_new'])}"


def _comparisons_made(
    table: pd.DataFrame, spreads: dict[str, Spread | None], tol: Tolerances
) -> list[str]:
    """One line per comparison made: which, for how many rows, and why."""
    lines = []
    for (kind, why), group in table.groupby(["comparison", "why"], sort=False):
        if kind == EXACT:
            lines.append(f"{len(group)} row(s) compared exactly: {why} (every column but timing)")
        elif kind == ACROSS:
            lines.append(f"{len(group)} row(s) compared across environments: {why}")
    for case, spread in spreads.items():
        if not (table["case"] == case).any() or not (table["comparison"] == ACROSS).any():
            continue
        if spread is None:
            lines.append(
                f"{case}: no measured rounding spread beside the baseline ({case}.spread.csv); "
                f"first-failure epochs may move by {tol.nan_epoch:.0%}, MAEs are not compared"
            )
        else:
            lines.append(
                f"{case}: rounding spread measured on layouts {', '.join(spread.layouts)} "
                f"({case}.spread.md): each variant's first-failure epochs may move by its "
                f"measured spread (at least 1 epoch; {spread.overall.epoch:.2%} for a variant "
                f"not measured), final MAEs by theirs (up to {spread.overall.mae:.2%})"
            )
    return lines


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
        help="across environments, where the case's rounding spread was not measured "
        "(<case>.spread.csv beside the baseline): allowed move of a run's first-failure "
        f"epoch, as a fraction of the baseline's (default: {Tolerances.nan_epoch})",
    )
    compare.add_argument(
        "--mae-tolerance",
        type=_fraction,
        default=Tolerances.mae,
        metavar="FRACTION",
        help="across environments: allowed worsening of a run's final MAE, as a fraction of "
        "the baseline's (default: the measured spread where there is one, else not compared)",
    )
    compare.add_argument(
        "--all-comparable",
        action="store_true",
        help="fail (exit 1) when a row is not comparable (other data, epochs or seeds), "
        "for a gate whose baseline must hold the very runs it reruns; by default such a "
        "row is reported and not counted",
    )
    # compare reads CSVs only: no variant modules to import, and no TensorFlow to start
    # (seconds saved in every CI gate that calls it).
    compare.set_defaults(plugin=[], tensorflow=False)


def compare_command(args: argparse.Namespace) -> int:
    """Print the diff table; return 1 if a verdict changed, else 0."""
    new = load_results_dir(args.new)
    baseline = load_results_dir(args.baseline)
    cases = sorted(set(baseline["case"]))
    spreads = {case: read_spread(args.baseline, case) for case in cases}
    table = compare_results(
        new, baseline, Tolerances(args.nan_epoch_tolerance, args.mae_tolerance), spreads
    )
    changed = table["changed"]
    print(table.drop(columns=["changed", "why"]).to_markdown(index=False))
    print()
    for line in _comparisons_made(table, spreads, Tolerances(args.nan_epoch_tolerance)):
        print(line)
    apart = int(table["status"].str.startswith("not comparable").sum())
    if apart:
        print(
            f"\n{apart} row(s) not comparable: base and new ran on different data or settings "
            "(not counted as changed)"
        )
    if changed.any():
        print(f"\n{int(changed.sum())} verdict(s) changed against {args.baseline}")
        return EXIT_VERDICT_CHANGED
    if apart and args.all_comparable:
        print(f"\n--all-comparable: {apart} row(s) of {args.baseline} could not be compared")
        return EXIT_VERDICT_CHANGED
    print(f"\nno verdict changed against {args.baseline}")
    return 0
