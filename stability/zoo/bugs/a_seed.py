"""The seed: "Gradient exploding problem in a graph neural network" (a Stack Overflow question).

Source: the question and its author's own answer, kept in ``shared/seed/
gradient-exploding-gnn.txt``. The text names no address; a stored copy of the question is at
https://python.tutorialink.com/gradient-exploding-problem-in-a-graph-neural-network (a
mirror of the Stack Overflow post; the original's address is not in the text or in any copy
found).

What the asker saw: a custom message-passing GNN in TensorFlow whose training loss "suddenly
jumps to NaN after about 30 epochs with a batch size of 32" (about 200 epochs at batch size
128), only when the edge distance ``e`` (always 0.5-4) is concatenated to the mean of the two
node states before ``Net``, a single Dense layer. Gradient clipping, a lower learning rate,
larger batches and weight regularization only delayed it; ``sigmoid(e)`` avoided it at a cost
in MAE, ``relu(e)`` did not. Why: ``Net``'s output feeds a softmax written as
``exp(a) / sum(exp(a))``. ``e`` is larger than the node states, so as training grows ``Net``'s
kernel its outputs reach the hundreds, and ``exp`` above ``log(float32 max) = 88.7`` returns
inf; ``inf / inf`` is NaN, which the loss and then the gradients inherit. It is not a gradient
explosion, which is why clipping did nothing. What the asker changed (their answer): a kernel
constraint on ``Net`` (``min_max_norm(max_value=1.0)``), found with
``tf.debugging.check_numerics``; they name the max-subtracted softmax as the alternative.

The model is the asker's snippet in plain Keras (``K.concatenate``, ``self.Net``), not the
harness's built-in ``raw_e``. Thirty epochs of the asker's data do not fit in a zoo run, so the
case gives the distances rare outliers up to 400 (unscaled, as if in the wrong unit) instead
of waiting for training to grow ``Net``'s kernel: ``Net``'s output starts in the hundreds, as
the asker measured it late in training. Its sign is the sign of ``Net``'s weight on ``e``,
negative at seed 0, so here every ``exp`` into a node whose incoming edges are all outliers
flushes to 0 and the softmax computes ``0 / 0``: the underflow side of the same ``exp``, the
side the harness also finds on the seed's own task (docs/findings.md, "Underflow, not
overflow"). With a positive weight the same program overflows instead (``inf / inf``).
"""

import keras
import tensorflow as tf
from keras import ops as K

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


class MessagePassing(keras.layers.Layer):
    """The asker's message-passing layer: ``z = [neighbors_mean, e]``, ``Net(z)`` scores each
    edge, the naive softmax over each node's incoming edges weighs a message of ``z``.

    Shapes: ``v`` ``[num_nodes, hidden]``, ``e`` ``[num_edges, 1]``, ``senders``,
    ``receivers`` ``[num_edges]``; returns ``[num_nodes, hidden]``.
    """

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.Net = keras.layers.Dense(1)  # "a single layer feed-forward network"
        self.message = keras.layers.Dense(hidden, activation="relu")

    def call(self, v, e, senders, receivers):
        num_nodes = tf.shape(v)[0]
        neighbors_mean = (tf.gather(v, receivers) + tf.gather(v, senders)) / 2.0
        to_concat = [neighbors_mean, e]
        z = K.concatenate(to_concat, axis=-1)
        output = self.Net(z)  # [num_edges, 1]
        # softmax e^a / sum e^a over the edges into each node, as the asker's answer writes it
        weight = tf.exp(output)
        total = tf.math.unsorted_segment_sum(weight, receivers, num_nodes)
        alpha = weight / tf.gather(total, receivers)
        messages = alpha * self.message(z)
        return v + tf.math.unsorted_segment_sum(messages, receivers, num_nodes)


class SeedGNN(keras.Model):
    """Embed the nodes, one message-passing layer, sum over each graph, and the two outputs
    the asker's robust loss takes (mean and log sigma)."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.mp = MessagePassing(hidden)
        self.readout = keras.layers.Dense(hidden, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, inputs):
        v = self.embed(inputs["nodes"])
        v = self.mp(v, inputs["edges"], inputs["senders"], inputs["receivers"])
        pooled = tf.math.unsorted_segment_sum(v, inputs["node_graph"], inputs["num_graphs"])
        return self.out(self.readout(pooled))


@register_variant
def zoo_a_seed(ctx):
    """the seed's GNN as its asker wrote it: concat(neighbors_mean, e), Net, exp/sum softmax"""
    return Recipe(model=SeedGNN(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_seed",
    source="stackoverflow: Gradient exploding problem in a graph neural network",
    url="https://python.tutorialink.com/gradient-exploding-problem-in-a-graph-neural-network",
    summary=(
        "exp in a naive attention softmax leaves float32's range once Net's output, fed the "
        "unscaled edge distance, reaches the hundreds: every exp into a node flushes to 0 and "
        "the softmax divides 0 by 0 (not a gradient explosion)"
    ),
    fix_class="architecture change",
    variant="zoo_a_seed",
    stage="forward",
    op="RealDiv",
    cause="forward underflow (0/0)",
    fix=(
        "the asker bounded Net's kernel (min_max_norm(max_value=1.0)); the max-subtracted "
        "softmax is the general fix; gradient clipping does nothing"
    ),
    silent=False,
)
