"""Chainer Chemistry's GGNN transposed its message tensor on the wrong axes, mixing atoms
with channels: the prediction changes when the atoms are renumbered.

Source: chainer/chainer-chemistry issue #142,
https://github.com/chainer/chainer-chemistry/issues/142, "GGNN output is not graph
isomorphism invariant"; the fix is pull request #143, "Ggnn graph invariant" (merged).

What was seen: "GGNN output differs when we permute the index of atoms/adjs"; every value
finite. The cause, in ``GGNN.update``: the message layer's output is reshaped to ``m:
(minibatch, atom, ch, edge_type)`` but the code (commented ``(minibatch, ch, atom,
edge_type)``) transposed it with ``(0, 3, 2, 1)``, giving ``(minibatch, edge_type, ch,
atom)``, then reshaped it to ``(minibatch * edge_type, atom, ch)`` for ``matmul(adj, m)``:
the reshape reads the channel-major layout as atom-major, so each atom's message is built
from other atoms' channels, in an order set by the atoms' numbering. What the maintainer
changed (commit 9a90d0d, "Bug fix: GGNN should be graph invariant"; "This is the only
mis-implementation"): ``functions.transpose(m, (0, 3, 1, 2))``, and a test that permutes
the atoms.

The model is that GGNN on the harness's batches: each batch laid out densely as Chainer
Chemistry's padded arrays (``[num_graphs, max_atoms, ch]`` and a ``[num_graphs, edge_type,
max_atoms, max_atoms]`` adjacency; the 4 edge types are bins of the distance, standing for
bond types), a message layer, a GRU update for 2 steps, the gated readout summed over each
graph's real atoms.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

NUM_EDGE_TYPE = 4
#: Distance bin edges (A) of the 4 edge types.
EDGE_TYPE_BOUNDS = (1.5, 2.5, 3.5)


def dense_layout(graph, num_graphs):
    """``([N, 2] (graph, slot) of each node, max_atoms)``: a node's slot is its index minus
    its graph's first index (a batch lists each graph's nodes contiguously)."""
    counts = tf.math.unsorted_segment_sum(tf.ones_like(graph), graph, num_graphs)
    slot = tf.range(tf.shape(graph)[0]) - tf.gather(tf.cumsum(counts, exclusive=True), graph)
    return tf.stack([graph, slot], axis=1), tf.reduce_max(counts)


class GGNN(keras.Model):
    """Chainer Chemistry's ``GGNN`` (weight tying, 2 steps) with its (mean, log sigma) head."""

    def __init__(self, hidden: int, steps: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.steps = hidden, steps
        self.embed = keras.layers.Dense(hidden)
        self.message_layer = keras.layers.Dense(NUM_EDGE_TYPE * hidden)
        self.update_layer = keras.layers.GRUCell(hidden)
        self.i_layer = keras.layers.Dense(hidden)
        self.j_layer = keras.layers.Dense(hidden)
        self.head = keras.layers.Dense(2)

    def transpose_messages(self, m):
        """``m`` ``(minibatch, atom, ch, edge_type)`` to ``(minibatch, edge_type, atom,
        ch)``: the bug, axes ``(0, 3, 2, 1)``, gives ``(minibatch, edge_type, ch, atom)``."""
        return tf.transpose(m, (0, 3, 2, 1))

    def update(self, h, adj, state):
        mb, atom, ch = tf.shape(h)[0], tf.shape(h)[1], self.hidden
        m = tf.reshape(self.message_layer(h), (mb, atom, ch, NUM_EDGE_TYPE))
        m = self.transpose_messages(m)
        m = tf.reshape(m, (mb * NUM_EDGE_TYPE, atom, ch))
        m = tf.matmul(tf.reshape(adj, (mb * NUM_EDGE_TYPE, atom, atom)), m)
        m = tf.reduce_sum(tf.reshape(m, (mb, NUM_EDGE_TYPE, atom, ch)), axis=1)
        x = tf.reshape(tf.concat([h, m], axis=-1), (mb * atom, 2 * ch))
        out, state = self.update_layer(x, state)
        return tf.reshape(out, (mb, atom, ch)), state

    def call(self, inputs):
        graph, num_graphs = inputs["node_graph"], inputs["num_graphs"]
        where, max_atoms = dense_layout(graph, num_graphs)
        dtype = inputs["nodes"].dtype
        h = tf.scatter_nd(where, self.embed(inputs["nodes"]), [num_graphs, max_atoms, self.hidden])
        real = tf.scatter_nd(where, tf.ones_like(graph, dtype), [num_graphs, max_atoms])
        # [num_graphs, edge_type, max_atoms, max_atoms]: adj[g, t, i, j] = 1 for an edge j -> i
        edge_type = tf.searchsorted(
            tf.constant(EDGE_TYPE_BOUNDS, dtype), inputs["edges"][:, 0], side="right"
        )
        target, source = tf.gather(where, inputs["receivers"]), tf.gather(where, inputs["senders"])
        index = tf.stack([target[:, 0], edge_type, target[:, 1], source[:, 1]], axis=1)
        shape = [num_graphs, NUM_EDGE_TYPE, max_atoms, max_atoms]
        adj = tf.scatter_nd(index, tf.ones_like(inputs["edges"][:, 0]), shape)
        h0, state = h, [tf.zeros([num_graphs * max_atoms, self.hidden], dtype)]
        for _ in range(self.steps):
            h, state = self.update(h, adj, state)
        gate = tf.sigmoid(self.i_layer(tf.concat([h, h0], axis=-1))) * self.j_layer(h)
        g = tf.reduce_sum(gate * real[..., None], axis=1)  # sum over each graph's real atoms
        return self.head(g)


@register_variant
def zoo_s_chainer_ggnn_transpose(ctx):
    """Chainer Chemistry GGNN before #143: messages transposed on the wrong axes"""
    return Recipe(model=GGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_chainer_ggnn_transpose",
    source="chainer/chainer-chemistry#142",
    url="https://github.com/chainer/chainer-chemistry/issues/142",
    summary=(
        "GGNN transposes its (minibatch, atom, ch, edge_type) messages with (0, 3, 2, 1), so "
        "the reshape mixes atoms with channels and the output depends on the atoms' numbering"
    ),
    fix_class="architecture change",
    variant="zoo_s_chainer_ggnn_transpose",
    stage="forward",
    op="Transpose",
    cause="none",
    fix=(
        "PR #143 (commit 9a90d0d): transpose with (0, 3, 1, 2), and a test that permutes the atoms"
    ),
    silent=True,
    invariant="node_permutation",
)
