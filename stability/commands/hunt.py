"""``python -m stability hunt``: search a case's data for graphs that break a variant, write
what it found as a case, and check that ``run`` reproduces it (``stability.explore.hunt``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from stability.commands.flags import add_case_argument
from stability.core.errors import StabilityError


def add_hunt_parser(
    sub: argparse._SubParsersAction,
    positive_int: Callable[[str], int],
    add_plugin_flag: Callable[[argparse.ArgumentParser], None],
    add_set_flag: Callable[[argparse.ArgumentParser], None],
) -> None:
    hunt = sub.add_parser(
        "hunt",
        help="search a case's data for graphs on which a variant fails, in few trainings",
        description="Train VARIANT on the case's data, then move the data (edge distances "
        "within the case's bounds, and the graphs' structure) towards the dtype limit the "
        "run came closest to, by the gradient of the harness's headroom statistics, until a "
        "training fails or the budget is spent (docs/hunt.md). Writes into --out the found "
        "data as <case>_hunt_<variant>.npz and a case that trains it, "
        "<case>_hunt_<variant>.toml, then runs that case as `stability run` would and says "
        "in <case>_hunt_<variant>.hunt.md whether it reproduced the failure; "
        "<case>_hunt_<variant>.hunt.csv holds one row per training. Works on cases whose "
        "data set is synthetic or generated.",
    )
    add_case_argument(hunt)
    hunt.add_argument("--variant", required=True, help="the variant to hunt a failure of")
    hunt.add_argument(
        "--budget",
        type=positive_int,
        default=10,
        metavar="N",
        help="at most N trainings (default: 10)",
    )
    hunt.add_argument(
        "--graphs",
        type=positive_int,
        metavar="N",
        help="graphs in each candidate data set (default: the case's num_graphs)",
    )
    hunt.add_argument("--seed", type=int, help="the runs' seed (default: the case's first seed)")
    hunt.add_argument(
        "--strategy",
        choices=("directed", "plain"),
        default="directed",
        help="'directed', the climb (default), or 'plain': Hypothesis' generation of the same "
        "space, one data set per training, the undirected baseline",
    )
    hunt.add_argument(
        "--soonest",
        action="store_true",
        help="spend the whole budget looking for an earlier failure, not stop at the first",
    )
    hunt.add_argument(
        "--no-reproduce",
        action="store_true",
        help="do not rerun the written case to check that it reproduces the failure",
    )
    hunt.add_argument(
        "--out", type=Path, default=Path("reports/hunt"), help="folder (default: reports/hunt)"
    )
    hunt.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_plugin_flag(hunt)
    add_set_flag(hunt)


def hunt_command(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from stability.commands.flags import show_progress
    from stability.explore.hunt import hunt
    from stability.explore.run import no_failure_line, training_line, write_hunt
    from stability.sweep.case_file import absolute_plugins
    from stability.sweep.cases import load_case

    case = load_case(args.case, args.overrides)
    _check_out(args.out)
    bar = tqdm(
        total=args.budget,
        desc=f"hunt {args.variant}",
        unit="training",
        disable=not show_progress(args),
        dynamic_ncols=True,
    )

    def on_training(training) -> None:
        bar.update(1)
        bar.write(training_line(training))

    try:
        found = hunt(
            case,
            args.variant,
            budget=args.budget,
            num_graphs=args.graphs,
            strategy=args.strategy,
            seed=args.seed,
            soonest=args.soonest,
            on_training=on_training,
        )
    finally:
        bar.close()
    plugins = absolute_plugins(case, args.case, args.plugin)
    path, report = write_hunt(found, args.out, plugins, reproduce=not args.no_reproduce)
    print(f"wrote {path}, {path.with_suffix('.npz').name} and {report}")
    if not found.found:
        print(no_failure_line(found), file=sys.stderr)
    return 0


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise StabilityError(f"--out {out}: not a folder")
