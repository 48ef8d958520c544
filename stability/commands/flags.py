"""The flags several commands share (``--plugin``, ``--set``, the run flags) and their
argument types."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from stability.core.errors import StabilityError


def add_plugin_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name or a path to a .py file) first, so the variants "
        "and data sets it registers can be named (repeatable; a plugin runs code, like a "
        "pytest plugin)",
    )


def add_case_argument(parser: argparse.ArgumentParser) -> None:
    """The one case a command works on (``doctor``, ``hunt``, ``spread``)."""
    parser.add_argument("case", type=Path, metavar="CASE", help="a case TOML file")


def add_set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="override a case key, validated as if it were in the file (repeatable): "
        "--set epochs=20 --set dataset.num_graphs=200; recorded in the report",
    )


def add_run_flags(
    parser: argparse.ArgumentParser,
    out_help: str = "folder for <case>.csv, <case>.history.csv, <case>.md (default: reports)",
) -> None:
    """Flags shared by ``run``, ``claims`` and ``doctor``."""
    parser.add_argument("--out", type=Path, default=Path("reports"), help=out_help)
    add_plugin_flag(parser)
    add_set_flag(parser)
    existing = parser.add_mutually_exclusive_group()
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
    add_progress_flag(parser)
    parser.add_argument(
        "--jit-compile",
        action="store_true",
        help="compile each run's training step with XLA, on batches padded to one shape "
        "(the case key jit_compile); XLA moves where the naive softmax fails and is not "
        "faster per run here (docs/findings.md, 'XLA fails twice as early')",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="train N runs at once in N processes (default: 1); rows as in a serial run",
    )
    parser.add_argument(
        "--executor",
        choices=("process", "ray"),
        default="process",
        help="what trains the runs: 'process', this machine's processes (--workers), or "
        "'ray', one Ray task per run on a local Ray or the cluster at --address "
        '(pip install "stability[ray]"; docs/cluster.md); rows as in a serial run',
    )
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="with --executor ray: join the Ray cluster whose head is at HOST:PORT "
        "(default: start a local Ray on this machine, bound to 127.0.0.1)",
    )
    parser.add_argument(
        "--cpus-per-run",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --executor ray: CPUs each run asks Ray for (default: 1); the run still "
        "trains on --threads",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="TensorFlow intra-op threads each run trains on, inter-op 1 (default: 1, the "
        "layout of the committed reports). Another count rounds the sums differently, so it "
        "moves the rows (each records its layout in the environment column): use it to "
        "measure the rounding spread, not for speed; --workers trains runs side by side",
    )


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (they are drawn only when stderr is a terminal)",
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: only where someone watches them, on a terminal. Into
    a pipe or a log file (CI, ``2> log``) each redraw would be one more line."""
    return not args.no_progress and sys.stderr.isatty()


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The run flags as a runner's keyword arguments (``run_case``, ``run_map``, the
    doctor's and the zoo's runs): progress bars, ``--resume``, ``--overwrite``, ``--workers``."""
    return {
        "progress": show_progress(args),
        "resume": args.resume,
        "overwrite": args.overwrite,
        "workers": args.workers,
    }


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} must be at least {least}")
    return value


def check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StabilityError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise StabilityError(f"--out {out}: the folder is not writable")
