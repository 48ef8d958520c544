"""Naming an update failure: the optimizer op that wrote the first non-finite value, the
variable it wrote (a slot such as Adam's second moment, or the weight), and the gradient it
came from, by replaying the update from the state before the failing step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.compat.keras_private import is_slot_of, slot_name
from stability.compat.tf_private import captured_handles, error_op_type
from stability.core.graph_function import graph_function
from stability.train.failing_op import failing_node
from stability.train.replay import first_check_error, loss_pair, one_off_traces, probe_op
from stability.train.site import NanSite, what_happened
from stability.train.tape import differentiate

#: Ops that write a variable: where an optimizer's computed value lands.
_WRITES = ("AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp")
#: How many ops forward (to the write) or back (to a gradient) the update walk looks.
_UPDATE_WALK_DEPTH = 12
#: What a Keras optimizer's slot holds, for the report (Adam's ``momentum`` is its first
#: moment; SGD's and RMSprop's is a momentum buffer, named as it is).
SLOT_WORDS = {"velocity": "second moment (velocity)"}
_FIRST_MOMENT_OPTIMIZERS = ("Adam", "AdamW", "Nadam", "Lamb")


def replay_update(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    compute_loss: Callable[[Any], tf.Tensor],
    inputs: Any,
    apply: Callable[[Any, list, list], Any],
    gradient_transform: Callable[[list[tf.Tensor]], list[tf.Tensor]] | None = None,
    predict: Callable[[Any], tf.Tensor] | None = None,
) -> NanSite | None:
    """Re-run one step's optimizer update with every op checked; name the op and its slot.

    The model's and the optimizer's variables must hold their values from before the step;
    they are restored afterwards, whatever happened. The gradients are computed as the step
    computed them (``gradient_transform`` included) and handed to ``apply(optimizer,
    gradients, weights)``, the step's own update, traced afresh with per-op checks. The first
    non-finite op is followed forward to the variable it is written to (a slot such as
    Adam's ``velocity``, or the weight itself), and back to the gradient it came from. Returns
    the site (stage ``weights``), with the largest |gradient| of that weight, or None if the
    update stayed finite.
    """
    weights = model.trainable_variables
    state = [*model.variables, *optimizer.variables]
    saved = [v.numpy() for v in state]
    predict = predict or (lambda batch: model(batch, training=True))

    def gradients(batch: Any) -> tuple[list, list]:
        done = differentiate(
            lambda: predict(batch), loss_pair(compute_loss), weights, gradient_transform
        )
        return done.raw, done.gradients

    def update(grads: list) -> tf.Tensor:
        apply(optimizer, grads, weights)
        return tf.constant(0.0)

    try:
        with one_off_traces():
            raw, final = graph_function(gradients, jit_compile=False)(inputs)
        restore(state, saved)
        stale = nonfinite_state(optimizer)
        if stale is not None:  # e.g. a NaN learning rate: no op of this update made it
            largest = _max_abs_value(raw)
            text = f"{type(optimizer).__name__} update: {stale} was not finite before the step"
            return NanSite("weights", None, text, None, largest, _global_norm(raw))
        error = first_check_error(update, list(final))
        if error is None:
            return None
        message, graph = error
        node = failing_node(message, graph)
        op_type = error_op_type(message) or "?"
        written = _written_variable(graph, node, [*weights, *optimizer.variables])
        present = [k for k, g in enumerate(final) if g is not None]
        index = _weight_index(graph, node, written, weights, present)
        restore(state, saved)
        evidence = probe_op(update, list(final), node) if node else None
    finally:
        restore(state, saved)

    weight = weights[index] if index is not None else None
    grad = raw[index] if index is not None else None
    largest = float(np.max(np.abs(grad.numpy()))) if grad is not None else None
    text = f"{type(optimizer).__name__} update: {op_type} ({(node or '?').rsplit('/', 1)[-1]})"
    if evidence is not None:
        text += f" {what_happened(evidence)}"
    if written is not None and weight is not None and written is not weight:
        text += f" in the {_slot_words(optimizer, written, weight)} of {weight.path}"
    elif weight is not None:
        text += f" in the update of {weight.path}"
    if largest is not None:
        text += f"; max |g| {largest:.3g}"
    layer = weight.path.rsplit("/", 1)[0] if weight is not None and "/" in weight.path else None
    slot = slot_name(written, weight) if written is not None and written is not weight else None
    return NanSite(
        "weights",
        layer,
        text,
        evidence,
        largest,
        _global_norm(raw),
        slot=slot if weight is not None else None,
        weight=weight.path if weight is not None else None,
    )


def nonfinite_state(optimizer: Any) -> str | None:
    """The path of the first optimizer variable holding a non-finite value, or None."""
    for variable in optimizer.variables:
        value = variable.numpy()
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            return variable.path
    return None


def _max_abs_value(tensors: Sequence[Any]) -> float | None:
    """max |x| over the (non-None) tensors, or None for none."""
    values = [
        float(np.max(np.abs(t.numpy())))
        for t in tensors
        if t is not None and t.shape.num_elements()
    ]
    return max(values) if values else None


def _global_norm(tensors: Sequence[Any]) -> float | None:
    """sqrt of the sum of squares over the (non-None) tensors, in float64."""
    parts = [np.square(t.numpy().astype(np.float64)).sum() for t in tensors if t is not None]
    return float(np.sqrt(sum(parts))) if parts else None


def restore(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def _walk(start: tf.Operation, step: Callable[[tf.Operation], list[tf.Operation]]):
    """Breadth-first from ``start`` (excluded) along ``step``, up to ``_UPDATE_WALK_DEPTH``."""
    frontier, seen = [start], {start.name}
    for _ in range(_UPDATE_WALK_DEPTH):
        following = []
        for operation in frontier:
            for other in step(operation):
                if other.name not in seen:
                    seen.add(other.name)
                    following.append(other)
                    yield other
        frontier = following


def _written_variable(graph: tf.Graph, node: str | None, variables: Sequence[Any]) -> Any:
    """The variable the value of op ``node`` is first written to, or None."""
    if not node:
        return None
    try:
        start = graph.get_operation_by_name(node)
    except (KeyError, ValueError):
        return None
    captured = captured_handles(graph)
    consumers = lambda op: [c for t in op.outputs for c in t.consumers()]  # noqa: E731
    for operation in [start, *_walk(start, consumers)]:
        if operation.type in _WRITES:
            handle = captured.get(id(operation.inputs[0]))
            for variable in variables:
                if handle is not None and getattr(variable, "handle", None) is handle:
                    return variable
            return None
    return None


def _weight_index(
    graph: tf.Graph, node: str | None, written: Any, weights: list, present: list[int]
) -> int | None:
    """Which weight's update failed: the written variable when it is a weight, else the
    weight whose slot it is (Keras names a slot ``<weight path with _>_<slot>``), else the
    gradient input the failing op reads (``present``: the weights with a gradient, in the
    order of the traced function's inputs)."""
    for k, weight in enumerate(weights):
        if written is weight:
            return k
    if written is not None:
        owners = [(len(w.path), k) for k, w in enumerate(weights) if is_slot_of(written, w)]
        if owners:
            return max(owners)[1]
    if not node:
        return None
    placeholders = {t.op.name: k for t, k in zip(graph.inputs, present, strict=False)}
    try:
        start = graph.get_operation_by_name(node)
    except (KeyError, ValueError):
        return None
    producers = lambda op: [t.op for t in op.inputs]  # noqa: E731
    for operation in [start, *_walk(start, producers)]:
        if operation.name in placeholders:
            return placeholders[operation.name]
    return None


def _slot_words(optimizer: Any, slot: Any, weight: Any) -> str:
    """``second moment (velocity)``: a slot variable named for a report."""
    name = slot_name(slot, weight)
    if name == "momentum" and type(optimizer).__name__ in _FIRST_MOMENT_OPTIMIZERS:
        return "first moment (momentum)"
    return SLOT_WORDS.get(name, f"slot {name!r}")
