"""A log-sum-exp aggregation at a node without incoming edges: the log of an empty sum.

rusty1s/pytorch_scatter#368 (https://github.com/rusty1s/pytorch_scatter/issues/368),
"scatter_logsumexp: NaNs on untouched indices": ``scatter_logsumexp`` (the scatter op
behind log-sum-exp and softmax aggregations in PyTorch Geometric) returned NaN at every
output index that no input element maps to, the nodes with no incoming edge of a message
passing layer. The pooled value there is an empty sum of exponentials, 0, and its log is
-inf. The maintainer fixed it in rusty1s/pytorch_scatter#369 by mapping the non-finite
results to 0 (``out.nan_to_num_(neginf=0.0)``), which in turn made a segment of only -inf
entries return 0 instead of -inf (rusty1s/pytorch_scatter#407).

The model aggregates each node's incoming messages with a log-sum-exp (a smooth maximum,
as DeeperGCN's softmax-style aggregators), written the stable way, with the segment
maximum subtracted first. At a node with no incoming edge the sum of exponentials is 0,
``log(0) = -inf``, and the next ``Dense`` turns it into inf and NaN. The ``generated``
data set's random directed edges leave many such nodes.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class LogSumExpConv(keras.layers.Layer):
    """``relu(W [h_i, log sum_j exp(m_ij)])`` with ``m_ij = P [h_j, e_ij]``.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``edges`` ``[num_edges, 1]``,
    ``senders``/``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden)
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        m = self.message(tf.concat([tf.gather(h, senders), edges], axis=-1))
        top = tf.math.unsorted_segment_max(m, receivers, num_nodes)
        total = tf.math.unsorted_segment_sum(
            tf.exp(m - tf.gather(top, receivers)), receivers, num_nodes
        )
        pooled = tf.math.log(total) + top  # log(0) at a node without incoming edges
        return self.update(tf.concat([h, pooled], axis=-1))


class LogSumExpNet(keras.Model):
    """Embed the node types, two log-sum-exp layers, mean over each graph, a (mean,
    log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [LogSumExpConv(hidden), LogSumExpConv(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_b_log_pooled_zero(ctx):
    """log-sum-exp aggregation: log of the empty sum at nodes without incoming edges"""
    return Recipe(
        model=LogSumExpNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate)
    )


BUG = ZooBug(
    name="b_log_pooled_zero",
    source="rusty1s/pytorch_scatter#368",
    url="https://github.com/rusty1s/pytorch_scatter/issues/368",
    summary=(
        "a log-sum-exp aggregation takes the log of the pooled sum of exponentials, which "
        "is 0 at a node without incoming edges: log(0) = -inf"
    ),
    fix_class="op guard",
    variant="zoo_b_log_pooled_zero",
    stage="forward",
    op="Log",
    cause="forward overflow",
    fix=(
        "map the empty segments' non-finite results to 0, out.nan_to_num_(neginf=0.0) "
        "(rusty1s/pytorch_scatter#369)"
    ),
)
