"""``python -m stability doctor``: from a variant's first failure to a verified fix
(``stability.doctor.run``), written as ``<case>.doctor.md`` and ``<case>.doctor.csv``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stability.commands.flags import (
    add_case_argument,
    add_run_flags,
    check_writable,
    non_negative_int,
    run_options,
)
from stability.commands.push import PUSH_BUDGET
from stability.core.errors import StabilityError

#: Exit codes: a remedy fixed the failure (or there was none), no remedy did.
EXIT_FIXED, EXIT_NOT_FIXED = 0, 1


def add_doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="find a variant's first failure, rerun it with every remedy, say which fixes it",
        description="Train VARIANT on the case, name its first failure (stage, layer, op, "
        "cause), then rerun the same seeds with every remedy the harness can apply without "
        "code (gradient clipping, a lower learning rate, a larger Adam epsilon, a larger "
        "batch, float64, standardized or squashed edge distances, a kernel constraint, the "
        "stable softmax, a logit cap, a guard at the failing op such as an epsilon in its "
        "sqrt or a division that is 0 where its denominator is, and --candidates) for at "
        "least 3 times the failure epoch, and judge each: fixes (on fresh seeds too, and "
        "on data the hunt pushes toward its limits), delays or does not help "
        "(docs/doctor.md). A guard that fixes is printed as the "
        "line of your code to change. Writes <case>.doctor.md and <case>.doctor.csv into "
        "--out, and every remedy's runs into <out>/<case>.doctor/. Exit 0 when a remedy "
        "fixes the failure (or there is none), 1 when none does, 2 on bad input.",
    )
    add_case_argument(doctor)
    doctor.add_argument("--variant", required=True, help="the variant to doctor")
    doctor.add_argument(
        "--seeds",
        metavar="LIST",
        help="comma-separated seeds to train (default: the case's seeds)",
    )
    doctor.add_argument(
        "--candidates",
        metavar="NAMES",
        default="",
        help="comma-separated variants of your own to try as remedies too",
    )
    doctor.add_argument(
        "--push-budget",
        type=non_negative_int,
        default=PUSH_BUDGET,
        metavar="N",
        help="trainings the hunt may spend on each fix, moving the data toward the fix's "
        "limits; a fix whose failure comes back there only 'holds on this data', and the "
        "next is pushed, until "
        f"one holds (default: {PUSH_BUDGET}; 0: do not push; the generated and synthetic "
        "data sets only)",
    )
    add_run_flags(
        doctor,
        out_help="folder for <case>.doctor.md, <case>.doctor.csv and <case>.doctor/ "
        "(default: reports)",
    )


def doctor_command(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from stability.commands.push import hunt_push
    from stability.commands.run import cluster_of, variant_list
    from stability.doctor.report import write_doctor_report
    from stability.doctor.run import doctor
    from stability.sweep.case_file import absolute_plugins
    from stability.sweep.cases import load_case

    case = load_case(args.case, args.overrides)
    case = replace(case, threads=args.threads, jit_compile=case.jit_compile or args.jit_compile)
    variant_list(args.variant)  # one line for an unknown name, before any training
    candidates = variant_list(args.candidates) if args.candidates.strip() else ()
    seeds = seed_list(args.seeds) if args.seeds is not None else None
    check_writable(args.out)
    runs = args.out / f"{case.name}.doctor"
    _check_fresh(runs, args)
    cluster = cluster_of([case], args)
    plugins = absolute_plugins(case, args.case, args.plugin)
    try:
        result = doctor(
            case,
            args.variant,
            runs,
            seeds=seeds,
            candidates=candidates,
            cluster=cluster,
            on_stage=lambda text: print(f"doctor: {text}", file=sys.stderr),
            push=hunt_push(args.push_budget, plugins) if args.push_budget else None,
            **run_options(args),
        )
    finally:
        if cluster is not None:
            cluster.shutdown()
    csv_path, md_path = write_doctor_report(result, args.out, str(args.case))
    print(f"wrote {md_path} and {csv_path}")
    best = result.recommended()
    if result.finding.symptom is None:
        print(
            f"{args.variant}: no failure to doctor in training; for what a model breaks without "
            f"a NaN, run `python -m stability check {args.case} --variant {args.variant} "
            "--doctor`",
            file=sys.stderr,
        )
        return EXIT_FIXED
    if result.bad_input:
        graphs = len(result.bad_input)
        print(
            f"{args.variant}: the input data holds NaN or Inf in {graphs} graphs", file=sys.stderr
        )
        return EXIT_NOT_FIXED
    if best is None:
        print(f"{args.variant}: no remedy fixed the {result.finding.symptom}", file=sys.stderr)
        return EXIT_NOT_FIXED
    print(f"{args.variant}: {result.finding.symptom}; fixed by {best.remedy.name}", file=sys.stderr)
    return EXIT_FIXED


def seed_list(text: str) -> tuple[int, ...]:
    """``--seeds 0,1`` as integers >= 0, or a one-line error."""
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        seeds = ()
    if not seeds or any(s < 0 for s in seeds):
        raise StabilityError(f"--seeds {text!r}: expected comma-separated integers >= 0, e.g. 0,1")
    return seeds


def _check_fresh(runs: Path, args: argparse.Namespace) -> None:
    """Without --resume or --overwrite, a doctor folder that holds runs is an error before
    any training (as for ``run``), not after the original runs trained."""
    if args.resume or args.overwrite or not runs.is_dir():
        return
    held = sorted(p.name for p in runs.glob("*.runs.sqlite"))
    if held:
        raise StabilityError(
            f"{runs} already holds the runs of an earlier doctor ({held[0]}, ...); pass "
            "--resume to keep them and run only the missing ones, --overwrite to discard "
            "them, or another --out"
        )
