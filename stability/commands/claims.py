"""``python -m stability claims``: run the claim cases, then judge the seed's claims into
``claims.md`` (``stability.claims.table``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stability.commands.flags import add_run_flags
from stability.commands.run import run_cases
from stability.core.errors import StabilityError

if TYPE_CHECKING:
    from stability.sweep.cases import Case

#: The cases the claims are judged from (``cases/<name>.toml``), in the order they run.
CLAIM_CASES = ("seed", "batch_size", "learning_rate")


def add_claims_parser(sub: argparse._SubParsersAction) -> None:
    from stability.claims.table import ID_RANGE

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
    from stability.claims.float64 import CASE, float64_section
    from stability.claims.report import claims_markdown, molecules_section, summary
    from stability.claims.table import ClaimInputs, Rules, judge
    from stability.core.files import atomic_write_text
    from stability.report.writer import read_history, read_results
    from stability.sweep.cases import load_case
    from stability.sweep.runner import case_datasets

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
