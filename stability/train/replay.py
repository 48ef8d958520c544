"""Naming where a step's first non-finite value came from, by replaying that one step.

Healthy steps pay only the step guard (``guard``). When it fires, the trainer (or the
``NanSentinel`` callback) still holds the weights from before the failing step and the
batch, and replays the step once with TensorFlow's own per-op check
(``tf.debugging.enable_check_numerics``): the first op whose output is NaN or Inf stops
the replay, and its name scope tells the Keras layer, its type the op.

The replay is traced afresh (check ops are added at trace time) and never with XLA, where
those check ops are not supported. XLA rewrites arithmetic (it turns the softmax
gradient's ``(-x / y) / y`` into ``-x / (y * y)``, which underflows at half the logit), so
a step may fail under XLA only. ``xla_gradient_site`` then names the layer, not the op:
it recomputes the step's gradients under XLA and reports the weights they went
non-finite for.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.compat.keras_layers import layer_names
from stability.compat.tf_private import error_op_type
from stability.core.graph_function import graph_function
from stability.core.quiet import stderr_silenced
from stability.train.failing_op import (
    LOSS_SCOPE,
    failing_node,
    selected_away,
    site_from_error,
    site_from_node,
)
from stability.train.site import (
    DENOMINATOR,
    XLA_ONLY,
    NanSite,
    OpEvidence,
    evidence_from,
)
from stability.train.tape import TRANSFORM_SCOPE, differentiate, transform_name


def replay_step(
    model: keras.Model,
    compute_loss: Callable[[Any], tf.Tensor],
    inputs: Any,
    gradient_transform: Callable[[list[tf.Tensor]], list[tf.Tensor]] | None = None,
    predict: Callable[[Any], tf.Tensor] | None = None,
) -> NanSite | None:
    """Re-run forward, loss, gradients and the gradient transform of one step, every op checked.

    ``predict(inputs)`` must be the step's own call of the model, with the same training
    flag (default: ``model(inputs, training=True)``, as ``Model.fit`` calls it);
    ``compute_loss(predictions)`` returns the scalar loss. Returns the first non-finite
    site, or None if the replay stayed finite (then the update itself made the weights
    non-finite). A gradient op is named by the forward op whose gradient it computes.
    """
    weights = model.trainable_variables
    predict = predict or (lambda batch: model(batch, training=True))

    def step(batch: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        done = differentiate(
            lambda: predict(batch), loss_pair(compute_loss), weights, gradient_transform, LOSS_SCOPE
        )
        return done.loss, done.gradients

    return _checked(step, inputs, layer_names(model), gradient_transform, model.name)


def replay_forward(
    model: keras.Model, predict: Callable[[Any], Any], inputs: Any
) -> NanSite | None:
    """Re-run one forward pass (``predict(inputs)``) with every op checked; None if finite."""
    return _checked(predict, inputs, layer_names(model), None, model.name)


def loss_pair(compute_loss: Callable[[Any], tf.Tensor]) -> Callable[[Any], tuple]:
    """A replay's loss as ``differentiate`` takes it: the loss it reports is the one it
    differentiates."""

    def loss_of(predictions: Any) -> tuple[tf.Tensor, tf.Tensor]:
        loss = compute_loss(predictions)
        return loss, loss

    return loss_of


def _checked(
    fn: Callable[[Any], Any],
    inputs: Any,
    known_layers: set[str],
    gradient_transform: Any,
    model_name: str | None = None,
) -> NanSite | None:
    error = first_check_error(fn, inputs)
    if error is None:
        return None
    message, graph = error
    site = site_from_error(message, known_layers, graph, model_name)
    node = failing_node(message, graph)
    origin = origin_op(fn, inputs) if error_op_type(message) == "Const" else None
    if origin is not None:  # the check named a constant the model wrote (a -inf mask)
        node, graph = origin.name, origin.graph
        site = site_from_node(node, origin.type, known_layers, graph, model_name)
    if gradient_transform is not None and node and TRANSFORM_SCOPE in node:
        name = transform_name(gradient_transform)
        site = NanSite("gradient", None, f"{site.op} in gradient transform {name}")
    evidence = probe_op(fn, inputs, node) if node else None
    selected = site.where in ("forward", "loss") and selected_away(graph, node)
    return NanSite(site.where, site.layer, site.op, evidence, selected=selected)


@contextlib.contextmanager
def one_off_traces() -> Iterator[None]:
    """Hide TensorFlow's "triggered tf.function retracing" warning: a replay traces a
    fresh function on purpose (its check ops are added at trace time), once per failure."""
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def first_check_error(fn: Callable[[Any], Any], inputs: Any) -> tuple[str, tf.Graph] | None:
    """Run ``fn(inputs)`` traced afresh with every op checked: the error's message and the
    traced graph, or None if every op stayed finite."""
    traced = graph_function(fn, jit_compile=False)
    tf.debugging.enable_check_numerics()
    try:
        # The failing check's error, some 70 lines, is also logged by TensorFlow's C++
        # runtime straight to file descriptor 2, before the harness's one line says the same.
        with one_off_traces(), stderr_silenced():
            traced(inputs)
    except tf.errors.InvalidArgumentError as error:
        return str(error), traced.get_concrete_function(inputs).graph
    finally:
        tf.debugging.disable_check_numerics()
    return None


def origin_op(fn: Callable[[Any], Any], inputs: Any) -> tf.Operation | None:
    """The first op of ``fn(inputs)``, run unchecked, that makes a new non-finite value: a
    NaN where none of its float inputs holds one, or an Inf where every input is finite.
    Constants are left out, and so is an op that only passes on a non-finite input.

    ``check_numerics`` checks every op's output, a ``Const`` included, and stops at the
    first non-finite one: a model that writes ``-inf`` on purpose (``tf.fill(shape, -inf)``
    as an attention mask) fails there, before the op that goes wrong (the ``0 / 0`` of a
    softmax whose entries are all masked). This reads every float value the step computes
    (the ops of the traced graph, in the order they were built, which is an order they can
    run in) and finds that op; None if there is none (or the values cannot be read).
    """

    live: list[tf.Operation] = []

    def every_value(batch: Any) -> dict[str, tf.Tensor]:
        results = tf.nest.flatten(fn(batch))
        graph = tf.compat.v1.get_default_graph()
        live.extend(_ancestors(graph, [t for t in results if isinstance(t, tf.Tensor)]))
        return {t.name: tf.identity(t) for op in live for t in op.outputs if t.dtype.is_floating}

    try:
        traced = graph_function(every_value, jit_compile=False)
        with one_off_traces():
            values = {name: np.asarray(v) for name, v in traced(inputs).items()}
    except (ValueError, KeyError, TypeError, tf.errors.OpError):
        return None
    for op in live:
        if op.type != "Const" and _makes_non_finite(op, values):
            return op
    return None


def _ancestors(graph: tf.Graph, tensors: list[tf.Tensor]) -> list[tf.Operation]:
    """The ops of ``graph`` that ``tensors`` are computed from, in the order they were built
    (an order they can run in). An op whose outputs nothing reads is left out: the raw op
    an op guard replaced (``stability.model.op_guard``) is still in the graph, unused."""
    seen: set[str] = set()
    stack = [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op.name in seen]


def _makes_non_finite(op: tf.Operation, values: dict[str, np.ndarray]) -> bool:
    """Whether ``op``'s outputs hold a NaN none of its inputs held, or an Inf from finite
    inputs (its float inputs' and outputs' ``values``, by tensor name)."""
    ins = [values[t.name] for t in op.inputs if t.name in values]
    outs = [values[t.name] for t in op.outputs if t.name in values]
    nan_in = any(np.isnan(v).any() for v in ins)
    finite_in = all(np.isfinite(v).all() for v in ins)
    new_nan = not nan_in and any(np.isnan(v).any() for v in outs)
    new_inf = finite_in and any(np.isinf(v).any() for v in outs)
    return new_nan or new_inf


def probe_op(fn: Callable[[Any], Any], inputs: Any, node: str) -> OpEvidence | None:
    """Run ``fn(inputs)`` again, unchecked, and read the values of op ``node``.

    A fresh trace of the same function names its ops as the checked trace did (the check
    ops go into each op's own scope), so the node is found by name. None where it is not
    (or sits inside a control-flow branch, whose tensors cannot be returned).
    """

    def probed(batch: Any) -> list[tf.Tensor]:
        fn(batch)
        try:
            op = tf.compat.v1.get_default_graph().get_operation_by_name(node)
        except (KeyError, ValueError):
            return []
        return [tf.identity(t) for t in (*op.inputs, *op.outputs[:1]) if t.dtype.is_floating]

    try:
        traced = graph_function(probed, jit_compile=False)
        with one_off_traces():
            values = [np.asarray(v) for v in traced(inputs)]
        graph = traced.get_concrete_function(inputs).graph
        op_type = graph.get_operation_by_name(node).type
    except (ValueError, KeyError, TypeError, tf.errors.OpError):
        return None
    return evidence_from(op_type, values, _denominator_position(graph, node)) if values else None


def _denominator_position(graph: tf.Graph, node: str) -> int | None:
    """The position of a dividing op's denominator among its float inputs, or None."""
    op = graph.get_operation_by_name(node)
    index = DENOMINATOR.get(op.type)
    if index is None or index >= len(op.inputs):
        return None
    floats = [k for k, t in enumerate(op.inputs) if t.dtype.is_floating]
    return floats.index(index) if index in floats else None


def xla_gradient_site(
    model: keras.Model,
    compute_loss: Callable[[Any], tf.Tensor],
    inputs: Any,
    gradient_transform: Callable[[list[tf.Tensor]], list[tf.Tensor]] | None = None,
    predict: Callable[[Any], tf.Tensor] | None = None,
) -> NanSite | None:
    """Recompute one step's gradients under XLA; name the layer of the non-finite ones.

    The gradients are checked as the backward pass left them, before any
    ``gradient_transform``: a global-norm clip turns one non-finite gradient into all of them.
    Of the weights whose gradient is not finite, the one created last is taken: in a model
    built input to output, that is the layer nearest the loss, where the backward pass first
    met the bad value. If only the transform's output is not finite, the layer is None.
    Returns None if the gradients are finite under XLA as well.
    """
    weights = model.trainable_variables
    predict = predict or (lambda batch: model(batch, training=True))

    def finite_gradients(batch: Any) -> tuple[tf.Tensor, tf.Tensor]:
        done = differentiate(
            lambda: predict(batch), loss_pair(compute_loss), weights, gradient_transform
        )
        return (
            tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in done.raw]),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in done.gradients]),
        )

    raw_finite, final_finite = graph_function(finite_gradients, jit_compile=True)(inputs)
    # XLA compiles the whole step into one cluster, so no per-op check can name the op.
    bad = [w.path for w, ok in zip(weights, raw_finite.numpy(), strict=True) if not ok]
    if bad:
        return NanSite("gradient", bad[-1].rsplit("/", 1)[0], XLA_ONLY)
    return None if final_finite.numpy() else NanSite("gradient", None, XLA_ONLY)
