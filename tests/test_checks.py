"""The step's cheap checks: what they rely on in TensorFlow, and the invariant's tolerance."""

import numpy as np
import pytest
import tensorflow as tf

from stability.core.tolerance import MAX_TOLERANCE, normalization_tolerance, sum_tolerance
from stability.model.softmax import naive_segment_softmax, stable_segment_softmax
from stability.train.checks import (
    attention_ok,
    attention_sums,
    finite_given,
    finite_max,
    normalization_site,
)
from stability.train.forward import max_abs


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


@pytest.mark.parametrize(
    ("values", "finite"),
    [
        pytest.param([1.0, -3.0], True, id="finite"),
        pytest.param([1.0, np.nan], False, id="nan"),
        pytest.param([1.0, np.inf], False, id="inf"),
        pytest.param([-np.inf], False, id="minus-inf"),
        pytest.param([], True, id="no-elements"),
    ],
)
def test_a_max_over_no_elements_is_finite(values, finite):
    """The logits of a batch without edges are empty: their max |logit| is -inf, and the
    check must not call that a non-finite forward pass (an edgeless graph is data)."""
    tensors = [tf.constant(values, tf.float32, shape=[len(values), 1])]
    assert bool(finite_max(max_abs(tensors), tensors).numpy()) is finite
    assert bool(finite_max(max_abs(tensors), tensors, exact=True).numpy()) is finite


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


@pytest.mark.parametrize("degree", [256, 4096])
def test_a_float16_dead_segment_is_caught_at_high_in_degree(degree):
    """4 eps d reaches 1 at in-degree 256 in float16: uncapped, a dead segment (sum 0)
    passed. The cap keeps it a failure at any in-degree, and the float32 sum and count
    keep a correct float16 segment of the same degree passing."""
    receivers = tf.zeros([degree], tf.int32)
    assert normalization_tolerance("float16", float(degree)) <= MAX_TOLERANCE
    dead = tf.zeros([degree, 1], tf.float16)
    assert not attention_ok([dead], [receivers]).numpy()
    site = normalization_site("forward", [dead.numpy()], [receivers.numpy()], ["layer"])
    assert site is not None and "sum to 0 at 1 of 1" in site.op
    logits = tf.constant(np.random.default_rng(0).uniform(-3, 3, (degree, 1)), tf.float16)
    alpha = stable_segment_softmax(logits, receivers, 1)
    assert attention_ok([alpha], [receivers]).numpy(), "a correct float16 softmax was flagged"


def test_the_in_degree_is_counted_exactly_past_float16s_integers():
    """float16 counts 2049 ones as 2048; a uniform softmax over 4097 edges, each weight
    rounded to float16, is a correct one and passes."""
    degree = 4097
    receivers = tf.zeros([degree], tf.int32)
    sums, counts = attention_sums(
        tf.fill([degree, 1], tf.constant(1 / degree, tf.float16)), receivers
    )
    assert counts.numpy()[0, 0] == degree
    assert abs(float(sums.numpy()[0, 0]) - 1.0) < normalization_tolerance("float16", degree)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_a_softmax_that_passes_conformance_is_never_flagged_in_training(dtype):
    """The conformance suite's sum tolerance is at most the step guard's at every in-degree,
    so the suite and training cannot disagree in that direction."""
    degrees = np.concatenate([np.arange(0, 300), np.geomspace(300, 1e7, 50)])
    conformance = sum_tolerance(dtype, degrees)
    training = normalization_tolerance(dtype, degrees)
    assert (conformance <= training).all()
    assert (training <= MAX_TOLERANCE).all() and training[1] > 0
