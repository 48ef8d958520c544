"""A max aggregation at nodes without incoming edges: the empty maximum's fill value
overflows the next layer.

dmlc/dgl#761 (https://github.com/dmlc/dgl/issues/761), "[Bug] Reduce with max built-in
having different behavior comparing to UDF": DGL's built-in ``fn.max`` reduce left a node
with no in-edge at ``-inf``, and a maintainer pointed out that a classifier fed that
feature gets a gradient that is NaN everywhere. ``tf.math.unsorted_segment_max`` does the
same in TensorFlow: an empty segment is ``numeric_limits<T>::lowest()``, -3.4e38 in
float32, finite, so nothing flags it until the next ``Dense`` sums a few of them times
weights of order one and overflows to inf (and inf - inf to NaN). DGL later set every
reduce result of a zero-in-degree node to 0 (dmlc/dgl#2011, "Set reduce results to all zero
for nodes with zero in-degrees") and made ``GraphConv``/``GATConv`` refuse such graphs
unless built with ``allow_zero_in_degree=True``.

The model is a GraphSAGE with the max-pool aggregator in plain Keras; the ``generated``
data set's random directed edges leave many nodes with no incoming edge.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class SAGEMaxPool(keras.layers.Layer):
    """``relu(W [h, max_j relu(P h_j)])`` over each node's incoming edges.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``senders``/``receivers`` ``[num_edges]``;
    returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.pool = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, senders, receivers):
        num_nodes = tf.shape(h)[0]
        messages = self.pool(tf.gather(h, senders))  # [num_edges, hidden]
        # An empty segment (no incoming edge) comes out as the dtype's lowest value.
        pooled = tf.math.unsorted_segment_max(messages, receivers, num_nodes)
        return self.update(tf.concat([h, pooled], axis=-1))


class MaxPoolSAGE(keras.Model):
    """Embed the node types, two max-pool SAGE layers, mean over each graph, a (mean,
    log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SAGEMaxPool(hidden), SAGEMaxPool(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_b_dgl_zero_in_degree(ctx):
    """max-pool GraphSAGE: unsorted_segment_max's -3.4e38 at zero-in-degree nodes overflows"""
    return Recipe(model=MaxPoolSAGE(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_dgl_zero_in_degree",
    source="dmlc/dgl#761",
    url="https://github.com/dmlc/dgl/issues/761",
    summary=(
        "a max reduce leaves nodes without in-edges at the dtype's lowest value (DGL: -inf); "
        "the next Dense layer overflows to inf"
    ),
    fix_class="data cleaning",
    variant="zoo_b_dgl_zero_in_degree",
    stage="forward",
    op="MatMul",
    cause="forward overflow",
    fix=(
        "zero the reduce result of zero-in-degree nodes (dmlc/dgl#2011) and refuse such "
        "graphs unless allow_zero_in_degree=True"
    ),
)
