"""DGL's mean aggregation on a graph with no edges: ``0 / 0`` at every node.

dmlc/dgl#2777 (https://github.com/dmlc/dgl/issues/2777), "SAGEConv produces NANs on a graph
with no edges on dgl v0.6.0.post1": a ``SAGEConv(aggregator_type="mean")`` applied to a
two-node graph without edges returned NaN in every output entry. DGL 0.6's fused mean
reduce (``dgl.ops.spmm.gspmm``) divided the summed messages by
``clamp(in_degrees, 1, g.number_of_edges())``, and with no edge at all the upper bound is 0:
``torch.clamp`` with min 1 and max 0 returns 0, so each node's mean is ``0 / 0``. The
reporter's pull request dmlc/dgl#2786 ("[BUG] fix for zero degree nodes"), merged, changed
the bound to ``max(g.number_of_edges(), 1)``.

The model below is a GraphSAGE-mean written in plain Keras with DGL 0.6's reduce ported
as it computes: ``torch.clamp`` applies the lower bound, then the upper one, which is
``tf.minimum(tf.maximum(deg, 1), num_edges)`` (TensorFlow's own ``tf.clip_by_value``
applies them the other way round and would hide the bug). A batch's graphs are one
disconnected graph, as in DGL's ``dgl.batch``, so the bug fires on a batch in which no
graph has an edge: one-atom molecules at ``batch_size = 1``.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph


class SAGEMean(keras.layers.Layer):
    """GraphSAGE with the mean aggregator: ``fc_self(h) + fc_neigh(mean of neighbours)``.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``senders``/``receivers`` ``[num_edges]``;
    returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.fc_self = keras.layers.Dense(hidden)
        self.fc_neigh = keras.layers.Dense(hidden, use_bias=False)

    def call(self, h, senders, receivers):
        num_nodes = tf.shape(h)[0]
        num_edges = tf.cast(tf.shape(senders)[0], h.dtype)
        summed = tf.math.unsorted_segment_sum(tf.gather(h, senders), receivers, num_nodes)
        ones = tf.ones_like(receivers, dtype=h.dtype)
        deg = tf.math.unsorted_segment_sum(ones, receivers, num_nodes)  # [num_nodes]
        # DGL 0.6: deg.clamp(1, g.number_of_edges()); with no edge the upper bound is 0.
        deg = tf.minimum(tf.maximum(deg, 1.0), num_edges)
        h_neigh = summed / deg[:, None]
        return tf.nn.leaky_relu(self.fc_self(h) + self.fc_neigh(h_neigh))


class SAGENet(keras.Model):
    """Embed the atoms, two SAGE-mean layers, sum over each molecule, a (mean, log sigma)
    head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SAGEMean(hidden), SAGEMean(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_lone_atoms(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    max_atoms: int = 6,
    lone_fraction: float = 0.2,
    cutoff: float = 2.5,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (2 to ``max_atoms`` atoms in a 2 A box, an edge each way for every
    pair closer than ``cutoff``) and, a ``lone_fraction`` of them, single atoms (a noble
    gas, an ion) with no edge. Nodes: a one-hot of 3 elements; target: the number of bonds
    plus the atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = 1 if rng.random() < lone_fraction else int(rng.integers(2, max_atoms + 1))
        types = rng.integers(0, 3, n)
        pos = rng.uniform(0.0, 2.0, (n, 3))
        graphs.append(molecule_graph(pos, types, cutoff))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_dgl_no_edges(ctx):
    """GraphSAGE-mean with DGL 0.6's deg.clamp(1, num_edges): 0/0 on a batch without edges"""
    return Recipe(model=SAGENet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_dgl_no_edges",
    source="dmlc/dgl#2777",
    url="https://github.com/dmlc/dgl/issues/2777",
    summary=(
        "SAGEConv's mean divides by clamp(in_degree, 1, number_of_edges), which is 0 on a "
        "graph without edges: 0 / 0 at every node"
    ),
    fix_class="op guard",
    variant="zoo_b_dgl_no_edges",
    stage="forward",
    op="RealDiv",
    cause="forward underflow (0/0)",
    fix="clamp the degree to [1, max(number_of_edges, 1)] (dmlc/dgl#2786)",
)
