"""GraphNeuralNetworks.jl #246: "Overflows in GATConv and GATv2Conv".

Source: JuliaGraphs/GraphNeuralNetworks.jl issue #246,
https://github.com/JuliaGraphs/GraphNeuralNetworks.jl/issues/246 (fixed by pull request
#244, https://github.com/JuliaGraphs/GraphNeuralNetworks.jl/pull/244).

What users saw: the attention softmax of ``GATConv`` and ``GATv2Conv`` "can too easily lead to
overflows, e.g., already with input values of ~100" (the reporter). Why: the layer computed
the softmax inside its message function, ``alpha = exp(leakyrelu(a' [W x_i; W x_j]))``, summed
``alpha`` and ``alpha * W x_j`` over each node's incoming edges (self-loops included) and
divided the two sums, with no maximum subtracted. With node features of ~100 the attention
score is in the hundreds at the first forward pass, ``exp`` returns inf above 88.7 (float32),
and ``inf / inf`` is NaN. What the maintainers changed (#244): the layers compute their
coefficients with ``softmax_edge_neighbors``, the max-subtracted softmax over each node's
incoming edges (a first draft subtracted one maximum over all edges; the maintainer pointed
out that a global maximum trades the overflow for underflow in the other neighbourhoods).

The model is that ``GATConv`` written in plain Keras (a ``Dense`` without bias for ``W``, the
attention vector ``a``, self-loops, the message-function softmax), two layers, a mean over
each graph's nodes and a head of two outputs. Its data set ``a_gnnjl_raw_features`` is the
``generated`` graphs with node features left unnormalized at the scale of ~100 that the
report names (a one-hot type and sixteen raw descriptors drawn in [0, 100]).
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, load_dataset, register_dataset
from stability.zoo.bug import ZooBug


@register_dataset
def a_gnnjl_raw_features(
    *,
    seed: int = 0,
    num_graphs: int = 128,
    scale: float = 100.0,
    descriptors: int = 4,
    val_fraction: float = 0.1,
) -> Dataset:
    """The ``generated`` graphs (uniform distances 0.5-4) with raw node features of ~``scale``:
    each node's one-hot type and ``descriptors`` unnormalized values drawn in [0, ``scale``]
    (raw intensities or counts, as fed to GATConv without a scaler)."""
    base = load_dataset(
        "generated", seed=seed, num_graphs=num_graphs, distribution="uniform", val_fraction=0.5
    )
    rng = np.random.default_rng(seed)
    graphs = []
    for g in [*base.train, *base.val]:
        raw = rng.uniform(0.0, scale, size=(g.num_nodes, descriptors))
        graphs.append(dataclasses.replace(g, nodes=np.hstack([g.nodes, raw]), source_index=None))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


class GATConv(keras.layers.Layer):
    """GraphNeuralNetworks.jl's ``GATConv`` before #244, one head.

    Shapes: ``x`` ``[num_nodes, F]``, ``senders``, ``receivers`` ``[num_edges]``; returns
    ``[num_nodes, channels]``.
    """

    def __init__(self, channels, negative_slope=0.2, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels
        self.negative_slope = negative_slope
        self.dense_x = keras.layers.Dense(channels, use_bias=False)

    def build(self, input_shape):
        self.a = self.add_weight(shape=(2 * self.channels,), initializer="glorot_uniform", name="a")
        self.bias = self.add_weight(shape=(self.channels,), initializer="zeros", name="bias")

    def call(self, x, senders, receivers):
        num_nodes = tf.shape(x)[0]
        loops = tf.range(num_nodes, dtype=senders.dtype)  # add_self_loops = true
        src = tf.concat([senders, loops], axis=0)
        dst = tf.concat([receivers, loops], axis=0)
        wx = self.dense_x(x)  # [num_nodes, channels]
        wxi, wxj = tf.gather(wx, dst), tf.gather(wx, src)  # [num_edges + num_nodes, channels]
        # message(l, Wxi, Wxj): alpha = exp(leakyrelu(a' [Wxi; Wxj])), m = alpha * Wxj
        score = tf.reduce_sum(self.a * tf.concat([wxi, wxj], axis=-1), axis=-1)
        alpha = tf.exp(tf.nn.leaky_relu(score, self.negative_slope))  # [num_edges + num_nodes]
        m = alpha[:, None] * wxj
        # propagate(message, g, +): both summed over each node's incoming edges, then divided
        alpha_sum = tf.math.unsorted_segment_sum(alpha, dst, num_nodes)
        m_sum = tf.math.unsorted_segment_sum(m, dst, num_nodes)
        return m_sum / alpha_sum[:, None] + self.bias


class GAT(keras.Model):
    """Two GATConv layers with elu, a mean over each graph's nodes, and two outputs."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = GATConv(hidden)
        self.conv2 = GATConv(hidden)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        s, r = inputs["senders"], inputs["receivers"]
        h = tf.nn.elu(self.conv1(inputs["nodes"], s, r))
        h = tf.nn.elu(self.conv2(h, s, r))
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_gnnjl_gat_100(ctx):
    """GraphNeuralNetworks.jl's GATConv before #244: exp/sum attention, no max subtracted"""
    return Recipe(model=GAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_gnnjl_gat_100",
    source="JuliaGraphs/GraphNeuralNetworks.jl#246",
    url="https://github.com/JuliaGraphs/GraphNeuralNetworks.jl/issues/246",
    summary=(
        "GATConv's softmax exp(leakyrelu(a'[Wx_i; Wx_j])) without the max subtracted "
        "overflows at the first forward pass for inputs of ~100; inf/inf is NaN"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_gnnjl_gat_100",
    stage="forward",
    op="Exp",
    cause="forward overflow",
    fix=(
        "PR #244: the coefficients come from softmax_edge_neighbors, the max-subtracted "
        "softmax over each node's incoming edges"
    ),
    silent=False,
)
