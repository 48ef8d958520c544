"""Where a segment softmax stays finite: the logits at which its output first overflows
and underflows, found by bisection on the dtype's representable values.

The upper end is the highest ``x`` with ``[x, 0]`` in one segment finite, the lower the
lowest ``x`` with a single edge ``[x]`` finite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stability.testing.assertions import nonfinite
from stability.testing.implementation import Implementation
from stability.testing.inputs import SoftmaxInput
from stability.testing.properties import outputs


def _finite_at(impl: Implementation, x: SoftmaxInput) -> bool:
    out, problem = outputs(impl, x)
    return problem is None and not nonfinite(out).any()


def _single(dtype: str, logits: list[Any], mask: bool) -> SoftmaxInput:
    kind = np.dtype(dtype).type
    n = len(logits)
    return SoftmaxInput(
        np.array(logits, kind),
        np.zeros(n, np.int32),
        1,
        np.ones(n, bool) if mask else None,
        np.ones(n, kind),
    )


def _last_finite(dtype: str, ok: Callable[[Any], bool]) -> float:
    """The largest representable ``v >= 0`` with ``ok(v)``, by bisection on the bit patterns
    (ordered like the values for non-negative floats); assumes ``ok(0)``."""
    kind = np.dtype(dtype).type
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}").type
    low, high = 0, int(np.array(np.finfo(kind).max, kind).view(bits))
    if ok(np.array(high, bits).view(kind)):
        return float(np.finfo(kind).max)
    while high - low > 1:  # ok at low, not ok at high
        mid = (low + high) // 2
        if ok(np.array(mid, bits).view(kind)):
            low = mid
        else:
            high = mid
    return float(np.array(low, bits).view(kind))


def finite_logits(impl: Implementation, dtype: str) -> tuple[float, float] | None:
    """(lowest, highest) logit for which ``impl`` stays finite: the highest ``x`` with
    ``[x, 0]`` in one segment finite, the lowest with a single edge ``[x]`` finite; None if
    neither is finite at 0."""
    mask = impl.takes_mask

    def over(v: Any) -> bool:
        return _finite_at(impl, _single(dtype, [v, 0], mask))

    def under(v: Any) -> bool:
        return _finite_at(impl, _single(dtype, [-v], mask))

    if not (over(0) and under(0)):
        return None
    return -_last_finite(dtype, under), _last_finite(dtype, over)


def span_text(span: tuple[float, float] | None, dtype: str) -> str:
    """``[low, high]``, each the shortest text that reads back as the same ``dtype`` value."""
    if span is None:
        return "no logit (not even 0)"
    kind = np.dtype(dtype).type
    return f"[{kind(span[0])!s}, {kind(span[1])!s}]"  # str: the shortest text for the dtype
