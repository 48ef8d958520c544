"""``python -m stability list`` and ``report``: what is registered, and a case's markdown
rendered again from its CSV (with ``--resummarize``, its summary columns first recomputed
from its history, in the CSV and the run store behind it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stability.commands.flags import add_plugin_flag, add_set_flag
from stability.core.errors import StabilityError
from stability.report.description import report_description

if TYPE_CHECKING:
    from stability.explore.map import MapCase
    from stability.sweep.cases import Case


def add_list_parser(sub: argparse._SubParsersAction) -> None:
    lst = sub.add_parser("list", help="list the registered variants, then the data sets")
    add_plugin_flag(lst)
    lst.add_argument("--filter", help="only names containing this text")


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="regenerate <case>.md from a results CSV")
    rep.add_argument("csv", type=Path, metavar="CSV", help="a results CSV written by `run`")
    rep.add_argument("--out", type=Path, help="folder for the markdown (default: beside the CSV)")
    rep.add_argument(
        "--case", type=Path, metavar="CASE", help="the case file, for its description (optional)"
    )
    rep.add_argument(
        "--resummarize",
        action="store_true",
        help="first recompute every row's summary columns (final, best and last-good MAE, "
        "headroom, divergence, warning) from <case>.history.csv, as a run's end computes "
        "them, and rewrite <case>.csv and its run store <case>.runs.sqlite in place; needs "
        "--case (the rows do not record jit_compile). A map case's CASE writes its map report",
    )
    add_plugin_flag(rep)
    add_set_flag(rep)


def list_command(args: argparse.Namespace) -> int:
    from stability.model.variants import list_variants

    variants = list_variants(args.filter)
    width = max((len(v.name) for v in variants), default=0)
    for variant in variants:
        print(f"{variant.name:<{width}}  {variant.description}")
    _list_datasets(args.filter)
    return 0


def _list_datasets(filter: str | None) -> None:
    """The data sets after the variants, each with its parameters and their defaults."""
    from stability.data import dataset_parameters, list_datasets

    names = [name for name in list_datasets() if filter is None or filter in name]
    if names:
        print("\ndata sets ([dataset] name = ..., then its keys with their defaults):")
    for name in names:
        params = ", ".join(f"{k}={v!r}" for k, v in dataset_parameters(name).items())
        print(f"  {name}({params})")


def report_command(args: argparse.Namespace) -> int:
    from stability.report.writer import read_history, read_results, write_reports

    if args.overrides and args.case is None:
        raise StabilityError("report --set needs --case: the overrides apply to a case file")
    if args.resummarize and args.case is None:
        raise StabilityError(
            "report --resummarize needs --case: whether XLA compiled the step (jit_compile) "
            "is the case's, not a column of the rows"
        )
    case_file, map_case = _load_case(args.case, args.overrides)
    if args.resummarize:
        resummarize_csv(args.csv, case_file.jit_compile)
    out = args.out or args.csv.parent
    if map_case is not None:
        return _map_report(map_case, args.csv, out)
    frame = read_results(args.csv)
    # The history beside the CSV (<case>.history.csv) brings the risk lines and the plots.
    history = read_history(_history_path(args.csv))
    if frame.empty:
        raise StabilityError(f"{args.csv}: has no result rows")
    case = str(frame["case"].iloc[0])
    # The run's --set overrides, given again, keep their line in the report.
    description = report_description(case_file) if case_file is not None else ""
    datasets = _datasets(case_file) if case_file is not None else []
    path = write_reports(frame, out, case, description, history, datasets)
    print(f"wrote {path}")
    return 0


def _load_case(path: Path | None, overrides: list[str]) -> tuple[Case | None, MapCase | None]:
    """The case file named by ``--case`` (None without one) and, for a map case, its map."""
    if path is None:
        return None, None
    from stability.explore.run import read_case_file

    return read_case_file(path, overrides)


def _datasets(case: Case) -> list:
    """The case's data sets, for what they held (the Settings' graph and edge counts)."""
    from stability.sweep.runner import case_datasets

    return case_datasets(case)


def _history_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.name.removesuffix(".csv") + ".history.csv")


def resummarize_csv(csv_path: Path, jit_compile: bool) -> int:
    """Recompute every row's summary columns of ``csv_path`` from its history
    (``run_summary.resummarize``) in the run store behind it, which renders the CSVs; a
    CSV without a store is first taken into one. Returns how many rows were rewritten."""
    from stability.sweep.store import RunStore, run_key
    from stability.train.run_summary import resummarize

    if not csv_path.exists():
        raise StabilityError(f"{csv_path}: no such results file")
    store = RunStore(csv_path.parent, csv_path.name.removesuffix(".csv"), resume=True)
    try:
        histories = store.histories()
        rows = []
        for row in store.rows():
            history = histories.get(run_key(row), [])
            if not history and row["first_nan_where"] != "input":
                # A trained run has at least one epoch; without it the summary would be lost.
                raise StabilityError(f"{csv_path}: no history for the run {run_key(row)}")
            rows.append(resummarize(row, history, jit_compile))
        store.rewrite(rows)
    finally:
        store.close()
    print(f"rewrote the summary columns of {len(rows)} row(s) of {csv_path}")
    return len(rows)


def _map_report(map_case: MapCase, csv_path: Path, out: Path) -> int:
    from stability.explore.run import rewrite_map_report

    path = rewrite_map_report(map_case, csv_path, out)
    print(f"wrote {path}")
    return 0
