"""A run's failure cause, read from its result row: the one place that derives it.

Issue 21 adds a ``failure_cause`` column; a row that has it is read as it says. A row
without it (an older CSV, or before that column lands) is read from the columns of today:
``failure_kind`` names the silent failures (attention weights not summing to 1, a
non-finite gradient masked by the transform), and otherwise a ``first_nan_epoch`` means a
non-finite value: a forward one is read by its op as issue 12's C11b rule reads it (the
softmax's ``exp`` overflowed, its division computed 0/0 after every ``exp`` of a node
underflowed), any other by the stage ``first_nan_where`` names, as the cause rule reads a
stage without evidence. Every value returned is one of ``CAUSES``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: The cause of a run without a failure.
NO_FAILURE = "none"

#: Every value of ``failure_cause``, the one vocabulary of causes: what
#: ``stability.train.cause.failure_cause`` writes and what ``failure_cause`` reads back from
#: any row, old CSVs included (docs/findings.md, "Reading the failure cause").
CAUSES = (
    "forward overflow",
    "forward underflow (0/0)",
    "forward",
    "loss",
    "gradient explosion",
    "non-finite gradient op",
    "optimizer",
    "input",
    "normalization",
    "masked gradient",
    NO_FAILURE,
)

#: The cause of an older row's failure read by its stage alone (no evidence kept): what the
#: cause rule gives a stage whose failing op could not be run again.
_STAGE_CAUSE = {
    "loss": "loss",
    "gradient": "non-finite gradient op",
    "weights": "optimizer",
}

#: Causes that are failures without a NaN or Inf anywhere in the step (issue 11).
SILENT_CAUSES = frozenset({"normalization", "masked gradient"})

#: ``failure_kind`` values of today's rows that name a silent failure, and their cause.
_SILENT_KINDS = {"normalization": "normalization", "masked_gradient": "masked gradient"}


def _text(row: Mapping[str, object], column: str) -> str:
    """The cell as text; empty for a missing column, None and NaN (pandas' empty cell)."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


def failure_cause(row: Mapping[str, object]) -> str:
    """What made the run of ``row`` (a result row, a dict or a pandas row) fail, or
    ``"none"``: ``failure_cause`` when the row has it, else derived from ``failure_kind``,
    ``first_nan_epoch`` and ``first_nan_where``."""
    cause = _text(row, "failure_cause")
    if cause:
        return cause
    kind = _text(row, "failure_kind")
    if kind in _SILENT_KINDS:
        return _SILENT_KINDS[kind]
    if kind == "input" or _text(row, "first_nan_where") == "input":
        return "input"
    if _text(row, "first_nan_epoch"):
        where, op = _text(row, "first_nan_where"), _text(row, "first_nan_op")
        if where in ("forward", "validation") and "softmax_exp" in op:
            return "forward overflow"
        if where in ("forward", "validation") and "softmax_div" in op:
            return "forward underflow (0/0)"
        return _STAGE_CAUSE.get(where, "forward")
    return NO_FAILURE


def failed(row: Mapping[str, object]) -> bool:
    """Whether the run of ``row`` failed within its budget, silently or not."""
    return failure_cause(row) != NO_FAILURE


def is_silent(cause: str) -> bool:
    """Whether ``cause`` is a failure without a non-finite value."""
    return cause in SILENT_CAUSES
