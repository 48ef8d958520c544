"""The step guard's statistics: figures that do not overflow where the run's values do not."""

import numpy as np
import pytest
import tensorflow as tf

from stability.train import guard
from stability.train.forward import completed, stats_dtype
from stability.train.guard import StepReport


def checked(loss, gradients, dtype=tf.float32, weights=(1.0,)):
    out = completed({"predictions": tf.constant([0.0], dtype)})
    before = guard.before_update(out, {}, tf.constant(loss, dtype), gradients, dtype=dtype)
    ok, largest = guard.after_update([tf.Variable(list(weights), dtype=dtype)], [], dtype=dtype)
    return StepReport.of(guard.report(before, ok, largest).numpy())


def test_a_norm_whose_squares_overflow_float32_is_rescaled_not_inf():
    """Gradients of 1e20 are finite; the float32 sum of their squares (1e40) is not."""
    gradients = [tf.constant([1e20, -1e20], tf.float32), tf.constant([[3e19]], tf.float32)]
    assert not np.isfinite(tf.linalg.global_norm(gradients).numpy()), "guards the test"
    report = checked(1.0, gradients)
    assert report.ok
    expected = np.sqrt(2 * 1e40 + 9e38)
    assert report.stat("raw_grad_norm") == pytest.approx(expected, rel=1e-5)
    assert report.stat("grad_norm") == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_gradient_keeps_its_norm_non_finite(bad):
    report = checked(1.0, [tf.constant([1e20, bad], tf.float32)])
    assert not report.passed("gradient")
    assert not np.isfinite(report.stat("raw_grad_norm"))


def test_a_float64_models_figures_are_float64():
    """A float64 loss of 1e300 is finite: float32 statistics recorded it as inf, and rounded
    every other figure to float32."""
    assert stats_dtype([tf.Variable([1.0], dtype=tf.float64)]) == tf.float64
    assert stats_dtype([tf.Variable([1.0], dtype=tf.float32)]) == tf.float32
    report = checked(1e300, [tf.constant([0.1], tf.float64)], dtype=tf.float64)
    assert report.ok
    assert report.stat("loss") == 1e300
    assert report.stat("max_abs_grad") == 0.1  # float32 would give 0.10000000149011612
