"""``python -m stability map``: train a map case's grid and bisections, then write its
markdown and heatmaps (``stability.explore.map``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stability.commands.flags import add_run_flags, check_writable, run_options
from stability.commands.run import cluster_of


def add_map_parser(sub: argparse._SubParsersAction) -> None:
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
    add_run_flags(mapper)


def map_command(args: argparse.Namespace) -> int:
    from stability.explore.run import load_maps, map_and_report

    maps = load_maps(args.cases, args.overrides, args.threads, args.jit_compile)
    cluster = cluster_of([m.case for m in maps], args)
    try:
        check_writable(args.out)
        for m in maps:
            path = map_and_report(
                m,
                args.out,
                cluster=cluster,
                **run_options(args),
            )
            print(f"wrote {args.out / (m.name + '.csv')} and {path}")
    finally:
        if cluster is not None:
            cluster.shutdown()
    return 0
