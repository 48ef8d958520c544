"""PyTorch Geometric #2013: "Numerical issue with torch_geometric.utils.softmax".

Source: pyg-team/pytorch_geometric issue #2013,
https://github.com/pyg-team/pytorch_geometric/issues/2013; the change that caused it is pull
request #1707 ("Update softmax.py", https://github.com/pyg-team/pytorch_geometric/pull/1707,
from issue #1705, "More fast softmax: Global softmax").

What the user saw: ``utils.softmax`` over two groups returned the first group's weights
right and the second's as ``[0.0, 4.85e-26, 4.85e-26, 0.0, 4.85e-26]`` where
``torch.softmax`` gives ``[1.4e-06, 0.333, 0.333, 1.4e-06, 0.333]``, with no error and no
NaN. Why: #1707 made the softmax about three times faster by subtracting one maximum over
all entries, ``src - src.max()``, instead of each group's own ``scatter_max``. A group whose
logits sit more than ~87 below the global maximum has every ``exp`` flushed to 0 (or to a
few denormal-sized values), and the ``1e-16`` in the denominator turns its ``0 / 0`` into
``0 / 1e-16 = 0``: its weights sum to 0, or to far less than 1, silently. What the maintainer
changed: "This got introduced by this PR [#1707]. The numerical instability is caused by the
high variance of values between different indices, so that global normalization is not
sufficient to accurately compute the softmax output. I reverted the changes" (back to the
per-group max).

The model is a GAT-style layer in plain Keras whose attention is normalized by that softmax.
It exposes its attention through the forward contract (docs/plugins.md), as PyG users read
it with ``return_attention_weights=True``. Its case gives the distances rare outliers up to
400: the logits of the edges that carry one are hundreds away from the others', which is the
"high variance between indices" the maintainer names.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


def softmax(src, index, num_nodes):
    """``torch_geometric.utils.softmax`` after #1707: one global max, ``1e-16`` in the
    denominator. ``src`` ``[num_edges, 1]``, ``index`` ``[num_edges]``; same shape out."""
    out = src - tf.reduce_max(src)
    out = tf.exp(out)
    out_sum = tf.gather(tf.math.unsorted_segment_sum(out, index, num_nodes), index)
    return out / (out_sum + 1e-16)


class EdgeAttention(keras.layers.Layer):
    """Attention over each node's incoming edges, scored from the pair and the distance.
    Returns the node states ``[num_nodes, hidden]``, the logits and the weights
    ``[num_edges, 1]``."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.message = keras.layers.Dense(hidden, activation="relu")
        self.score = keras.layers.Dense(1)
        self.update = keras.layers.Dense(hidden, activation="relu")

    def call(self, h, edges, senders, receivers):
        num_nodes = tf.shape(h)[0]
        pair = tf.concat([tf.gather(h, receivers), tf.gather(h, senders), edges], axis=-1)
        message = self.message(pair)
        logits = self.score(tf.concat([message, edges], axis=-1))  # [num_edges, 1]
        alpha = softmax(logits, receivers, num_nodes)
        summed = tf.math.unsorted_segment_sum(alpha * message, receivers, num_nodes)
        return self.update(tf.concat([h, summed], axis=-1)), logits, alpha


class GAT(keras.Model):
    """Embed the nodes, two attention layers, a mean over each graph, two outputs;
    ``forward`` also returns the attention."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.rounds = [EdgeAttention(hidden), EdgeAttention(hidden)]
        self.head = keras.layers.Dense(2)

    def forward(self, inputs):
        h = self.embed(inputs["nodes"])
        logits, alphas = [], []
        for layer in self.rounds:
            h, logit, alpha = layer(h, inputs["edges"], inputs["senders"], inputs["receivers"])
            logits.append(logit)
            alphas.append(alpha)
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
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
def zoo_a_pyg_global_max(ctx):
    """PyG's utils.softmax after PR #1707: one global max; far groups underflow to 0 weights"""
    return Recipe(model=GAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_pyg_global_max",
    source="pyg-team/pytorch_geometric#2013",
    url="https://github.com/pyg-team/pytorch_geometric/issues/2013",
    summary=(
        "utils.softmax subtracted one global max (PR #1707): a group far below it underflows "
        "and 0/(0 + 1e-16) gives weights summing to 0, with no NaN"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_pyg_global_max",
    stage="forward",
    op="softmax normalization",
    cause="normalization",
    fix="PR #1707 reverted: each group's own scatter_max is subtracted again",
    silent=True,
    invariant="attention_normalization",
)
