"""keras-team/keras #21131: "Problem with loss: nan - val_loss: nan" in Keras' GAT example.

Source: keras-team/keras issue #21131, https://github.com/keras-team/keras/issues/21131; the
example is keras.io's "Graph attention network (GAT) for node classification"
(keras-team/keras-io, ``examples/graph/gat_node_classification.py``).

What the user saw: they took the Keras GAT example, made it a binary classifier on their own
protein-interaction graph with 89 float features in [0, 1], and got ``loss: nan - val_loss:
nan``. The thread ends without a diagnosis (labelled "awaiting response from contributor",
then closed), so what follows is what the example's code itself does with such a graph. The
example's ``GraphAttention`` normalizes its attention by summing ``exp(clip(score, -2, 2))``
per target node with ``unsorted_segment_sum`` and spreading each node's sum back onto the
edges with ``tf.repeat(sums, tf.math.bincount(edges[:, 0]))``. That repeat lays the sums out
in node order, so it lines up with the edges only when the edge list is sorted by target
node, as the Cora file the example reads is ordered by its first column, the target; the
user's list is not (they appended each edge's reverse and dropped duplicates). On an
unsorted edge list every edge is divided by some other node's sum: no value is non-finite
(the clip keeps every ``exp`` in [e^-2, e^2]), but a node's weights no longer sum to 1 (on
16 of this case's graphs they sum to between 0.02 and 20), and a node divided by a
low-degree node's sum gathers many times its neighbours' states, which the example's
residual layers and its learning rate of 0.3 (SGD, momentum 0.9) do nothing to damp. What
the maintainers changed, in the example's Keras 3 rewrite (keras-team/keras-io pull request
#2290): the sums are gathered back by target index (``ops.take(attention_sum,
target_indices)``, plus 1e-8) with one segment per node, correct for any edge order, and the
learning rate went from 0.3 to 0.003.

The model is the example's ``GraphAttention``, ``MultiHeadGraphAttention`` and
``GraphAttentionNetwork`` (preprocess Dense, residual attention layers), with a mean over each
graph's nodes for the graph target, trained with the example's optimizer. Like the example it
does not expose its attention, so only a NaN could show the bug. The harness's batches list
each graph's edges unsorted, as the user's list was.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class GraphAttention(keras.layers.Layer):
    """The example's ``GraphAttention``. Inputs ``[node_states, edges]``: ``[N, F]`` and
    ``[E, 2]`` int (target, source); returns ``[N, units]``."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(input_shape[0][-1], self.units), initializer="glorot_uniform", name="kernel"
        )
        self.kernel_attention = self.add_weight(
            shape=(self.units * 2, 1), initializer="glorot_uniform", name="kernel_attention"
        )

    def call(self, inputs):
        node_states, edges = inputs
        # Linearly transform node states
        node_states_transformed = tf.matmul(node_states, self.kernel)
        # (1) Compute pair-wise attention scores
        node_states_expanded = tf.gather(node_states_transformed, edges)
        node_states_expanded = tf.reshape(node_states_expanded, (tf.shape(edges)[0], -1))
        attention_scores = tf.nn.leaky_relu(tf.matmul(node_states_expanded, self.kernel_attention))
        attention_scores = tf.squeeze(attention_scores, -1)
        # (2) Normalize attention scores
        attention_scores = tf.math.exp(tf.clip_by_value(attention_scores, -2, 2))
        attention_scores_sum = tf.math.unsorted_segment_sum(
            data=attention_scores,
            segment_ids=edges[:, 0],
            num_segments=tf.reduce_max(edges[:, 0]) + 1,
        )
        attention_scores_sum = tf.repeat(
            attention_scores_sum, tf.math.bincount(tf.cast(edges[:, 0], "int32"))
        )
        attention_scores_norm = attention_scores / attention_scores_sum
        # (3) Gather node states of neighbors, apply attention scores and aggregate
        node_states_neighbors = tf.gather(node_states_transformed, edges[:, 1])
        return tf.math.unsorted_segment_sum(
            data=node_states_neighbors * attention_scores_norm[:, tf.newaxis],
            segment_ids=edges[:, 0],
            num_segments=tf.shape(node_states)[0],
        )


class MultiHeadGraphAttention(keras.layers.Layer):
    """The example's multi-head layer: heads concatenated, then relu."""

    def __init__(self, units, num_heads=2, **kwargs):
        super().__init__(**kwargs)
        self.attention_layers = [GraphAttention(units) for _ in range(num_heads)]

    def call(self, inputs):
        atom_features, pair_indices = inputs
        outputs = [layer([atom_features, pair_indices]) for layer in self.attention_layers]
        return tf.nn.relu(tf.concat(outputs, axis=-1))


class GraphAttentionNetwork(keras.Model):
    """The example's network (preprocess, residual attention layers, output layer), with a
    mean over each graph's nodes before the output for a graph target."""

    def __init__(self, hidden_units, num_heads=2, num_layers=3, output_dim=2, **kwargs):
        super().__init__(**kwargs)
        self.preprocess = keras.layers.Dense(hidden_units * num_heads, activation="relu")
        self.attention_layers = [
            MultiHeadGraphAttention(hidden_units, num_heads) for _ in range(num_layers)
        ]
        self.output_layer = keras.layers.Dense(output_dim)

    def call(self, inputs):
        edges = tf.stack([inputs["receivers"], inputs["senders"]], axis=1)  # (target, source)
        x = self.preprocess(inputs["nodes"])
        for attention_layer in self.attention_layers:
            x = attention_layer([x, edges]) + x
        pooled = tf.math.unsorted_segment_mean(x, inputs["node_graph"], inputs["num_graphs"])
        return self.output_layer(pooled)


@register_variant
def zoo_a_keras_gat_example(ctx):
    """Keras' GAT example: attention sums spread back by tf.repeat(bincount), SGD momentum"""
    return Recipe(
        model=GraphAttentionNetwork(max(ctx.hidden // 2, 1)),
        optimizer=keras.optimizers.SGD(ctx.learning_rate, momentum=0.9),
    )


BUG = ZooBug(
    name="a_keras_gat_example",
    source="keras-team/keras#21131",
    url="https://github.com/keras-team/keras/issues/21131",
    summary=(
        "the GAT example spreads each node's attention sum back with tf.repeat(bincount), "
        "right only for edges sorted by target; on an unsorted edge list the weights of a "
        "node no longer sum to 1, with every value finite"
    ),
    fix_class="architecture change",
    variant="zoo_a_keras_gat_example",
    stage="forward",
    op="softmax normalization",
    cause="normalization",
    fix=(
        "keras-io PR #2290 (the Keras 3 rewrite): gather each edge's sum by its target index "
        "(ops.take, plus 1e-8) with one segment per node, and a learning rate of 0.003 "
        "instead of 0.3"
    ),
    silent=True,
    invariant="edge_order",
)
