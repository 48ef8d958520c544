"""PyTorch Geometric #53: "scatter softmax output 'nan'".

Source: pyg-team/pytorch_geometric issue #53,
https://github.com/pyg-team/pytorch_geometric/issues/53

What users saw: ``GATConv`` "produce[s] 'nan' frequently" in training (the reporter, December
2018). Why: ``torch_geometric.utils.softmax``, which ``GATConv`` calls to normalize its
attention over each node's incoming edges, computed ``src.exp()`` and divided by the
``scatter_add`` of it over the node, with no maximum subtracted. As training grows the
attention scores ``leaky_relu(a' [W x_i || W x_j])``, one above 88.7 makes ``exp`` return
inf in float32, and ``inf / inf`` is NaN. What the maintainers changed: the reporter proposed
subtracting the per-node ``scatter_max`` before ``exp`` (``src - row_max[index]``), and the
maintainer replied "Fixed in master!" the same day.

The model is that ``GATConv`` in plain Keras (a ``Dense`` without bias for ``W``, an attention
vector per head, self-loops added, dropout left out), multi-head as in PyG's GAT example, the
softmax written as ``utils.softmax`` was before the fix. Its data set
``a_pyg_raw_features`` gives each node its one-hot type and raw, unscaled descriptors, so the
scores grow past ``exp``'s range within a few epochs of training rather than at the first
step.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, load_dataset, register_dataset
from stability.zoo.bug import ZooBug


@register_dataset
def a_pyg_raw_features(
    *,
    seed: int = 0,
    num_graphs: int = 160,
    scale: float = 30.0,
    descriptors: int = 8,
    val_fraction: float = 0.1,
) -> Dataset:
    """The ``generated`` graphs (uniform distances 0.5-4) with each node's one-hot type and
    ``descriptors`` raw values drawn in [0, ``scale``], not normalized."""
    base = load_dataset(
        "generated", seed=seed, num_graphs=num_graphs, distribution="uniform", val_fraction=0.5
    )
    rng = np.random.default_rng(seed)
    graphs = []
    for g in [*base.train, *base.val]:
        raw = rng.uniform(0.0, scale, size=(g.num_nodes, descriptors))
        graphs.append(dataclasses.replace(g, nodes=np.hstack([g.nodes, raw]), source_index=None))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


def softmax(src, index, num_nodes):
    """``torch_geometric.utils.softmax`` before the fix of #53: ``exp`` of the raw scores
    over the ``scatter_add`` of them at each node. Shapes: ``src`` ``[num_edges, heads]``,
    ``index`` ``[num_edges]``; returns ``[num_edges, heads]``."""
    out = tf.exp(src)
    return out / tf.gather(tf.math.unsorted_segment_sum(out, index, num_nodes), index)


class GATConv(keras.layers.Layer):
    """PyG's ``GATConv`` of late 2018, ``heads`` heads concatenated.

    Shapes: ``x`` ``[num_nodes, F]``, ``senders``, ``receivers`` ``[num_edges]``; returns
    ``[num_nodes, heads * channels]``.
    """

    def __init__(self, channels, heads=2, negative_slope=0.2, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.heads, self.negative_slope = channels, heads, negative_slope
        self.weight = keras.layers.Dense(heads * channels, use_bias=False)

    def build(self, input_shape):
        self.att = self.add_weight(
            shape=(1, self.heads, 2 * self.channels), initializer="glorot_uniform", name="att"
        )
        self.bias = self.add_weight(
            shape=(self.heads * self.channels,), initializer="zeros", name="bias"
        )

    def call(self, x, senders, receivers):
        num_nodes = tf.shape(x)[0]
        loops = tf.range(num_nodes, dtype=senders.dtype)  # add_self_loops(edge_index)
        row = tf.concat([receivers, loops], axis=0)  # the node each message goes to
        col = tf.concat([senders, loops], axis=0)
        h = tf.reshape(self.weight(x), [-1, self.heads, self.channels])
        x_i, x_j = tf.gather(h, row), tf.gather(h, col)  # [num_edges', heads, channels]
        alpha = tf.reduce_sum(tf.concat([x_i, x_j], axis=-1) * self.att, axis=-1)
        alpha = tf.nn.leaky_relu(alpha, self.negative_slope)  # [num_edges', heads]
        alpha = softmax(alpha, row, num_nodes)
        out = tf.math.unsorted_segment_sum(x_j * alpha[..., None], row, num_nodes)
        return tf.reshape(out, [-1, self.heads * self.channels]) + self.bias


class GAT(keras.Model):
    """PyG's GAT example reshaped for a graph target: GATConv, elu, GATConv, a mean over
    each graph's nodes, and two outputs."""

    def __init__(self, hidden, heads=2, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = GATConv(hidden // heads, heads=heads)
        self.conv2 = GATConv(hidden // heads, heads=heads)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        s, r = inputs["senders"], inputs["receivers"]
        h = tf.nn.elu(self.conv1(inputs["nodes"], s, r))
        h = tf.nn.elu(self.conv2(h, s, r))
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_pyg_gat_softmax(ctx):
    """PyG's GATConv of 2018: utils.softmax as exp / scatter_add, no max subtracted"""
    return Recipe(model=GAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_pyg_gat_softmax",
    source="pyg-team/pytorch_geometric#53",
    url="https://github.com/pyg-team/pytorch_geometric/issues/53",
    summary=(
        "utils.softmax computed exp(src) / scatter_add(exp(src)) without the per-node max; "
        "GATConv's scores grow past 88.7 in training, exp overflows and inf/inf is NaN"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_pyg_gat_softmax",
    stage="forward",
    op="Exp",
    cause="forward overflow",
    fix="subtract the per-node scatter_max before exp (src - row_max[index]), fixed in master",
    silent=False,
)
