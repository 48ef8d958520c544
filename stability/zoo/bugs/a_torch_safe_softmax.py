"""PyTorch #55056 ("[FR] Safe softmax") and pull request #131060 ("Add a private
_safe_softmax"): the softmax of a fully masked row is NaN.

Source: pytorch/pytorch issue #55056, https://github.com/pytorch/pytorch/issues/55056, and
pull request #131060, https://github.com/pytorch/pytorch/pull/131060 (re-landed for
scaled_dot_product_attention as #131863 and #133882).

What users saw: attention with a ``-inf`` mask (``masked_fill(~mask, -inf)`` then softmax)
gives NaN for a query whose keys are all masked out, "leading to training divergence"
(#55056, citing #41508 and #40932); the NaN then reaches the loss and every weight. Why: a
softmax over nothing is ``0 / 0``. PyTorch's kernel computes ``x - max`` with ``max = -inf``,
which is already NaN; in TensorFlow the segment max of a segment whose entries are all
``-inf`` is the lowest float (the kernel's initial value, which ``-inf`` never beats), so
``-inf - lowest = -inf``, every ``exp`` is exactly 0, the node's sum is 0, and the division is
``0 / 0 = NaN``. What the maintainers changed: #55056 asked for an ``eps`` in the
denominator; #131060 added ``torch._safe_softmax``, which returns 0 for a fully masked row,
and scaled_dot_product_attention switched to it ("Changes the stance of SDPA on what to do for
fully masked out rows").

The model is a graph attention layer written the way a PyTorch user ports a masked attention
to TensorFlow: edges beyond a cutoff are masked with ``-inf`` before a max-subtracted
segment softmax. Its case draws uniform distances 0.5-4 with a cutoff of 1.5, so many nodes
have incoming edges that are all masked.
"""

import math

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

CUTOFF = 1.5  # edges longer than this are masked out of the attention


def masked_segment_softmax(logits, mask, segment_ids, num_segments):
    """``softmax(logits.masked_fill(~mask, -inf))`` over each node's incoming edges, max
    subtracted. Shapes: ``logits``, ``mask`` ``[num_edges]``; returns ``[num_edges]``."""
    logits = tf.where(mask, logits, tf.fill(tf.shape(logits), -math.inf))
    top = tf.math.unsorted_segment_max(logits, segment_ids, num_segments)
    ex = tf.exp(logits - tf.gather(top, segment_ids))
    total = tf.math.unsorted_segment_sum(ex, segment_ids, num_segments)
    return ex / tf.gather(total, segment_ids)


class CutoffAttention(keras.layers.Layer):
    """Attention over each node's incoming edges shorter than the cutoff.

    Shapes: ``h`` ``[num_nodes, hidden]``, ``edges`` ``[num_edges, 1]``, ``senders``,
    ``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.query = keras.layers.Dense(hidden)
        self.key = keras.layers.Dense(hidden)
        self.value = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        q = tf.gather(self.query(h), receivers)
        k = self.key(tf.concat([tf.gather(h, senders), edges], axis=-1))
        logits = tf.reduce_sum(q * k, axis=-1) / math.sqrt(q.shape[-1])  # [num_edges]
        mask = tf.squeeze(edges, -1) < CUTOFF
        alpha = masked_segment_softmax(logits, mask, receivers, num_nodes)
        messages = alpha[:, None] * self.value(tf.concat([tf.gather(h, senders), edges], -1))
        return h + tf.math.unsorted_segment_sum(messages, receivers, num_nodes)


class CutoffGNN(keras.Model):
    """Embed the nodes, two cutoff-attention layers, a sum over each graph, two outputs."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.rounds = [CutoffAttention(hidden), CutoffAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for layer in self.rounds:
            h = layer(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return self.head(pooled)


@register_variant
def zoo_a_torch_safe_softmax(ctx):
    """-inf-masked segment softmax: a node whose incoming edges are all masked gets 0/0"""
    return Recipe(model=CutoffGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_torch_safe_softmax",
    source="pytorch/pytorch#55056",
    url="https://github.com/pytorch/pytorch/issues/55056",
    summary=(
        "a softmax over a fully masked (-inf) row sums nothing: every exp is 0 and the "
        "division is 0/0 = NaN"
    ),
    fix_class="op guard",
    variant="zoo_a_torch_safe_softmax",
    stage="forward",
    op="RealDiv",
    cause="forward underflow (0/0)",
    fix=(
        "PR #131060: torch._safe_softmax returns 0 for a fully masked row, and "
        "scaled_dot_product_attention uses it; #55056 proposed an eps in the denominator"
    ),
    silent=False,
)
