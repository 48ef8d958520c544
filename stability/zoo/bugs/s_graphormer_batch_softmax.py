"""graphormer-pyg's attention head: one dense softmax over every node of the batch, so the
nodes of one graph attend to the nodes of the others.

Source: leffff/graphormer-pyg issue #14, https://github.com/leffff/graphormer-pyg/issues/14,
"softmax in GraphormerAttentionHead".

What the user saw: in ``GraphormerAttentionHead.forward``, ``softmax = torch.softmax(a,
dim=-1)`` "is not exact here since we should compute the attention in each graph. However,
such direct computation causes the attention between nodes from different graphs in a
batch." The maintainer agreed. The cause: the head builds the dense ``[N, N]`` score matrix
of the whole batch, ``a = q k^T / sqrt(d)``, adds the spatial and edge encodings, and
multiplies by a block-diagonal 0/1 ``batch_mask``: a pair from two graphs gets score 0, not
-inf, so it keeps a weight ``exp(0) / sum`` and each node mixes in the values of every other
graph of the batch. Every value is finite. What the maintainer changed (commit f56d648,
"Fixed attention bug"): the softmax's output is multiplied by the 0/1 block mask
(``softmax(a) * batch_mask_zeros``), so other graphs' values no longer enter, and the
scores outside a graph's block are scaled by -1e6 before the softmax. (A later comment in the
thread points out that scaling rather than adding -1e6 leaves each row's weights summing to
less than 1; the fix applied in ``tests/test_zoo_silent.py`` masks the scores with -inf
outside each graph's block, the intent of both.)

The model: embed, a spatial encoding (a learned bias of each edge's distance on its (i, j)
entry), two residual single-head attention layers as the head computes them before the fix,
a per-graph mean (``global_mean_pool``), a (mean, log sigma) head.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class GraphormerAttentionHead(keras.layers.Layer):
    """Dense attention over the batch's ``[N, N]`` node pairs; returns ``[N, hidden]``."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.q = keras.layers.Dense(hidden)
        self.k = keras.layers.Dense(hidden)
        self.v = keras.layers.Dense(hidden)

    def weights_of(self, a, same_graph):
        """``[N, N]`` the attention weights from the scores ``a`` and the 0/1 block mask:
        the bug, a pair of two graphs scores 0 and keeps a weight."""
        return tf.nn.softmax(a * same_graph, axis=-1)

    def call(self, x, b, same_graph):
        q, k, v = self.q(x), self.k(x), self.v(x)
        a = tf.matmul(q, k, transpose_b=True) / tf.sqrt(tf.cast(tf.shape(q)[-1], x.dtype))
        return tf.matmul(self.weights_of(a + b, same_graph), v)


class Graphormer(keras.Model):
    """Embed, spatial bias, two residual attention layers, per-graph mean, head."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.spatial = keras.layers.Dense(1)
        self.layers_ = [GraphormerAttentionHead(hidden), GraphormerAttentionHead(hidden)]
        self.ffn = [keras.layers.Dense(hidden, activation="relu") for _ in self.layers_]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        graph, num_nodes = inputs["node_graph"], tf.shape(inputs["nodes"])[0]
        # [N, N] 1 where i and j are nodes of one graph, else 0 (the head's batch_mask)
        same_graph = tf.cast(tf.equal(graph[:, None], graph[None, :]), inputs["nodes"].dtype)
        # [N, N] the spatial bias: a learned function of the distance on each edge's entry
        pairs = tf.stack([inputs["receivers"], inputs["senders"]], axis=1)
        b = tf.scatter_nd(pairs, self.spatial(inputs["edges"])[:, 0], [num_nodes, num_nodes])
        h = self.embed(inputs["nodes"])
        for attention, ffn in zip(self.layers_, self.ffn, strict=True):
            h = h + attention(h, b, same_graph)
            h = h + ffn(h)
        pooled = tf.math.unsorted_segment_mean(h, graph, inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_s_graphormer_batch_softmax(ctx):
    """graphormer-pyg's attention before #14's fix: a softmax across the graphs of a batch"""
    return Recipe(model=Graphormer(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_graphormer_batch_softmax",
    source="leffff/graphormer-pyg#14",
    url="https://github.com/leffff/graphormer-pyg/issues/14",
    summary=(
        "the attention head masks pairs of two graphs to score 0 instead of -inf, so each "
        "node's softmax spans the whole batch and mixes in other graphs' values"
    ),
    fix_class="architecture change",
    variant="zoo_s_graphormer_batch_softmax",
    stage="forward",
    op="softmax",
    cause="none",
    fix=(
        "commit f56d648: the softmax's output is multiplied by the 0/1 block mask of each "
        "graph and the scores outside the block are scaled by -1e6"
    ),
    silent=True,
    invariant="batch_independence",
)
