"""How far from 1 a node's attention weights may sum: the tolerances of the normalization
invariant, one rule for the step guard and the conformance suite.

A node's ``d`` weights are rounded quotients whose sum is rounded ``d`` times: a correct
softmax is off 1 by at most about ``(d + 1) * eps`` (Higham, "Accuracy and Stability of
Numerical Algorithms", 4.2), ``eps`` the machine epsilon of the weights' dtype. Both
tolerances are ``(ulps + factor * d) * eps``, from the same base (``BASE_ULPS``):

- the conformance suite, a property test of one softmax against a longdouble reference,
  allows ``CONFORMANCE_FACTOR`` (2) per edge: the rounding of the sum and of the quotients;
- the step guard, an alarm inside training, allows ``TOLERANCE_FACTOR`` (4) per edge, which
  also covers the rounding of the denominator's gather and of a mixed policy's cast.

So a softmax that passes the conformance suite is never flagged in training
(``tests/test_checks.py`` checks the order). The sum that is checked is accumulated in at
least float32 and the in-degree counted in float32 (exact to 2**24), so the check adds no
float16 rounding of its own.

Both grow with the in-degree, and in float16 ``4 * eps * d`` reaches 1 at in-degree 256,
where a dead segment (a sum of 0) would pass. ``MAX_TOLERANCE`` caps them: weights that sum
to less than a half, or more than one and a half, have lost or gained half the node's
attention, which is a failure whatever made it, rounding included.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: The base of both tolerances, in ULPs of 1.0.
BASE_ULPS = 8

#: The step guard's tolerance per incoming edge, in ULPs of 1.0.
TOLERANCE_FACTOR = 4.0

#: The conformance suite's tolerance per edge of the segment, in ULPs of 1.0.
CONFORMANCE_FACTOR = 2.0

#: The largest tolerance in any dtype and at any in-degree (see the module docstring).
MAX_TOLERANCE = 0.5


def machine_eps(dtype: object) -> float:
    """The machine epsilon of a float dtype (a TensorFlow or NumPy dtype, or its name)."""
    return float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).eps)


def sum_tolerance(
    dtype: object, in_degree: object, ulps: float = BASE_ULPS, factor: float = CONFORMANCE_FACTOR
) -> object:
    """``min((ulps + factor * in_degree) * eps(dtype), MAX_TOLERANCE)``: how far from 1 the
    weights of a node (a segment) with ``in_degree`` edges may sum; a tensor or array of
    in-degrees gives one of tolerances. The conformance suite's by default."""
    tolerance = (ulps + factor * in_degree) * machine_eps(dtype)
    if isinstance(tolerance, tf.Tensor):
        return tf.minimum(tolerance, MAX_TOLERANCE)
    return np.minimum(tolerance, MAX_TOLERANCE)


def normalization_tolerance(dtype: object, in_degree: object) -> object:
    """The step guard's tolerance, ``sum_tolerance`` with ``TOLERANCE_FACTOR``: float32
    9.5e-7 plus 4.8e-7 per incoming edge; float16 7.8e-3 plus 3.9e-3 per edge, up to the cap
    at in-degree 126."""
    return sum_tolerance(dtype, in_degree, BASE_ULPS, TOLERANCE_FACTOR)


def accumulation_dtype(dtype: object) -> tf.DType:
    """The dtype a sum of weights of ``dtype`` is accumulated in: float32 for narrower
    floats (float16, bfloat16), whose own rounding would otherwise grow with the in-degree;
    the dtype itself otherwise."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype.size < 4 else dtype
