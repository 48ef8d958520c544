"""A softplus standard-deviation head under a Gaussian negative log-likelihood: the
softplus underflows to (almost) 0 and the loss divides by it.

mllam/neural-lam#537 (https://github.com/mllam/neural-lam/pull/537), "Fix: prevent variance
underflow causing NaN losses": neural-lam's graph-based weather models predict a standard
deviation through a softplus and train on the Gaussian negative log-likelihood; "softplus
activation can produce zero values for very negative inputs, leading to division-by-zero
and NaN losses during training". The pull request clamped the predicted standard deviation
to at least 1e-6 before the loss (it was closed unmerged). In float32 softplus(x) is
``exp(x)`` below about -16, a subnormal below -87 and exactly 0 below -104, and the
likelihood overflows long before sigma is 0: with a residual of order 10, the square of
``(y - mu) / sigma`` overflows for sigma below ~5e-19 (x < -42), the division itself below
~3e-38, and ``log(sigma)`` is -inf only at exactly 0. So the first non-finite op is the
``Square``, unless a single step takes sigma all the way below 3e-38.

The model is a plain Keras GNN whose head outputs a mean and ``softplus(raw)`` as the
standard deviation, trained on ``log(sigma) + ((y - mu) / sigma)^2 / 2``. Its edge
messages read the raw distances, and the ``generated`` data set's rare outlier distances
(up to 2000) make the head's raw output swing by tens per update, so within a few steps it
lands far below 0 for some graph: the forward stays finite (softplus returns a tiny
sigma) and the loss is inf.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


def gaussian_nll(y_true, y_pred):
    """``mean(log(sigma) + ((y - mu) / sigma)^2 / 2)``; ``y_pred`` is ``[num_graphs, 2]``,
    the mean and the standard deviation."""
    mu, sigma = y_pred[:, 0], y_pred[:, 1]
    y_true = tf.cast(y_true, y_pred.dtype)
    return tf.reduce_mean(tf.math.log(sigma) + 0.5 * tf.square((y_true - mu) / sigma))


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), edges], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class ProbabilisticGNN(keras.Model):
    """Embed the node types, two convolutions, sum over each graph, a head of a mean and a
    softplus standard deviation."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.mean = keras.layers.Dense(1)
        self.std = keras.layers.Dense(1, activation="softplus")

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return tf.concat([self.mean(pooled), self.std(pooled)], axis=-1)


@register_variant
def zoo_b_softplus_logsigma(ctx):
    """softplus std head under a Gaussian NLL: sigma underflows, the loss divides by it"""
    return Recipe(
        model=ProbabilisticGNN(ctx.hidden),
        optimizer=keras.optimizers.Adam(ctx.learning_rate),
        loss=gaussian_nll,
    )


BUG = ZooBug(
    name="b_softplus_logsigma",
    source="mllam/neural-lam#537",
    url="https://github.com/mllam/neural-lam/pull/537",
    summary=(
        "a softplus standard deviation underflows to ~0 for very negative inputs, and the "
        "Gaussian NLL's ((y - mu) / sigma)^2 overflows"
    ),
    fix_class="op guard",
    variant="zoo_b_softplus_logsigma",
    stage="loss",
    op="Square",
    cause="loss",
    fix="clamp the predicted standard deviation to at least 1e-6 before the loss",
)
