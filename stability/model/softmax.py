"""Softmax of edge logits over the edges that enter each node (a segment softmax).

``alpha_ij = exp(a_ij) / sum_k exp(a_ik)`` over the edges ``k -> i`` into receiver ``i``.

Two forms, each under its own name:

- ``naive``: the seed's formula as written. ``exp`` overflows float32 once a logit exceeds
  log(float32 max) = 88.72 (float16: 11.09, float64: 709.78), giving ``inf / inf = NaN``.
- ``stable``: the segment maximum is subtracted first. The softmax is unchanged in exact
  arithmetic, but every ``exp`` argument is <= 0, so nothing overflows, and the largest
  term of each segment is exactly 1, so no denominator is 0.

Shapes: ``logits`` ``[num_edges, 1]``, ``receivers`` ``[num_edges]``, result ``[num_edges, 1]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from stability.core.registry import Registry

SegmentSoftmax = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]


def naive_segment_softmax(
    logits: tf.Tensor, receivers: tf.Tensor, num_nodes: tf.Tensor
) -> tf.Tensor:
    """The seed's ``exp(a) / sum exp(a)``; overflows for logits above log(dtype max)."""
    # [num_edges, 1]
    exp = tf.exp(logits, name="softmax_exp")
    # [num_nodes, 1]
    denominator = tf.math.unsorted_segment_sum(exp, receivers, num_nodes)
    return tf.math.truediv(exp, tf.gather(denominator, receivers), name="softmax_div")


def stable_segment_softmax(
    logits: tf.Tensor, receivers: tf.Tensor, num_nodes: tf.Tensor
) -> tf.Tensor:
    """Softmax with the segment max subtracted for numerical stability; empty segments safe."""
    # [num_nodes, 1]; a node with no incoming edge gets the dtype's lowest value here.
    segment_max = tf.math.unsorted_segment_max(logits, receivers, num_nodes)
    # Empty segments are never gathered, but keep the table finite so nothing can leak out.
    segment_max = tf.where(tf.math.is_finite(segment_max), segment_max, tf.zeros_like(segment_max))
    # The shift cancels in the ratio, so its gradient is exactly zero: stop it rather than
    # backpropagate through the max's tie-splitting gradient.
    shift = tf.stop_gradient(tf.gather(segment_max, receivers))
    # [num_edges, 1], every value in (0, 1]
    exp = tf.exp(logits - shift, name="softmax_exp")
    # [num_nodes, 1], >= 1 for every node that has an incoming edge
    denominator = tf.math.unsorted_segment_sum(exp, receivers, num_nodes)
    return tf.math.truediv(exp, tf.gather(denominator, receivers), name="softmax_div")


_softmaxes: Registry[SegmentSoftmax] = Registry(  # name -> segment softmax
    "softmax", {"naive": naive_segment_softmax, "stable": stable_segment_softmax}
)


def register_softmax(fn: SegmentSoftmax | None = None, *, name: str | None = None) -> Any:
    """Decorator: register ``fn(logits, receivers, num_nodes)`` as the segment softmax
    ``name`` (default: its function name), for ``create_recipe(ctx, softmax=name)``.

    Shapes: ``logits`` ``[num_edges, 1]``, ``receivers`` ``[num_edges]``, ``num_nodes`` a
    scalar; it returns ``[num_edges, 1]``.
    """
    return _softmaxes.register(fn, name=name)


def list_softmaxes() -> list[str]:
    return _softmaxes.names()


def get_softmax(name: str) -> SegmentSoftmax:
    """The segment softmax called ``name`` ("naive", "stable" or a registered one)."""
    return _softmaxes.get(name)
