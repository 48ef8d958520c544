"""Planted bugs for ``stability check`` (tests/test_check.py): one small message-passing
model, correct as ``planted_clean``, and one variant per property with a bug that breaks
that property alone, written the way such bugs are written in the wild."""

import keras
import tensorflow as tf

from stability import Recipe, register_variant


class PlantedNet(keras.Model):
    """Embed the nodes, one message-passing layer (messages from the sender's state and the
    distance, summed per receiver), a mean per graph, a dense head. ``bug`` plants one
    mistake (see the variants below)."""

    def __init__(self, hidden, bug="", **kwargs):
        super().__init__(**kwargs)
        self.bug = bug
        self.embed = keras.layers.Dense(hidden, activation="tanh")
        self.message = keras.layers.Dense(hidden, activation="tanh")
        self.score = keras.layers.Dense(1)
        self.head = keras.layers.Dense(2)  # mean and log sigma, for the robust loss

    def forward(self, inputs, training=False):
        nodes, edges = inputs["nodes"], inputs["edges"]
        senders, receivers = inputs["senders"], inputs["receivers"]
        num_nodes = tf.shape(nodes)[0]
        if self.bug == "node_index":  # the node's position in the batch as a feature
            index = tf.cast(tf.range(num_nodes), nodes.dtype)[:, None] / 10.0
            nodes = tf.concat([nodes[:, :-1], index], axis=-1)
        h = self.embed(nodes)
        distance = edges
        if self.bug == "exp_overflow":  # an unscaled exp of the distance
            distance = tf.exp(60.0 * edges)
        m = self.message(tf.concat([tf.gather(h, senders), distance], axis=-1))
        if self.bug == "hard_cutoff":  # messages switched off past 2.0, with no envelope
            m = m * tf.cast(edges < 2.0, m.dtype)
        # A cosine envelope: 1 at distance 0, 0 from the cutoff 4.0 on, smooth in between.
        fade = 0.5 * (tf.cos(3.14159265 * tf.minimum(edges, 4.0) / 4.0) + 1.0)
        if self.bug == "smooth_cutoff":  # correct: the whole message fades at the cutoff
            m = m * fade
        if self.bug == "partial_cutoff":  # only part of the message fades at the cutoff
            m = m * fade + 0.5 * tf.gather(h, senders)
        out = {}
        if self.bug == "first_edge":  # each node reads its first listed edge only
            ids = tf.range(tf.shape(receivers)[0])
            first = tf.math.unsorted_segment_min(ids, receivers, num_nodes)
            has = tf.math.unsorted_segment_max(tf.ones_like(ids), receivers, num_nodes) > 0
            first = tf.where(has, first, 0)
            picked = tf.gather(m, tf.maximum(tf.minimum(first, tf.shape(m)[0] - 1), 0))
            summed = tf.where(has[:, None], picked, tf.zeros_like(picked))
        elif self.bug == "unnormalized_attention":  # exp over (sum + 1): not a softmax
            logits = self.score(m)[:, 0]
            weights = tf.exp(logits)
            alpha = weights / (
                tf.gather(tf.math.unsorted_segment_sum(weights, receivers, num_nodes), receivers)
                + 1.0
            )
            summed = tf.math.unsorted_segment_sum(m * alpha[:, None], receivers, num_nodes)
            out = {"alpha": [alpha], "logits": [logits], "receivers": [receivers]}
        else:
            summed = tf.math.unsorted_segment_sum(m, receivers, num_nodes)
        h = h + summed
        if self.bug == "batch_norm":  # normalized by the whole batch's statistics
            h = (h - tf.reduce_mean(h, axis=0)) / (tf.math.reduce_std(h, axis=0) + 1e-3)
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        if self.bug == "cancellation":  # std as sqrt(E[x^2] - E[x]^2) of large values
            shifted = pooled + 3000.0
            var = (
                tf.reduce_mean(shifted**2, axis=-1, keepdims=True)
                - tf.reduce_mean(shifted, axis=-1, keepdims=True) ** 2
            )
            pooled = tf.concat([pooled, tf.sqrt(tf.maximum(var, 0.0) + 1.0)], axis=-1)
        if self.bug == "segment_cancellation":  # a graph norm's variance as E[x^2] - E[x]^2
            graph, n = inputs["node_graph"], inputs["num_graphs"]
            shifted = h + 3000.0
            mean = tf.math.unsorted_segment_mean(shifted, graph, n)
            var = tf.math.unsorted_segment_mean(shifted**2, graph, n) - mean**2
            pooled = tf.concat([pooled, tf.sqrt(tf.maximum(var, 0.0) + 1.0)], axis=-1)
        return {"predictions": self.head(pooled), **out}

    def call(self, inputs, training=False):
        return self.forward(inputs, training=training)["predictions"]


def _planted(bug):
    def build(ctx):
        return Recipe(
            model=PlantedNet(ctx.hidden, bug), optimizer=keras.optimizers.Adam(ctx.learning_rate)
        )

    return build


for _bug in (
    "",
    "node_index",
    "exp_overflow",
    "hard_cutoff",
    "partial_cutoff",
    "smooth_cutoff",
    "first_edge",
    "unnormalized_attention",
    "batch_norm",
    "cancellation",
    "segment_cancellation",
):
    register_variant(
        _planted(_bug),
        name=f"planted_{_bug or 'clean'}",
        description=f"the planted model, bug: {_bug or 'none'}",
    )
