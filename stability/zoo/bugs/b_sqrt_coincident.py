"""EGNN at coincident atoms: the distance ``|x_i - x_j|`` is 0, finite forward, and the
gradient of its square root is NaN.

dmlc/dgl#7271 (https://github.com/dmlc/dgl/issues/7271), "EGNNConv Leading to NaN
Gradients for Identical Input Coordinates": three stacked ``dgl.nn.EGNNConv`` layers on a
graph whose positions were all zero trained to NaN gradients. The layer's coordinate
update makes each layer's output positions depend on its weights, so from the second
layer on, a ``sqrt`` of ``|x_i - x_j|^2`` sits between the loss and the weights, and at
coincident atoms its derivative ``0.5 / sqrt(0)`` is infinite; the chain rule multiplies
it by ``2 (x_i - x_j) = 0``, which is NaN. ``EGNNConv`` adds its epsilon outside the root
(``x_diff / (sqrt(radial) + 1e-30)``), which keeps the forward finite and not the
gradient. The issue was closed as stale with no change to DGL; the EGNN reference
implementation (vgsatorras/egnn) normalizes by ``sqrt(radial).detach() + epsilon``.

The model is DGL's ``EGNNConv`` ported to plain Keras, two layers (the report stacked three;
the second is the first whose distance depends on weights), with one change the port needs to
fail in TensorFlow as the PyTorch layer does: TensorFlow's
``SqrtGrad`` returns 0 for a zero incoming gradient (PyTorch computes ``0 / 0``), and the
normalization's incoming gradient is exactly 0 at coincident atoms, so here the edge MLP
reads the distance ``tf.norm(x_i - x_j)`` rather than its square, as EGNN variants that
expand the distance in a radial basis do. ``tf.norm``'s gradient at a zero vector is NaN
(tensorflow/tensorflow#12071). Nodes carry a one-hot element and the atom's position; a
fifth of the molecules have no conformer and every coordinate at 0 (what a SMILES parsed
without an embedding step gives), so all their atoms coincide.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph

NUM_ELEMENTS = 3


class EGNNConv(keras.layers.Layer):
    """One E(n)-equivariant layer, as ``dgl.nn.pytorch.EGNNConv`` computes it, with the
    distance instead of its square as the edge MLP's radial feature.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``x`` ``[num_nodes, 3]``, ``edges``
    ``[num_edges, 1]``, ``senders``/``receivers`` ``[num_edges]``; returns the new ``h`` and
    ``x``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.edge_mlp = keras.Sequential(
            [keras.layers.Dense(hidden, activation="silu"), keras.layers.Dense(hidden, "silu")]
        )
        self.node_mlp = keras.Sequential(
            [keras.layers.Dense(hidden, activation="silu"), keras.layers.Dense(hidden)]
        )
        self.coord_mlp = keras.Sequential(
            [keras.layers.Dense(hidden, activation="silu"), keras.layers.Dense(1, use_bias=False)]
        )

    def call(self, h, x, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        x_diff = tf.gather(x, senders) - tf.gather(x, receivers)  # [num_edges, 3]
        dist = tf.norm(x_diff, axis=-1, keepdims=True)  # |x_i - x_j|, [num_edges, 1]
        x_diff = x_diff / (dist + 1e-30)
        pair = tf.concat([tf.gather(h, senders), tf.gather(h, receivers), dist, edges], -1)
        msg_h = self.edge_mlp(pair)
        msg_x = self.coord_mlp(msg_h) * x_diff
        x_neigh = tf.math.unsorted_segment_mean(msg_x, receivers, num_nodes)
        h_neigh = tf.math.unsorted_segment_sum(msg_h, receivers, num_nodes)
        return self.node_mlp(tf.concat([h, h_neigh], axis=-1)), x + x_neigh


class EGNN(keras.Model):
    """Embed the elements, two EGNN layers over the atoms' positions, sum over each
    molecule, a (mean, log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden)
        self.convs = [EGNNConv(hidden) for _ in range(2)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        nodes = inputs["nodes"]
        h, x = self.embed(nodes[:, :NUM_ELEMENTS]), nodes[:, NUM_ELEMENTS:]
        for conv in self.convs:
            h, x = conv(h, x, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_missing_conformers(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 7,
    missing_fraction: float = 0.2,
    cutoff: float = 2.5,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules whose nodes are a one-hot of 3 elements and the atom's position
    (``[num_atoms, 6]``), atoms in a 2.5 A box, an edge each way for every pair closer than
    ``cutoff``; a ``missing_fraction`` of them have every coordinate at 0, so all their
    atoms coincide (distance 0) and are all joined. Target: the number of bonds plus the
    atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        types = rng.integers(0, NUM_ELEMENTS, n)
        pos = np.zeros((n, 3)) if rng.random() < missing_fraction else rng.uniform(0, 2.5, (n, 3))
        graphs.append(
            molecule_graph(pos, types, cutoff, num_elements=NUM_ELEMENTS, positions_in_nodes=True)
        )
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_sqrt_coincident(ctx):
    """DGL's EGNNConv x2 on |x_i - x_j|: sqrt's gradient at coincident atoms is NaN"""
    return Recipe(model=EGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_sqrt_coincident",
    source="dmlc/dgl#7271",
    url="https://github.com/dmlc/dgl/issues/7271",
    summary=(
        "EGNN's distance |x_i - x_j| between weight-dependent positions is 0 at coincident "
        "atoms: finite forward, but sqrt's gradient there is inf, times 0 is NaN"
    ),
    fix_class="op guard",
    variant="zoo_b_sqrt_coincident",
    stage="gradient",
    op="Sqrt",
    cause="non-finite gradient op",
    fix=(
        "none in DGL (closed as stale); the EGNN reference divides by "
        "sqrt(radial).detach() + 1e-8; a safe norm takes sqrt(radial + eps)"
    ),
)
