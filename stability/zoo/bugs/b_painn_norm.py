"""PaiNN's norm of the vector features at an atom whose vector features are 0: finite
forward, NaN gradient.

atomistic-machine-learning/schnetpack#301
(https://github.com/atomistic-machine-learning/schnetpack/pull/301), "add epsilon to
painn": PaiNN's update block mixes each atom's vector features with a linear map and feeds
their norm over the three spatial components, ``torch.norm(mu_V, dim=-2)``, to an MLP; the
merged pull request replaced it with ``sqrt(sum(mu_V ** 2) + epsilon)``. What it guards
against: the vector features start at 0 and only messages from neighbours make them
non-zero, so at an atom with no neighbour inside the cutoff they stay exactly 0; the norm's
forward is 0, its derivative ``mu_V / |mu_V|`` is ``0 / 0``, and the NaN reaches the
weights of the mixing map.

The model is PaiNN (one message and one update block) in plain Keras with
``tf.norm(mu_V, axis=-2)``, as schnetpack computed it before the fix. Nodes carry a
one-hot element and the atom's position, so that the messages can use the unit vectors of
the edges; a quarter of the molecules carry a counter-ion 8 A away, an atom without
neighbours.
"""

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph

NUM_ELEMENTS = 3
CUTOFF = 2.0


def gaussian_rbf(d, num=8, cutoff=CUTOFF):
    """``exp(-(d - mu_k)^2 / (2 width^2))`` on ``num`` centres in ``[0, cutoff]``;
    ``d`` ``[num_edges, 1]`` -> ``[num_edges, num]``."""
    centres = tf.linspace(0.0, cutoff, num)
    width = cutoff / num
    return tf.exp(-tf.square(d - centres) / (2 * width**2))


class PaiNNMessage(keras.layers.Layer):
    """Scalar and vector messages from each neighbour, filtered by the distance."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        self.phi = keras.Sequential(
            [keras.layers.Dense(hidden, activation="silu"), keras.layers.Dense(3 * hidden)]
        )
        self.filter = keras.layers.Dense(3 * hidden)

    def call(self, h, v, edges, unit, senders, receivers):
        num_nodes = tf.shape(h)[0]
        x = tf.gather(self.phi(h), senders) * self.filter(gaussian_rbf(edges))
        ds, dvv, dvs = tf.split(x, 3, axis=-1)  # [num_edges, hidden] each
        dv = dvv[:, None, :] * tf.gather(v, senders) + dvs[:, None, :] * unit[:, :, None]
        h = h + tf.math.unsorted_segment_sum(ds, receivers, num_nodes)
        return h, v + tf.math.unsorted_segment_sum(dv, receivers, num_nodes)


class PaiNNUpdate(keras.layers.Layer):
    """Mix each atom's vector channels, and update from their norms."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.mu_channel_mix = keras.layers.Dense(2 * hidden, use_bias=False)
        self.intra_atomic = keras.Sequential(
            [keras.layers.Dense(hidden, activation="silu"), keras.layers.Dense(3 * hidden)]
        )

    def call(self, h, v):
        mu_v, mu_w = tf.split(self.mu_channel_mix(v), 2, axis=-1)  # [num_nodes, 3, hidden]
        mu_vn = tf.norm(mu_v, axis=-2)  # [num_nodes, hidden]; 0 where v is 0
        a_vv, a_sv, a_ss = tf.split(self.intra_atomic(tf.concat([h, mu_vn], -1)), 3, -1)
        dh = a_sv * tf.reduce_sum(mu_v * mu_w, axis=-2) + a_ss
        return h + dh, v + a_vv[:, None, :] * mu_w


class PaiNN(keras.Model):
    """Embed the elements, a message and an update block, sum over each molecule, a (mean,
    log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        self.embed = keras.layers.Dense(hidden)
        self.message = PaiNNMessage(hidden)
        self.update = PaiNNUpdate(hidden)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        nodes, senders, receivers = inputs["nodes"], inputs["senders"], inputs["receivers"]
        pos = nodes[:, NUM_ELEMENTS:]
        unit = (tf.gather(pos, senders) - tf.gather(pos, receivers)) / inputs["edges"]
        h = self.embed(nodes[:, :NUM_ELEMENTS])
        v = tf.zeros([tf.shape(h)[0], 3, self.hidden], h.dtype)  # vector features start at 0
        h, v = self.message(h, v, inputs["edges"], unit, senders, receivers)
        h, v = self.update(h, v)
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_ions_with_positions(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 7,
    ion_fraction: float = 0.25,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules whose nodes are a one-hot of 3 elements and the atom's position
    (``[num_atoms, 6]``), atoms in a 2.5 A box, an edge each way for every pair closer than
    2 A; an ``ion_fraction`` of them carry a counter-ion 8 A away, which no edge reaches.
    Target: the number of bonds plus the atoms' element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        pos = rng.uniform(0.0, 2.5, (n, 3))
        if rng.random() < ion_fraction:
            pos = np.vstack([pos, [[10.5, 1.0, 1.0]]])
        types = rng.integers(0, NUM_ELEMENTS, len(pos))
        graphs.append(
            molecule_graph(pos, types, CUTOFF, num_elements=NUM_ELEMENTS, positions_in_nodes=True)
        )
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_painn_norm(ctx):
    """PaiNN with tf.norm of the mixed vector features: NaN gradient at atoms without neighbours"""
    return Recipe(model=PaiNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_painn_norm",
    source="atomistic-machine-learning/schnetpack#301",
    url="https://github.com/atomistic-machine-learning/schnetpack/pull/301",
    summary=(
        "PaiNN's norm of the mixed vector features is 0 at an atom without neighbours, and "
        "its gradient there is 0 / 0"
    ),
    fix_class="op guard",
    variant="zoo_b_painn_norm",
    stage="gradient",
    op="Sqrt",
    cause="non-finite gradient op",
    fix="compute the norm as sqrt(sum(mu_V ** 2) + epsilon)",
)
