"""The seed's robust loss for a two-output head (mean, log sigma)."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf


def robust_loss(
    y_true: tf.Tensor,
    y_pred: tf.Tensor,
    log_sigma_clip: tuple[float, float] | None = None,
) -> tf.Tensor:
    """``mean(sqrt(2) * |mean - y| * exp(-log_sigma) + log_sigma)``, the seed's loss.

    A Laplace negative log-likelihood up to a constant. ``log_sigma_clip`` clips log sigma
    to ``[low, high]`` first, as the seed tried (the ``sigma_clip`` variant).

    Shapes: ``y_true`` ``[num_graphs]``, ``y_pred`` ``[num_graphs, 2]``; returns a scalar.
    """
    # [num_graphs]
    mean, log_sigma = y_pred[:, 0], y_pred[:, 1]
    if log_sigma_clip is not None:
        log_sigma = tf.clip_by_value(log_sigma, *log_sigma_clip)
    y_true = tf.cast(y_true, y_pred.dtype)
    per_graph = math.sqrt(2.0) * tf.abs(mean - y_true) * tf.exp(-log_sigma) + log_sigma
    return tf.reduce_mean(per_graph)


def prediction_need(loss: Any) -> tuple[int, str] | None:
    """(width, what the columns are) of the predictions ``[num_graphs, width]`` a built-in
    loss needs (``functools.partial`` of it included); None for a loss of the user's own,
    which is then only called on the probe's batch (``stability.train.probe``)."""
    loss = inspect.unwrap(loss)  # a guarded loss (``op_guard.guard_loss``) is the user's
    while isinstance(loss, functools.partial):
        loss = inspect.unwrap(loss.func)
    return (2, "mean and log sigma") if loss is robust_loss else None


def loss_predictions(loss: Callable[..., Any], predictions: tf.Tensor) -> tf.Tensor:
    """``predictions`` as Keras' compiled loss hands them to ``loss``, so that ``run`` and
    ``Model.fit`` compute the same loss: under a mixed policy the model computes in float16
    (or bfloat16), and Keras converts the predictions to the loss's dtype, ``floatx``
    (float32), before any loss function sees them. A ``keras.losses.Loss`` converts them
    to its own dtype when called, so it gets them as they are; a float32 or float64 model's
    predictions are left alone (no op is added).
    """
    low = predictions.dtype in (tf.float16, tf.bfloat16)
    if not low or isinstance(loss, keras.losses.Loss):
        return predictions
    return tf.cast(predictions, keras.config.floatx())
