"""The failure record: one typed value for a run's first failure, rendered once.

A failure is found in training (``stability.train.diagnosis``, ``NanSentinel``) and built
there as a ``Failure``: its stage, kind and cause (enums whose values are the strings the
CSV holds), where it happened (layer, op, the optimizer slot and weight of an update
failure) and the failing step's gradient figures. ``Failure.columns`` renders it into the
result row's columns; ``read_cause`` reads a row's cause back, older CSVs included, and is
the one place a cause is derived from a row.

A row without a ``failure_cause`` column (an older CSV) is read from the columns it has:
``failure_kind`` names the silent failures (attention weights not summing to 1, a non-finite
gradient masked by the transform), and otherwise a ``first_nan_epoch`` means a non-finite
value: a forward one is read by its op as the claims' *mechanism* rule reads it (the softmax's
``exp`` overflowed, its division computed 0/0 after every ``exp`` of a node underflowed),
any other by its stage, as the cause rule reads a stage without evidence. Every cause read
is one of ``CAUSES``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from stability.core.errors import DataError


class Stage(str, Enum):
    """Where the first failure appeared (``first_nan_where``)."""

    FORWARD = "forward"
    LOSS = "loss"
    GRADIENT = "gradient"
    WEIGHTS = "weights"
    VALIDATION = "validation"
    INPUT = "input"


class Kind(str, Enum):
    """What the first failure was (``failure_kind``): a non-finite value, the attention
    weights not summing to 1, a non-finite gradient the gradient transform made finite, or
    non-finite input data (the run is not trained)."""

    NONFINITE = "nonfinite"
    NORMALIZATION = "normalization"
    MASKED_GRADIENT = "masked_gradient"
    INPUT = "input"


class Cause(str, Enum):
    """Why the run failed (``failure_cause``), by the rule of ``stability.train.cause``
    (docs/findings.md, "Reading the failure cause")."""

    FORWARD_OVERFLOW = "forward overflow"
    FORWARD_UNDERFLOW = "forward underflow (0/0)"
    FORWARD = "forward"
    LOSS = "loss"
    GRADIENT_EXPLOSION = "gradient explosion"
    NONFINITE_GRADIENT_OP = "non-finite gradient op"
    OPTIMIZER = "optimizer"
    INPUT = "input"
    NORMALIZATION = "normalization"
    MASKED_GRADIENT = "masked gradient"
    LOSS_SCALE_COLLAPSE = "loss scale collapse"
    NONE = "none"


#: The cause of a run without a failure.
NO_FAILURE = Cause.NONE.value

#: Every value of ``failure_cause``: the one vocabulary of causes.
CAUSES = tuple(cause.value for cause in Cause)

#: Every value of ``failure_kind``.
KINDS = tuple(kind.value for kind in Kind)

#: Causes that are failures without a NaN or Inf anywhere in the step (issue 11).
SILENT_CAUSES = frozenset({Cause.NORMALIZATION.value, Cause.MASKED_GRADIENT.value})

#: The cause each kind has whatever the stage.
KIND_CAUSE = {
    Kind.INPUT: Cause.INPUT,
    Kind.NORMALIZATION: Cause.NORMALIZATION,
    Kind.MASKED_GRADIENT: Cause.MASKED_GRADIENT,
}

#: The cause of an older row's failure read by its stage alone (no evidence kept): what the
#: cause rule gives a stage whose failing op could not be run again.
_STAGE_CAUSE = {
    Stage.LOSS.value: Cause.LOSS,
    Stage.GRADIENT.value: Cause.NONFINITE_GRADIENT_OP,
    Stage.WEIGHTS.value: Cause.OPTIMIZER,
}


@dataclass(frozen=True)
class Failure:
    """A run's first failure.

    ``epoch`` and ``step`` count from 1 (None for input data that was never trained on);
    ``layer`` is the Keras layer path or None, ``op`` what failed in words (for an update
    failure: the optimizer op, the slot and the weight). ``slot`` and ``weight`` name the
    optimizer variable and the weight an update failure wrote (None otherwise, or where the
    replay could not tell); ``weight_max_abs_grad`` is that weight's largest |gradient|.
    ``grad_norm`` and ``max_abs_grad`` are the failing step's raw gradient norm and largest
    |gradient| (None where not finite).
    """

    stage: Stage
    kind: Kind
    cause: Cause
    epoch: int | None = None
    step: int | None = None
    layer: str | None = None
    op: str | None = None
    slot: str | None = None
    weight: str | None = None
    weight_max_abs_grad: float | None = None
    grad_norm: float | None = None
    max_abs_grad: float | None = None

    def columns(self) -> dict[str, Any]:
        """The result row's columns this failure fills, as the CSV holds them."""
        return {
            "first_nan_epoch": self.epoch,
            "first_nan_step": self.step,
            "first_nan_where": self.stage.value,
            "first_nan_layer": self.layer,
            "first_nan_op": self.op,
            "failure_kind": self.kind.value,
            "failure_cause": self.cause.value,
            "failure_grad_norm": self.grad_norm,
            "failure_max_abs_grad": self.max_abs_grad,
        }


def read_cause(row: Mapping[str, object]) -> Cause:
    """The cause of the run of ``row``: its ``failure_cause`` when the row has it, else
    derived from ``failure_kind``, ``first_nan_epoch``, ``first_nan_where`` and
    ``first_nan_op`` (module docstring)."""
    cause = _text(row, "failure_cause")
    if cause in CAUSES:
        return Cause(cause)
    if cause:
        raise DataError(f"failure_cause {cause!r} is not a cause; accepted: {', '.join(CAUSES)}")
    kind = _text(row, "failure_kind")
    if kind in KINDS and Kind(kind) in KIND_CAUSE:
        return KIND_CAUSE[Kind(kind)]
    if _text(row, "first_nan_where") == Stage.INPUT.value:
        return Cause.INPUT
    if _text(row, "first_nan_epoch"):
        where, op = _text(row, "first_nan_where"), _text(row, "first_nan_op")
        if where in ("forward", "validation") and "softmax_exp" in op:
            return Cause.FORWARD_OVERFLOW
        if where in ("forward", "validation") and "softmax_div" in op:
            return Cause.FORWARD_UNDERFLOW
        return _STAGE_CAUSE.get(where, Cause.FORWARD)
    return Cause.NONE


def failure_cause(row: Mapping[str, object]) -> str:
    """What made the run of ``row`` fail, or ``"none"`` (``read_cause``, as the CSV says it)."""
    return read_cause(row).value


def failed(row: Mapping[str, object]) -> bool:
    """Whether the run of ``row`` failed within its budget, silently or not."""
    return read_cause(row) is not Cause.NONE


def is_silent(cause: str) -> bool:
    """Whether ``cause`` is a failure without a non-finite value."""
    return cause in SILENT_CAUSES


def _text(row: Mapping[str, object], column: str) -> str:
    """The cell as text; empty for a missing column, None and NaN (pandas' empty cell)."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()
