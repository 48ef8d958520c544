"""A GNN of your own, in plain Keras, trained by the harness like the built-in variants.

A small GAT-like model written the way one writes it for ``model.fit``: a ``keras.Model``
subclass, ``Dense`` layers, ``tf.math.unsorted_segment_*`` over the edges, and the textbook
attention ``exp(a) / sum(exp(a))`` without the max subtracted. Nothing here comes from the
harness but ``Recipe`` and ``register_variant``. Run it with::

    python -m stability run examples/my_gat.toml --out reports/examples
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant


class EdgeAttention(keras.layers.Layer):
    """One round of attention over each node's incoming edges.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``edges`` ``[num_edges, 1]`` (the raw distance),
    ``senders``/``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.score = keras.layers.Dense(1)
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        pair = tf.concat([tf.gather(h, senders), tf.gather(h, receivers), edges], axis=-1)
        message = self.message(pair)  # [num_edges, hidden]
        score = tf.squeeze(self.score(tf.concat([message, edges], axis=-1)), -1)  # [num_edges]
        # The textbook softmax, as the seed wrote it: exp of the raw score, no max taken off.
        weight = tf.exp(score)
        total = tf.math.unsorted_segment_sum(weight, receivers, num_nodes)
        alpha = weight / tf.gather(total, receivers)
        summed = tf.math.unsorted_segment_sum(alpha[:, None] * message, receivers, num_nodes)
        return self.update(tf.concat([h, summed], axis=-1))


class MyGAT(keras.Model):
    """Embed the nodes, two rounds of attention, mean over each graph's nodes, and a head of
    two outputs (mean and log sigma, what the harness's robust loss takes)."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.rounds = [EdgeAttention(hidden), EdgeAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for attention in self.rounds:
            h = attention(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def my_gat(ctx):
    """my own GAT in plain Keras: Dense layers and a naive exp/sum attention"""
    return Recipe(model=MyGAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))
