"""``reports/claims.md``: the rules, one row per claim, and a summary built from the verdicts;
``write_claims`` judges the claim cases' CSVs and writes it (the ``claims`` command's logic).

Every sentence here is assembled from the verdicts and the rows: a different outcome gives
different words. The seed's words stand in quotes, verbatim; the harness's reading of each
claim is in its own column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from stability.claims.float64 import CASE as FLOAT64_CASE
from stability.claims.float64 import float64_section
from stability.claims.rules import (
    MECHANISM_WORDS,
    Rules,
    avoids,
    best_avoider,
    mechanism,
    timing_phrase,
)
from stability.claims.stats import CLAIM_CASES, ClaimInputs, SeedReading, seed_reading
from stability.claims.table import (
    BY_ID,
    LARGER_BATCH,
    LOWER_RATE,
    MECHANISM,
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    WHERE,
    Verdict,
    by_role,
    judge,
)
from stability.core.files import atomic_write_text
from stability.report.summary import settings
from stability.report.writer import read_history, read_results

if TYPE_CHECKING:
    from stability.sweep.cases import Case


def write_claims(out: Path, cases: Sequence[Case], rules: Rules | None = None) -> Path:
    """Judge the claims from the CSVs in ``out`` of ``cases`` (the claim cases, in the order
    of ``CLAIM_CASES``; a case without a CSV is *not run*) and write ``out/claims.md``, with
    the float64 and molecules sections where their CSVs are in ``out``. Returns its path."""
    from stability.sweep.runner import case_datasets

    names = tuple(case.name for case in cases)
    if names != CLAIM_CASES:
        raise ValueError(f"the claim cases are {', '.join(CLAIM_CASES)}, not {', '.join(names)}")
    frames = {case.name: _results(out / f"{case.name}.csv") for case in cases}
    seed = cases[0]
    inputs = ClaimInputs(
        **frames,
        train_graphs=len(case_datasets(seed)[0].train),
        seed_batch_size=seed.batch_sizes[0],
        seed_learning_rate=seed.learning_rates[0],
    )
    rules = rules or Rules()
    verdicts = judge(inputs, rules)
    molecules = molecules_section(_results(out / "g2_molecules.csv"))
    float64 = float64_section(
        _results(out / f"{FLOAT64_CASE}.csv"),
        read_history(out / f"{FLOAT64_CASE}.history.csv"),
        verdicts,
        inputs,
        rules,
    )
    path = out / "claims.md"
    text = claims_markdown(verdicts, rules, summary(verdicts, inputs, rules), molecules, float64)
    atomic_write_text(path, text)
    return path


def _results(path: Path) -> pd.DataFrame | None:
    """A case's rows, None where its CSV is absent."""
    return read_results(path) if path.exists() else None


