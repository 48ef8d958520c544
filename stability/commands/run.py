"""``python -m stability run``: train case files into a folder and write their reports; the
training of ``map`` and ``claims`` goes through the same helpers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stability.commands.flags import add_run_flags, check_writable, run_options
from stability.core.errors import StabilityError
from stability.report.description import report_description

if TYPE_CHECKING:
    from stability.sweep.cases import Case
    from stability.sweep.ray_executor import RayCluster


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run case files and write CSV and markdown reports")
    run.add_argument("cases", nargs="+", type=Path, metavar="CASE", help="case TOML files")
    run.add_argument(
        "--variants",
        metavar="NAMES",
        help="comma-separated variants to run instead of the case's list",
    )
    add_run_flags(run)


def run_command(args: argparse.Namespace) -> int:
    from stability.sweep.cases import load_case

    # All validated before any training.
    cases = [load_case(path, args.overrides) for path in args.cases]
    if args.variants:
        from dataclasses import replace

        names = variant_list(args.variants)
        cases = [replace(case, variants=names) for case in cases]
    run_cases(cases, args)
    return 0


def variant_list(text: str) -> tuple[str, ...]:
    """``--variants a,b`` as registered names, or a one-line error."""
    from stability.core.plugins import plugin_hint
    from stability.model.variants import get_variant

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise StabilityError(f"--variants {text!r}: name at least one variant")
    for name in names:
        try:
            get_variant(name)
        except StabilityError as exc:
            raise StabilityError(plugin_hint(exc)) from None
    return names


def run_cases(cases: Sequence[Case], args: argparse.Namespace) -> None:
    """Train every case into ``args.out`` and write its markdown from the whole CSV."""
    from dataclasses import replace

    from stability.core.files import folder_lock
    from stability.report.writer import read_history, read_results, write_reports
    from stability.sweep.runner import case_datasets, run_case

    cases = [replace(case, threads=args.threads) for case in cases]
    if args.jit_compile:
        cases = [replace(case, jit_compile=True) for case in cases]
    cluster = cluster_of(cases, args)  # before anything is written: it may refuse
    try:
        check_writable(args.out)
        for case in cases:
            run_case(
                case,
                args.out,
                cluster=cluster,
                **run_options(args),
            )
            # The markdown follows the whole CSV: resumed runs and other processes' runs too.
            with folder_lock(args.out):
                frame = read_results(args.out / f"{case.name}.csv")
                history = read_history(args.out / f"{case.name}.history.csv")
                path = write_reports(
                    frame,
                    args.out,
                    case.name,
                    report_description(case),
                    history,
                    case_datasets(case),
                )
            print(f"wrote {args.out / (case.name + '.csv')} and {path}")
    finally:
        if cluster is not None:
            cluster.shutdown()


def cluster_of(cases: Sequence[Case], args: argparse.Namespace) -> RayCluster | None:
    """The Ray cluster of ``--executor ray``, connected and checked; None for processes."""
    if args.executor != "ray":
        for flag, given in (("--address", args.address), ("--cpus-per-run", args.cpus_per_run > 1)):
            if given:
                raise StabilityError(f"{flag} needs --executor ray")
        return None
    from stability.sweep.ray_executor import RayCluster
    from stability.sweep.workers import variant_modules

    modules = variant_modules([name for case in cases for name in case.variants])
    return RayCluster.connect(args.address, args.cpus_per_run, [*modules, *args.plugin])
