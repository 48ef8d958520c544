import math

import numpy as np
import pytest
import tensorflow as tf

from stability.model.losses import robust_loss


def reference(y, mean, log_sigma):
    return np.mean(math.sqrt(2) * np.abs(mean - y) * np.exp(-log_sigma) + log_sigma)


def test_matches_formula():
    y = np.array([0.5, -1.0, 2.0])
    pred = np.array([[0.0, 0.1], [-1.5, -0.3], [2.5, 1.2]])
    got = robust_loss(tf.constant(y), tf.constant(pred)).numpy()
    assert got == pytest.approx(reference(y, pred[:, 0], pred[:, 1]), rel=1e-12)


def test_log_sigma_clip():
    y = np.array([0.0])
    pred = np.array([[1.0, -10.0]])
    got = robust_loss(tf.constant(y), tf.constant(pred), log_sigma_clip=(-4.0, 1.0)).numpy()
    assert got == pytest.approx(reference(y, pred[:, 0], np.array([-4.0])))


def test_overflows_for_very_negative_log_sigma():
    """exp(-log_sigma) overflows float32 once -log_sigma > 88.72: the loss, not the softmax."""
    pred = tf.constant([[1.0, -100.0]], tf.float32)
    assert not np.isfinite(robust_loss(tf.constant([0.0]), pred).numpy())
