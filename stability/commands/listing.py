"""``python -m stability list`` and ``report``: what is registered, and a case's markdown
rendered again from its CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

from stability.commands.flags import add_plugin_flag, add_set_flag
from stability.commands.run import report_description
from stability.core.errors import StabilityError


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

    frame = read_results(args.csv)
    # The history beside the CSV (<case>.history.csv) brings the risk lines and the plots.
    history = read_history(args.csv.with_name(args.csv.name.removesuffix(".csv") + ".history.csv"))
    if frame.empty:
        raise StabilityError(f"{args.csv}: has no result rows")
    case = str(frame["case"].iloc[0])
    description = ""
    if args.overrides and args.case is None:
        raise StabilityError("report --set needs --case: the overrides apply to a case file")
    if args.case is not None:
        from stability.sweep.cases import load_case

        # The run's --set overrides, given again, keep their line in the report.
        description = report_description(load_case(args.case, args.overrides))
    path = write_reports(frame, args.out or args.csv.parent, case, description, history)
    print(f"wrote {path}")
    return 0
