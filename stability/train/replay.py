"""Naming where a step's first non-finite value came from, by replaying that one step.

Healthy steps pay only the fused check in ``sentinel``. When it fires, the trainer (or the
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

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from stability.train.keras_layers import layer_names

#: Name scope around the loss in a replay, so that ops there are reported as ``loss``.
LOSS_SCOPE = "stability_loss"
#: Name scope around the gradient transform, in the step and in a replay: its ops are
#: reported at stage ``gradient``, with the transform named.
TRANSFORM_SCOPE = "stability_gradient_transform"
#: The scope TensorFlow's tape puts a gradient op in: ``gradient_tape/<forward op's scope>``.
GRADIENT_SCOPE = "gradient_tape"
#: How many ops back from a failing gradient op ``forward_op_of`` looks for forward tensors.
_GRADIENT_WALK_DEPTH = 4

_NODE = re.compile(r"Detected at node (\S+?)/CheckNumerics\w*")
_OP = re.compile(r'of (?:graph )?op "(\w+)"')
_INPUT = re.compile(r'Tensor\("([^"]+)"')


@dataclass(frozen=True)
class NanSite:
    """Where a first non-finite value came from.

    ``where`` is one of ``forward``, ``loss``, ``gradient``, ``weights``; ``layer`` is the
    Keras layer path (``message_passing_0/net``) or None; ``op`` the TensorFlow op type with
    its node name, e.g. ``Exp (softmax_exp)``.
    """

    where: str
    layer: str | None = None
    op: str | None = None


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
        with tf.GradientTape() as tape:
            predictions = predict(batch)
            with tf.name_scope(LOSS_SCOPE):
                loss = compute_loss(predictions)
        gradients = tape.gradient(loss, weights)
        if gradient_transform is not None:
            gradients = transformed(gradient_transform, gradients)
        return loss, gradients

    return _checked(step, inputs, layer_names(model), gradient_transform)


def replay_forward(
    model: keras.Model, predict: Callable[[Any], Any], inputs: Any
) -> NanSite | None:
    """Re-run one forward pass (``predict(inputs)``) with every op checked; None if finite."""
    return _checked(predict, inputs, layer_names(model), None)


def transformed(
    gradient_transform: Callable[[list[tf.Tensor]], list[tf.Tensor]], gradients: list
) -> list[tf.Tensor]:
    """``gradient_transform(gradients)`` inside ``TRANSFORM_SCOPE``, so its ops are named."""
    with tf.name_scope(TRANSFORM_SCOPE):
        return gradient_transform(gradients)


def transform_name(gradient_transform: Any) -> str:
    """A gradient transform's name for a report: its function's name (through partials)."""
    fn = getattr(gradient_transform, "func", gradient_transform)
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _checked(
    fn: Callable[[Any], Any], inputs: Any, known_layers: set[str], gradient_transform: Any
) -> NanSite | None:
    traced = tf.function(fn, jit_compile=False)
    tf.debugging.enable_check_numerics()
    try:
        traced(inputs)
    except tf.errors.InvalidArgumentError as error:
        graph = traced.get_concrete_function(inputs).graph
        site = site_from_error(str(error), known_layers, graph)
        node = failing_node(str(error), graph)
        if gradient_transform is not None and node and TRANSFORM_SCOPE in node:
            name = transform_name(gradient_transform)
            site = NanSite("gradient", None, f"{site.op} in gradient transform {name}")
        return site
    finally:
        tf.debugging.disable_check_numerics()
    return None


#: ``NanSite.op`` of a failure that only XLA's arithmetic makes (see the module docstring).
XLA_ONLY = "XLA only (finite without XLA)"


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
        with tf.GradientTape() as tape:
            loss = compute_loss(predict(batch))
        raw = tape.gradient(loss, weights)
        final = gradient_transform(raw) if gradient_transform is not None else raw
        return (
            tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in raw]),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in final]),
        )

    raw_finite, final_finite = tf.function(finite_gradients, jit_compile=True)(inputs)
    # XLA compiles the whole step into one cluster, so no per-op check can name the op.
    bad = [w.path for w, ok in zip(weights, raw_finite.numpy(), strict=True) if not ok]
    if bad:
        return NanSite("gradient", bad[-1].rsplit("/", 1)[0], XLA_ONLY)
    return None if final_finite.numpy() else NanSite("gradient", None, XLA_ONLY)


def site_from_error(message: str, known_layers: set[str], graph: tf.Graph | None = None) -> NanSite:
    """Read a ``check_numerics`` error: the failing node's scope and op type.

    A gradient op (scope ``gradient_tape/...``) is named by the forward op whose gradient it
    computes when ``graph`` (the replay's graph) is given: ``Sqrt (Sqrt) gradient: SqrtGrad``.
    """
    node_name = failing_node(message, graph)
    op = _OP.search(message)
    scope = node_name.split("/") if node_name else []
    where = "forward"
    in_tape = bool(scope) and scope[0] == GRADIENT_SCOPE
    if any(_strip_suffix(part, {TRANSFORM_SCOPE}) == TRANSFORM_SCOPE for part in scope):
        where = "gradient"
    elif in_tape:
        where, scope = "gradient", scope[1:]
    elif LOSS_SCOPE in (_strip_suffix(part, {LOSS_SCOPE}) for part in scope):
        where = "loss"
    layers = [_strip_suffix(part, known_layers) for part in scope[:-1]]
    layers = [part for part in layers if part in known_layers]
    op_text = f"{op.group(1)} ({scope[-1]})" if op and scope else (op.group(1) if op else None)
    if in_tape and graph is not None:
        forward_op = forward_op_of(graph, node_name)
        if forward_op is not None:
            op_text = (
                f"{forward_op.type} ({forward_op.name.rsplit('/', 1)[-1]}) gradient: "
                f"{op.group(1) if op else '?'}"
            )
    return NanSite(where=where, layer="/".join(layers) or None, op=op_text)


def failing_node(message: str, graph: tf.Graph | None = None) -> str | None:
    """The name of the op a ``check_numerics`` error is about.

    The error names the node ("Detected at node ...") when TensorFlow attaches the
    node's traceback; otherwise only the op type and its input tensors are given, and the
    node is the op of that type in ``graph`` that reads the first input (or, without a
    graph, a name in that input's scope).
    """
    node = _NODE.search(message)
    if node:
        return node.group(1)
    op, first_input = _OP.search(message), _INPUT.search(message)
    if not (op and first_input):
        return None
    tensor = first_input.group(1)
    if graph is not None:
        for candidate in graph.get_operations():
            if candidate.type == op.group(1) and tensor in (t.name for t in candidate.inputs):
                return candidate.name
    scope = tensor.rsplit("/", 1)[0] if "/" in tensor else ""
    return f"{scope}/{op.group(1)}" if scope else op.group(1)


def forward_op_of(graph: tf.Graph, gradient_node: str) -> tf.Operation | None:
    """The forward op whose gradient the op ``gradient_node`` computes, or None.

    The tape puts every gradient op of a forward op in scope ``s`` into scope
    ``gradient_tape/s``, but names it after the gradient's own math (``SqrtGrad``,
    ``RealDiv_1``). The gradient reads the forward op's inputs and outputs, so: walk back
    from the failing op through the gradient ops of the same scope, collect the forward
    tensors met (nearer ones count more), and take the forward op of scope ``s`` whose
    inputs and outputs hold most of them; an op whose own output was met wins a tie.
    """
    try:
        failing = graph.get_operation_by_name(gradient_node)
    except (KeyError, ValueError):
        return None
    scope = gradient_node.rsplit("/", 1)[0]
    forward_scope = scope[len(GRADIENT_SCOPE) + 1 :] if scope != GRADIENT_SCOPE else ""
    weights: dict[str, float] = {}
    frontier, seen = [failing], {failing.name}
    for depth in range(_GRADIENT_WALK_DEPTH):
        following = []
        for operation in frontier:
            for tensor in operation.inputs:
                producer = tensor.op
                if not producer.name.startswith(GRADIENT_SCOPE + "/"):
                    weights[tensor.name] = weights.get(tensor.name, 0.0) + 1.0 / (1 + depth)
                elif producer.name.rsplit("/", 1)[0] == scope and producer.name not in seen:
                    seen.add(producer.name)
                    following.append(producer)
        frontier = following
    if not weights:
        return None
    best, best_score = None, (0.0, False)
    for candidate in graph.get_operations():
        name = candidate.name
        if (name.rsplit("/", 1)[0] if "/" in name else "") != forward_scope:
            continue
        outputs = {t.name for t in candidate.outputs}
        touched = outputs | {t.name for t in candidate.inputs}
        score = (
            sum(w for name, w in weights.items() if name in touched),
            any(name in outputs for name in weights),
        )
        if score > best_score:
            best, best_score = candidate, score
    return best


def _strip_suffix(part: str, known: set[str]) -> str:
    """``message_passing_0_1`` -> ``message_passing_0``: TensorFlow uniquifies a name scope
    that is entered again in the same graph by appending ``_<n>``."""
    if part in known:
        return part
    base, _, number = part.rpartition("_")
    return base if number.isdigit() and base in known else part
