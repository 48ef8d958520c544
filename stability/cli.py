"""``python -m stability run|map|list|report|compare|claims|conformance|spread|hunt``: the CLI.

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
from typing import TYPE_CHECKING

from stability.core.errors import StabilityError
from stability.core.limits import exp_limits
from stability.hunt_command import add_hunt_parser, hunt_command
from stability.report.compare import add_compare_parser, compare_command

if TYPE_CHECKING:
    from stability.sweep.cases import Case
    from stability.sweep.ray_executor import RayCluster

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stability",
        description="Train GNN variants on graph data, find the first NaN, write reports.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run case files and write CSV and markdown reports")
    run.add_argument("cases", nargs="+", type=Path, metavar="CASE", help="case TOML files")
    run.add_argument(
        "--variants",
        metavar="NAMES",
        help="comma-separated variants to run instead of the case's list",
    )
    _add_run_flags(run)
    _add_map_parser(sub)

    lst = sub.add_parser("list", help="list the registered variants, then the data sets")
    _add_plugin_flag(lst)
    lst.add_argument("--filter", help="only names containing this text")

    rep = sub.add_parser("report", help="regenerate <case>.md from a results CSV")
    rep.add_argument("csv", type=Path, metavar="CSV", help="a results CSV written by `run`")
    rep.add_argument("--out", type=Path, help="folder for the markdown (default: beside the CSV)")
    rep.add_argument(
        "--case", type=Path, metavar="CASE", help="the case file, for its description (optional)"
    )
    _add_plugin_flag(rep)
    _add_set_flag(rep)
    add_compare_parser(sub)
    _add_claims_parser(sub)
    _add_conformance_parser(sub)
    _add_spread_parser(sub)
    add_hunt_parser(sub, _positive_int, _add_plugin_flag, _add_set_flag)
    return parser


def _add_plugin_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name or a path to a .py file) first, so the variants "
        "and data sets it registers can be named (repeatable; a plugin runs code, like a "
        "pytest plugin)",
    )


def _add_set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="override a case key, validated as if it were in the file (repeatable): "
        "--set epochs=20 --set dataset.num_graphs=200; recorded in the report",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stability")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``claims``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("reports"),
        help="folder for <case>.csv, <case>.history.csv, <case>.md (default: reports)",
    )
    _add_plugin_flag(parser)
    _add_set_flag(parser)
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--jit-compile",
        action="store_true",
        help="compile each run's training step with XLA, on batches padded to one shape "
        "(the case key jit_compile); XLA moves where the naive softmax fails and is not "
        "faster per run here (docs/findings.md, 'XLA fails twice as early')",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
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
        type=_positive_int,
        default=1,
        metavar="N",
        help="with --executor ray: CPUs each run asks Ray for (default: 1); the run still "
        "trains on --threads",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        metavar="N",
        help="TensorFlow intra-op threads each run trains on, inter-op 1 (default: 1, the "
        "layout of the committed reports). Another count rounds the sums differently, so it "
        "moves the rows (each records its layout in the environment column): use it to "
        "measure the rounding spread, not for speed; --workers trains runs side by side",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _load_plugins(args.plugin)
        commands = {
            "run": _run,
            "map": _map,
            "list": _list,
            "report": _report,
            "compare": compare_command,
            "claims": _claims,
            "conformance": _conformance,
            "spread": _spread,
            "hunt": hunt_command,
        }
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


def _load_plugins(specs: Sequence[str]) -> None:
    """Import each ``--plugin``: a module name, or a .py path relative to the working folder."""
    from stability.core.plugins import forget_loaded, load_plugin

    forget_loaded()  # an unknown name hints at --plugin when this command line gave none
    for spec in specs:
        load_plugin(spec)


def _run(args: argparse.Namespace) -> int:
    from stability.sweep.cases import load_case

    # All validated before any training.
    cases = [load_case(path, args.overrides) for path in args.cases]
    if args.variants:
        from dataclasses import replace

        names = _variant_list(args.variants)
        cases = [replace(case, variants=names) for case in cases]
    _run_cases(cases, args)
    return 0


def _variant_list(text: str) -> tuple[str, ...]:
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


def _run_cases(cases: Sequence[Case], args: argparse.Namespace) -> None:
    """Train every case into ``args.out`` and write its markdown from the whole CSV."""
    from dataclasses import replace

    from stability.core.files import folder_lock
    from stability.report.writer import read_history, read_results, write_reports
    from stability.sweep.runner import run_case

    cases = [replace(case, threads=args.threads) for case in cases]
    if args.jit_compile:
        cases = [replace(case, jit_compile=True) for case in cases]
    cluster = _cluster(cases, args)  # before anything is written: it may refuse
    try:
        _check_writable(args.out)
        for case in cases:
            run_case(
                case,
                args.out,
                progress=not args.no_progress,
                resume=args.resume,
                overwrite=args.overwrite,
                workers=args.workers,
                cluster=cluster,
            )
            # The markdown follows the whole CSV: resumed runs and other processes' runs too.
            with folder_lock(args.out):
                frame = read_results(args.out / f"{case.name}.csv")
                history = read_history(args.out / f"{case.name}.history.csv")
                path = write_reports(frame, args.out, case.name, _description(case), history)
            print(f"wrote {args.out / (case.name + '.csv')} and {path}")
    finally:
        if cluster is not None:
            cluster.shutdown()


def _add_map_parser(sub: argparse._SubParsersAction) -> None:
    mapper = sub.add_parser(
        "map",
        help="run map cases: where each variant fails over generated edge distances",
        description="Train every variant of a map case on K generated data sets per "
        "(distribution, scale) of its grid, then bisect the scale for each variant and "
        "distribution to find where at least fail_fraction of the runs fail. Writes "
        "<map>.csv, <map>.history.csv, <map>.md and the heatmaps <map>.failure_rate.png "
        "and <map>.mae.png. A map case is a case with a [map] table: distributions, scales, "
        "bracket = [lo, hi], steps, fail_fraction (docs/map.md); the scale is the largest "
        "distance a draw can have (max_outlier for outliers, max_distance otherwise).",
    )
    mapper.add_argument(
        "cases", nargs="+", type=Path, metavar="CASE", help="map case TOML files ([map] table)"
    )
    _add_run_flags(mapper)


def _map(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from stability.report.map_report import write_map_report
    from stability.sweep.map import load_map, run_map

    maps = [load_map(path, args.overrides) for path in args.cases]  # all checked first
    maps = [replace(m, case=replace(m.case, threads=args.threads)) for m in maps]
    if args.jit_compile:
        maps = [replace(m, case=replace(m.case, jit_compile=True)) for m in maps]
    cluster = _cluster([m.case for m in maps], args)
    try:
        _check_writable(args.out)
        for m in maps:
            rows = run_map(
                m,
                args.out,
                progress=not args.no_progress,
                resume=args.resume,
                overwrite=args.overwrite,
                workers=args.workers,
                cluster=cluster,
            )
            path = write_map_report(m, rows, args.out, _description(m.case))
            print(f"wrote {args.out / (m.name + '.csv')} and {path}")
    finally:
        if cluster is not None:
            cluster.shutdown()
    return 0


def _cluster(cases: Sequence[Case], args: argparse.Namespace) -> RayCluster | None:
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


def xla_note(dtype: str) -> str:
    """The note a report of a case trained under XLA opens with: its rows do not say so.

    XLA rewrites the softmax division's gradient ``(-x / y) / y`` as ``-x / (y * y)``, so
    ``y * y`` flushes to 0 at half the logit where ``y`` itself does (``tests/test_xla.py``).
    """
    limits = exp_limits(dtype)
    return (
        f"Trained with `jit_compile` (XLA) on padded batches. XLA rewrites arithmetic: in "
        f"{dtype}, the naive softmax's gradient fails once a node's logits are all below "
        f"-{limits.underflow / 2:.2f}, half of the -{limits.underflow:.2f} where it fails "
        f"without XLA (docs/findings.md), so these rows are not comparable with a run "
        f"without XLA. The Risk lines and plots below still draw the limits without XLA."
    )


def _description(case: Case) -> str:
    text = f"{xla_note(case.dtype)}\n\n{case.description}" if case.jit_compile else case.description
    return f"{text}\n\n{_overrides_note(case)}" if case.overrides else text


def _overrides_note(case: Case) -> str:
    """The report's line saying which settings the command line changed (``--set``)."""
    flags = " ".join(f"`--set {override}`" for override in case.overrides)
    return f"Settings changed on the command line, over the case file: {flags}."


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StabilityError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise StabilityError(f"--out {out}: the folder is not writable")


