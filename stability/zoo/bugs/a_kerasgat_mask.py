"""keras-gat #23: "Getting NaN loss" from the additive ``-10e9`` attention mask.

Source: danielegrattarola/keras-gat issue #23,
https://github.com/danielegrattarola/keras-gat/issues/23

What users saw: "after a sufficient number of iterations, my model loss unexpectedly goes to
nan", which the reporter traced to the two lines of ``GraphAttention.call`` that mask the
attention logits before the softmax, ``mask = -10e9 * (1.0 - A)`` and ``dense += mask``: "I
think the above masking is resulting in a -inf value somewhere". Replacing them with
``dense *= A`` removed the NaN; they proposed clamping the mask instead
(``K.maximum(-10e6 * (1.0 - A), -10e9)``), and the maintainer, who had "never encountered the
problem", agreed it was "probably due to what you suggest" and invited a pull request. No
change was merged: the mask line is the same in the repository's last version, and the
project was later deprecated in favour of Spektral's GAT. (In #28 the maintainer asked
another NaN reporter whether they trained "with some particular setup (e.g. restricted
precision)".)

The mechanism, where it is real: ``-10e9`` is finite in float32 (``dense + mask`` stays about
``-1e10``, and the row max subtracted by the softmax keeps it finite), but not in float16,
whose largest value is 65504. Under Keras' ``mixed_float16`` policy the layer computes in
float16: ``A`` arrives as float16, the Python constant ``-10e9`` is converted to float16 as
``-inf``, and ``-inf * (1.0 - A)`` is ``-inf`` where there is no edge and ``-inf * 0 = NaN``
on every edge and self-loop. Every logit the softmax should keep is NaN at the first forward
pass. The fix is a mask that is finite in the compute dtype (``tf.where(A > 0, dense,
dtype.min)``, or ``-1e4`` in float16) or a boolean mask; the sparse, edge-list GAT of Spektral
needs none.

The model is keras-gat's ``GraphAttention`` (one head, dense N x N attention, self-loops
added to ``A`` as in its example) in Keras 3, on a dense adjacency built from each batch;
its case trains it under ``mixed_float16``.
"""

import keras
import tensorflow as tf
from keras import ops as K

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class GraphAttention(keras.layers.Layer):
    """keras-gat's ``GraphAttention`` (one head, no dropout). Inputs ``[X, A]``: node
    features ``[N, F]`` and the dense adjacency ``[N, N]`` (``A[i, j] = 1`` for an edge
    ``j -> i`` and on the diagonal); returns ``[N, F_]``."""

    def __init__(self, F_, **kwargs):
        super().__init__(**kwargs)
        self.F_ = F_

    def build(self, input_shape):
        F = input_shape[0][-1]
        self.kernel = self.add_weight(shape=(F, self.F_), initializer="glorot_uniform")
        self.bias = self.add_weight(shape=(self.F_,), initializer="zeros")
        self.attn_kernel_self = self.add_weight(shape=(self.F_, 1), initializer="glorot_uniform")
        self.attn_kernel_neighs = self.add_weight(shape=(self.F_, 1), initializer="glorot_uniform")

    def call(self, inputs):
        X = inputs[0]  # Node features (N x F)
        A = inputs[1]  # Adjacency matrix (N x N)
        features = K.matmul(X, self.kernel)  # (N x F')
        attn_for_self = K.matmul(features, self.attn_kernel_self)  # (N x 1)
        attn_for_neighs = K.matmul(features, self.attn_kernel_neighs)  # (N x 1)
        dense = attn_for_self + K.transpose(attn_for_neighs)  # (N x N) via broadcasting
        dense = K.leaky_relu(dense, negative_slope=0.2)
        # Mask values before activation (Vaswani et al., 2017)
        mask = -10e9 * (1.0 - A)
        dense += mask
        dense = K.softmax(dense)  # (N x N)
        node_features = K.matmul(dense, features)  # (N x F')
        return K.elu(node_features + self.bias)


class KerasGAT(keras.Model):
    """Two GraphAttention layers on the batch's dense adjacency, a mean over each graph's
    nodes and two outputs."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.gat1 = GraphAttention(hidden)
        self.gat2 = GraphAttention(hidden)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        X = inputs["nodes"]
        num_nodes = tf.shape(X)[0]
        pairs = tf.stack([inputs["receivers"], inputs["senders"]], axis=1)
        A = tf.scatter_nd(pairs, tf.ones_like(inputs["senders"], tf.float32), [num_nodes] * 2)
        A = tf.minimum(A + tf.eye(num_nodes), 1.0)  # A = A + np.eye(A.shape[0]): self-loops
        h = self.gat1([X, A])
        h = self.gat2([h, A])
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_kerasgat_mask(ctx):
    """keras-gat's GraphAttention: additive -10e9 * (1 - A) mask, dense softmax"""
    return Recipe(model=KerasGAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_kerasgat_mask",
    source="danielegrattarola/keras-gat#23",
    url="https://github.com/danielegrattarola/keras-gat/issues/23",
    summary=(
        "the additive mask -10e9 * (1 - A) overflows float16: -10e9 becomes -inf and "
        "-inf * 0 = NaN on every edge, so the masked softmax is NaN"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_kerasgat_mask",
    stage="forward",
    op="mul",
    cause="forward overflow",
    fix=(
        "none merged (the reporter proposed clamping the mask, K.maximum(-10e6 * (1 - A), "
        "-10e9)); a mask finite in the compute dtype or a boolean tf.where avoids it"
    ),
    silent=False,
)
