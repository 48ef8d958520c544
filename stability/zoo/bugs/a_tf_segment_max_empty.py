"""TensorFlow #58123: "segment max does not output zero for empty segment".

Source: tensorflow/tensorflow issue #58123,
https://github.com/tensorflow/tensorflow/issues/58123 (related: #106602 and #118197, where the
GPU kernel of ``tf.math.unsorted_segment_max`` returns the same sentinel for a segment that
holds a NaN).

What users saw: a segment max returns ``-3.4028235e+38``, the lowest float32, for a segment
that no entry falls in (the report: ``tf.math.segment_max`` on GPU, whose documentation
promises 0 there). ``tf.math.unsorted_segment_max`` does so on every device by design: its
documentation says that for an empty segment "it outputs the smallest possible value for the
specific numeric type". Why it breaks a model that looks stable: a max-subtracted softmax is
safe for the entries of the segment the max was taken over, not for a value read against the
max of another set. Here a GAT layer with self-attention (GATConv's self-loop) scores each
node against itself at the node and against its neighbours on the edges, and takes the max
over the incoming edges only, as an edge-list softmax does. A node without incoming edges
gets the sentinel; its own score minus it is ``+3.4e38`` (still finite), ``exp`` of that is
inf, and ``inf / (inf + 0)`` is NaN: the first forward pass on a batch with such a node
fails. What the maintainers did: #58123 went to the kernels' owners (labels ``comp:gpu``,
``comp:ops``) and is closed; the unsorted segment max keeps the lowest value as its
documented empty-segment result, so the fix is the model's: take the max over every term the
softmax sums (the self score included), or guard an empty segment's max to 0 before the
subtraction.

The model is plain Keras; its case draws sparse ``generated`` graphs (at most 8 edges on 6-15
nodes), so most batches hold nodes that receive no edge.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class SelfAttention(keras.layers.Layer):
    """One round of attention over a node's incoming edges and the node itself.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``edges`` ``[num_edges, 1]``, ``senders``,
    ``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.lin = keras.layers.Dense(hidden, use_bias=False)
        self.score = keras.layers.Dense(1)
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        wh = self.lin(h)  # [num_nodes, hidden]
        wh_i, wh_j = tf.gather(wh, receivers), tf.gather(wh, senders)
        # [num_edges] neighbour scores and [num_nodes] self scores
        edge_score = tf.squeeze(self.score(tf.concat([wh_i, wh_j, edges], axis=-1)), -1)
        self_score = tf.squeeze(self.score(tf.concat([wh, wh, tf.zeros_like(wh[:, :1])], -1)), -1)
        # "stable" softmax: subtract each node's max over its incoming edges
        node_max = tf.math.unsorted_segment_max(edge_score, receivers, num_nodes)
        edge_weight = tf.exp(edge_score - tf.gather(node_max, receivers))
        self_weight = tf.exp(self_score - node_max)
        total = tf.math.unsorted_segment_sum(edge_weight, receivers, num_nodes) + self_weight
        alpha = edge_weight / tf.gather(total, receivers)  # [num_edges]
        alpha_self = self_weight / total  # [num_nodes]
        summed = tf.math.unsorted_segment_sum(alpha[:, None] * wh_j, receivers, num_nodes)
        return self.update(summed + alpha_self[:, None] * wh)


class GAT(keras.Model):
    """Embed the nodes, two rounds of self-and-neighbour attention, a sum over each graph's
    nodes and two outputs."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.rounds = [SelfAttention(hidden), SelfAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for layer in self.rounds:
            h = layer(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_tf_segment_max_empty(ctx):
    """GAT with a self term; its max over incoming edges is TF's lowest float at a node with none"""
    return Recipe(model=GAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_tf_segment_max_empty",
    source="tensorflow/tensorflow#58123",
    url="https://github.com/tensorflow/tensorflow/issues/58123",
    summary=(
        "a segment max returns the lowest float for an empty segment; a max-subtracted "
        "softmax with a self term reads it at a node without incoming edges, exp(self - "
        "lowest) = exp(3.4e38) = inf and inf/inf is NaN"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_tf_segment_max_empty",
    stage="forward",
    op="Exp",
    cause="forward overflow",
    fix=(
        "take the max over every term the softmax sums (the self score included), or guard "
        "an empty segment's max (the lowest float) to 0 before subtracting it"
    ),
    silent=False,
)