def _list(args: argparse.Namespace) -> int:
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


def _report(args: argparse.Namespace) -> int:
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
        description = _description(load_case(args.case, args.overrides))
    path = write_reports(frame, args.out or args.csv.parent, case, description, history)
    print(f"wrote {path}")
    return 0


#: The cases the claims are judged from (``cases/<name>.toml``), in the order they run.
CLAIM_CASES = ("seed", "batch_size", "learning_rate")


def _add_claims_parser(sub: argparse._SubParsersAction) -> None:
    claims = sub.add_parser(
        "claims",
        help="the main job: run the claim cases, write their reports and reports/claims.md",
        description="Run cases/seed.toml, cases/batch_size.toml and cases/learning_rate.toml, "
        "write each case's reports, then judge the seed's claims C1-C11 into <out>/claims.md.",
    )
    claims.add_argument(
        "--cases",
        type=Path,
        default=Path("cases"),
        metavar="DIR",
        help="folder holding " + ", ".join(f"{n}.toml" for n in CLAIM_CASES) + " (default: cases)",
    )
    claims.add_argument(
        "--no-run", action="store_true", help="judge the CSVs already in --out; train nothing"
    )
    claims.add_argument(
        "--smoke",
        action="store_true",
        help="1 seed, 3 epochs, 64 graphs per case: checks the whole path in about a minute; "
        "its verdicts say nothing about the claims",
    )
    _add_run_flags(claims)


