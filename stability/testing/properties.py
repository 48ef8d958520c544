"""The six conformance properties of a segment softmax, each a check of one input.

Each check takes the ``Implementation``, one drawn ``SoftmaxInput`` and the tolerance's
base ``ulps`` (``stability.testing.tolerance``), and returns None when the property holds,
else the paragraph describing the failure (``stability.testing.paragraph``):

- ``finite``: every output is finite;
- ``in_unit_interval``: every output lies in [0, 1];
- ``sums_to_one``: each segment with an edge taking part sums to 1 within
  ``(ulps + 2n) * eps``;
- ``matches_reference``: each output is within ``(ulps + n) * eps`` of the reference;
- ``gradient_finite`` and ``gradient_matches``: the gradient of ``sum(softmax * m)``
  (``m`` drawn in [-1, 1]) is finite and within ``2 * (ulps + 2n) * eps`` of the reference.

The reference is the max-shifted softmax computed in ``np.longdouble`` from the very logits
the implementation saw (``stability.testing.inputs``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stability.testing.assertions import nonfinite, segment_sums, unnormalized
from stability.testing.implementation import Implementation, check_output
from stability.testing.inputs import SoftmaxInput, reference_gradient, reference_softmax
from stability.testing.paragraph import describe_input, first_bad, raised_text
from stability.testing.tolerance import gradient_tolerance, value_tolerance

PROPERTIES = (
    "finite",
    "in_unit_interval",
    "sums_to_one",
    "matches_reference",
    "gradient_finite",
    "gradient_matches",
)
#: The properties an implementation without gradients cannot be checked on.
GRADIENT_PROPERTIES = ("gradient_finite", "gradient_matches")


def outputs(impl: Implementation, x: SoftmaxInput) -> tuple[np.ndarray | None, str | None]:
    """``impl``'s output ``[num_edges]`` on ``x``, or the paragraph saying why there is none."""
    try:
        return check_output(x, impl.forward(x), "output"), None
    except Exception as exc:
        return None, raised_text(exc, x)


def _gradient(impl: Implementation, x: SoftmaxInput) -> tuple[np.ndarray | None, str | None]:
    assert impl.gradient is not None
    try:
        gradient = impl.gradient(x)
        if gradient is None:
            return None, f"it has no gradient. {describe_input(x)}."
        return check_output(x, gradient, "gradient"), None
    except Exception as exc:
        return None, raised_text(exc, x)


def _sizes(x: SoftmaxInput) -> np.ndarray:
    """[num_edges]: the number of edges in each edge's segment."""
    return np.bincount(x.segment_ids, minlength=x.num_segments)[x.segment_ids]


def _finite(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = outputs(impl, x)
    if problem:
        return problem
    return first_bad(x, nonfinite(out), "a non-finite output", out, reference_softmax(x))


def _in_unit_interval(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = outputs(impl, x)
    if problem:
        return problem
    inside = (out >= 0) & (out <= 1)
    return first_bad(x, ~inside, "an output outside [0, 1]", out, reference_softmax(x))


def _sums_to_one(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = outputs(impl, x)
    if problem:
        return problem
    part = x.taking_part()
    off = unnormalized(out, x.segment_ids, x.num_segments, ulps=ulps, taking_part=part)
    if not off.any():
        return None
    segment = int(np.argmax(off))
    sums, _ = segment_sums(out, x.segment_ids, x.num_segments, part)
    edge = int(np.argmax((x.segment_ids == segment) & part))
    what = f"a segment summing to {float(sums[segment])!r}"
    return first_bad(x, np.arange(len(out)) == edge, what, out, reference_softmax(x))


def _matches_reference(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    out, problem = outputs(impl, x)
    if problem:
        return problem
    expected = reference_softmax(x)
    close = np.abs(out.astype(np.float64) - expected) <= value_tolerance(out.dtype, _sizes(x), ulps)
    return first_bad(x, ~close, "an output off the reference", out, expected)


def _gradient_finite(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    gradient, problem = _gradient(impl, x)
    if problem:
        return problem
    bad = nonfinite(gradient)
    return first_bad(x, bad, "a non-finite gradient", gradient, reference_gradient(x), True)


def _gradient_matches(impl: Implementation, x: SoftmaxInput, ulps: int) -> str | None:
    gradient, problem = _gradient(impl, x)
    if problem:
        return problem
    expected = reference_gradient(x)
    tolerance = gradient_tolerance(gradient.dtype, _sizes(x), ulps)
    close = np.abs(gradient.astype(np.float64) - expected) <= tolerance
    return first_bad(x, ~close, "a gradient off the reference", gradient, expected, True)


#: property -> its check
CHECKS: dict[str, Callable[[Implementation, SoftmaxInput, int], str | None]] = {
    "finite": _finite,
    "in_unit_interval": _in_unit_interval,
    "sums_to_one": _sums_to_one,
    "matches_reference": _matches_reference,
    "gradient_finite": _gradient_finite,
    "gradient_matches": _gradient_matches,
}
