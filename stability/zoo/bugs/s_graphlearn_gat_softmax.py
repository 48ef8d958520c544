"""Graph-Learn's full-neighbour ``GATConv``: the softmax runs over the score's last axis,
which holds one value, so every attention weight is 1 and a node sums its neighbours.

Source: alibaba/graph-learn pull request #26, https://github.com/alibaba/graph-learn/pull/26,
"hg: Softmax on coefficients for each segment_id" (merged as commit d20edf7).

What was seen: the PR's author, reading ``graphlearn/python/model/tf/layers/gat_conv.py``
against the GAT paper's equation (3), found that the full-neighbour branch did not normalize
the attention over each node's neighbours ("Softmax is applied on each node and it's
neighbors, not all the nodes in the batch and their neighbors"). Nothing is non-finite. The
cause, in the code as it stood: ``coefficients = tf.nn.softmax(leaky_relu(attn_fc(concat(
[self_vecs_extend, neigh_vecs]))))``, where ``attn_fc`` is a ``Dense(1)``, so the scores are
``[total_nbrs, 1]`` and ``tf.nn.softmax`` normalizes their last axis, one entry long: every
coefficient is exactly 1, the weights of a node sum to its in-degree, and the learned
attention kernel receives no gradient. What the maintainers merged (commit c2cddc4, PR #26):
``coefficients = exp(leaky_relu(...))`` divided by ``gather(segment_sum(coefficients,
segment_ids), segment_ids)``, a softmax over each node's neighbours.

The model is that layer (one head, no attention dropout, the ReLU activation, as
``GATConv(out_dim, attn_drop=0.0)``) twice on the harness's batches, a node's neighbours
being the senders of its incoming edges (``segment_ids`` is the receiver), then a mean over
each graph and a (mean, log sigma) head. Graph-Learn's ``tf.segment_sum`` needs the
receivers sorted, as its sampler lays them out; the harness's batches are not, so the sums
are ``unsorted_segment_sum``. The model exposes the coefficients through the forward
contract (docs/plugins.md), as a user who wants them checked writes it.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class GATConv(keras.layers.Layer):
    """Graph-Learn's ``GATConv.forward`` on the full neighbourhood, before PR #26. Returns the
    node states ``[num_nodes, out_dim]``, the scores and the coefficients ``[num_edges, 1]``."""

    def __init__(self, out_dim, **kwargs):
        super().__init__(**kwargs)
        self.fc = keras.layers.Dense(out_dim, use_bias=False)
        self.attn_fc = keras.layers.Dense(1, use_bias=False)

    def normalize(self, scores, segment_ids, num_segments):
        """The coefficients: the bug, ``tf.nn.softmax`` over the last axis (length 1)."""
        return tf.nn.softmax(scores)

    def call(self, h, senders, receivers):
        num_nodes = tf.shape(h)[0]
        self_vecs = self.fc(h)
        neigh_vecs = tf.gather(self_vecs, senders)  # [total_nbrs, out_dim]
        self_vecs_extend = tf.gather(self_vecs, receivers)
        scores = tf.nn.leaky_relu(self.attn_fc(tf.concat([self_vecs_extend, neigh_vecs], -1)))
        coefficients = self.normalize(scores, receivers, num_nodes)
        neigh_vecs = tf.math.unsorted_segment_sum(coefficients * neigh_vecs, receivers, num_nodes)
        return tf.nn.relu(neigh_vecs), scores, coefficients


class GraphLearnGAT(keras.Model):
    """Embed, two ``GATConv``, a mean over each graph, a (mean, log sigma) head; ``forward``
    also returns the attention."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [GATConv(hidden), GATConv(hidden)]
        self.head = keras.layers.Dense(2)

    def forward(self, inputs):
        h = self.embed(inputs["nodes"])
        scores, alphas = [], []
        for conv in self.convs:
            h, score, alpha = conv(h, inputs["senders"], inputs["receivers"])
            scores.append(score)
            alphas.append(alpha)
        pooled = tf.math.unsorted_segment_mean(h, inputs["node_graph"], inputs["num_graphs"])
        return {
            "predictions": self.head(pooled),
            "alpha": alphas,
            "receivers": [inputs["receivers"]] * len(self.convs),
            "logits": scores,
            "attention_layers": [conv.name for conv in self.convs],
            "softmax_shifted": [True] * len(self.convs),
        }

    def call(self, inputs):
        return self.forward(inputs)["predictions"]


@register_variant
def zoo_s_graphlearn_gat_softmax(ctx):
    """Graph-Learn GATConv before PR #26: softmax over a length-1 axis, every weight 1"""
    return Recipe(
        model=GraphLearnGAT(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate)
    )


BUG = ZooBug(
    name="s_graphlearn_gat_softmax",
    source="alibaba/graph-learn#26",
    url="https://github.com/alibaba/graph-learn/pull/26",
    summary=(
        "GATConv's full-neighbour branch applies tf.nn.softmax to [total_nbrs, 1] scores, a "
        "softmax over one value: every weight is 1 and a node's weights sum to its in-degree"
    ),
    fix_class="architecture change",
    variant="zoo_s_graphlearn_gat_softmax",
    stage="forward",
    op="softmax normalization",
    cause="normalization",
    fix=(
        "PR #26 (commit c2cddc4): exp of the scores divided by their segment_sum over each "
        "node's neighbours (segment_ids), a softmax per node"
    ),
    silent=True,
    invariant="attention_normalization",
)
