"""``python -m stability claims``: the parser, and running the claim cases; judging them into
``claims.md`` is ``stability.claims.report.write_claims``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stability.claims.stats import CLAIM_CASES
from stability.claims.table import ID_RANGE
from stability.commands.flags import add_run_flags
from stability.commands.run import run_cases
from stability.core.errors import StabilityError

if TYPE_CHECKING:
    from stability.sweep.cases import Case


def add_claims_parser(sub: argparse._SubParsersAction) -> None:
    claims = sub.add_parser(
        "claims",
        help="the main job: run the claim cases, write their reports and reports/claims.md",
        description="Run cases/seed.toml, cases/batch_size.toml and cases/learning_rate.toml, "
        "write each case's reports, then judge the seed's claims "
        f"{ID_RANGE} into <out>/claims.md.",
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
    add_run_flags(claims)


def claims_command(args: argparse.Namespace) -> int:
    from stability.claims.report import write_claims
    from stability.sweep.cases import load_case

    if args.no_run and not args.out.is_dir():
        raise StabilityError(
            f"--out {args.out}: no such folder; --no-run judges the claim cases' CSVs already "
            "there (seed.csv, batch_size.csv, learning_rate.csv)"
        )
    cases = [load_case(args.cases / f"{name}.toml", args.overrides) for name in CLAIM_CASES]
    if args.smoke:
        cases = [_smoke(case) for case in cases]
    if not args.no_run:
        run_cases(cases, args)
    print(f"wrote {write_claims(args.out, cases)}")
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
