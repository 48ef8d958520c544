"""The exp lines drawn in the reports, checked against what TensorFlow computes here."""

import numpy as np
import pytest
import tensorflow as tf

from stability.core.errors import StabilityError
from stability.core.limits import exp_limits


def _first_zero(dtype: str, low: float, high: float) -> float:
    """Bisect for the x in [low, high] where tf.exp(-x) first becomes exactly 0."""
    assert tf.exp(tf.constant(-low, dtype)).numpy() > 0
    assert tf.exp(tf.constant(-high, dtype)).numpy() == 0
    for _ in range(60):
        mid = (low + high) / 2
        if tf.exp(tf.constant(-mid, dtype)).numpy() > 0:
            low = mid
        else:
            high = mid
    return high


def _first_inf(dtype: str, low: float, high: float) -> float:
    for _ in range(60):
        mid = (low + high) / 2
        if np.isfinite(tf.exp(tf.constant(mid, dtype)).numpy()):
            low = mid
        else:
            high = mid
    return high


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_underflow_line_is_where_tf_exp_flushes_to_zero(dtype):
    limits = exp_limits(dtype)
    measured = _first_zero(dtype, 10.0, 800.0 if dtype == "float64" else 110.0)
    assert measured == pytest.approx(limits.underflow, abs=0.01), (
        f"tf.exp({dtype}) is 0 below -{measured:.4f}, the report draws -{limits.underflow:.4f}"
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_overflow_line_is_where_tf_exp_overflows(dtype):
    limits = exp_limits(dtype)
    measured = _first_inf(dtype, 10.0, 800.0 if dtype == "float64" else 110.0)
    assert measured == pytest.approx(limits.overflow, abs=0.01)


def test_float32_values_and_the_nearer_line():
    limits = exp_limits("float32")
    assert round(limits.overflow, 2) == 88.72 and round(limits.underflow, 2) == 87.34
    assert limits.nearest == ("underflow", limits.underflow)


def test_float64_values_the_seed_and_claims_md_name():
    """The seed's "e^709": float64's overflow line, and its whole-segment underflow line."""
    limits = exp_limits("float64")
    assert round(limits.overflow, 2) == 709.78 and round(limits.underflow, 2) == 708.40
    assert limits.nearest == ("underflow", limits.underflow)


def test_unknown_dtype_is_a_stability_error():
    with pytest.raises(StabilityError, match="float dtype"):
        exp_limits("int8x")


def test_mixed_policy_uses_its_compute_dtype():
    assert round(exp_limits("mixed_float16").overflow, 2) == 11.09
