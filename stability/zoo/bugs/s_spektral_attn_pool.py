"""Spektral's ``GlobalAttnSumPool`` in disjoint mode: one softmax over every node of the
batch, so a graph's readout depends on the graphs it is batched with.

Source: danielegrattarola/spektral issue #302,
https://github.com/danielegrattarola/spektral/issues/302, "GlobalAttnSumPool is calculating
softmax over all samples in batch in disjoint mode."

What the user saw: reading ``GlobalAttnSumPool`` they noticed that in disjoint mode (a batch
is one disconnected graph plus a graph index ``I`` per node) the attention weights of the
nodes of one graph did not sum to 1 (``tf.math.segment_sum(attn_coeff, I)`` was not a vector
of ones): "we are mixing together information from different samples in batch". Nothing is
non-finite. The cause: the layer computes ``attn_coeff = K.softmax(K.dot(X, a))`` over the
node axis of the whole batch, then ``tf.math.segment_sum(attn_coeff[:, None] * X, I)`` per
graph; the normalizing sum runs over every graph of the batch, so a graph's pooled vector is
scaled by its share of the batch's total attention, which changes with its batch-mates. What
the maintainer changed (commit 570cb91, "Fix bug in GlobalAttnSumPool that caused the readout
to apply attention to the full disjoint batch (see issue #302)"): in disjoint mode the
weights are ``ops.unsorted_segment_softmax(attn_coeff, I, ...)``, a softmax per graph.

The model is a Spektral-style disjoint graph network: two sum-aggregation convolutions over
the incoming edges, then the layer as it was before the fix, then a (mean, log sigma) head.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges: ``[N, hidden]``."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), edges], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class GlobalAttnSumPool(keras.layers.Layer):
    """Spektral's ``GlobalAttnSumPool`` in disjoint mode, before commit 570cb91. Inputs
    ``X`` ``[N, F]`` and ``I`` ``[N]`` (sorted graph ids); returns ``[num_graphs, F]``."""

    def build(self, input_shape):
        self.attn_kernel = self.add_weight(
            shape=(input_shape[0][-1], 1), initializer="glorot_uniform", name="attn_kernel"
        )

    def weights_of(self, attn_coeff, graph, num_graphs):
        """``[N]`` attention weights: the bug, one softmax over every node of the batch."""
        return tf.nn.softmax(attn_coeff)

    def call(self, inputs):
        x, graph, num_graphs = inputs
        attn_coeff = tf.squeeze(tf.matmul(x, self.attn_kernel), -1)  # [N]
        attn_coeff = self.weights_of(attn_coeff, graph, num_graphs)
        return tf.math.unsorted_segment_sum(attn_coeff[:, None] * x, graph, num_graphs)


class AttnPoolNet(keras.Model):
    """Embed, two convolutions, ``GlobalAttnSumPool``, a (mean, log sigma) head."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.pool = GlobalAttnSumPool()
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        return self.head(self.pool([h, inputs["node_graph"], inputs["num_graphs"]]))


@register_variant
def zoo_s_spektral_attn_pool(ctx):
    """Spektral GlobalAttnSumPool before #302's fix: one softmax over the whole batch"""
    return Recipe(model=AttnPoolNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_spektral_attn_pool",
    source="danielegrattarola/spektral#302",
    url="https://github.com/danielegrattarola/spektral/issues/302",
    summary=(
        "GlobalAttnSumPool in disjoint mode takes one softmax over every node of the batch, "
        "so a graph's pooled vector depends on the graphs batched with it; all values finite"
    ),
    fix_class="architecture change",
    variant="zoo_s_spektral_attn_pool",
    stage="forward",
    op="softmax",
    cause="none",
    fix=(
        "commit 570cb91: in disjoint mode the weights are ops.unsorted_segment_softmax("
        "attn_coeff, I), a softmax per graph"
    ),
    silent=True,
    invariant="batch_independence",
)
