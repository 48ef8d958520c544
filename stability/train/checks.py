"""Numerical-failure detection: one fused check per training step, and naming what it found.

A "NaN" here is any non-finite value (NaN or +-Inf). The check runs inside the compiled
training step and returns one boolean per check, in causal order (``CHECKS``): the forward
pass is finite, its attention weights are normalized, the loss is finite, the raw gradients
are finite, the gradients after the variant's transform are finite, and the weights after the
update are finite. The first check that fails is where the run's first failure came from;
``STAGE_OF`` maps it to the stage a report names (``forward``, ``loss``, ``gradient``,
``weights``).

Checking the loss alone is not enough: inside ``tf.function`` a ``Dense(relu)`` fed NaN
returns 0 (the fused MatMul+BiasAdd+Relu kernel), so NaN node states and NaN weights can
leave the loss finite. Keras' ``TerminateOnNaN`` looks at the loss only and misses that.

Finite is not enough either: a softmax whose denominator overflows while every ``exp`` is
finite gives ``finite / inf = 0`` at every node, and a masked softmax whose masked entry is
``inf`` poisons its segment. Every such bug breaks the same invariant, whatever the softmax's
code: at each node with incoming edges, the attention weights sum to 1. ``attention_ok``
checks it (see ``normalization_tolerance`` for the tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from stability.train.replay import NanSite

#: The checks ``step_flags`` returns, in its output order (causal order within a step).
CHECKS = ("forward", "attention", "loss", "gradient", "transform", "weights")

#: The stage each check reports: the attention invariant is a forward failure, a failure
#: the gradient transform introduces or hides is a gradient failure.
STAGE_OF = {"attention": "forward", "transform": "gradient"}

#: The stages a training step's failure can be reported at, in causal order.
STAGES = ("forward", "loss", "gradient", "weights")

#: Tolerance factor of the normalization invariant, in units of eps * in-degree: a sum of
#: ``d`` rounded terms, each a rounded quotient, is off by at most about ``(d + 1) * eps``
#: (Higham, "Accuracy and Stability of Numerical Algorithms", 4.2); 4x covers the rounding
#: of the denominator's gather and of a mixed policy's cast, and stays far below any real
#: violation (a dead segment sums to 0, a poisoned one to NaN).
TOLERANCE_FACTOR = 4.0


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """A scalar bool: every element of every tensor is finite (True for no tensors)."""
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None]
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def normalization_tolerance(dtype: tf.DType, in_degree: tf.Tensor) -> tf.Tensor:
    """``TOLERANCE_FACTOR * eps(dtype) * in_degree``: how far from 1 a node's attention
    weights may sum. float32: 4.8e-7 per incoming edge; float16: 3.9e-3. A node without
    incoming edges gets 0: its sum is an empty sum, exactly 0."""
    eps = float(np.finfo(dtype.as_numpy_dtype).eps)
    return (TOLERANCE_FACTOR * eps) * in_degree


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
    both in ``alpha``'s dtype. ``num_nodes`` defaults to the largest receiver plus one.
    """
    alpha = as_columns(alpha)
    if num_nodes is None:
        num_nodes = tf.reduce_max(receivers) + 1
    sums = tf.math.unsorted_segment_sum(alpha, receivers, num_nodes)
    degree = tf.math.unsorted_segment_sum(tf.ones_like(alpha[:, :1]), receivers, num_nodes)
    return sums, degree


def attention_ok(
    alphas: Sequence[tf.Tensor],
    receivers: Sequence[tf.Tensor],
    num_nodes: tf.Tensor | None = None,
) -> tf.Tensor:
    """A scalar bool: every layer's weights sum to 1 at every node with incoming edges.

    A NaN sum fails too (``<=`` is False for NaN). True for no attention. Layers that share
    one receivers tensor share its in-degree, so each further layer costs one segment sum,
    a subtraction and a comparison.
    """
    checks, shared = [], {}
    for alpha, receiver in zip(alphas, receivers, strict=True):
        alpha = as_columns(alpha)
        nodes = tf.reduce_max(receiver) + 1 if num_nodes is None else num_nodes
        key = (id(receiver), alpha.dtype)
        if key not in shared:
            # [num_nodes, 1]
            degree = tf.math.unsorted_segment_sum(
                tf.ones_like(alpha[:, :1]) if alpha.shape[-1] != 1 else tf.ones_like(alpha),
                receiver,
                nodes,
            )
            # What a node's weights must sum to: 1 with incoming edges, and 0 (an empty
            # sum, exactly) without; one comparison then covers both.
            shared[key] = (tf.minimum(degree, 1.0), normalization_tolerance(alpha.dtype, degree))
        target, tolerance = shared[key]
        sums = tf.math.unsorted_segment_sum(alpha, receiver, nodes)
        checks.append(tf.reduce_all(tf.abs(sums - target) <= tolerance))
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


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


def step_flags(
    forward: tf.Tensor,
    attention: tf.Tensor,
    loss: tf.Tensor,
    raw_gradients: tf.Tensor,
    gradients: tf.Tensor | None,
) -> tf.Tensor:
    """``[5]`` bool, the checks of ``CHECKS`` before the update (all but ``weights``, which
    the step appends after it), from scalar bools: the forward tensors are finite, the
    attention is normalized, the loss, the raw gradients and the transformed gradients
    (None without a transform) are finite."""
    return tf.stack(
        [
            forward,
            attention,
            tf.reduce_all(tf.math.is_finite(loss)),
            raw_gradients,
            raw_gradients if gradients is None else gradients,
        ]
    )


def first_failure(flags: np.ndarray) -> str | None:
    """The first check (of ``CHECKS``) whose flag is False, or None when the step was fine."""
    for check, ok in zip(CHECKS, flags, strict=True):
        if not ok:
            return check
    return None


def stage_of(check: str) -> str:
    """The stage a failed check is reported at."""
    return STAGE_OF.get(check, check)


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
