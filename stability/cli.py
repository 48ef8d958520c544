"""``python -m stability run|list|report|compare``: the command line.

Bad input (a flag, a case file, data, a variant or plugin name, a file that cannot be read
or written) ends in one line on stderr and exit code 2; ``--debug`` shows the traceback
too. argparse's own errors (an unknown flag, a missing argument) are its standard two lines,
usage and error, also with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from stability.compare import add_compare_parser, compare_command
from stability.errors import StabilityError

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stability",
        description="Train GNN variants on graph data, find the first NaN, write reports.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run case files and write CSV and markdown reports")
    run.add_argument("cases", nargs="+", type=Path, metavar="CASE", help="case TOML files")
    run.add_argument(
        "--out",
        type=Path,
        default=Path("reports"),
        help="folder for <case>.csv, <case>.history.csv, <case>.md (default: reports)",
    )
    run.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so the variants it registers can be named (repeatable)",
    )
    run.add_argument(
        "--variants",
        metavar="NAMES",
        help="comma-separated variants to run instead of the case's list",
    )
    existing = run.add_mutually_exclusive_group()
    existing.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in <case>.csv and run only the missing ones "
        "(without --resume or --overwrite, a CSV that holds runs is an error)",
    )
    existing.add_argument(
        "--overwrite",
        action="store_true",
        help="discard the runs already in <case>.csv and <case>.history.csv",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars")

    lst = sub.add_parser("list", help="list the registered variants")
    lst.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (repeatable)",
    )
    lst.add_argument("--filter", help="only names containing this text")

    rep = sub.add_parser("report", help="regenerate <case>.md from a results CSV")
    rep.add_argument("csv", type=Path, metavar="CSV", help="a results CSV written by `run`")
    rep.add_argument("--out", type=Path, help="folder for the markdown (default: beside the CSV)")
    rep.add_argument(
        "--case", type=Path, metavar="CASE", help="the case file, for its description (optional)"
    )
    rep.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, for the descriptions of your variants",
    )
    add_compare_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _load_plugins(args.plugin)
        commands = {"run": _run, "list": _list, "report": _report, "compare": compare_command}
        return commands[args.command](args)
    except StabilityError as exc:
        return _bad_input(args, str(exc))
    except OSError as exc:  # a file we could not read or write; not a bug in the harness
        where = f"{exc.filename}: " if exc.filename else ""
        return _bad_input(args, f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print(
            "stability: interrupted; finished runs are in the CSV, --resume runs the rest",
            file=sys.stderr,
        )
        return 130


def _bad_input(args: argparse.Namespace, message: str) -> int:
    if args.debug:
        traceback.print_exc()
    one_line = " ".join(message.split())
    print(f"stability: error: {one_line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _load_plugins(modules: Sequence[str]) -> None:
    # The current folder is importable, as with `python -m`, so a user's module beside the
    # case files can be named without installing it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise StabilityError(
                f"plugin {module!r} failed to import: {type(exc).__name__}: {exc}"
            ) from exc


def _run(args: argparse.Namespace) -> int:
    from stability.cases import load_case
    from stability.report import read_history, read_results, write_reports
    from stability.runner import run_case
    from stability.store import folder_lock

    cases = [load_case(path) for path in args.cases]  # all validated before any training
    if args.variants:
        from dataclasses import replace

        from stability.variants import get_variant

        names = tuple(n.strip() for n in args.variants.split(",") if n.strip())
        if not names:
            raise StabilityError(f"--variants {args.variants!r}: name at least one variant")
        for name in names:
            get_variant(name)
        cases = [replace(case, variants=names) for case in cases]
    _check_writable(args.out)
    for case in cases:
        run_case(
            case,
            args.out,
            progress=not args.no_progress,
            resume=args.resume,
            overwrite=args.overwrite,
        )
        # The markdown follows the whole CSV: resumed runs and other processes' runs too.
        with folder_lock(args.out):
            frame = read_results(args.out / f"{case.name}.csv")
            history = read_history(args.out / f"{case.name}.history.csv")
            path = write_reports(frame, args.out, case.name, case.description, history)
        print(f"wrote {args.out / (case.name + '.csv')} and {path}")
    return 0


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StabilityError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise StabilityError(f"--out {out}: the folder is not writable")


def _list(args: argparse.Namespace) -> int:
    from stability.variants import list_variants

    variants = list_variants(args.filter)
    width = max((len(v.name) for v in variants), default=0)
    for variant in variants:
        print(f"{variant.name:<{width}}  {variant.description}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from stability.report import read_history, read_results, write_reports

    frame = read_results(args.csv)
    # The history beside the CSV (<case>.history.csv) brings the risk lines and the plots.
    history = read_history(args.csv.with_name(args.csv.name.removesuffix(".csv") + ".history.csv"))
    if frame.empty:
        raise StabilityError(f"{args.csv}: has no result rows")
    case = str(frame["case"].iloc[0])
    description = ""
    if args.case is not None:
        from stability.cases import load_case

        description = load_case(args.case).description
    path = write_reports(frame, args.out or args.csv.parent, case, description, history)
    print(f"wrote {path}")
    return 0
