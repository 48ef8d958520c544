"""Both segment softmaxes against a float64 NumPy reference, gradients included."""

import numpy as np
import pytest
import tensorflow as tf

from stability.model.softmax import get_softmax, naive_segment_softmax, stable_segment_softmax

# Node 0 has three incoming edges, node 1 one (a single-edge segment), node 2 none (isolated).
RECEIVERS = np.array([0, 0, 0, 1], dtype=np.int32)
NUM_NODES = 3


def reference_softmax(logits: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    out = np.zeros_like(logits, dtype=np.float64)
    for node in np.unique(receivers):
        mask = receivers == node
        shifted = logits[mask] - logits[mask].max()
        out[mask] = np.exp(shifted) / np.exp(shifted).sum()
    return out


def reference_gradient(alpha: np.ndarray, weights: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """d/d logits of sum(alpha * weights): alpha_i * (w_i - sum_k alpha_k w_k) per segment."""
    weighted = alpha * weights
    segment_mean = np.zeros(NUM_NODES)
    np.add.at(segment_mean, receivers, weighted)
    return alpha * (weights - segment_mean[receivers])


def run(softmax, logits: np.ndarray, weights: np.ndarray, dtype=tf.float32):
    a = tf.constant(logits.reshape(-1, 1), dtype)
    with tf.GradientTape() as tape:
        tape.watch(a)
        alpha = softmax(a, tf.constant(RECEIVERS), tf.constant(NUM_NODES))
        objective = tf.reduce_sum(alpha[:, 0] * tf.constant(weights, dtype))
    return alpha.numpy().ravel(), tape.gradient(objective, a).numpy().ravel()


@pytest.mark.parametrize("name", ["naive", "stable"])
@pytest.mark.parametrize(
    "logits",
    [
        pytest.param([0.1, -2.0, 3.0, 0.7], id="small"),
        pytest.param([40.0, 39.0, -10.0, 80.0], id="large-but-finite"),
        pytest.param([-5.0, -5.0, -5.0, 12.0], id="ties"),
    ],
)
def test_matches_float64_reference(name, logits):
    logits = np.array(logits)
    weights = np.array([0.3, -1.2, 2.0, 0.5])
    alpha, grad = run(get_softmax(name), logits, weights)
    expected = reference_softmax(logits, RECEIVERS)
    np.testing.assert_allclose(alpha, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, reference_gradient(expected, weights, RECEIVERS), atol=1e-5)
    assert alpha[3] == pytest.approx(1.0), "a single-edge segment must get all the weight"


def test_naive_overflows_and_stable_does_not():
    logits = np.array([100.0, 1.0, 0.0, 95.0])  # above log(float32 max) = 88.72
    naive, _ = run(naive_segment_softmax, logits, np.ones(4))
    stable, grad = run(stable_segment_softmax, logits, np.ones(4))
    assert not np.isfinite(naive).all(), "the naive softmax should overflow above 88.72"
    np.testing.assert_allclose(stable, reference_softmax(logits, RECEIVERS), atol=1e-6)
    assert np.isfinite(grad).all(), "stable softmax gradient included NaNs"


def test_isolated_node_receives_nothing():
    """A node with no incoming edge: no alpha, and the stable form keeps its max table finite."""
    a = tf.constant([[1.0], [2.0]])
    alpha = stable_segment_softmax(a, tf.constant([1, 1]), tf.constant(3))
    messages = tf.math.unsorted_segment_sum(alpha, tf.constant([1, 1]), 3).numpy().ravel()
    np.testing.assert_allclose(messages, [0.0, 1.0, 0.0], atol=1e-7)


def test_unknown_softmax_suggests():
    with pytest.raises(ValueError, match="Did you mean 'stable'"):
        get_softmax("stabel")