def _claims(args: argparse.Namespace) -> int:
    from stability.core.files import atomic_write_text
    from stability.report.claims import ClaimInputs, Rules, judge
    from stability.report.claims_dtype import CASE, float64_section
    from stability.report.claims_report import claims_markdown, molecules_section, summary
    from stability.report.writer import read_history, read_results
    from stability.sweep.cases import load_case
    from stability.sweep.runner import case_datasets

    cases = [load_case(args.cases / f"{name}.toml", args.overrides) for name in CLAIM_CASES]
    if args.smoke:
        cases = [_smoke(case) for case in cases]
    if not args.no_run:
        _run_cases(cases, args)
    frames = {}
    for case in cases:
        path = args.out / f"{case.name}.csv"
        frames[case.name] = read_results(path) if path.exists() else None
    seed = cases[0]
    inputs = ClaimInputs(
        seed=frames["seed"],
        batch_size=frames["batch_size"],
        learning_rate=frames["learning_rate"],
        train_graphs=len(case_datasets(seed)[0].train),
        seed_batch_size=seed.batch_sizes[0],
        seed_learning_rate=seed.learning_rates[0],
    )
    rules = Rules()
    verdicts = judge(inputs, rules)
    path = args.out / "claims.md"
    molecules_csv = args.out / "g2_molecules.csv"
    molecules = molecules_section(read_results(molecules_csv) if molecules_csv.exists() else None)
    float64_csv = args.out / f"{CASE}.csv"
    float64 = float64_section(
        read_results(float64_csv) if float64_csv.exists() else None,
        read_history(args.out / f"{CASE}.history.csv"),
        verdicts,
        inputs,
        rules,
    )
    text = claims_markdown(verdicts, rules, summary(verdicts, inputs, rules), molecules, float64)
    atomic_write_text(path, text)
    print(f"wrote {path}")
    return 0


def _smoke(case: Case) -> Case:
    """The case cut down to check the plumbing: 1 seed, 3 epochs, 64 graphs."""
    from dataclasses import replace

    return replace(
        case,
        seeds=case.seeds[:1],
        epochs=min(case.epochs, 3),
        dataset_params={**case.dataset_params, "num_graphs": 64},
    )


def _add_spread_parser(sub: argparse._SubParsersAction) -> None:
    spread = sub.add_parser(
        "spread",
        help="measure the rounding spread: rerun a case on other thread layouts",
        description="Train a case's runs on other intra-op thread counts, which round the "
        "float sums differently as another CPU does, and write <case>.spread.csv and "
        "<case>.spread.md into --out: how far the first-failure epochs and final MAEs "
        "moved. compare and the headline test read <case>.spread.csv beside a baseline as "
        "the tolerance of a comparison across environments (docs/reports.md).",
    )
    spread.add_argument("case", type=Path, metavar="CASE", help="a case TOML file")
    spread.add_argument(
        "--layouts",
        type=_thread_counts,
        default=(1, 2, 8),
        metavar="N,M,...",
        help="intra-op thread counts to train on; the first is the reference unless "
        "--reference is given (default: 1,2,8)",
    )
    spread.add_argument(
        "--reference",
        type=Path,
        metavar="CSV",
        help="a results CSV of the case (e.g. reports/seed.csv) whose rows stand for the "
        "reference layout they record, instead of training it",
    )
    spread.add_argument(
        "--variants", help="comma-separated variants to measure (default: the case's)"
    )
    spread.add_argument(
        "--out", type=Path, default=Path("reports"), help="folder for the spread files"
    )
    spread.add_argument("--workers", type=_positive_int, default=1, metavar="N")
    spread.add_argument(
        "--resume", action="store_true", help="keep the reruns already trained under --out"
    )
    spread.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_plugin_flag(spread)
    _add_set_flag(spread)


