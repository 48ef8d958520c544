"""Where a step's first non-finite value came from (``NanSite``), and what the failing op
computed (``OpEvidence``): the values a diagnosis hands the cause rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: ``NanSite.op`` of a failure that only XLA's arithmetic makes (``replay`` module docstring).
XLA_ONLY = "XLA only (finite without XLA)"

#: Ops that divide, with the index of their denominator input: a non-finite output where
#: the denominator is 0 is a division by zero (0/0 or x/0), not an overflow.
DENOMINATOR = {
    "RealDiv": 1,
    "Div": 1,
    "DivNoNan": 1,
    "Xdivy": 1,
    "FloorDiv": 1,
    "Reciprocal": 0,
    "Inv": 0,
    "SqrtGrad": 0,  # dy * 0.5 / y
}


@dataclass(frozen=True)
class OpEvidence:
    """What the first non-finite op computed, read by running the step again unchecked.

    ``has_nan`` / ``has_inf``: its output holds NaN / +-Inf; ``inputs_finite``: every float
    input was finite (so this op made the first non-finite value); ``zero_denominator``: a
    dividing op (``DENOMINATOR``) whose denominator is 0 where the output is not finite.
    """

    op_type: str
    has_nan: bool
    has_inf: bool
    inputs_finite: bool
    zero_denominator: bool


@dataclass(frozen=True)
class NanSite:
    """Where a first non-finite value came from.

    ``where`` is one of ``forward``, ``loss``, ``gradient``, ``weights``; ``layer`` is the
    Keras layer path (``message_passing_0/net``) or None; ``op`` the TensorFlow op type with
    its node name, e.g. ``Exp (softmax_exp)``. ``evidence`` holds the failing op's values
    (None where the op could not be run again, e.g. under XLA); ``max_abs_grad`` the largest
    |gradient| of the weight an optimizer update failed for, and ``grad_norm`` the global
    norm of all the step's raw gradients, computed in float64 (a float32 sum of squares
    overflows for gradients above about 1e19, exactly when it matters). ``slot`` and
    ``weight`` name the optimizer variable and the weight path an update failure wrote
    (``velocity``, ``message_passing_0/net/kernel``), where the replay found them.
    """

    where: str
    layer: str | None = None
    op: str | None = None
    evidence: OpEvidence | None = field(default=None, compare=False)
    max_abs_grad: float | None = field(default=None, compare=False)
    grad_norm: float | None = field(default=None, compare=False)
    slot: str | None = field(default=None, compare=False)
    weight: str | None = field(default=None, compare=False)
    #: The non-finite forward value reaches a ``tf.where`` within a few ops
    #: (``failing_op.selected_away``), which can discard it: a finite forward pass with a
    #: non-finite gradient.
    selected: bool = field(default=False, compare=False)


def evidence_from(
    op_type: str, values: Sequence[np.ndarray], denominator: int | None
) -> OpEvidence:
    """``OpEvidence`` from an op's float inputs and its output (the last of ``values``)."""
    *operands, out = (np.asarray(v) for v in values)
    bad = ~np.isfinite(out)
    zero = False
    if denominator is not None:
        below = operands[denominator]
        try:
            zero = bool(np.any((np.broadcast_to(below, out.shape) == 0) & bad))
        except ValueError:  # shapes that do not broadcast: any zero denominator
            zero = bool(np.any(below == 0))
    return OpEvidence(
        op_type=op_type,
        has_nan=bool(np.isnan(out).any()),
        has_inf=bool(np.isinf(out).any()),
        inputs_finite=all(bool(np.isfinite(v).all()) for v in operands),
        zero_denominator=zero,
    )


def what_happened(evidence: OpEvidence) -> str:
    """A failing op's arithmetic in a few words, from its values: ``overflow``, ``0/0``,
    ``division by 0``, ``inf - inf`` (a subtraction fed two infinities), ``NaN``."""
    if evidence.zero_denominator:
        return "0/0" if evidence.has_nan else "division by 0"
    if not evidence.inputs_finite:
        if evidence.op_type == "Sub" and evidence.has_nan:
            return "inf - inf"
        return "fed a non-finite value"
    return "overflow" if evidence.has_inf and not evidence.has_nan else "NaN"
