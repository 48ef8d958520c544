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

from stability.core.failures import CAUSES, NO_FAILURE, SILENT_CAUSES
from stability.train.replay import XLA_ONLY, NanSite

assert set(CAUSES) >= SILENT_CAUSES

#: ``failure_kind`` values with a cause of their own, whatever the stage.
_KIND_CAUSE = {
    "input": "input",
    "normalization": "normalization",
    "masked_gradient": "masked gradient",
}


def explosion_threshold(dtype: str) -> float:
    """sqrt(max) of ``dtype``: a gradient at least this large has a square that overflows."""
    return math.sqrt(float(np.finfo(np.dtype(dtype)).max))


def failure_cause(
    kind: str | None,
    site: NanSite | None,
    gradient_dtype: str = "float32",
    max_abs_grad: float | None = None,
) -> str:
    """The cause of a run's first failure (one of ``CAUSES``), by the module's rule.

    ``kind`` is the row's ``failure_kind`` (None: no failure), ``site`` where it was
    found; ``max_abs_grad`` the failing step's largest |gradient|, used for an update
    failure when the replay did not name the weight.
    """
    if kind is None:
        return NO_FAILURE
    if kind in _KIND_CAUSE:
        return _KIND_CAUSE[kind]
    where = site.where if site is not None else None
    evidence = site.evidence if site is not None else None
    if where in ("forward", "validation"):
        return _forward_cause(site)
    if where == "loss":
        return "loss"
    if where == "gradient":
        if (site.op and XLA_ONLY in site.op) or evidence is None:
            return "non-finite gradient op"
        if evidence.has_inf and not evidence.has_nan and not evidence.zero_denominator:
            return "gradient explosion"
        return "non-finite gradient op"
    if where == "weights":
        largest = site.max_abs_grad if site.max_abs_grad is not None else max_abs_grad
        if largest is not None and largest >= explosion_threshold(gradient_dtype):
            return "gradient explosion"
        return "optimizer"
    return "forward"


def _forward_cause(site: NanSite) -> str:
    evidence = site.evidence
    if evidence is None:
        return "forward overflow" if site.op and site.op.startswith("Exp ") else "forward"
    if evidence.has_nan and evidence.zero_denominator:
        return "forward underflow (0/0)"
    if evidence.has_inf:
        return "forward overflow"
    return "forward"
