"""Keras 3.0's ``BatchNormalization`` computed the batch variance as ``E[x^2] - E[x]^2``,
clamped at 0: on features whose mean is large against their spread, float32 loses every
digit of the variance, with every value finite.

Source: keras-team/keras pull request #18795, https://github.com/keras-team/keras/pull/18795,
"Fix numerical issues in TF and JAX ``moments`` implementation." (merged).

What was seen: keras-core pull request #866 ("Add ``ops.nn.moments`` and speed-up
normalization layers") made ``ops.moments``, and so ``BatchNormalization``,
``LayerNormalization`` and ``GroupNormalization``, compute the variance "fast but unstable"
as ``mean(square(x)) - square(mean)``. The author of #18795: "Without this fix, it won't
guarantee that variance >= 0 ... we're occasionally running into NaN's when using
BatchNorm." The cause is catastrophic cancellation: both terms are about ``mean^2``, and
their float32 difference keeps only ``ulp(mean^2)`` of the variance. What the maintainers
changed: #18795 clamped the difference at 0 (``tf.maximum(..., 0.0)``), which removes the
NaN but not the cancellation: a feature with mean 1000 and variance 0.3 gets a float32
variance that is rounding noise (often 0, then ``rsqrt(0 + epsilon)`` scales it by 30), a
wrong normalization that float64 does not make. Commit 9815ac1 ("Fix BN with XLA", Keras
3.0.4) then replaced the formula by ``tf.nn.moments`` (TensorFlow) and ``jnp.var`` (JAX),
which subtract the mean before squaring.

The model standardizes its raw node features with that ``BatchNormalization`` (the #18795
formula in ``_moments``), then two sum convolutions, a per-graph mean and a (mean, log
sigma) head. Its data (``zoo_s_slab_molecules``): small molecules adsorbed on a slab, each
atom's features its element (one-hot) and its height in A above the cell floor, about
1000 A and within 2 A of each other.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from stability import Recipe, register_variant
from stability.data import Dataset, register_dataset
from stability.data.graphs import Graph
from stability.zoo.bug import ZooBug


class FastVarianceBatchNormalization(keras.layers.BatchNormalization):
    """``BatchNormalization`` whose batch moments are Keras 3.0's (PR #18795)."""

    def _moments(self, inputs, mask):
        if mask is not None:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        mean = ops.mean(inputs, axes)
        # var = E[x^2] - E[x]^2, clamped at 0 (#18795): cancels every digit when mean^2 >> var
        variance = ops.maximum(
            ops.mean(ops.square(inputs), axes) - ops.square(ops.stop_gradient(mean)), 0.0
        )
        return mean, variance


class SumConv(keras.layers.Layer):
    """``relu(W [h_i, sum_j P [h_j, e_ij]])`` over the incoming edges: ``[N, hidden]``."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        m = self.message(tf.concat([tf.gather(h, senders), edges], axis=-1))
        summed = tf.math.unsorted_segment_sum(m, receivers, tf.shape(h)[0])
        return self.update(tf.concat([h, summed], axis=-1))


class StandardizedNet(keras.Model):
    """Batch-normalized raw features, two convolutions, per-graph mean, head."""

    def __init__(self, hidden: int, normalization=FastVarianceBatchNormalization, **kwargs):
        super().__init__(**kwargs)
        self.standardize = normalization()
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs, training=None):
        h = self.embed(self.standardize(inputs["nodes"], training=training))
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_dataset
def zoo_s_slab_molecules(
    *,
    seed: int = 0,
    num_graphs: int = 64,
    max_atoms: int = 7,
    height: float = 1000.0,
    cutoff: float = 2.5,
    val_fraction: float = 0.1,
) -> Dataset:
    """Molecules of 2 to ``max_atoms`` atoms in a 2 A box whose floor is at ``height`` A (an
    edge each way for every pair closer than ``cutoff``). Nodes: a one-hot of 3 elements and
    the atom's height; target: the number of bonds plus the element numbers plus the
    molecule's mean height above the slab."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(rng.integers(2, max_atoms + 1))
        types = rng.integers(0, 3, n)
        pos = rng.uniform(0.0, 2.0, (n, 3))
        dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
        senders, receivers = np.nonzero((dist < cutoff) & ~np.eye(n, dtype=bool))
        graphs.append(
            Graph(
                nodes=np.concatenate([np.eye(3)[types], height + pos[:, 2:]], axis=1),
                edges=dist[senders, receivers][:, None],
                senders=senders.astype(np.int32),
                receivers=receivers.astype(np.int32),
                target=float(len(senders) / 2 + types.sum() + pos[:, 2].mean()),
            )
        )
    key = (
        f"zoo_s_slab_molecules(seed={seed},num_graphs={num_graphs},max_atoms={max_atoms},"
        f"height={height!r},cutoff={cutoff!r},val_fraction={val_fraction!r})"
    )
    return Dataset.from_graphs(key, graphs, seed=seed, val_fraction=val_fraction, cutoff=cutoff)


@register_variant
def zoo_s_keras_fast_variance(ctx):
    """BatchNormalization with Keras 3.0's var = E[x^2] - E[x]^2 (clamped) on raw features"""
    return Recipe(
        model=StandardizedNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate)
    )


BUG = ZooBug(
    name="s_keras_fast_variance",
    source="keras-team/keras#18795",
    url="https://github.com/keras-team/keras/pull/18795",
    summary=(
        "BatchNormalization's variance E[x^2] - E[x]^2 (clamped at 0) cancels every float32 "
        "digit of a feature whose mean is large against its spread; float64 gets it right"
    ),
    fix_class="stable reformulation",
    variant="zoo_s_keras_fast_variance",
    stage="forward",
    op="moments",
    cause="none",
    fix=(
        "PR #18795 clamped the variance at 0 (no NaN, still cancelling); commit 9815ac1 "
        "(Keras 3.0.4) computes it with tf.nn.moments / jnp.var, the mean subtracted first"
    ),
    silent=True,
    invariant="dtype_agreement",
)
