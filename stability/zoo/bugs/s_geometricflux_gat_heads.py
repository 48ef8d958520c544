"""GeometricFlux.jl's ``GATConv``: each message's scores are softmaxed across the heads, not
across the node's neighbours, so a node's weights per head do not sum to 1.

Source: FluxML/GeometricFlux.jl issue #130, https://github.com/FluxML/GeometricFlux.jl/issues/130,
"GATConv does not seem to have the desired behaviour"; the fix is pull request #131, "Fix
softmaxing of alphas in GATConv" (merged, commit 9e00c88).

What the user saw, reading the layer: ``message(g::GATConv, x_i, x_j, e_ij)`` scores one
edge per head, ``alpha = leakyrelu.(sum(vcat(W x_i, W x_j) .* g.a, dims=1))`` (``heads``
values), then ``alpha = Flux.softmax(alpha)``; with one head "alpha is an array of one single
value. It means that applying a softmax to it will always turn our alpha into 1" (the
issue writes alpha as the Greek letter). Nothing is non-finite. The
cause: the message function sees one edge at a time, so its softmax can only normalize over
what that edge holds, the heads: with one head every weight is 1, with several the heads of
one edge share 1 between them, and in both cases the weights a node gives its neighbours
(summed by the ``:add`` aggregation) sum to anything. What the maintainers merged (PR #131):
the message returns the raw score beside ``W x_j``, and a new ``apply_batch_message`` takes
``Flux.softmax(..., dims=2)`` over all of a node's neighbours, per head, before weighting the
messages; the same PR adds each node's self-loop to its neighbourhood, as the paper has it.

The model is that layer with 2 heads concatenated (``GATConv(in => out, heads=2)``, bias,
negative slope 0.2) twice on the harness's batches, a node's neighbours being the senders of
its incoming edges, then a mean over each graph and a (mean, log sigma) head. It exposes the
weights ``[num_edges, heads]`` through the forward contract (docs/plugins.md).
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

HEADS = 2


class GATConv(keras.layers.Layer):
    """GeometricFlux's ``GATConv`` before PR #131, heads concatenated. Returns the node states
    ``[num_nodes, heads * out]``, the scores and the weights ``[num_edges, heads]``."""

    def __init__(self, out, heads=HEADS, negative_slope=0.2, **kwargs):
        super().__init__(**kwargs)
        self.out, self.heads, self.negative_slope = out, heads, negative_slope
        self.weight = keras.layers.Dense(out * heads, use_bias=False)

    def build(self, input_shape):
        self.a = self.add_weight(shape=(2 * self.out, self.heads), name="a")
        self.bias = self.add_weight(
            shape=(self.out * self.heads,), initializer="zeros", name="bias"
        )

    def normalize(self, e, receivers, num_nodes):
        """``[num_edges, heads]`` weights: the bug, ``Flux.softmax(alpha)`` within each message,
        across its heads."""
        return tf.nn.softmax(e, axis=-1)

    def call(self, x, senders, receivers):
        num_nodes = tf.shape(x)[0]
        wx = tf.reshape(self.weight(x), (-1, self.heads, self.out))  # [num_nodes, heads, out]
        x_i, x_j = tf.gather(wx, receivers), tf.gather(wx, senders)  # [num_edges, heads, out]
        # sum(vcat(x_i, x_j) .* a, dims=1): one score per head
        e = tf.einsum("ehc,ch->eh", tf.concat([x_i, x_j], -1), self.a)
        e = tf.nn.leaky_relu(e, self.negative_slope)
        alpha = self.normalize(e, receivers, num_nodes)
        m = tf.reshape(x_j * alpha[..., None], (-1, self.heads * self.out))
        m = tf.math.unsorted_segment_sum(m, receivers, num_nodes)  # propagate(..., :add)
        return m + self.bias, e, alpha


class GeometricFluxGAT(keras.Model):
    """Embed, two ``GATConv`` (ReLU between), a mean over each graph, a (mean, log sigma)
    head; ``forward`` also returns the attention."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(hidden, activation="relu")
        self.convs = [GATConv(hidden // HEADS), GATConv(hidden // HEADS)]
        self.head = keras.layers.Dense(2)

    def forward(self, inputs):
        h = self.embed(inputs["nodes"])
        scores, alphas = [], []
        for conv in self.convs:
            h, score, alpha = conv(h, inputs["senders"], inputs["receivers"])
            h = tf.nn.relu(h)
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
def zoo_s_geometricflux_gat_heads(ctx):
    """GeometricFlux GATConv before PR #131: each message softmaxed across its heads"""
    model = GeometricFluxGAT(ctx.hidden)
    return Recipe(model=model, optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="s_geometricflux_gat_heads",
    source="FluxML/GeometricFlux.jl#130",
    url="https://github.com/FluxML/GeometricFlux.jl/issues/130",
    summary=(
        "GATConv softmaxes each message's scores across its heads inside the message "
        "function, never across the node's neighbours: a node's weights per head do not sum "
        "to 1"
    ),
    fix_class="architecture change",
    variant="zoo_s_geometricflux_gat_heads",
    stage="forward",
    op="softmax normalization",
    cause="normalization",
    fix=(
        "PR #131: the message returns the raw score, and apply_batch_message takes "
        "Flux.softmax(..., dims=2) over each node's neighbours per head (self-loops added)"
    ),
    silent=True,
    invariant="attention_normalization",
)
