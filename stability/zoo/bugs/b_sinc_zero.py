"""DimeNet's radial Bessel basis ``sin(n pi d / c) / d`` at a zero distance: ``0 / 0``.

deepmodeling/deepmd-kit#874 (https://github.com/deepmodeling/deepmd-kit/issues/874), "Got
nan value in output": a user's own training data gave NaN in ``lcurve.out`` while the
example data trained; a maintainer reproduced it and found that some atoms overlapped
(DeePMD's descriptor is built from ``1 / r``, which is inf at ``r = 0``), and proposed a
check that rejects such data. Overlapping atoms are common in real structure files: a CIF
with partial occupancy (two elements sharing a site) converts to two atoms at one
position (lab-cosmo/librascal#319 is the same NaN from such a file).

The model is a SchNet-style network on DimeNet's radial basis as the paper writes it,
``e_n(d) = sqrt(2 / c) sin(f_n d / c) / d`` with trainable frequencies ``f_n`` (started
at ``n pi``) and the polynomial envelope: finite everywhere but at ``d = 0``, where it is
``0 / 0`` although its limit is ``sqrt(2 / c) f_n / c``. A fifth of the molecules have one
disordered site holding two atoms.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph

CUTOFF = 3.0


class BesselBasis(keras.layers.Layer):
    """DimeNet's radial basis with the polynomial envelope (p = 6).

    Shapes: ``d`` ``[num_edges, 1]``; returns ``[num_edges, num_radial]``.
    """

    def __init__(self, num_radial=6, cutoff=CUTOFF, **kwargs):
        super().__init__(**kwargs)
        self.num_radial, self.cutoff = num_radial, cutoff

    def build(self, input_shape):
        start = keras.initializers.Constant(np.pi * np.arange(1, self.num_radial + 1))
        self.frequencies = self.add_weight(
            shape=(self.num_radial,), initializer=start, name="frequencies"
        )

    def call(self, d):
        x = d / self.cutoff
        p = 6
        envelope = (
            1
            - (p + 1) * (p + 2) / 2 * x**p
            + p * (p + 2) * x ** (p + 1)
            - p * (p + 1) / 2 * x ** (p + 2)
        )
        rbf = math.sqrt(2 / self.cutoff) * tf.sin(self.frequencies * x) / d
        return envelope * rbf


class Interaction(keras.layers.Layer):
    """A continuous-filter convolution: ``h_i + sum_j W(e(d_ij)) * h_j``."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.filter = keras.layers.Dense(hidden)
        self.message = keras.layers.Dense(hidden, activation="silu")

    def call(self, h, rbf, senders, receivers):
        messages = self.message(tf.gather(h, senders)) * self.filter(rbf)
        return h + tf.math.unsorted_segment_sum(messages, receivers, tf.shape(h)[0])


class BesselNet(keras.Model):
    """Embed the elements, the radial basis of every edge, two interactions, sum over each
    molecule, a (mean, log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden)
        self.basis = BesselBasis()
        self.interactions = [Interaction(hidden), Interaction(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        rbf = self.basis(inputs["edges"])
        for interaction in self.interactions:
            h = interaction(h, rbf, inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_disordered_sites(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 7,
    disordered_fraction: float = 0.2,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (atoms in a 2.5 A box, an edge each way for every pair closer than
    3 A); a ``disordered_fraction`` of them have one partially occupied site converted to
    two atoms of different elements at the same position, an edge of length 0 each way.
    Nodes: a one-hot of 3 elements; target: the number of bonds plus the element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        pos = rng.uniform(0.0, 2.5, (n, 3))
        types = rng.integers(0, 3, n)
        if rng.random() < disordered_fraction:
            pos = np.vstack([pos, pos[:1]])
            types = np.append(types, (types[0] + 1) % 3)
        graphs.append(molecule_graph(pos, types, CUTOFF))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_sinc_zero(ctx):
    """SchNet-style net on DimeNet's sin(f d / c) / d basis: 0 / 0 at overlapping atoms"""
    return Recipe(model=BesselNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_sinc_zero",
    source="deepmodeling/deepmd-kit#874",
    url="https://github.com/deepmodeling/deepmd-kit/issues/874",
    summary=(
        "a radial function that divides by the distance, DimeNet's sin(f d / c) / d, is "
        "0 / 0 at two overlapping atoms"
    ),
    fix_class="data cleaning",
    variant="zoo_b_sinc_zero",
    stage="forward",
    op="RealDiv",
    cause="forward underflow (0/0)",
    fix=(
        "reject overlapping atoms in the data (the maintainers' proposed check); in the "
        "model, evaluate sin(x)/x by its limit at 0 with a safe denominator"
    ),
)
