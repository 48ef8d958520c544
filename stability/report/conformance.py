"""``reports/conformance.md``: which segment softmaxes pass which conformance property.

Every sentence is computed from the ``ConformanceReport``s handed in: one row per
implementation and dtype, one column per property, then each failure's shrunk
counterexample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stability.core.limits import FLOAT_DTYPES, exp_limits
from stability.testing.conformance import ConformanceReport
from stability.testing.finite_range import span_text
from stability.testing.properties import PROPERTIES


def conformance_markdown(
    reports: Sequence[ConformanceReport], unavailable: Mapping[str, str] | None = None
) -> str:
    """The markdown page; ``unavailable`` maps an implementation that could not be checked
    to the reason (an install or import error)."""
    lines = ["# Segment softmax conformance", ""]
    if reports:
        first = reports[0]
        lines += [
            f"Profile `{first.profile}`: {first.examples} Hypothesis examples per property and "
            f"dtype, derandomized. Tolerance: {first.tolerance()}.",
            "",
            "`finite for logits` is where the output stays finite: the highest x with "
            "[x, 0] in one segment, the lowest with a single edge [x].",
            "",
            "| implementation | dtype | finite for logits | " + " | ".join(PROPERTIES) + " |",
            "|---|---|---|" + "---|" * len(PROPERTIES),
        ]
    for report in reports:
        for dtype, span in report.finite_logits.items():
            verdicts = {r.name: r.status for r in report.results if r.dtype == dtype}
            cells = [verdicts.get(p, "-") for p in PROPERTIES]
            lines.append(
                f"| {report.implementation} | {dtype} | {span_text(span, dtype)} | "
                + " | ".join(cells)
                + " |"
            )
    dtypes = sorted({d for r in reports for d in r.finite_logits}, key=FLOAT_DTYPES.index)
    if dtypes:
        lines += [
            "",
            "For comparison, the `exp` lines of `stability.core.limits` (underflow, overflow): "
            + "; ".join(
                f"{d} [{-exp_limits(d).underflow:.2f}, {exp_limits(d).overflow:.2f}]"
                for d in dtypes
            )
            + ".",
        ]
    lines += ["", "## Failures", ""]
    failures = [(r, f) for r in reports for f in r.failures]
    if not failures:
        lines.append("None.")
    for report, failure in failures:
        lines += [
            f"- **{report.implementation}, {failure.dtype}, {failure.name}**: "
            f"{failure.counterexample}",
            "",
        ]
    if unavailable:
        lines += ["## Not checked", ""]
        lines += [f"- **{name}**: {reason}" for name, reason in unavailable.items()]
    passing = [r.implementation for r in reports if r.passed]
    lines += [
        "",
        f"{len(passing)} of {len(reports)} implementations pass every property"
        + (f": {', '.join(passing)}." if passing else "."),
    ]
    return "\n".join(lines).rstrip() + "\n"
