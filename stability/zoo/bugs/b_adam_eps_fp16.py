"""Adam's step computed in float16: ``epsilon = 1e-8`` rounds to 0, and a zero gradient
gives ``0 / (sqrt(0) + 0) = NaN``.

google-deepmind/optax#1754 (https://github.com/google-deepmind/optax/issues/1754),
"Adam-family optimizers (adam, amsgrad, adabelief, yogi) produce NaN on float16
zero-gradient steps": with float16 parameters, optax computes ``m / (sqrt(v + eps_root) +
eps)`` in float16, where the default ``eps = 1e-8`` is below float16's smallest subnormal
(6e-8) and rounds to exactly 0. On a step whose gradient is exactly 0 (an unused embedding
row, a masked input) both moments are 0 and the update is ``0 / 0``; the NaN then poisons
every later step. optax#1789 reports the same for AdaDelta, Adan and NovoGrad. The fixes
under review (optax#1755, optax#1769) evaluate the denominator in at least float32 and
cast the update back. keras-team/keras#11860 ("adam optimizer does not work with FP16")
is the Keras face of it: ``loss: nan`` with Adam under ``K.set_floatx('float16')``, fine
with SGD or in float32.

The harness keeps weights in float32 under ``mixed_float16``, so the optimizer here is a
user's Adam that does what optax does with float16 parameters: it keeps Keras' moments and
computes the step in the policy's compute dtype, float16, with PyTorch's and optax's
``epsilon = 1e-8`` (Keras' own 1e-7 survives as a float16 subnormal). The atoms are a
one-hot over a fixed vocabulary of 5 elements of which these molecules use 3, so the
embedding rows of the other two get an exactly-zero gradient at every step.
"""

from dataclasses import replace

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.zoo.bug import ZooBug
from stability.zoo.bugs._molecules import molecule_graph

VOCABULARY = ("H", "C", "N", "O", "F")


class HalfStepAdam(keras.optimizers.Adam):
    """Adam whose step ``alpha m / (sqrt(v) + epsilon)`` is computed in ``step_dtype``."""

    def __init__(self, learning_rate=0.001, epsilon=1e-8, step_dtype="float16", **kwargs):
        super().__init__(learning_rate=learning_rate, epsilon=epsilon, **kwargs)
        self.step_dtype = step_dtype

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        local_step = ops.cast(self.iterations + 1, variable.dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, variable.dtype), local_step)
        beta_2_power = ops.power(ops.cast(self.beta_2, variable.dtype), local_step)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        half = self.step_dtype
        step = ops.divide(
            ops.multiply(ops.cast(m, half), ops.cast(alpha, half)),
            ops.add(ops.sqrt(ops.cast(v, half)), ops.cast(self.epsilon, half)),
        )
        self.assign_sub(variable, ops.cast(step, variable.dtype))


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), tf.cast(edges, h.dtype)], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class ElementNet(keras.Model):
    """Embed the one-hot elements, two convolutions, mean over each molecule, a (mean,
    log sigma) head."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_b_hco_molecules(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    min_atoms: int = 3,
    max_atoms: int = 8,
    cutoff: float = 2.0,
    val_fraction: float = 0.1,
) -> Dataset:
    """Small molecules of H, C and O only (atoms in a 2.5 A box, an edge each way for every
    pair closer than ``cutoff``), featurized as a one-hot over the 5-element vocabulary
    H, C, N, O, F. Target: the number of bonds plus the number of heavy atoms."""
    rng = np.random.default_rng(seed)
    used = [VOCABULARY.index(e) for e in ("H", "C", "O")]
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        types = rng.choice(used, n)
        pos = rng.uniform(0.0, 2.5, (n, 3))
        graph = molecule_graph(pos, types, cutoff, num_elements=len(VOCABULARY))
        # The target counts heavy atoms, not element numbers.
        graphs.append(replace(graph, target=float(graph.num_edges / 2 + (types > 0).sum())))
    return Dataset.split(graphs, seed=seed, val_fraction=val_fraction)


@register_variant
def zoo_b_adam_eps_fp16(ctx):
    """Adam with epsilon 1e-8 and its step in float16: 0/0 on exactly-zero gradients"""
    step_dtype = "float16" if ctx.dtype == "mixed_float16" else ctx.dtype
    return Recipe(
        model=ElementNet(ctx.hidden),
        optimizer=HalfStepAdam(ctx.learning_rate, epsilon=1e-8, step_dtype=step_dtype),
    )


BUG = ZooBug(
    name="b_adam_eps_fp16",
    source="google-deepmind/optax#1754",
    url="https://github.com/google-deepmind/optax/issues/1754",
    summary=(
        "Adam's step m / (sqrt(v) + eps) computed in float16, where eps = 1e-8 rounds to 0: "
        "0 / 0 on a weight whose gradient is exactly 0"
    ),
    fix_class="dtype",
    variant="zoo_b_adam_eps_fp16",
    stage="weights",
    op="RealDiv",
    cause="optimizer",
    fix=(
        "evaluate the denominator in at least float32 and cast the update back "
        "(optax#1755, optax#1769; AdaDelta/Adan/NovoGrad: optax#1790)"
    ),
)
