"""What XLA does to the naive softmax, and how a run under jit_compile names it.

Measured on the machine that runs the tests: XLA rewrites the division's gradient
``(-x / y) / y`` as ``-x / (y * y)``, so once every logit into a node is below
ln(float32's smallest normal) / 2 = -43.67, ``y * y`` flushes to 0 and the gradient is
-inf, while TensorFlow without XLA stays finite down to the forward pass's own limit,
-87.34. Above ln(float32 max) / 2 = +44.36 the same rewrite makes it wrong, but finite.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from stability.model.recipe import Variant
from stability.model.softmax import naive_segment_softmax
from stability.model.variants import create_recipe, get_variant
from stability.train.config import TrainConfig
from stability.train.site import XLA_ONLY
from stability.train.trainer import Trainer

RECEIVERS = tf.constant([0, 0, 1, 1])
WEIGHTS = tf.constant([[1.0], [2.0], [3.0], [4.0]])
#: Half of float32's flush-to-zero line for exp: where y * y leaves the normal range.
HALF_LINE = math.log(np.finfo(np.float32).tiny) / 2


def softmax_gradient(logits):
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = tf.reduce_sum(naive_segment_softmax(logits, RECEIVERS, 2) * WEIGHTS)
    return tape.gradient(loss, logits)


def gradient(logit, jit_compile):
    """The gradient for node 0 with logits (logit, logit - 1); node 1 is ordinary."""
    logits = tf.constant([[logit], [logit - 1.0], [0.0], [1.0]])
    return tf.function(softmax_gradient, jit_compile=jit_compile)(logits).numpy()[:2, 0]


@pytest.mark.parametrize("logit", [HALF_LINE - 2.0, -60.0, -80.0])
def test_below_half_the_line_the_gradient_is_finite_without_xla_and_not_with_it(logit):
    plain = gradient(logit, jit_compile=False)
    assert np.isfinite(plain).all(), f"no XLA at {logit}: {plain}"
    np.testing.assert_allclose(plain, gradient(0.0, jit_compile=False), rtol=1e-4)
    xla = gradient(logit, jit_compile=True)
    assert not np.isfinite(xla).all(), f"XLA stayed finite at {logit}: {xla}"


def test_above_half_the_line_xla_agrees():
    """Guards the test above: XLA's gradient is right where y * y is still normal."""
    logit = HALF_LINE + 2.0
    np.testing.assert_allclose(
        gradient(logit, jit_compile=True), gradient(logit, jit_compile=False), rtol=1e-4
    )


def low_logits(ctx):
    """Every attention logit is -60: the forward pass and the gradient without XLA are
    finite, the gradient under XLA is not."""
    recipe = create_recipe(ctx)
    net = recipe.model.passes[0].net
    net.kernel.assign(np.zeros(net.kernel.shape, np.float32))
    net.bias.assign([-60.0])
    return recipe


def clipped_low_logits(ctx):
    """``low_logits`` with grad_clip's transform, which spreads one bad gradient to all."""
    recipe = get_variant("grad_clip").build(ctx)
    net = recipe.model.passes[0].net
    net.kernel.assign(np.zeros(net.kernel.shape, np.float32))
    net.bias.assign([-60.0])
    return recipe


def first_step(dataset, jit_compile, build=low_logits):
    config = TrainConfig(
        seed=0, batch_size=16, epochs=1, hidden=8, dtype="float32", jit_compile=jit_compile
    )
    return Trainer(Variant("planted", "test-only", build), dataset, config).run()


@pytest.mark.parametrize("build", [low_logits, clipped_low_logits])
def test_a_jit_run_names_the_layer_of_a_failure_only_xla_makes(build, tiny_dataset):
    result = first_step(tiny_dataset, jit_compile=True, build=build)
    assert (result.first_nan_epoch, result.first_nan_step) == (1, 1)
    assert result.first_nan_where == "gradient"
    assert result.first_nan_layer.endswith("message_passing_0/net")
    assert result.first_nan_op == XLA_ONLY


def test_the_same_plant_without_xla_trains_on(tiny_dataset):
    """Guards the test above: the failure is XLA's, not the plant's."""
    result = first_step(tiny_dataset, jit_compile=False)
    assert result.first_nan_step is None or result.first_nan_step > 1


#: Where y * y overflows float32: ln(sqrt(float32 max)) = 44.36.
OVERFLOW_HALF_LINE = math.log(np.finfo(np.float32).max) / 2


def test_above_half_the_overflow_line_xla_is_finite_but_wrong():
    """y * y overflows to inf, so -x / (y * y) is 0 instead of the true term: no NaN to see.
    The softmax does not see a shift of every logit, so the true gradient is the one at 0."""
    logit = OVERFLOW_HALF_LINE + 4.0
    truth = gradient(0.0, jit_compile=False)
    np.testing.assert_allclose(gradient(logit, jit_compile=False), truth, rtol=1e-4)
    xla = gradient(logit, jit_compile=True)
    assert np.isfinite(xla).all()
    assert np.abs(xla - truth).max() > 0.1, f"XLA's gradient {xla} is right at {logit}"
