"""The primitives of the step guard (``guard``): finiteness read off a reduction, the
attention normalization invariant, and naming what a failed check found on the host.

A "NaN" here is any non-finite value (NaN or +-Inf). Checking the loss alone is not enough:
inside ``tf.function`` a ``Dense(relu)`` fed NaN returns 0 (the fused MatMul+BiasAdd+Relu
kernel), so NaN node states and NaN weights can leave the loss finite. Keras'
``TerminateOnNaN`` looks at the loss only and misses that.

Finite is not enough either: a softmax whose denominator overflows while every ``exp`` is
finite gives ``finite / inf = 0`` at every node, and a masked softmax whose masked entry is
``inf`` poisons its segment. Every such bug breaks the same invariant, whatever the softmax's
code: at each node with incoming edges, the attention weights sum to 1. ``attention_ok``
checks it (see ``stability.core.tolerance`` for the tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from stability.core.tolerance import accumulation_dtype, normalization_tolerance
from stability.train.site import NanSite


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """A scalar bool: every element of every tensor is finite (True for no tensors)."""
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None]
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def as_columns(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` as ``[num_edges, k]``: unchanged when it is already 2-D (no op is added,
    and the step pays per op), else reshaped."""
    if tensor.shape.rank == 2:
        return tensor
    return tf.reshape(tensor, [tf.shape(tensor)[0], -1])


