"""Why a run failed: the ``failure_cause`` column, from the evidence, by a written rule.

The stage a check fired at says *where* the first non-finite value appeared; the cause
says *what kind* of failure it was, which is what decides the fix (docs/findings.md,
"Reading the failure cause"). The rule, in order:

1. No failure: ``none``. Non-finite input data: ``input``. The attention weights not
   summing to 1: ``normalization``. A non-finite gradient the gradient transform made
   finite: ``masked gradient`` (the silent kinds).
2. Forward pass (training or validation), read off the first non-finite op's values:
   a dividing op whose denominator is 0 where its output is NaN: ``forward underflow
   (0/0)`` (the naive softmax, once every ``exp`` of a node has flushed to 0); an output
   holding +-Inf: ``forward overflow`` (``exp`` above log(max)); any other NaN (the log or
   square root of a negative number): ``forward``.
3. Loss: ``loss``.
4. Gradients (forward pass and loss finite): a gradient op that turned finite inputs into
   +-Inf without dividing by zero overflowed: ``gradient explosion``. A gradient op that
   divided by zero, made a NaN, or failed only under XLA: ``non-finite gradient op``.
5. Update (finite gradients, non-finite weights or optimizer state): ``gradient
   explosion`` when the failing weight's largest |gradient| is at least sqrt(max) of the
   gradient's dtype (float32: 1.84e19), so that an optimizer's ``g * g`` overflows;
   otherwise ``optimizer`` (a 0/0 with ``epsilon=0``, a NaN learning rate).

Without the failing op's values (the op could not be run again), rule 2 takes an ``Exp``
as an overflow (``exp`` of a finite number is never NaN) and anything else as
``forward``, and rule 4 takes the failure as a ``non-finite gradient op``.
"""

from __future__ import annotations

import math

import numpy as np

from stability.core.failures import KIND_CAUSE, Cause, Kind
from stability.train.site import XLA_ONLY, NanSite


def explosion_threshold(dtype: str) -> float:
    """sqrt(max) of ``dtype``: a gradient at least this large has a square that overflows."""
    return math.sqrt(float(np.finfo(np.dtype(dtype)).max))


def failure_cause(
    kind: str | None,
    site: NanSite | None,
    gradient_dtype: str = "float32",
    max_abs_grad: float | None = None,
) -> Cause:
    """The cause of a run's first failure, by the module's rule.

    ``kind`` is the row's ``failure_kind`` (None: no failure), ``site`` where it was
    found; ``max_abs_grad`` the failing step's largest |gradient|, used for an update
    failure when the replay did not name the weight.
    """
    if kind is None:
        return Cause.NONE
    if Kind(kind) in KIND_CAUSE:
        return KIND_CAUSE[Kind(kind)]
    where = site.where if site is not None else None
    if where in ("forward", "validation"):
        return _forward_cause(site)
    if where == "loss":
        return Cause.LOSS
    if where == "gradient":
        return _gradient_cause(site)
    if where == "weights":
        largest = site.max_abs_grad if site.max_abs_grad is not None else max_abs_grad
        if largest is not None and largest >= explosion_threshold(gradient_dtype):
            return Cause.GRADIENT_EXPLOSION
        return Cause.OPTIMIZER
    return Cause.FORWARD


def _gradient_cause(site: NanSite) -> Cause:
    evidence = site.evidence
    if (site.op and XLA_ONLY in site.op) or evidence is None:
        return Cause.NONFINITE_GRADIENT_OP
    if evidence.has_inf and not evidence.has_nan and not evidence.zero_denominator:
        return Cause.GRADIENT_EXPLOSION
    return Cause.NONFINITE_GRADIENT_OP


def _forward_cause(site: NanSite) -> Cause:
    evidence = site.evidence
    if evidence is None:
        exp = site.op and site.op.startswith("Exp ")
        return Cause.FORWARD_OVERFLOW if exp else Cause.FORWARD
    if evidence.has_nan and evidence.zero_denominator:
        return Cause.FORWARD_UNDERFLOW
    if evidence.has_inf:
        return Cause.FORWARD_OVERFLOW
    return Cause.FORWARD
