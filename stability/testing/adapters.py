"""Public segment softmaxes as ``Implementation``s for ``check_segment_softmax``.

Each library is imported only when its adapter is called (``pip install
'stability[conformance]'`` installs them): ``import stability`` never loads one.
TF-GNN 1.x needs Keras 2 as ``tf.keras``: set ``TF_USE_LEGACY_KERAS=1`` before TensorFlow
is imported (``tox -e conformance`` does).

Every adapter takes ``logits`` ``[num_edges]``, ``segment_ids`` ``[num_edges]`` and
``num_segments`` and returns ``[num_edges]`` in the logits' dtype, so each is named on the
command line as ``stability.testing.adapters:<name>``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from stability.testing.implementation import Implementation, from_tensorflow
from stability.testing.inputs import SoftmaxInput


def from_jax(fn: Callable[..., Any], *, name: str | None = None) -> Implementation:
    """An ``Implementation`` of a JAX ``fn(logits, segment_ids, num_segments)``, with
    gradients by ``jax.vjp``. Turns on JAX's float64 (``jax_enable_x64``), without which
    float64 logits would silently become float32."""
    import jax

    jax.config.update("jax_enable_x64", True)

    def forward(x: SoftmaxInput) -> np.ndarray:
        return np.asarray(fn(jax.numpy.asarray(x.logits), x.segment_ids, x.num_segments))

    def gradient(x: SoftmaxInput) -> np.ndarray:
        def call(logits: Any) -> Any:
            return fn(logits, jax.numpy.asarray(x.segment_ids), x.num_segments)

        _, pullback = jax.vjp(call, jax.numpy.asarray(x.logits))
        (grad,) = pullback(jax.numpy.asarray(x.messages))
        return np.asarray(grad)

    return Implementation(name or getattr(fn, "__name__", "jax"), forward, gradient)


def adapter(factory: Callable[[], Implementation]) -> Callable[[], Implementation]:
    """Marks a zero-argument factory of an ``Implementation``, so the command line calls it
    (``python -m stability conformance stability.testing.adapters:jraph_segment_softmax``)."""
    factory.makes_implementation = True  # type: ignore[attr-defined]
    return factory


@adapter
def jraph_segment_softmax() -> Implementation:
    """``jraph.segment_softmax`` (JAX)."""
    import jraph

    return from_jax(jraph.segment_softmax, name="jraph.segment_softmax")


@adapter
def spektral_segment_softmax() -> Implementation:
    """``spektral.layers.ops.unsorted_segment_softmax`` (TensorFlow)."""
    from spektral.layers import ops

    def softmax(logits: tf.Tensor, segment_ids: tf.Tensor, num_segments: int) -> tf.Tensor:
        return ops.unsorted_segment_softmax(logits, segment_ids, num_segments)

    return from_tensorflow(softmax, name="spektral unsorted_segment_softmax")


@adapter
def tfgnn_softmax() -> Implementation:
    """``tfgnn.softmax`` over the edges into each node of a GraphTensor (TensorFlow)."""
    import tensorflow_gnn as tfgnn

    def softmax(logits: tf.Tensor, segment_ids: tf.Tensor, num_segments: int) -> tf.Tensor:
        # One node per segment; edge i runs from node segment_ids[i] into it (the source
        # does not matter to a softmax per TARGET).
        graph = tfgnn.GraphTensor.from_pieces(
            node_sets={"nodes": tfgnn.NodeSet.from_fields(sizes=[num_segments])},
            edge_sets={
                "edges": tfgnn.EdgeSet.from_fields(
                    sizes=tf.shape(segment_ids)[:1],
                    adjacency=tfgnn.Adjacency.from_indices(
                        source=("nodes", segment_ids), target=("nodes", segment_ids)
                    ),
                )
            },
        )
        return tfgnn.softmax(graph, tfgnn.TARGET, edge_set_name="edges", feature_value=logits)

    return from_tensorflow(softmax, name="tfgnn.softmax")


@adapter
def keras_dense_softmax() -> Implementation:
    """``keras.ops.softmax`` on the dense padded layout: the edges of each segment in one
    row of ``[num_segments, max_edges_per_segment]``, padded with ``-inf``."""
    import keras

    def softmax(logits: tf.Tensor, segment_ids: tf.Tensor, num_segments: int) -> tf.Tensor:
        # [num_edges, num_segments]: the running count of each segment, so an edge's
        # column is the number of earlier edges in its segment.
        seen = tf.cumsum(tf.one_hot(segment_ids, num_segments, dtype=tf.int32), axis=0)
        column = tf.gather(seen, segment_ids, batch_dims=1) - 1
        # max of no edges is the int32 minimum: the maximum with 1 keeps one column.
        width = tf.maximum(tf.reduce_max(column) + 1, 1)
        where = tf.stack([segment_ids, column], axis=1)  # [num_edges, 2]
        # Padding is -inf, so a pad's exp is exactly 0: it takes nothing from the real edges.
        pad = tf.fill([num_segments, width], tf.constant(-np.inf, logits.dtype))
        dense = tf.tensor_scatter_nd_update(pad, where, logits)
        with warnings.catch_warnings():
            # Keras warns of a width-1 softmax, which is right here: every segment has one edge.
            warnings.simplefilter("ignore", UserWarning)
            weights = keras.ops.softmax(dense, axis=-1)  # [num_segments, width]
        return tf.gather_nd(weights, where)

    return from_tensorflow(softmax, name="keras.ops.softmax (dense, -inf padding)")


#: name -> adapter, in the order the report lists them
ADAPTERS: dict[str, Callable[[], Implementation]] = {
    "tfgnn": tfgnn_softmax,
    "spektral": spektral_segment_softmax,
    "jraph": jraph_segment_softmax,
    "keras_dense": keras_dense_softmax,
}
