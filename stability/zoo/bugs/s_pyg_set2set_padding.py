"""PyTorch Geometric's early ``Set2Set``: each graph padded with zero rows to the batch's
largest graph, and the attention softmax taken over the padding too.

Source: pyg-team/pytorch_geometric issue #57,
https://github.com/pyg-team/pytorch_geometric/issues/57, "set2set output depends on batch
order?".

What the user saw: "the output of set2set layer may depend on the order of the batch ... if i
stack two graphs into a batch, the output is different than if i feed the graphs separately",
on 408 of 1870 molecules; every value finite. The maintainer reproduced it ("I can reproduce
the error") and fixed it the same day. The cause: ``Set2Set.forward`` called
``to_batch(x, batch)``, which lays the batch out as ``[batch_size, max_nodes, F]`` with zero
rows after each smaller graph, then ``a = torch.softmax((x * q).sum(-1), dim=-1)`` and ``r =
(a * x).sum(1)``: each zero row has score 0 and takes a weight ``exp(0) / sum``, so a graph's
weights on its own nodes shrink with the number of padding rows, that is, with the largest
graph it is batched with. What the maintainer changed (commit 3b66ade, "set2set without
to_batch convert"): no padding; the scores are normalized per graph by
``torch_geometric.utils.softmax(e, batch)`` and summed by ``scatter_add(a * x, batch)``.

The model: embed, two sum convolutions, ``Set2Set`` (an LSTM cell, 3 processing steps) as it
was before the fix, a (mean, log sigma) head. The padding is built the way ``to_batch`` built
it (each node's slot is its index minus its graph's first index).
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


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


def to_batch(x, graph, num_graphs):
    """PyG's old ``to_batch``: ``[num_graphs, max_nodes, F]``, zero rows after each graph's
    nodes (a batch lists each graph's nodes contiguously)."""
    counts = tf.math.unsorted_segment_sum(tf.ones_like(graph), graph, num_graphs)  # [G]
    first = tf.cumsum(counts, exclusive=True)  # [G] index of each graph's first node
    slot = tf.range(tf.shape(graph)[0]) - tf.gather(first, graph)  # [N] place in its graph
    shape = tf.stack([num_graphs, tf.reduce_max(counts), tf.shape(x)[1]])
    return tf.scatter_nd(tf.stack([graph, slot], axis=1), x, shape)


class Set2Set(keras.layers.Layer):
    """``q_t = LSTM(q*_{t-1})``, ``a = softmax(x . q_t)``, ``r_t = sum a x``, ``q*_t = [q_t,
    r_t]``; returns ``[num_graphs, 2 F]``."""

    def __init__(self, channels: int, processing_steps: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.processing_steps = channels, processing_steps
        self.lstm = keras.layers.LSTMCell(channels)

    def read(self, x, q, graph, num_graphs):
        """``[num_graphs, F]`` the attention readout for queries ``q`` ``[num_graphs, F]``:
        the bug, a softmax over each padded row of ``to_batch``."""
        dense = to_batch(x, graph, num_graphs)  # [G, max_nodes, F]
        e = tf.reduce_sum(dense * q[:, None, :], axis=-1)  # [G, max_nodes], 0 on padding
        a = tf.nn.softmax(e, axis=-1)
        return tf.reduce_sum(a[..., None] * dense, axis=1)

    def call(self, x, graph, num_graphs):
        zeros = tf.zeros(tf.stack([num_graphs, self.channels]), x.dtype)
        state, q_star = [zeros, zeros], tf.concat([zeros, zeros], axis=-1)
        for _ in range(self.processing_steps):
            q, state = self.lstm(q_star, state)
            q_star = tf.concat([q, self.read(x, q, graph, num_graphs)], axis=-1)
        return q_star


class Set2SetNet(keras.Model):
    """Embed, two convolutions, ``Set2Set``, a (mean, log sigma) head."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [SumConv(hidden), SumConv(hidden)]
        self.pool = Set2Set(hidden)
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        h = self.embed(inputs["nodes"])
        for conv in self.convs:
            h = conv(h, inputs["edges"], inputs["senders"], inputs["receivers"])
        return self.head(self.pool(h, inputs["node_graph"], inputs["num_graphs"]))


@register_variant
def zoo_s_pyg_set2set_padding(ctx):
    """PyG Set2Set before #57's fix: softmax over zero-padded rows of the batch"""
    return Recipe(model=Set2SetNet(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_pyg_set2set_padding",
    source="pyg-team/pytorch_geometric#57",
    url="https://github.com/pyg-team/pytorch_geometric/issues/57",
    summary=(
        "Set2Set pads every graph with zero rows to the batch's largest graph and its softmax "
        "gives each padding row a weight, so a graph's readout depends on its batch-mates"
    ),
    fix_class="architecture change",
    variant="zoo_s_pyg_set2set_padding",
    stage="forward",
    op="softmax",
    cause="none",
    fix=(
        "commit 3b66ade (set2set without to_batch convert): no padding; a per-graph "
        "softmax(e, batch) and scatter_add(a * x, batch)"
    ),
    silent=True,
    invariant="batch_independence",
)
