"""Loss scaling on a float16 loss: the scaled loss overflows float16's 65504.

keras-team/keras#16552 (https://github.com/keras-team/keras/issues/16552), "Mix precision
leads to nan loss": a model that trained in float32 gave an inf loss from
``optimizer.get_scaled_loss`` (or NaN gradients after it) under ``mixed_float16``, "even
though use (get_scaled_loss, get_unscaled_gradients) or scale loss manually". Loss scaling
multiplies the loss by a large factor (Keras starts its dynamic scale at 2^15) so that
small float16 gradients do not flush to 0; it presumes the loss itself is float32. Under
``mixed_float16`` a model's last layer computes in float16 unless told otherwise, so its
predictions, the loss computed from them and the scaled loss are float16, and any loss
above 65504 / 32768 = 2 scales to inf. The issue was closed (labelled awaiting response)
with no change to Keras; the TensorFlow mixed-precision guide's rule is the answer: make
the model's outputs float32
(``dtype="float32"`` on the last layer), so that the loss and its scaling are float32.

The model is a plain Keras GNN under ``mixed_float16`` whose head keeps the policy's
float16, trained with the loss scaled by hand, as the reporter also tried: a Laplace
negative log-likelihood summed over the batch's graphs (the reporter's cross-entropy over
many classes starts above 2 as well), times 2^15, and the gradients divided by 2^15 before
the update.
"""

import math

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

LOSS_SCALE = 2.0**15  # the initial scale of Keras' LossScaleOptimizer


def laplace_nll(y_true, y_pred):
    """``sum(sqrt(2) |mean - y| exp(-log_sigma) + log_sigma)`` over the batch's graphs, in
    the predictions' dtype."""
    mean, log_sigma = y_pred[:, 0], y_pred[:, 1]
    y_true = tf.cast(y_true, y_pred.dtype)
    return tf.reduce_sum(math.sqrt(2.0) * tf.abs(mean - y_true) * tf.exp(-log_sigma) + log_sigma)


class ScaledLoss(keras.losses.Loss):
    """The loss times the loss scale, as ``get_scaled_loss`` computes it, in the model's
    compute dtype (float16 under ``mixed_float16``): the reporter's custom training loop
    called the loss on the head's float16 predictions. Keras' compiled loss would convert
    them to float32 first; a ``Loss`` of the compute dtype keeps them as the reporter had
    them, in ``run`` and in ``fit`` alike."""

    def __init__(self, dtype):
        super().__init__(name="scaled_laplace_nll", dtype=dtype)

    def call(self, y_true, y_pred):
        return laplace_nll(y_true, y_pred) * LOSS_SCALE


def unscale(gradients):
    """The gradients divided by the loss scale, as ``get_unscaled_gradients`` does."""
    return [g / LOSS_SCALE for g in gradients]


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), tf.cast(edges, h.dtype)], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class MixedPrecisionGNN(keras.Model):
    """Embed the node types, two convolutions, mean over each graph, a (mean, log sigma)
    head left at the policy's float16."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.head = keras.layers.Dense(2)  # float16 under mixed_float16: no dtype="float32"

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_b_fp16_loss_scaling(ctx):
    """mixed_float16 GNN with a float16 head, loss scaled by 2^15 by hand: inf loss"""
    return Recipe(
        model=MixedPrecisionGNN(ctx.hidden),
        optimizer=keras.optimizers.Adam(ctx.learning_rate),
        loss=ScaledLoss(keras.mixed_precision.Policy(ctx.dtype).compute_dtype),
        gradient_transform=unscale,
    )


BUG = ZooBug(
    name="b_fp16_loss_scaling",
    source="keras-team/keras#16552",
    url="https://github.com/keras-team/keras/issues/16552",
    summary=(
        "under mixed_float16 a float16 head makes the loss float16, and the loss scaled by "
        "2^15 overflows float16 as soon as the loss exceeds 2"
    ),
    fix_class="dtype",
    variant="zoo_b_fp16_loss_scaling",
    stage="loss",
    op="Mul",
    cause="loss",
    fix=(
        "keep the model's outputs float32 (dtype='float32' on the last layer), so the loss "
        "and its scaling are float32, as the TensorFlow mixed-precision guide says"
    ),
)
