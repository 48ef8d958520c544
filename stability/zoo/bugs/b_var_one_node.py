"""A per-graph standard deviation readout over a one-atom molecule: ``sqrt(0)``, finite
forward, infinite derivative.

keras-team/keras#2960 (https://github.com/keras-team/keras/issues/2960), "K.std results in
NaN if input is zero vector": ``K.std(x)`` was ``sqrt(var(x))``, so its gradient is
``0.5 / sqrt(0)`` wherever the variance is 0, and the chain rule multiplies that inf by
``x - mean(x) = 0``: NaN in every weight behind it (the reporter met it in
``BatchNormalization`` on inputs that were sometimes all zero). The maintainer agreed to
expose ``K.var`` so that layers compute ``sqrt(var + epsilon)``, with the epsilon inside
the root, and the reporter opened the pull request.

The model reads each molecule out by the mean and the standard deviation of its atoms'
states (the "mean + std" readout of PNA-style aggregators), with the standard deviation
written as ``sqrt(mean((h - mean)^2))``. A single atom (a noble gas, an ion) has variance
exactly 0 in every feature; so does any feature a ReLU switched off on a whole molecule.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), edges], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class MeanStdReadoutNet(keras.Model):
    """Embed the atoms, two convolutions, read each molecule out by the mean and the
    standard deviation of its atoms' states, a (mean, log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        graph, num_graphs = inputs["node_graph"], inputs["num_graphs"]
        mean = tf.math.unsorted_segment_mean(h, graph, num_graphs)  # [num_graphs, hidden]
        var = tf.math.unsorted_segment_mean(
            tf.square(h - tf.gather(mean, graph)), graph, num_graphs
        )
        std = tf.sqrt(var)  # K.std: 0 for a one-atom molecule, with an infinite derivative
        return self.head(tf.concat([mean, std], axis=-1))


@register_dataset
def zoo_b_with_single_atoms(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    max_atoms: int = 7,
    single_fraction: float = 0.2,
    cutoff: float = 2.5,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (2 to ``max_atoms`` atoms in a 2 A box, an edge each way for every
    pair closer than ``cutoff``) and, a ``single_fraction`` of them, single atoms. Nodes: a
    one-hot of 3 elements; target: the number of bonds plus the atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = 1 if rng.random() < single_fraction else int(rng.integers(2, max_atoms + 1))
        types = rng.integers(0, 3, n)
        pos = rng.uniform(0.0, 2.0, (n, 3))
        graphs.append(molecule_graph(pos, types, cutoff))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_var_one_node(ctx):
    """mean + std readout with std = sqrt(var): NaN gradient at a one-atom molecule"""
    return Recipe(
        model=MeanStdReadoutNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate)
    )


BUG = ZooBug(
    name="b_var_one_node",
    source="keras-team/keras#2960",
    url="https://github.com/keras-team/keras/issues/2960",
    summary=(
        "a per-graph std readout sqrt(var) is 0 on a one-atom molecule, and sqrt's "
        "derivative there is inf, times h - mean = 0 is NaN"
    ),
    fix_class="op guard",
    variant="zoo_b_var_one_node",
    stage="gradient",
    op="Sqrt",
    cause="non-finite gradient op",
    fix=(
        "expose K.var and compute the std as sqrt(var + epsilon), the epsilon inside the "
        "root (agreed by the maintainer, pull request by the reporter)"
    ),
)
