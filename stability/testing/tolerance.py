"""How far from exact a segment softmax may be: a tolerance in ULPs of 1.0.

Every softmax value is at most 1, so the tolerance is counted in ``eps``, the dtype's
machine epsilon (one ULP of 1.0), and grows with ``n``, the number of edges in the
segment, because a sum of ``n`` terms may round ``n`` times. ``ulps`` is the base,
``DEFAULT_ULPS`` unless a caller passes another:

- a value is within ``(ulps + n) * eps`` of the reference;
- a segment sums to 1 within ``(ulps + 2n) * eps`` (at most ``MAX_TOLERANCE``, 0.5);
- a gradient is within ``2 * (ulps + 2n) * eps`` of the reference.
"""

from __future__ import annotations

import numpy as np

from stability.core.tolerance import BASE_ULPS, CONFORMANCE_FACTOR
from stability.core.tolerance import sum_tolerance as core_sum_tolerance

#: The tolerance's base, in ULPs of 1.0 (the step guard's too: ``stability.core.tolerance``).
DEFAULT_ULPS = BASE_ULPS


def _eps(dtype: np.dtype | str | type) -> float:
    return float(np.finfo(dtype).eps)


def value_tolerance(dtype: np.dtype | str | type, n: np.ndarray, ulps: int) -> np.ndarray:
    """``(ulps + n) * eps``: how far a softmax value may be from the reference; ``n`` is
    the number of edges in each value's segment (any shape)."""
    return (ulps + np.asarray(n)) * _eps(dtype)


def sum_tolerance(dtype: np.dtype | str | type, n: np.ndarray, ulps: int) -> np.ndarray:
    """``(ulps + 2n) * eps``, capped at ``MAX_TOLERANCE``: how far a segment of ``n`` edges
    may sum from 1 (``stability.core.tolerance.sum_tolerance``, the rule the step guard's
    looser tolerance shares)."""
    return core_sum_tolerance(np.dtype(dtype), np.asarray(n), ulps, CONFORMANCE_FACTOR)


def gradient_tolerance(dtype: np.dtype | str | type, n: np.ndarray, ulps: int) -> np.ndarray:
    """``2 * (ulps + 2n) * eps``: how far a gradient entry may be from the reference."""
    return 2 * (ulps + 2 * np.asarray(n)) * _eps(dtype)


def tolerance_text(ulps: int) -> str:
    """The stated tolerance, for reports."""
    return (
        f"values within ({ulps} + n) eps of the longdouble reference, segment sums within "
        f"({ulps} + 2n) eps of 1, gradients within 2 ({ulps} + 2n) eps; eps is the dtype's "
        "machine epsilon, n the number of edges in the segment"
    )
