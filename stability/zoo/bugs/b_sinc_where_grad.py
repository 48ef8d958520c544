"""DimeNet's radial basis ``sin(f d / c) / d`` guarded with ``tf.where`` at ``d = 0``:
the forward is fixed, the gradient is ``0 / 0``.

tensorflow/tensorflow#38349 (https://github.com/tensorflow/tensorflow/issues/38349),
"``nan`` gradient when ``tf.where`` is used": ``tf.where(cond, a, b)`` selects values, but
its gradient still runs through both branches, sending 0 into the branch that was not
taken; a branch whose own derivative is infinite or NaN there turns that 0 into NaN
(``0 / 0``, ``0 * inf``). The maintainers answered with documentation (proposed in
tensorflow/tensorflow#38467; ``tf.where``'s docstring carries the warning): make the
untaken branch safe with a second ``where`` on its input, ``tf.where(y > 0,
tf.sqrt(tf.where(y > 0, y, 1)), y)``, the "double where" that JAX adopted for
``jnp.sinc`` (jax-ml/jax#1722).

The model is b_sinc_zero's SchNet-style network on DimeNet's radial basis with trainable
frequencies, where the user fixed the forward ``0 / 0`` at overlapping atoms the natural
way, ``tf.where(d == 0, limit, sin(f d / c) / d)``: the prediction is finite now, and the
division's gradient with respect to its numerator, ``0 / d``, is ``0 / 0`` at ``d = 0``,
which reaches the frequencies through ``sin``. A fifth of the molecules hold an atom
duplicated by a symmetry operation onto itself (an atom on a special position expanded
twice), an edge of length 0.
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
    """DimeNet's radial basis with the polynomial envelope (p = 6), its value at 0 set to
    the limit with ``tf.where``.

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
        limit = self.frequencies / self.cutoff  # sin(f x) / d -> f / c as d -> 0
        rbf = math.sqrt(2 / self.cutoff) * tf.where(d == 0, limit, tf.sin(self.frequencies * x) / d)
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
def zoo_b_special_positions(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 7,
    duplicated_fraction: float = 0.2,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules (atoms in a 2.5 A box, an edge each way for every pair closer than
    3 A); a ``duplicated_fraction`` of them hold one atom twice at the same position (a
    symmetry copy of an atom on a special position), an edge of length 0 each way. Nodes:
    a one-hot of 3 elements; target: the number of bonds plus the element numbers."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        pos = rng.uniform(0.0, 2.5, (n, 3))
        types = rng.integers(0, 3, n)
        if rng.random() < duplicated_fraction:
            pos = np.vstack([pos, pos[:1]])
            types = np.append(types, types[0])
        graphs.append(molecule_graph(pos, types, CUTOFF))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_sinc_where_grad(ctx):
    """DimeNet basis with tf.where(d == 0, limit, sin(f d / c) / d): NaN gradient at d = 0"""
    return Recipe(model=BesselNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="b_sinc_where_grad",
    source="tensorflow/tensorflow#38349",
    url="https://github.com/tensorflow/tensorflow/issues/38349",
    summary=(
        "tf.where(d == 0, limit, sin(f d / c) / d) is finite forward, but the untaken "
        "branch's gradient 0 / d is 0 / 0 at d = 0"
    ),
    fix_class="op guard",
    variant="zoo_b_sinc_where_grad",
    stage="gradient",
    op="RealDiv",
    cause="non-finite gradient op",
    fix=(
        "the double where: divide by tf.where(d == 0, 1, d) inside the branch, so that no "
        "branch is evaluated at the singular point (the tf.where docstring, "
        "tensorflow/tensorflow#38467)"
    ),
)
