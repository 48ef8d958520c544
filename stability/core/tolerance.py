"""How far from 1 a node's attention weights may sum: the one tolerance of the
normalization invariant, shared by the step guard and the conformance suite.

A node's ``d`` weights are rounded quotients whose sum is rounded ``d`` times: a correct
softmax is off 1 by at most about ``(d + 1) * eps`` (Higham, "Accuracy and Stability of
Numerical Algorithms", 4.2), ``eps`` the machine epsilon of the weights' dtype.
``TOLERANCE_FACTOR`` (4x) covers the rounding of the denominator's gather and of a mixed
policy's cast. The sum that is checked is accumulated in at least float32 and the in-degree
counted in float32 (exact to 2**24), so the check adds no float16 rounding of its own.

The bound grows with the in-degree, and in float16 it reaches 1 at in-degree 256, where a
dead segment (a sum of 0) would pass. ``MAX_TOLERANCE`` caps it: weights that sum to less
than a half, or more than one and a half, have lost or gained half the node's attention,
which is a failure whatever made it, rounding included.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: The tolerance in units of eps * in-degree (see the module docstring).
TOLERANCE_FACTOR = 4.0

#: The largest tolerance in any dtype and at any in-degree (see the module docstring).
MAX_TOLERANCE = 0.5


def machine_eps(dtype: object) -> float:
    """The machine epsilon of a float dtype (a TensorFlow or NumPy dtype, or its name)."""
    return float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).eps)


def normalization_tolerance(dtype: object, in_degree: object) -> object:
    """``min(TOLERANCE_FACTOR * eps(dtype) * in_degree, MAX_TOLERANCE)``: how far from 1 the
    weights of a node with ``in_degree`` incoming edges may sum (a tensor or array of
    in-degrees gives one of tolerances). float32: 4.8e-7 per incoming edge; float16:
    3.9e-3, up to the cap at in-degree 128. A node without incoming edges gets 0: its sum is
    an empty sum, exactly 0."""
    tolerance = (TOLERANCE_FACTOR * machine_eps(dtype)) * in_degree
    if isinstance(tolerance, tf.Tensor):
        return tf.minimum(tolerance, MAX_TOLERANCE)
    return np.minimum(tolerance, MAX_TOLERANCE)


def accumulation_dtype(dtype: object) -> tf.DType:
    """The dtype a sum of weights of ``dtype`` is accumulated in: float32 for narrower
    floats (float16, bfloat16), whose own rounding would otherwise grow with the in-degree;
    the dtype itself otherwise."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype.size < 4 else dtype
