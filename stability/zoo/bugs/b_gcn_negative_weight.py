"""GCN normalization with learned edge weights: a negative weighted degree, and
``deg ** -0.5`` is NaN.

pyg-team/pytorch_geometric#61 (https://github.com/pyg-team/pytorch_geometric/issues/61),
"GCNConv nan": with edge weights passed to ``GCNConv``, the degree is the weighted sum
``scatter_add(edge_weight, col)``, and the user got NaN (not inf) out of
``deg.pow(-0.5)``, which the inf guard after it does not catch. The maintainer's answer:
the weights "need to be positive because of the square root"; the layer was left as it
is, and positive weights are the caller's job.

The model is a GCN (as b_gcn_deg_isolated, with PyG's self-loops of weight 1) whose edge
weights a ``Dense(1)`` learns from the distance, with no activation to keep them positive.
At initialization every weight has the sign of that layer's kernel entry, negative with
this case's seed, and a node whose incoming weights sum below -1 has a negative degree:
``pow(negative, -0.5)`` is NaN.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph


class GCNLayer(keras.layers.Layer):
    """``relu(D^-1/2 (A + I) D^-1/2 h W)`` with a weighted adjacency ``A`` and self-loops of
    weight 1, as PyG's ``gcn_norm``.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``weight`` ``[num_edges]``,
    ``senders``/``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.linear = keras.layers.Dense(hidden)

    def call(self, h, weight, senders, receivers):
        num_nodes = tf.shape(h)[0]
        deg = 1.0 + tf.math.unsorted_segment_sum(weight, receivers, num_nodes)  # [num_nodes]
        deg_inv_sqrt = tf.pow(deg, -0.5)  # NaN where the weighted degree is negative
        deg_inv_sqrt = tf.where(tf.math.is_inf(deg_inv_sqrt), 0.0, deg_inv_sqrt)
        norm = tf.gather(deg_inv_sqrt, senders) * weight * tf.gather(deg_inv_sqrt, receivers)
        h = self.linear(h)
        messages = norm[:, None] * tf.gather(h, senders)
        summed = tf.math.unsorted_segment_sum(messages, receivers, num_nodes)
        return tf.nn.relu(summed + tf.square(deg_inv_sqrt)[:, None] * h)


class WeightedGCN(keras.Model):
    """Embed the atoms, learn an edge weight from each distance, two GCN layers, sum over
    each molecule, a (mean, log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.edge_weight = keras.layers.Dense(1)  # no activation: any sign
        self.convs = [GCNLayer(hidden), GCNLayer(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        weight = tf.squeeze(self.edge_weight(inputs["edges"]), -1)  # [num_edges]
        for conv in self.convs:
            h = conv(h, weight, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_dense_molecules(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 8,
    cutoff: float = 3.0,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (``min_atoms`` to ``max_atoms`` atoms in a 2.5 A box, an edge each
    way for every pair closer than ``cutoff``). Nodes: a one-hot of 3 elements; target: the
    number of bonds plus the atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        pos = rng.uniform(0.0, 2.5, (n, 3))
        types = rng.integers(0, 3, len(pos))
        graphs.append(molecule_graph(pos, types, cutoff))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_gcn_negative_weight(ctx):
    """GCN on learned edge weights of any sign: deg ** -0.5 of a negative degree is NaN"""
    return Recipe(model=WeightedGCN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_gcn_negative_weight",
    source="pyg-team/pytorch_geometric#61",
    url="https://github.com/pyg-team/pytorch_geometric/issues/61",
    summary=(
        "GCN's weighted degree is negative where learned edge weights of any sign sum "
        "below -1, and deg ** -0.5 of it is NaN"
    ),
    fix_class="architecture change",
    variant="zoo_b_gcn_negative_weight",
    stage="forward",
    op="Pow",
    cause="forward",
    fix=(
        "none in the layer: edge weights must be positive (the maintainer's answer); keep "
        "learned weights positive, e.g. with a softplus or sigmoid"
    ),
)
