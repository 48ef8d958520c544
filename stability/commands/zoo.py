"""``python -m stability zoo``: every bug of the zoo through the harness, the doctor and the
tools people use today, scored against the bugs' ground truth (``stability.zoo.run``)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from stability.commands.flags import add_progress_flag, check_writable, positive_int, run_options


def add_zoo_parser(sub: argparse._SubParsersAction) -> None:
    zoo = sub.add_parser(
        "zoo",
        help="run the zoo of real GNN numerical bugs and score the harness, the doctor, "
        "TerminateOnNaN and check_numerics on it",
        description="Every bug of stability/zoo/bugs (a small Keras GNN reproducing one "
        "public issue, with its ground truth) through the harness and the doctor, and "
        "through model.fit with Keras' TerminateOnNaN and with tf.debugging's check_numerics, "
        "and through stability check (no training); writes zoo.csv (one row per bug) and "
        "zoo.md (the scoreboard) into --out, and each "
        "bug's runs into <out>/zoo/ (docs/zoo.md).",
    )
    zoo.add_argument("--out", type=Path, default=Path("reports"), help="folder (default: reports)")
    zoo.add_argument("--bugs", metavar="NAMES", help="comma-separated bugs to run (default: all)")
    zoo.add_argument(
        "--workers", type=positive_int, default=1, metavar="N", help="train N runs at once"
    )
    existing = zoo.add_mutually_exclusive_group()
    existing.add_argument(
        "--resume", action="store_true", help="keep the runs already in <out>/zoo/"
    )
    existing.add_argument(
        "--overwrite", action="store_true", help="discard the runs already in <out>/zoo/"
    )
    add_progress_flag(zoo)
    zoo.add_argument("--plugin", action="append", default=[], help=argparse.SUPPRESS)


def _say(text: str) -> None:
    print(f"zoo: {text}", file=sys.stderr)


def zoo_command(args: argparse.Namespace) -> int:
    from stability.commands.check_doctor import check_and_repair
    from stability.commands.push import hunt_push
    from stability.doctor.run import doctor_many
    from stability.zoo.report import write_zoo_report, zoo_command_line
    from stability.zoo.run import bug_names, run_zoo

    check_writable(args.out)
    names = bug_names(args.bugs)
    # The zoo scores the doctor without importing it: the two features meet here.
    doctor = partial(doctor_many, **run_options(args), on_stage=_say, push=hunt_push())
    # And the check, which needs no training (run in the tools' worker processes), with the
    # doctor of what it finds broken for the bugs training does not show failing.
    entries = run_zoo(
        args.out / "zoo",
        doctor,
        names=names,
        **run_options(args),
        on_stage=_say,
        checker=check_and_repair,
    )
    csv_path, md_path = write_zoo_report(entries, args.out, zoo_command_line(names))
    print(f"wrote {md_path} and {csv_path}")
    return 0