def attention_sums(
    alpha: tf.Tensor, receivers: tf.Tensor, num_nodes: tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Per node, the sum of its incoming attention weights and its in-degree.

    Shapes: ``alpha`` ``[num_edges, heads]`` (or ``[num_edges]``), ``receivers``
    ``[num_edges]``; returns sums ``[num_nodes, heads]`` and in-degree ``[num_nodes, 1]``,
    both in ``accumulation_dtype(alpha.dtype)`` (float16 weights are summed in float32).
    ``num_nodes`` defaults to the largest receiver plus one.
    """
    alpha = _widened(as_columns(alpha))
    if num_nodes is None:
        num_nodes = tf.reduce_max(receivers) + 1
    sums = tf.math.unsorted_segment_sum(alpha, receivers, num_nodes)
    degree = tf.math.unsorted_segment_sum(tf.ones_like(alpha[:, :1]), receivers, num_nodes)
    return sums, degree


def _widened(alpha: tf.Tensor) -> tf.Tensor:
    """``alpha`` in its accumulation dtype: a float16 sum of d weights is itself off by up
    to d * eps(float16), 0.125 at in-degree 256 (no op for float32 and float64)."""
    wide = accumulation_dtype(alpha.dtype)
    return alpha if wide == alpha.dtype else tf.cast(alpha, wide)


def attention_ok(
    alphas: Sequence[tf.Tensor],
    receivers: Sequence[tf.Tensor],
    num_nodes: tf.Tensor | None = None,
) -> tf.Tensor:
    """A scalar bool: every layer's weights sum to 1 at every node with incoming edges.

    A NaN sum fails too (``<=`` is False for NaN). True for no attention. Layers that share
    one receivers tensor share its in-degree, so each further layer costs one segment sum,
    a subtraction and a comparison. The tolerance is ``normalization_tolerance`` of the
    weights' own dtype; the sums are accumulated in ``accumulation_dtype``.
    """
    checks, shared = [], {}
    for alpha, receiver in zip(alphas, receivers, strict=True):
        own = alpha.dtype
        alpha = _widened(as_columns(alpha))
        nodes = tf.reduce_max(receiver) + 1 if num_nodes is None else num_nodes
        key = (id(receiver), own)
        if key not in shared:
            # [num_nodes, 1]
            degree = tf.math.unsorted_segment_sum(
                tf.ones_like(alpha[:, :1]) if alpha.shape[-1] != 1 else tf.ones_like(alpha),
                receiver,
                nodes,
            )
            # What a node's weights must sum to: 1 with incoming edges, and 0 (an empty
            # sum, exactly) without; one comparison then covers both.
            shared[key] = (tf.minimum(degree, 1.0), normalization_tolerance(own, degree))
        target, tolerance = shared[key]
        sums = tf.math.unsorted_segment_sum(alpha, receiver, nodes)
        checks.append(tf.reduce_all(tf.abs(sums - target) <= tolerance))
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def finite_max(largest: tf.Tensor, tensors: Sequence[tf.Tensor], exact: bool = False) -> tf.Tensor:
    """Scalar bool: every element of ``tensors`` is finite, read off ``largest``, their max
    |x| (which the step computes anyway for its statistics).

    A max cannot overflow, and TensorFlow's max reduction propagates NaN and inf without XLA
    (``tests/test_checks.py`` checks it), so the one ``is_finite`` is exact. Under XLA a max
    drops NaN, so a step compiled with XLA passes ``exact=True`` (XLA fuses the exact check
    into one kernel anyway).

    A max over no elements at all (the logits of a batch without edges) is -inf, and
    nothing in it is non-finite: so the test is ``largest < inf``, which NaN and +inf fail
    and -inf passes (a max of absolute values is -inf only when there is nothing to take).
    """
    if exact:
        return all_finite(tensors)
    return tf.math.less(largest, math.inf)


def finite_given(
    summary: tf.Tensor, tensors: Sequence[tf.Tensor], exact: bool = False
) -> tf.Tensor:
    """Scalar bool: every element of ``tensors`` is finite, read off ``summary``.

    ``summary`` is a reduction the step computes anyway (a global norm, a max of absolute
    values) that is non-finite whenever one of ``tensors`` is: a sum of squares propagates
    NaN and inf, and so does TensorFlow's max reduction without XLA
    (``tests/test_checks.py`` checks both). Under XLA a max drops NaN, so a step compiled
    with XLA passes ``exact=True`` for a max (XLA fuses the exact check into one kernel
    anyway). A summary may also be non-finite by overflow alone (a norm of gradients of
    1e20), so only then is the exact check run, off the healthy path, inside a ``tf.cond``.
    """
    if exact:
        return all_finite(tensors)
    return tf.cond(
        tf.math.is_finite(tf.cast(summary, tf.float32)),
        lambda: tf.constant(True),
        lambda: all_finite(tensors),
    )


def nonfinite_weights(weights: Sequence[tf.Variable]) -> list[str]:
    """The paths of the weights that hold a non-finite value."""
    return [w.path for w in weights if not np.isfinite(w.numpy()).all()]


def nonfinite_weight_site(weights: Sequence[tf.Variable], optimizer: object) -> NanSite:
    """The site for weights that an update made non-finite from finite gradients."""
    bad = nonfinite_weights(weights)
    layer = bad[0].rsplit("/", 1)[0] if bad else None
    return NanSite("weights", layer, f"{type(optimizer).__name__} update")


def normalization_site(
    where: str,
    alphas: Sequence[np.ndarray],
    receivers: Sequence[np.ndarray],
    layers: Sequence[str],
) -> NanSite | None:
    """Name the first layer whose attention weights do not sum to 1, and what they sum to.

    Runs on the host, once, after the step's flag fired; ``alphas`` and ``receivers`` are the
    forward pass's, recomputed from the weights the guard kept. None if every layer is fine.
    """
    for alpha, receiver, layer in zip(alphas, receivers, layers, strict=True):
        alpha = np.asarray(alpha)
        sums, degree = (
            t.numpy() for t in attention_sums(tf.constant(alpha), tf.constant(receiver))
        )
        tolerance = np.asarray(normalization_tolerance(tf.as_dtype(alpha.dtype), degree))
        with np.errstate(invalid="ignore"):
            bad = ~((np.abs(sums - 1.0) <= tolerance) | (degree == 0.0))
        if not bad.any():
            continue
        nodes = np.flatnonzero(bad.any(axis=1))
        # The worst node: the farthest from 1, NaN first.
        values = sums[nodes].astype(np.float64)
        distance = np.where(np.isnan(values), np.inf, np.abs(values - 1.0)).max(axis=1)
        worst = values[np.argmax(distance)]
        worst = worst[np.argmax(np.where(np.isnan(worst), np.inf, np.abs(worst - 1.0)))]
        total = int((degree > 0).sum())
        return NanSite(
            where,
            layer,
            f"softmax normalization: weights sum to {_format_sum(worst)} "
            f"at {len(nodes)} of {total} nodes with incoming edges",
        )
    return None


def _format_sum(value: float) -> str:
    if value == 0.0:
        return "0"
    if np.isnan(value) or np.isinf(value):
        return str(value)  # "nan", "inf", "-inf"
    return f"{value:.6g}"
