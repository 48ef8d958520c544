"""GCN's symmetric normalization ``deg^-1/2`` at an isolated node: inf, then ``0 * inf``.

mlx-graphs/mlx-graphs#18 (https://github.com/mlx-graphs/mlx-graphs/pull/18), "Add support
for inf values in GCN": the library's ``GCNConv`` computed ``deg ** -0.5`` with nothing
to catch a node of degree 0, whose factor is inf; PyTorch Geometric's ``gcn_norm`` zeroes
those entries (``deg_inv_sqrt.masked_fill_(deg_inv_sqrt == inf, 0)``, Kipf's reference
code does ``d_inv_sqrt[np.isinf(d_inv_sqrt)] = 0``), but MLX had no boolean indexing then,
so the pull request worked around it with a small epsilon on the degree before the power;
mlx-graphs#146 later replaced the workaround with ``mx.where`` once MLX handled inf there
(mlx-graphs#117).

The model is a GCN written the way DGL's ``GraphConv(norm="both")`` computes it, with
the degree clamp left out: scale the node states by ``deg^-1/2``, sum over the incoming
edges, scale by ``deg^-1/2`` again. An isolated atom (a counter-ion beyond the cutoff of
every other atom) has degree 0: its states are scaled by inf, it receives nothing, and
``0 * inf`` is NaN; the readout sums it into its molecule's prediction.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph


class GCNLayer(keras.layers.Layer):
    """``relu(D^-1/2 A D^-1/2 h W)`` over the incoming edges, without self-loops.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``senders``/``receivers`` ``[num_edges]``;
    returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.linear = keras.layers.Dense(hidden)

    def call(self, h, senders, receivers):
        num_nodes = tf.shape(h)[0]
        ones = tf.ones_like(receivers, dtype=h.dtype)
        deg = tf.math.unsorted_segment_sum(ones, receivers, num_nodes)  # [num_nodes]
        norm = tf.pow(deg, -0.5)[:, None]  # inf where deg == 0
        h = self.linear(h) * norm
        summed = tf.math.unsorted_segment_sum(tf.gather(h, senders), receivers, num_nodes)
        return tf.nn.relu(summed * norm)


class GCN(keras.Model):
    """Embed the atoms, two GCN layers, sum over each molecule, a (mean, log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [GCNLayer(hidden), GCNLayer(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_counter_ions(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 8,
    ion_fraction: float = 0.25,
    cutoff: float = 2.0,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (``min_atoms`` to ``max_atoms`` atoms in a 2.5 A box, an edge each
    way for every pair closer than ``cutoff``); an ``ion_fraction`` of them carry one more
    atom, a counter-ion 8 A away, which no edge reaches. Nodes: a one-hot of 3 elements;
    target: the number of bonds plus the atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        pos = rng.uniform(0.0, 2.5, (n, 3))
        if rng.random() < ion_fraction:
            pos = np.vstack([pos, [[10.5, 1.0, 1.0]]])
        types = rng.integers(0, 3, len(pos))
        graphs.append(molecule_graph(pos, types, cutoff))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_gcn_deg_isolated(ctx):
    """GCN with deg ** -0.5 unguarded: inf at isolated atoms, then 0 * inf = NaN"""
    return Recipe(model=GCN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_gcn_deg_isolated",
    source="mlx-graphs/mlx-graphs#18",
    url="https://github.com/mlx-graphs/mlx-graphs/pull/18",
    summary=(
        "GCN's deg ** -0.5 is inf at a node of degree 0; the node's aggregate 0 times that "
        "inf is NaN"
    ),
    fix_class="op guard",
    variant="zoo_b_gcn_deg_isolated",
    stage="forward",
    op="Pow",
    cause="forward overflow",
    fix=(
        "zero the infinite entries of deg ** -0.5, as PyG's masked_fill does (mlx-graphs "
        "first added 1e-10 to the degree, then used mx.where, mlx-graphs#146)"
    ),
)
