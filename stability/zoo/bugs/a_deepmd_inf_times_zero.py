"""deepmd-kit pull request #5717: a masked entry's overflow poisons its whole segment.

Source: deepmodeling/deepmd-kit pull request #5717 ("feat(dpmodel): NeighborGraph 3-body angle
machinery (PR-E)"), https://github.com/deepmodeling/deepmd-kit/pull/5717, review of
``deepmd/dpmodel/utils/neighbor_graph/segment.py`` (the same finding was first raised on
#5715, which added that ``segment_softmax``).

What the review found: the graph-native ``segment_softmax`` kept masked entries out of the
per-segment max (``data_for_max = where(mask, data, -inf)``) but shifted the raw ``data``:
``ex = exp(data - seg_max)``, then ``ex * mask``. A masked entry whose raw logit exceeds its
segment's unmasked max by more than ~88 (float32) makes ``exp`` return inf, and the mask
multiply computes ``inf * 0 = NaN``. The NaN enters ``segment_sum`` and so the denominator of
every entry of that segment; the ``denom > 0`` guard does not catch it (``NaN > 0`` is
False), so it falls back to 1 and the segment's weights come out unnormalized, and the
masked entry's NaN goes on into the model through the post-softmax switch weighting
(``NaN * 0`` is NaN again). What the maintainers changed: the shift is taken from
``data_for_max`` (masked entries already ``-inf``, so ``exp`` gives exactly 0), with the mask
multiply kept as a defensive no-op.

The model is a plain Keras attention GNN that uses that ``segment_softmax`` as it stood before
the fix (its ``segment_max`` starts from ``-inf`` as deepmd's does, through
``tf.tensor_scatter_nd_max``), with a neighbour mask of the edges inside a cutoff and the
smooth switch ``sw(r)`` applied after the softmax, as se_atten does. Its case gives the
distances rare outliers up to 400, far beyond the cutoff of 6: they are masked, and their
raw logits are the ones that overflow.
"""

import math

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

RCUT = 6.0  # the neighbour cutoff: edges beyond it are masked out of the softmax


def segment_max(data, segment_ids, num_segments):
    """deepmd's ``segment_max``: empty segments are ``-inf``. ``data`` ``[n]``."""
    out = tf.fill([num_segments], tf.constant(-math.inf, data.dtype))
    return tf.tensor_scatter_nd_max(out, segment_ids[:, None], data)


def segment_softmax(data, segment_ids, num_segments, mask):
    """deepmd's ``segment_softmax`` before the fix. ``data`` ``[n]`` logits, ``mask`` ``[n]``
    bool; returns ``[n]`` weights."""
    data_for_max = tf.where(mask, data, tf.fill(tf.shape(data), -math.inf))
    seg_max = segment_max(data_for_max, segment_ids, num_segments)
    # guard -inf (empty / fully-masked segments) so gather doesn't yield inf-inf
    seg_max = tf.where(tf.math.is_inf(seg_max), tf.zeros_like(seg_max), seg_max)
    shifted = data - tf.gather(seg_max, segment_ids)  # the raw data: the bug
    ex = tf.exp(shifted)
    ex = ex * tf.cast(mask, ex.dtype)
    denom = tf.math.unsorted_segment_sum(ex, segment_ids, num_segments)
    denom_e = tf.gather(denom, segment_ids)
    safe = tf.where(denom_e > 0, denom_e, tf.ones_like(denom_e))
    return ex / safe


class MaskedAttention(keras.layers.Layer):
    """Attention over each node's neighbours within the cutoff, weighted by the smooth switch.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``r`` ``[num_edges, 1]``, ``senders``,
    ``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.logit = keras.layers.Dense(1)
        self.value = keras.layers.Dense(hidden, activation="tanh")

    def call(self, h, r, senders, receivers):
        num_nodes = tf.shape(h)[0]
        pair = tf.concat([tf.gather(h, receivers), tf.gather(h, senders), r], axis=-1)
        logits = tf.squeeze(self.logit(pair), -1)  # [num_edges]
        dist = tf.squeeze(r, -1)
        mask = dist < RCUT
        # smooth switch: 1 at r = 0, 0 from the cutoff on
        sw = tf.where(mask, 0.5 * (tf.cos(math.pi * dist / RCUT) + 1.0), tf.zeros_like(dist))
        alpha = segment_softmax(logits, receivers, num_nodes, mask) * sw
        messages = alpha[:, None] * self.value(pair)
        return h + tf.math.unsorted_segment_sum(messages, receivers, num_nodes)


class AttentionGNN(keras.Model):
    """Embed the nodes, two masked-attention layers, a sum over each graph and two outputs."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="tanh")
        self.layers_ = [MaskedAttention(hidden), MaskedAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for layer in self.layers_:
            h = layer(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_deepmd_inf_times_zero(ctx):
    """masked segment softmax shifting the raw logits: a masked overflow, then inf * 0"""
    return Recipe(
        model=AttentionGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate)
    )


BUG = ZooBug(
    name="a_deepmd_inf_times_zero",
    source="deepmodeling/deepmd-kit#5717",
    url="https://github.com/deepmodeling/deepmd-kit/pull/5717",
    summary=(
        "a masked segment softmax shifts the raw logits: a masked entry far above its "
        "segment's max overflows exp, the mask multiply makes inf * 0 = NaN, and the NaN "
        "poisons the segment's denominator"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_deepmd_inf_times_zero",
    stage="forward",
    op="Exp",
    cause="forward overflow",
    fix=(
        "shift data_for_max (masked entries already -inf, so exp gives 0) instead of the raw "
        "data; the mask multiply stays as a no-op"
    ),
    silent=False,
)
