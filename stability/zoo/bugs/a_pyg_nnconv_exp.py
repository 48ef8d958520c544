"""PyTorch Geometric #783: "`nan` loss in examples/qm9_nnconv.py".

Source: pyg-team/pytorch_geometric issue #783,
https://github.com/pyg-team/pytorch_geometric/issues/783 (related: rusty1s/pytorch_scatter
#78, "Expected behavior when using scatter_max with Pytorch 1.3", and #72, "not compatible
with PyTorch 1.3").

What the user saw: the NNConv example on QM9 printed ``Loss: nan, Validation MAE: nan`` from
its first epoch, while other examples (``gcn.py``) ran (PyTorch 1.2, PyG 1.3.2). The NaN is
not NNConv's: the reporter traced it to ``torch_geometric.utils.softmax``, which the
example's ``Set2Set`` readout calls to weigh each graph's nodes, "returning large positive
values (``scatter_max`` returns large negative values) and then going through ``out.exp()``
returning ``inf`` values, which become ``nans`` in the softmax". That softmax already
subtracted the max (the fix of #53); what failed is the max itself. ``scatter_max`` fills
its output with the lowest float before the kernel takes each segment's max; a torch-scatter
build that does not match the installed PyTorch returns that fill, ``-3.4028e+38``, for
every segment (pytorch_scatter#78 shows exactly that under PyTorch 1.3, and #72, "not
compatible with PyTorch 1.3", was fixed by torch-scatter 1.3.2), the most likely reading of
the report's "large negative values". Then ``src - max`` is ``+3.4e38``, ``exp`` is inf and
``inf / (inf + 1e-16)`` is NaN, at the first forward pass. What the maintainers said: the
issue is still open, with no change to PyG; for another broken torch-scatter install (#654, a
crash in ``scatter_max``) the maintainer's advice was to reinstall it and validate it with
its test suite. The model code needs no change.

The model is ``examples/qm9_nnconv.py`` (``qm9_nn_conv.py`` in PyG 1.3.2) in plain Keras:
``lin0``, an ``NNConv`` (an edge network maps each distance to a ``dim x dim`` kernel, mean
aggregation, no root weight, as the example sets it) applied three times with a ``GRUCell``,
a ``Set2Set`` readout (three steps of an ``LSTMCell``) and ``lin1``/``lin2``, with
``utils.softmax`` as PyG 1.3.2 wrote it. The broken install cannot be had in TensorFlow,
whose segment max returns its fill value only for a segment with nothing above it (an empty
one, or one of -inf or NaN only), so ``scatter_max`` here returns what the reporter's build
returned: the fill value for every segment. That one function stands for the environment;
everything else is the example.
"""

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug


def scatter_max(src, index, dim_size):
    """``torch_scatter.scatter_max(src, index, dim=0, dim_size=dim_size)[0]`` as the
    reporter's torch-scatter build returned it: the output buffer, initialized to the fill
    value (the lowest float), left untouched by a kernel that did not run. ``[dim_size]``."""
    return tf.fill([dim_size], src.dtype.min)


def softmax(src, index, num_nodes):
    """``torch_geometric.utils.softmax`` of PyG 1.3.2: max subtracted, ``1e-16`` in the
    denominator. ``src`` ``[n]``, ``index`` ``[n]``; returns ``[n]``."""
    out = src - tf.gather(scatter_max(src, index, num_nodes), index)
    out = tf.exp(out)
    return out / (tf.gather(tf.math.unsorted_segment_sum(out, index, num_nodes), index) + 1e-16)


class NNConv(keras.layers.Layer):
    """``NNConv(dim, dim, nn, aggr='mean', root_weight=False)``:
    ``x_i' = mean_j x_j . nn(e_ij) + bias``.

    Shapes: ``x`` ``[num_nodes, dim]``, ``edge_attr`` ``[num_edges, 1]``, ``senders``,
    ``receivers`` ``[num_edges]``; returns ``[num_nodes, dim]``.
    """

    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.nn = keras.Sequential(
            [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(dim * dim)]
        )
        self.bias = self.add_weight(shape=(dim,), initializer="zeros", name="bias")

    def call(self, x, edge_attr, senders, receivers):
        weight = tf.reshape(self.nn(edge_attr), [-1, self.dim, self.dim])
        message = tf.einsum("ed,edf->ef", tf.gather(x, senders), weight)
        aggr = tf.math.unsorted_segment_mean(message, receivers, tf.shape(x)[0])
        return aggr + self.bias


class Set2Set(keras.layers.Layer):
    """``Set2Set(dim, processing_steps=3)``: returns ``[num_graphs, 2 * dim]``."""

    def __init__(self, dim, processing_steps=3, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.processing_steps = dim, processing_steps
        self.lstm = keras.layers.LSTMCell(dim)

    def call(self, x, batch, batch_size):
        zeros = tf.zeros(tf.stack([batch_size, self.dim]), x.dtype)
        state = [zeros, zeros]
        q_star = tf.zeros(tf.stack([batch_size, 2 * self.dim]), x.dtype)
        for _ in range(self.processing_steps):
            q, state = self.lstm(q_star, state)
            e = tf.reduce_sum(x * tf.gather(q, batch), axis=-1)  # [num_nodes]
            a = softmax(e, batch, batch_size)
            r = tf.math.unsorted_segment_sum(a[:, None] * x, batch, batch_size)
            q_star = tf.concat([q, r], axis=-1)
        return q_star


class Net(keras.Model):
    """``examples/qm9_nnconv.py``'s ``Net``, with two outputs (mean, log sigma)."""

    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.lin0 = keras.layers.Dense(dim, activation="relu")
        self.conv = NNConv(dim)
        self.gru = keras.layers.GRUCell(dim)
        self.set2set = Set2Set(dim, processing_steps=3)
        self.lin1 = keras.layers.Dense(dim, activation="relu")
        self.lin2 = keras.layers.Dense(2)

    def call(self, inputs):
        out = self.lin0(inputs["nodes"])
        h = out
        for _ in range(3):
            m = tf.nn.relu(self.conv(out, inputs["edges"], inputs["senders"], inputs["receivers"]))
            out, states = self.gru(m, [h])
            h = states[0]
        out = self.set2set(out, inputs["node_graph"], inputs["num_graphs"])
        return self.lin2(self.lin1(out))


@register_variant
def zoo_a_pyg_nnconv_exp(ctx):
    """PyG's qm9_nnconv (NNConv, GRU, Set2Set) with the reporter's scatter_max: fill value only"""
    return Recipe(model=Net(ctx.hidden), optimizer=keras.optimizers.Adam(ctx.learning_rate))


BUG = ZooBug(
    name="a_pyg_nnconv_exp",
    source="pyg-team/pytorch_geometric#783",
    url="https://github.com/pyg-team/pytorch_geometric/issues/783",
    summary=(
        "Set2Set's max-subtracted softmax gets scatter_max's fill value (-3.4e38), most "
        "likely from a torch-scatter build not matching PyTorch; src - max = 3.4e38, exp "
        "overflows and inf/inf is NaN at the first step"
    ),
    fix_class="stable reformulation",
    variant="zoo_a_pyg_nnconv_exp",
    stage="forward",
    op="Exp",
    cause="forward overflow",
    fix=(
        "none in PyG (the issue is open): install a torch-scatter built for the installed "
        "PyTorch (torch-scatter 1.3.2 fixed PyTorch 1.3) and check it with its test suite"
    ),
    silent=False,
)