def _thread_counts(text: str) -> tuple[int, ...]:
    counts = tuple(_positive_int(part.strip()) for part in text.split(",") if part.strip())
    if not counts or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct counts such as 1,2,8")
    return counts


def _spread(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from stability.core.environment import parse
    from stability.core.files import atomic_write_text
    from stability.report.spread import measure, spread_markdown, spread_path, stack_layouts
    from stability.report.writer import read_results
    from stability.sweep.cases import load_case
    from stability.sweep.runner import run_case

    case = load_case(args.case, args.overrides)
    if args.variants:
        case = replace(case, variants=_variant_list(args.variants))
    frames = {}
    if args.reference is not None:
        frame = read_results(args.reference)
        frame = frame[frame["variant"].isin(case.variants) & frame["seed"].isin(case.seeds)]
        if frame.empty:
            raise StabilityError(f"{args.reference}: no rows of {case.name}'s variants and seeds")
        layouts = {parse(e).get("threads", "") for e in frame["environment"].fillna("")}
        if len(layouts) != 1 or "" in layouts:
            raise StabilityError(
                f"{args.reference}: its rows must record one thread layout in their "
                f"environment column; they record {sorted(layouts)}"
            )
        frames[layouts.pop()] = frame
    _check_writable(args.out)
    for threads in args.layouts:
        folder = args.out / "spread" / case.name / f"threads-{threads}"
        run_case(
            replace(case, threads=threads),
            folder,
            progress=not args.no_progress,
            resume=args.resume,
            overwrite=not args.resume,
            workers=args.workers,
        )
        frames[f"{threads}x1"] = read_results(folder / f"{case.name}.csv")
    stacked = stack_layouts(frames)
    spread = measure(stacked)
    path = spread_path(args.out, case.name)
    atomic_write_text(path, stacked.to_csv(index=False))
    markdown = args.out / f"{case.name}.spread.md"
    atomic_write_text(markdown, spread_markdown(case.name, stacked, spread))
    print(f"wrote {path} and {markdown}")
    return 0


def _add_conformance_parser(sub: argparse._SubParsersAction) -> None:
    from stability.model.softmax_inputs import DTYPES

    conformance = sub.add_parser(
        "conformance",
        help="check a segment softmax fn(logits, segment_ids, num_segments) at the dtype's "
        "limits (exit 1 when a property fails)",
        description="Drive MODULE:NAME with Hypothesis inputs up to and past where exp "
        "overflows and underflows, and check its outputs and gradients against a longdouble "
        "reference (docs/conformance.md).",
    )
    conformance.add_argument(
        "target", metavar="MODULE:NAME", help="the softmax, e.g. my_module:my_softmax"
    )
    conformance.add_argument(
        "--dtype",
        action="append",
        choices=DTYPES,
        help="a dtype to check (repeatable; default: all three)",
    )
    conformance.add_argument(
        "--profile", choices=("ci", "thorough"), help="examples per property (default: ci)"
    )
    conformance.add_argument(
        "--mask", action="store_true", help="the softmax takes a mask: fn(..., num_segments, mask)"
    )
    _add_plugin_flag(conformance)


def _conformance(args: argparse.Namespace) -> int:
    from stability.model.conformance import DTYPES, check_segment_softmax

    fn = _import_target(args.target)
    report = check_segment_softmax(
        fn, dtypes=tuple(args.dtype or DTYPES), mask=args.mask, profile=args.profile
    )
    print(report)
    return 0 if report.passed else 1


def _import_target(target: str):
    """The object ``module:name`` names; a factory marked by ``conformance_adapters.adapter``
    is called for its ``Implementation``."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise StabilityError(f"{target!r} must be MODULE:NAME, e.g. my_module:my_softmax")
    if os.getcwd() not in sys.path:  # like `python -m`: a module beside you can be named
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise StabilityError(
            f"{target}: module {module_name!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    try:
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise StabilityError(f"{target}: module {module_name!r} has no {name!r}") from None
    return obj() if getattr(obj, "makes_implementation", False) else obj
