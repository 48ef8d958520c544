"""A safe softmax's zero rows: a node whose incoming edges are all masked gets weights that
sum to 0, silently.

Source: pytorch/pytorch pull request #131060 ("Add a private _safe_softmax"),
https://github.com/pytorch/pytorch/pull/131060, the fix of the NaN of #55056 (the zoo's
``a_torch_safe_softmax``).

What it does: to end the NaN of a fully masked row, ``torch._safe_softmax`` returns 0 for it
(PyTorch's scaled_dot_product_attention switched to it), the choice the PR weighs against
attending uniformly; TensorFlow users get the same with ``tf.math.divide_no_nan`` in a segment
softmax. No value is ever non-finite, so no NaN check fires. What goes wrong instead: at a node
whose incoming edges are all masked the weights sum to 0, not 1, so the node aggregates
nothing, its update is its own state, and the gradient to its neighbours' messages is 0. On
data where such nodes are common (a cutoff shorter than most distances) the attention
silently learns from part of the graph; a node that has incoming edges is normalized over
none of them. Nothing in the run says so.

The model is the cutoff attention of ``a_torch_safe_softmax`` with the NaN fixed the
``divide_no_nan`` way. It exposes its attention through the forward contract
(docs/plugins.md): ``forward()`` returns the weights ``alpha``, the ``receivers`` they are
normalized over, and the logits, as a user who wants the harness to check the softmax
writes it; ``call`` goes through ``forward``.
"""

import math

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

CUTOFF = 1.5  # edges longer than this are masked out of the attention


def safe_segment_softmax(logits, mask, segment_ids, num_segments):
    """``softmax(logits.masked_fill(~mask, -inf))`` over each node's incoming edges, 0 for a
    node whose edges are all masked (``divide_no_nan``). Shapes: ``[num_edges]`` in and out."""
    logits = tf.where(mask, logits, tf.fill(tf.shape(logits), -math.inf))
    top = tf.math.unsorted_segment_max(logits, segment_ids, num_segments)
    ex = tf.exp(logits - tf.gather(top, segment_ids))
    total = tf.math.unsorted_segment_sum(ex, segment_ids, num_segments)
    return tf.math.divide_no_nan(ex, tf.gather(total, segment_ids))


class CutoffAttention(keras.layers.Layer):
    """Attention over each node's incoming edges shorter than the cutoff; returns the new
    node states ``[num_nodes, hidden]``, the logits and the weights ``[num_edges]``."""

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
        alpha = safe_segment_softmax(logits, mask, receivers, num_nodes)
        messages = alpha[:, None] * self.value(tf.concat([tf.gather(h, senders), edges], -1))
        updated = h + tf.math.unsorted_segment_sum(messages, receivers, num_nodes)
        return updated, logits, alpha


class CutoffGNN(keras.Model):
    """Embed the nodes, two cutoff-attention layers, a sum over each graph, two outputs;
    ``forward`` also returns the attention for the harness to check."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.rounds = [CutoffAttention(hidden), CutoffAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def forward(self, inputs):
        h = self.embed(inputs["nodes"])
        logits, alphas = [], []
        for layer in self.rounds:
            h, logit, alpha = layer(h, inputs["edges"], inputs["senders"], inputs["receivers"])
            logits.append(logit[:, None])
            alphas.append(alpha[:, None])
        pooled = tf.math.unsorted_segment_sum(h, inputs["node_graph"], inputs["num_graphs"])
        return {
            "predictions": self.head(pooled),
            "alpha": alphas,
            "receivers": [inputs["receivers"]] * len(self.rounds),
            "logits": logits,
            "attention_layers": [layer.name for layer in self.rounds],
            "softmax_shifted": [True] * len(self.rounds),
        }

    def call(self, inputs):
        return self.forward(inputs)["predictions"]


@register_variant
def zoo_a_masked_zero_rows(ctx):
    """-inf-masked segment softmax made safe with divide_no_nan: fully masked nodes sum to 0"""
    return Recipe(model=CutoffGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_masked_zero_rows",
    source="pytorch/pytorch#131060",
    url="https://github.com/pytorch/pytorch/pull/131060",
    summary=(
        "a safe softmax returns 0 for a fully masked row: a node whose incoming edges are all "
        "masked gets attention weights summing to 0, with no NaN anywhere"
    ),
    fix_class="data cleaning",
    variant="zoo_a_masked_zero_rows",
    stage="forward",
    op="softmax normalization",
    cause="normalization",
    fix=(
        "decide what a node with no unmasked neighbour should attend to (a self-loop that is "
        "never masked, or leave such nodes out of the graph) instead of zeroing its row"
    ),
    silent=True,
    invariant="attention_normalization",
)
