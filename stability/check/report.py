"""The check's report: ``<case>.check.csv`` (one row per variant, property and setting) and
``<case>.check.md``, every sentence of which is computed from the rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from stability.check.outcome import COLUMNS, FAIL, GENERATED, OWN_DATA, PASS, CheckRow
from stability.core.files import atomic_write_text


def write_check_report(
    rows: Sequence[CheckRow], out: Path, case: str, source: str
) -> tuple[Path, Path]:
    """Write the CSV and the markdown beside the other reports; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{case}.check.csv", out / f"{case}.check.md"
    frame = pd.DataFrame([r.as_dict() for r in rows], columns=list(COLUMNS))
    atomic_write_text(csv_path, frame.to_csv(index=False))
    atomic_write_text(md_path, check_markdown(rows, case, source))
    return csv_path, md_path


def check_markdown(rows: Sequence[CheckRow], case: str, source: str) -> str:
    variants = list(dict.fromkeys(r.variant for r in rows))
    properties = list(dict.fromkeys(r.property for r in rows))
    lines = [
        f"# `stability check` of case `{case}`",
        "",
        f"Written by `python -m stability check {source}`: {len(properties)} properties of "
        f"{len(variants)} variants, {_inputs(rows)}, without training "
        "([docs/check.md](../docs/check.md)).",
        "",
        *summary(rows, variants),
        "",
    ]
    for variant in variants:
        lines += _variant_section([r for r in rows if r.variant == variant], variant)
    return "\n".join(lines)


def _inputs(rows: Sequence[CheckRow]) -> str:
    """What the rows were checked on, from their settings and counts."""
    parts = []
    if any(r.setting == OWN_DATA for r in rows):
        parts.append("on the case's own data")
    generated = [r.examples for r in rows if r.setting == GENERATED and r.status == PASS]
    if any(r.setting == GENERATED for r in rows):
        tried = f" ({max(generated)} batches a property that held)" if generated else ""
        parts.append(f"on graphs drawn within its bounds{tried}")
    return " and ".join(parts) or "on no input"


def summary(rows: Sequence[CheckRow], variants: Sequence[str]) -> list[str]:
    """One sentence on how many variants passed, then one line per failing variant."""
    failing = [v for v in variants if any(r.failed for r in rows if r.variant == v)]
    seconds = sum(r.seconds for r in rows)
    lines = [
        f"{len(variants) - len(failing)} of {len(variants)} variants pass every property they "
        f"are checked for; the check took {seconds:.0f} s of property time."
    ]
    for variant in failing:
        broken = list(dict.fromkeys(r.property for r in rows if r.variant == variant and r.failed))
        lines.append(f"- `{variant}` fails {', '.join(f'`{p}`' for p in broken)}.")
    return lines


def _variant_section(rows: Sequence[CheckRow], variant: str) -> list[str]:
    lines = [
        f"## `{variant}`",
        "",
        "| property | input | verdict | tried | what broke | where | counterexample | s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        where = " / ".join(x for x in (r.stage, r.layer, r.op, r.cause) if x)
        size = f"{_count(r.graphs, 'graph')}, {_count(r.nodes, 'node')}" if r.graphs else ""
        case = f"{size} (`{Path(r.counterexample).name}`)" if r.counterexample else size
        verdict = f"**{r.status}**" if r.status == FAIL else r.status
        beyond = _beyond(r)
        detail = _cell(r.detail + beyond) if r.status != PASS else ""
        lines.append(
            f"| {r.property} | {r.setting} | {verdict} | {r.examples} | {detail} | "
            f"{_cell(where)} | {case} | {r.seconds:.1f} |"
        )
    return [*lines, ""]


def _beyond(row: CheckRow) -> str:
    if row.deviation is None or row.tolerance is None or not math.isfinite(row.tolerance):
        return ""
    return f" (off by {row.deviation:.3g}, allowed {row.tolerance:.3g})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _count(n: int | None, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