def claims_markdown(
    verdicts: list[Verdict], rules: Rules, summary: str, molecules: str = "", float64: str = ""
) -> str:
    """``reports/claims.md``: the rules, one row per claim, what it means, and the sections
    on the float64 case (``claims_dtype.float64_section``) and the molecules."""
    table = pd.DataFrame(
        [
            {
                "id": v.id,
                "the seed says": v.claim,
                "tested": BY_ID[v.id].tested,
                "verdict": v.verdict,
                "numbers": v.numbers,
                "why not": v.why or "",
                "report": v.report,
            }
            for v in verdicts
        ]
    )
    counts = table["verdict"].value_counts()
    tally = ", ".join(f"{counts.get(k, 0)} {k}" for k in (REPRODUCED, NOT_REPRODUCED, NOT_RUN))
    parts = [
        "# The seed's claims, checked",
        "Every verdict below is computed from the rows of the claim cases' CSVs by these rules "
        "(`stability/claims/rules.py`, one per claim of `CLAIM_TABLE` in "
        "`stability/claims/table.py`), and every sentence of this page from the verdicts "
        "and the rows (`stability/claims/report.py`). The seed's words are quoted "
        "verbatim; the *tested* column is the harness's reading of each.",
        "## Rules",
        rules.text(by_role(WHERE).id, by_role(MECHANISM).id),
        f"## Verdicts ({tally})",
        table.to_markdown(index=False),
        "## What this means",
        summary,
        float64,
        molecules,
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def summary(verdicts: list[Verdict], inputs: ClaimInputs, rules: Rules) -> str:
    """A paragraph for a reader with a NaN in their own GNN, built from the verdicts."""
    reading = seed_reading(inputs)
    if not isinstance(reading, SeedReading):
        return "The seed case was not run, so there is nothing to say yet."
    raw, stats, by_id = reading.raw, reading.stats, {v.id: v for v in verdicts}
    sentences = [
        _outcomes(stats),
        _where(raw, by_id),
        _remedies(stats, raw, rules, by_id),
        _fixes(stats, raw, rules),
    ]
    return " ".join(s for s in sentences if s)


def _outcomes(stats: dict) -> str:
    finite = sorted(v for v, s in stats.items() if s.nans == 0)
    failed = sorted(f"{v} (median epoch {_epoch(s)})" for v, s in stats.items() if s.nans)
    parts = []
    if finite:
        parts.append(f"the variants that stayed finite in every run were {', '.join(finite)}")
    if failed:
        parts.append(
            f"{'the others' if finite else 'every variant'} hit a NaN: {', '.join(failed)}"
        )
    return "On the seed case " + "; ".join(parts) + "."


def _epoch(s) -> str:
    finite = s.epochs[s.epochs < math.inf]
    return f"{float(pd.Series(finite).median()):g}" if len(finite) else "-"


def _where(raw, by_id: dict[str, Verdict]) -> str:
    if not raw.nans:
        return "raw_e never hit a NaN, so where and how it fails is not known here."
    where = ", ".join(raw.wheres)
    ops = ", ".join(raw.ops) or "no named op"
    forward, how = (by_id[by_role(role).id] for role in (WHERE, MECHANISM))
    return (
        f"The first non-finite value of raw_e arose in the {where} stage at {ops}"
        + (by_role(WHERE).summary if forward.verdict == REPRODUCED else "")
        + f" ({forward.id} {forward.verdict}); there {MECHANISM_WORDS[mechanism(raw)]} "
        f"({how.id} {how.verdict})."
    )


def _remedies(stats: dict, raw, rules: Rules, by_id: dict[str, Verdict]) -> str:
    """The optimizer-side remedies the seed tried, in words the rules allow."""
    parts = []
    clip = stats.get("grad_clip")
    if clip is not None:
        outcome = "avoided the NaN" if avoids(clip, raw, rules) else "did not avoid the NaN"
        parts.append(f"gradient clipping (grad_clip) {outcome}: {timing_phrase(clip, raw, rules)}")
    for claim in (by_role(LOWER_RATE), by_role(LARGER_BATCH)):
        verdict = by_id[claim.id]
        if verdict.verdict == NOT_RUN:
            continue
        avoided = verdict.verdict == NOT_REPRODUCED
        outcome = (
            "avoided the NaN within the budget in at least one setting"
            if avoided
            else "did not avoid the NaN in any setting tried"
        )
        parts.append(f"{claim.summary} {outcome} ({claim.id} {verdict.verdict})")
    if not parts:
        return ""
    forward = by_id[by_role(WHERE).id].verdict == REPRODUCED
    lead = (
        "Since the NaN starts in the forward pass, the optimizer-side remedies can change when "
        "it comes, not where: "
        if forward
        else "Of the optimizer-side remedies, "
    )
    return lead + "; ".join(parts) + "."


def _fixes(stats: dict, raw, rules: Rules) -> str:
    """The variants that avoided the NaN and what they cost in final MAE."""
    best_name, best = best_avoider(stats, raw, rules)
    if best is None:
        return "No variant avoided the NaN for a budget long enough to judge."
    others = [
        f"{v} ({s.final_mae:.4g}, {s.final_mae / best.final_mae:.2f} x)"
        for v, s in sorted(stats.items())
        if v != best_name and avoids(s, raw, rules) and math.isfinite(s.final_mae)
    ]
    text = (
        f"Of the variants that avoided the NaN, {best_name} had the lowest median final MAE "
        f"({best.final_mae:.4g})"
    )
    if others:
        text += f"; the others cost more: {', '.join(others)}"
    return text + "."


def molecules_section(frame: pd.DataFrame | None) -> str:
    """The same variants on the G2 molecules, where that case was run: one row each."""
    if frame is None:
        return ""
    rows = [
        {
            "variant": variant,
            "NaN in": f"{s.nan_runs}/{s.runs}",
            "max abs logit, median": round(s.median("max_abs_logit"), 1),
            "final MAE, median (kcal/mol)": round(s.final_mae, 2),
        }
        for (variant,), s in sorted(settings(frame, ["variant"]), key=lambda kv: kv[0])
    ]
    failing = [r["variant"] for r in rows if not r["NaN in"].startswith("0/")]
    seen = (
        f"{len(failing)} of {len(rows)} variants hit a NaN there: {', '.join(failing)}"
        if failing
        else f"none of the {len(rows)} variants hit a NaN there"
    )
    return (
        "## The same variants on real molecules\n\n"
        f"[g2_molecules](g2_molecules.md): the seed case's model and variants on "
        f"{frame['dataset'].iloc[0]}; {seen}. The claims above are judged on the synthetic "
        "cases only.\n\n" + pd.DataFrame(rows).to_markdown(index=False)
    )
