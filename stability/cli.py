"""``python -m stability COMMAND`` (run, map, list, report, compare, claims, conformance, spread,
hunt, doctor, zoo, check):
the CLI.

TensorFlow loads only after the command line parsed (``stability.commands.startup``), so
``--help`` and ``--version`` answer at once.

Bad input (a flag, a case file, data, a variant or plugin name, a file that cannot be read
or written) ends in one line on stderr and exit code 2; ``--debug`` shows the traceback
too. argparse's own errors (an unknown flag, a missing argument) are its standard two lines,
usage and error, also with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from stability.commands.check import add_check_parser, check_command
from stability.commands.claims import add_claims_parser, claims_command
from stability.commands.conformance import add_conformance_parser, conformance_command
from stability.commands.doctor import add_doctor_parser, doctor_command
from stability.commands.flags import add_plugin_flag, add_set_flag, positive_int
from stability.commands.hunt import add_hunt_parser, hunt_command
from stability.commands.listing import (
    add_list_parser,
    add_report_parser,
    list_command,
    report_command,
)
from stability.commands.map import add_map_parser, map_command
from stability.commands.run import add_run_parser, run_command
from stability.commands.spread import add_spread_parser, spread_command
from stability.commands.startup import start_tensorflow
from stability.commands.zoo import add_zoo_parser, zoo_command
from stability.core.errors import StabilityError
from stability.report.compare import add_compare_parser, compare_command

EXIT_BAD_INPUT = 2

#: Each subcommand's function, by name; ``_parser`` adds their parsers in this order.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run_command,
    "map": map_command,
    "list": list_command,
    "report": report_command,
    "compare": compare_command,
    "claims": claims_command,
    "conformance": conformance_command,
    "spread": spread_command,
    "hunt": hunt_command,
    "doctor": doctor_command,
    "zoo": zoo_command,
    "check": check_command,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stability",
        description="Train GNN variants on graph data, find the first NaN, write reports.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_run_parser(sub)
    add_map_parser(sub)
    add_list_parser(sub)
    add_report_parser(sub)
    add_compare_parser(sub)
    add_claims_parser(sub)
    add_conformance_parser(sub)
    add_spread_parser(sub)
    add_hunt_parser(sub, positive_int, add_plugin_flag, add_set_flag)
    add_doctor_parser(sub)
    add_zoo_parser(sub)
    add_check_parser(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stability")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # --help and --version end here, without TensorFlow
    if getattr(args, "tensorflow", True):  # a command that only reads CSVs says it needs none
        start_tensorflow()
    try:
        _load_plugins(args.plugin)
        return COMMANDS[args.command](args)
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


def _load_plugins(specs: Sequence[str]) -> None:
    """Import each ``--plugin``: a module name, or a .py path relative to the working folder."""
    from stability.core.plugins import forget_loaded, load_plugin

    forget_loaded()  # an unknown name hints at --plugin when this command line gave none
    for spec in specs:
        load_plugin(spec)
