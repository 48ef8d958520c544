"""``python -m stability check``: a case's variants checked in seconds, without training
(``stability.check.run``), written as ``<case>.check.md`` and ``<case>.check.csv``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from stability.commands.flags import (
    add_case_argument,
    add_plugin_flag,
    add_progress_flag,
    add_set_flag,
    check_writable,
    positive_int,
    show_progress,
)

#: Exit codes: every property held, a property failed (2 is bad input, as everywhere).
EXIT_PASSED, EXIT_FAILED = 0, 1

#: The most worker processes the default starts: each loads TensorFlow (about 0.6 GB).
MAX_DEFAULT_WORKERS = 4


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check",
        help="check a case's variants for non-finite steps and broken graph invariants, "
        "without training",
        description="Check each variant of the case (or --variant) as built, untrained: its "
        "first training step through the step guard (undone after it) on every batch of the "
        "case's data "
        "and on graphs Hypothesis draws within the case's bounds (isolated nodes, empty and "
        "one-node graphs, duplicate edges, distances at the bounds), and the invariants of a "
        "graph network: node permutation, edge order, batch independence, continuity in "
        "the edge distances, float32 against float64, attention normalization "
        "(docs/check.md). A failing input is shrunk to the smallest that still fails and "
        "written as a case under <out>/<case>.check/. Writes <case>.check.md and "
        "<case>.check.csv into --out. Exit 0 when every property holds, 1 when one fails, 2 "
        "on bad input.",
    )
    add_case_argument(check)
    check.add_argument(
        "--variant",
        metavar="NAMES",
        help="comma-separated variants to check (default: the case's variants)",
    )
    check.add_argument(
        "--examples",
        type=positive_int,
        default=60,
        metavar="N",
        help="generated batches tried per property before it passes (default: %(default)s)",
    )
    check.add_argument(
        "--properties",
        metavar="NAMES",
        help="comma-separated properties to check (default: all; docs/check.md lists them)",
    )
    check.add_argument(
        "--trained",
        action="store_true",
        help="check the weights each variant's first run of the case ends with (trains it)",
    )
    check.add_argument(
        "--own-data-only",
        action="store_true",
        help="skip the generated graphs: check the case's own data only",
    )
    check.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="check N variants at once, each in its own process with one thread, the same "
        f"rows as one process (default: one a core, at most {MAX_DEFAULT_WORKERS})",
    )
    check.add_argument(
        "--out",
        type=Path,
        default=Path("reports"),
        help="folder for <case>.check.md, <case>.check.csv and <case>.check/ (default: reports)",
    )
    check.add_argument(
        "--doctor",
        action="store_true",
        help="for each variant that breaks a property, try every remedy that changes the model "
        "(an op guard at each layer that builds its op, a reformulation, an architecture "
        "change), check each remedied variant again, and write <case>.check.doctor.md: the "
        "verdicts and the recommended fix as the line of your code to change",
    )
    add_plugin_flag(check)
    add_set_flag(check)
    add_progress_flag(check)


def check_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from stability.check.outcome import OWN_DATA, SETTINGS
    from stability.check.properties import PROPERTIES
    from stability.check.report import write_check_report
    from stability.check.run import Declared, check_variant
    from stability.commands.run import variant_list
    from stability.sweep.case_file import absolute_plugins
    from stability.sweep.cases import load_case

    if args.doctor and args.trained:
        from stability.core.errors import StabilityError

        raise StabilityError(
            "--doctor checks each remedied model as built, so it cannot prove a repair of "
            "trained weights: use --doctor or --trained, not both"
        )
    case = load_case(args.case, args.overrides)
    Declared.of(case)  # a bad [check] table is one line, before any model is built
    variants = variant_list(args.variant) if args.variant else case.variants
    check_writable(args.out)
    settings = (OWN_DATA,) if args.own_data_only else SETTINGS
    properties = property_list(args.properties) if args.properties else PROPERTIES
    plugins = absolute_plugins(case, args.case, args.plugin)
    options = {
        "out": args.out,
        "examples": args.examples,
        "settings_": settings,
        "trained": args.trained,
        "properties": properties,
    }
    total = len(variants) * len(properties) * len(settings)
    with tqdm(total=total, desc="check", unit="property", disable=not show_progress(args)) as bar:
        workers = args.workers or min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)
        if workers > 1 and len(variants) > 1:
            rows = _in_workers(min(workers, len(variants)), args, variants, plugins, options, bar)
        else:
            from stability.sweep.runner import case_datasets

            dataset = case_datasets(case)[0]  # built once for every variant
            rows = [
                row
                for variant in variants
                for row in check_variant(
                    case,
                    variant,
                    on_row=lambda row: bar.update(1),
                    plugins=plugins,
                    dataset=dataset,
                    **options,
                )
            ]
    csv_path, md_path = write_check_report(rows, args.out, case.name, str(args.case))
    print(f"wrote {md_path} and {csv_path}")
    failed = [r for r in rows if r.failed]
    for row in failed:
        print(
            f"{row.variant}: {row.property} fails on {row.setting}: {row.detail}", file=sys.stderr
        )
    if args.doctor:
        broken = list(dict.fromkeys(r.variant for r in failed))
        _doctor(case, broken, args, properties)
    return EXIT_FAILED if failed else EXIT_PASSED


def _doctor(case, variants, args: argparse.Namespace, properties) -> None:
    """The doctor of each broken variant's invariants, written as ``<case>.check.doctor.md``."""
    from stability.commands.check_doctor import doctor_case
    from stability.core.files import atomic_write_text
    from stability.doctor.invariant import invariant_markdown

    doctors = []
    for variant in variants:
        print(f"doctor: {variant}: trying every remedy that changes the model", file=sys.stderr)

        def say(repair, variant=variant) -> None:
            if repair.case is not None:
                print(f"doctor: {variant}: {repair.name}: {repair.verdict}", file=sys.stderr)

        doctor = doctor_case(
            case, variant, args.examples, args.own_data_only, properties, on_repair=say
        )
        best = doctor.recommended()
        print(
            f"doctor: {variant}: " + (f"recommended {best.name}" if best else "no remedy fixes it"),
            file=sys.stderr,
        )
        for fix in doctor.code_fixes(best):
            print(f"doctor: {variant}: {fix.where}: {fix.before} => {fix.after}", file=sys.stderr)
        doctors.append(doctor)
    if not doctors:
        return
    path = args.out / f"{case.name}.check.doctor.md"
    chosen = [f"--variant {args.variant}"] if args.variant else []
    command = " ".join(["python -m stability check", str(args.case), *chosen, "--doctor"])
    atomic_write_text(path, invariant_markdown(doctors, str(args.case), command))
    print(f"wrote {path}")


def property_list(text: str) -> tuple[str, ...]:
    """``--properties a,b`` as property names, or a one-line error."""
    from stability.check.properties import PROPERTIES
    from stability.core.errors import StabilityError

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names:
        what = f"{unknown[0]!r} is not a property" if unknown else "name at least one property"
        raise StabilityError(f"--properties {text!r}: {what}; accepted: {', '.join(PROPERTIES)}")
    return names


def _in_workers(workers, args, variants, plugins, options, bar) -> list:
    """Each variant checked in one of ``workers`` spawned processes, with the runs' thread
    layout; the rows in the variants' order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from stability.check.run import check_in_worker
    from stability.sweep.workers import start_worker

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=start_worker,
        initargs=(1, 1, [], list(sys.path)),
    ) as pool:
        futures = [
            pool.submit(
                check_in_worker, str(args.case), list(args.overrides), plugins, v, **options
            )
            for v in variants
        ]
        rows = []
        for future in futures:
            done = future.result()
            bar.update(len(done))
            rows += done
    return rows
