"""Non-finite detection: one fused check per training step, and naming what it found.

A "NaN" here is any non-finite value (NaN or +-Inf). The check runs inside the compiled
training step and returns one boolean per stage, in causal order: the forward pass, the
loss, the gradients, and the weights after the update. The first stage that is not finite
is where the run's first NaN came from.

Checking the loss alone is not enough: inside ``tf.function`` a ``Dense(relu)`` fed NaN
returns 0 (the fused MatMul+BiasAdd+Relu kernel), so NaN node states and NaN weights can
leave the loss finite. Keras' ``TerminateOnNaN`` looks at the loss only and misses that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from stability.train.replay import NanSite

#: The stages ``finite_flags`` checks, in its output order.
STAGES = ("forward", "loss", "gradient", "weights")


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """A scalar bool: every element of every tensor is finite (True for no tensors)."""
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def finite_flags(
    forward: Sequence[tf.Tensor],
    loss: tf.Tensor,
    gradients: Sequence[tf.Tensor],
    weights: Sequence[tf.Variable],
) -> tf.Tensor:
    """``[4]`` bool: are the forward tensors, loss, gradients and weights all finite?"""
    return tf.stack(
        [all_finite(forward), all_finite([loss]), all_finite(gradients), all_finite(weights)]
    )


def first_failure(flags: np.ndarray) -> str | None:
    """The first stage whose flag is False, or None when the step was finite."""
    for stage, ok in zip(STAGES, flags, strict=True):
        if not ok:
            return stage
    return None


def nonfinite_weights(weights: Sequence[tf.Variable]) -> list[str]:
    """The paths of the weights that hold a non-finite value."""
    return [w.path for w in weights if not np.isfinite(w.numpy()).all()]


def nonfinite_weight_site(weights: Sequence[tf.Variable], optimizer: object) -> NanSite:
    """The site for weights that an update made non-finite from finite gradients."""
    bad = nonfinite_weights(weights)
    layer = bad[0].rsplit("/", 1)[0] if bad else None
    return NanSite("weights", layer, f"{type(optimizer).__name__} update")
