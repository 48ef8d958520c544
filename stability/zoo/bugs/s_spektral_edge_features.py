"""Spektral's edge features kept in the order they were listed while the adjacency matrix
sorts its edges: every edge reads another edge's features unless the list was sorted.

Source: danielegrattarola/spektral issue #199,
https://github.com/danielegrattarola/spektral/issues/199, "[Possible Bug] Out-of-order edge
feature array in QM9 data set".

What the user saw: ``mol_to_adj`` in ``spektral/datasets/qm9.py`` built the adjacency matrix
as ``sp.csr_matrix((ones, (row, col)))`` from bonds listed "stacked" ((0,1), (1,0), (0,2),
(2,0)), and the edge features ``e`` in that same stacked order; the sparse matrix keeps its
entries in lexicographic order ((0,1), (0,2), (1,0), (2,0)), and the layers pair row k of
``e`` with the k-th entry of the adjacency matrix. The maintainer: "yes, this is most
definitely a bug". Nothing is non-finite: each edge is convolved with another edge's
features. The cause is positional pairing across two orders. What the maintainer changed
(commit e6e95a1, "Fix issue with dataset that have edge attributes (#199)"): a new
``spektral.utils.sparse.reorder`` sorts the edge index lexicographically (``np.lexsort``)
and applies the same permutation to the edge features (``edge_index_to_matrix``), in the
QM9, QM7, OGB and TUDataset loaders.

The model is an edge-conditioned convolution as Spektral's ``ECCConv`` runs it: the adjacency
is a ``tf.SparseTensor`` of (target, source) entries, ``tf.sparse.reorder``-ed as Spektral's
loaders do, its ``indices`` give each message's endpoints, and the edge features are read by
position. The harness lists each graph's edges unsorted, as the QM9 loader did.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class ECCConv(keras.layers.Layer):
    """``h_i' = relu(W h_i + sum_j K(e_ij) h_j)``, the kernel ``K(e)`` ``[F, channels]``
    produced per edge by a small network from the edge's features."""

    def __init__(self, channels: int, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels
        self.root = keras.layers.Dense(channels)

    def build(self, input_shape):
        self.kernel_network = keras.layers.Dense(input_shape[-1] * self.channels)

    def call(self, x, a, e):
        targets, sources = a.indices[:, 0], a.indices[:, 1]  # [num_edges], lexicographic
        kernel = tf.reshape(self.kernel_network(e), (-1, x.shape[-1], self.channels))
        messages = tf.einsum("ef,efc->ec", tf.gather(x, sources), kernel)  # [num_edges, ch]
        summed = tf.math.unsorted_segment_sum(messages, targets, tf.shape(x)[0])
        return tf.nn.relu(self.root(x) + summed)


class ECCNet(keras.Model):
    """Embed, two ``ECCConv``, a per-graph mean, a (mean, log sigma) head."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [ECCConv(hidden), ECCConv(hidden)]
        self.head = keras.layers.Dense(2)

    def adjacency(self, inputs):
        """The sparse (target, source) adjacency, sorted as Spektral's loaders sort it."""
        indices = tf.cast(tf.stack([inputs["receivers"], inputs["senders"]], axis=1), tf.int64)
        num_nodes = tf.cast(tf.shape(inputs["nodes"])[0], tf.int64)
        values = tf.ones(tf.shape(indices)[:1], inputs["nodes"].dtype)
        return tf.sparse.reorder(tf.SparseTensor(indices, values, [num_nodes, num_nodes]))

    def edge_features(self, inputs):
        """``[num_edges, 1]`` the features entry k of ``adjacency`` reads: row k of the edge
        list as given, whatever its order (the bug)."""
        return inputs["edges"]

    def call(self, inputs):
        a, e = self.adjacency(inputs), self.edge_features(inputs)
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, a, e)
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_s_spektral_edge_features(ctx):
    """Spektral ECCConv with edge features unsorted against a sorted sparse adjacency"""
    return Recipe(model=ECCNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_spektral_edge_features",
    source="danielegrattarola/spektral#199",
    url="https://github.com/danielegrattarola/spektral/issues/199",
    summary=(
        "the sparse adjacency sorts its edges lexicographically while the edge features stay "
        "in the listed order, so each edge is convolved with another edge's features"
    ),
    fix_class="data cleaning",
    variant="zoo_s_spektral_edge_features",
    stage="forward",
    op="sparse.reorder",
    cause="none",
    fix=(
        "commit e6e95a1: spektral.utils.sparse.reorder lexsorts the edge index and applies "
        "the same permutation to the edge features (edge_index_to_matrix) in the loaders"
    ),
    silent=True,
    invariant="edge_order",
)
