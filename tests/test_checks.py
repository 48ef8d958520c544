"""The step's cheap checks: what they rely on in TensorFlow, and the invariant's tolerance."""

import numpy as np
import pytest
import tensorflow as tf

from stability.model.softmax import naive_segment_softmax, stable_segment_softmax
from stability.train.checks import attention_ok, finite_given


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_reductions_the_checks_read_propagate_nan_and_inf(jit_compile, bad):
    """finite_given reads the gradients' global norm and the weights' max |w|: the norm
    must be non-finite when one element is, with or without XLA; the max only without XLA
    (XLA's max drops NaN, so a step compiled with XLA checks the weights exactly)."""
    tensors = [tf.constant([1.0, 2.0]), tf.constant([[3.0, bad], [0.0, 1.0]])]

    @tf.function(jit_compile=jit_compile)
    def summaries(tensors):
        largest = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(t)) for t in tensors]))
        return tf.linalg.global_norm(tensors), largest

    norm, largest = summaries(tensors)
    assert not np.isfinite(norm.numpy())
    if not jit_compile:
        assert not np.isfinite(largest.numpy())


def test_an_overflowing_summary_falls_back_to_the_exact_check():
    huge = [tf.constant([1e20, -1e20], tf.float32)]
    norm = tf.linalg.global_norm(huge)
    assert not np.isfinite(norm.numpy()), "guards the test: the norm must overflow"
    assert finite_given(norm, huge).numpy()
    assert not finite_given(norm, [tf.constant([np.nan])]).numpy()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("softmax", [naive_segment_softmax, stable_segment_softmax])
def test_a_correct_softmax_is_never_flagged(dtype, softmax):
    """No false alarm: segments of in-degree 1 to 64, logits in the dtype's safe range."""
    rng = np.random.default_rng(0)
    degrees = np.arange(1, 65)
    receivers = np.repeat(np.arange(len(degrees)), degrees).astype(np.int32)
    scale = 5.0 if dtype == "float16" else 30.0
    for _ in range(20):
        logits = rng.uniform(-scale, scale, size=(len(receivers), 1)).astype(dtype)
        alpha = softmax(tf.constant(logits), tf.constant(receivers), len(degrees) + 1)
        assert attention_ok([alpha], [tf.constant(receivers)]).numpy()


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([0.5, 0.5, 1.0], True),
        ([0.0, 0.0, 1.0], False),  # a dead segment
        ([np.nan, 0.5, 1.0], False),
        ([0.5, 0.5, 0.999], False),
        ([0.5, 0.5 + 1e-7, 1.0], True),  # rounding
    ],
)
def test_the_invariant_is_sum_to_one_per_receiver(weights, expected):
    alpha = tf.constant(np.array(weights, np.float32)[:, None])
    receivers = tf.constant([0, 0, 2])  # node 1 has no incoming edge
    assert bool(attention_ok([alpha], [receivers]).numpy()) is expected
