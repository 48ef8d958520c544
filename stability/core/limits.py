"""Where ``exp`` leaves a dtype's range: the lines a max |attention logit| must stay under.

Two lines per dtype, both in units of |logit|:

- **overflow**: ``exp(x)`` is ``inf`` for ``x > log(max)`` (88.72 for float32, 709.78 for
  float64); the naive softmax then computes ``inf / inf = NaN``.
- **underflow**: TensorFlow on CPU flushes denormals to zero, so ``exp(x) == 0`` already
  for ``x < log(tiny)`` (-87.34 for float32, -708.40 for float64), not at the denormal limit
  (-103.97). When every logit into a node is below it, the naive softmax computes
  ``0 / 0 = NaN``. ``tests/test_limits.py`` measures this on the machine that runs it.

The history records max |logit| (the sign is lost), so a run's distance to NaN is its
distance to the nearer, lower line: the underflow one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stability.core.errors import StabilityError

#: The float dtypes whose limits ``exp_limits`` gives, narrowest first.
FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True)
class ExpLimits:
    """The |logit| at which ``exp`` overflows and (flushed to zero) underflows."""

    dtype: str
    overflow: float
    underflow: float

    @property
    def nearest(self) -> tuple[str, float]:
        """The lower line, (name, value): the first a growing |logit| reaches."""
        if self.underflow <= self.overflow:
            return "underflow", self.underflow
        return "overflow", self.overflow


def exp_limits(dtype: str) -> ExpLimits:
    """The ``exp`` lines of a float dtype or policy name (``float32``, ``mixed_float16``)."""
    # Under a mixed policy (``mixed_float16``) the logits are computed in the low dtype.
    compute = dtype.removeprefix("mixed_")
    try:
        info = np.finfo(np.dtype(compute))
    except (TypeError, ValueError):
        raise StabilityError(f"dtype {dtype!r} is not a float dtype numpy knows") from None
    # log(tiny), the smallest normal number, not log of the smallest denormal: denormal
    # results of exp are flushed to zero (see the module docstring).
    return ExpLimits(dtype, float(np.log(info.max)), float(-np.log(info.tiny)))
