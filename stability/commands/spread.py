"""``python -m stability spread``: rerun a case on other thread layouts and write how far
its rows moved (``stability.report.spread``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stability.commands.flags import (
    add_case_argument,
    add_plugin_flag,
    add_progress_flag,
    add_set_flag,
    check_writable,
    positive_int,
    show_progress,
)
from stability.commands.run import variant_list
from stability.core.errors import StabilityError

if TYPE_CHECKING:
    import pandas as pd

    from stability.sweep.cases import Case


def add_spread_parser(sub: argparse._SubParsersAction) -> None:
    spread = sub.add_parser(
        "spread",
        help="measure the rounding spread: rerun a case on other thread layouts",
        description="Train a case's runs on other intra-op thread counts, which round the "
        "float sums differently as another CPU does, and write <case>.spread.csv and "
        "<case>.spread.md into --out: how far the first-failure epochs and final MAEs "
        "moved. compare and the headline test read <case>.spread.csv beside a baseline as "
        "the tolerance of a comparison across environments (docs/reports.md).",
    )
    add_case_argument(spread)
    spread.add_argument(
        "--layouts",
        type=_thread_counts,
        default=(1, 2, 8),
        metavar="N,M,...",
        help="intra-op thread counts to train on; the first is the reference unless "
        "--reference is given; none trains nothing, for a spread of --other CPUs alone "
        "(default: 1,2,8)",
    )
    spread.add_argument(
        "--reference",
        type=Path,
        metavar="CSV",
        help="a results CSV of the case (e.g. reports/seed.csv) whose rows stand for the "
        "reference layout they record, instead of training it",
    )
    spread.add_argument(
        "--other",
        type=Path,
        action="append",
        default=[],
        metavar="CSV",
        help="rows of the case trained elsewhere (a results or spread CSV, e.g. a copy of "
        "another CPU's reports/seed.csv); each of its layouts not trained in this call "
        "joins the spread, named '<threads> on <cpu>' for a CPU other than the reference's. "
        "Repeatable; passing "
        "the spread CSV being rewritten keeps the layouts it measured before",
    )
    spread.add_argument(
        "--variants", help="comma-separated variants to measure (default: the case's)"
    )
    spread.add_argument(
        "--out", type=Path, default=Path("reports"), help="folder for the spread files"
    )
    spread.add_argument("--workers", type=positive_int, default=1, metavar="N")
    spread.add_argument(
        "--resume", action="store_true", help="keep the reruns already trained under --out"
    )
    add_progress_flag(spread)
    add_plugin_flag(spread)
    add_set_flag(spread)


def _thread_counts(text: str) -> tuple[int, ...]:
    if text.strip() == "none":
        return ()
    counts = tuple(positive_int(part.strip()) for part in text.split(",") if part.strip())
    if not counts or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected distinct counts such as 1,2,8, or none"
        )
    return counts


def spread_command(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from stability.core.environment import cpu, short_cpu
    from stability.core.files import atomic_write_text
    from stability.report.spread import (
        carried_layouts,
        measure,
        read_rows,
        spread_markdown,
        spread_path,
        stack_layouts,
    )
    from stability.sweep.cases import load_case

    case = load_case(args.case, args.overrides)
    if args.variants:
        case = replace(case, variants=variant_list(args.variants))
    frames = _reference(args.reference, case) if args.reference is not None else {}
    if not args.layouts and (args.reference is None or not args.other):
        raise StabilityError("--layouts none needs --reference and --other: nothing to compare")
    others = [(path, read_rows(path)) for path in args.other]
    check_writable(args.out)
    # The spread's own CPU is the reference's: its layouts are named by their threads alone,
    # wherever the command runs, and the layouts trained here name this CPU if it differs.
    home = _cpu_of(frames) or cpu()
    trained = _trained(args, case)
    if home != cpu():
        trained = {f"{name} on {short_cpu(cpu())}": rows for name, rows in trained.items()}
    frames.update(trained)
    runs = next(iter(frames.values()))
    for path, frame in others:
        carried = carried_layouts(frame, home, runs, str(path))
        # A layout trained in this call is measured afresh, not carried.
        frames.update({name: rows for name, rows in carried.items() if name not in frames})
    stacked = stack_layouts(frames)
    path = spread_path(args.out, case.name)
    atomic_write_text(path, stacked.to_csv(index=False))
    markdown = args.out / f"{case.name}.spread.md"
    atomic_write_text(markdown, spread_markdown(case.name, stacked, measure(stacked)))
    print(f"wrote {path} and {markdown}")
    return 0


def _cpu_of(frames: dict[str, pd.DataFrame]) -> str:
    """The CPU the reference's rows record (``--reference``), or '' without one."""
    from stability.core.environment import parse

    for frame in frames.values():
        return parse(str(frame["environment"].iloc[0])).get("cpu", "")
    return ""


def _reference(path: Path, case: Case) -> dict[str, pd.DataFrame]:
    """{layout: rows} of ``--reference``'s rows of ``case``, which must record one layout."""
    from stability.core.environment import parse
    from stability.report.writer import read_results

    frame = read_results(path)
    frame = frame[frame["variant"].isin(case.variants) & frame["seed"].isin(case.seeds)]
    if frame.empty:
        raise StabilityError(f"{path}: no rows of {case.name}'s variants and seeds")
    layouts = {parse(e).get("threads", "") for e in frame["environment"].fillna("")}
    if len(layouts) != 1 or "" in layouts:
        raise StabilityError(
            f"{path}: its rows must record one thread layout in their "
            f"environment column; they record {sorted(layouts)}"
        )
    return {layouts.pop(): frame}


def _trained(args: argparse.Namespace, case: Case) -> dict[str, pd.DataFrame]:
    """{``Nx1``: rows} of the case trained here on each of ``--layouts``."""
    from dataclasses import replace

    from stability.report.writer import read_results
    from stability.sweep.runner import run_case

    frames = {}
    for threads in args.layouts:
        folder = args.out / "spread" / case.name / f"threads-{threads}"
        run_case(
            replace(case, threads=threads),
            folder,
            progress=show_progress(args),
            resume=args.resume,
            overwrite=not args.resume,
            workers=args.workers,
        )
        frames[f"{threads}x1"] = read_results(folder / f"{case.name}.csv")
    return frames
