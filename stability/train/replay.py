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

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.train.keras_layers import layer_names
from stability.train.tape import TRANSFORM_SCOPE, differentiate, transform_name

#: Name scope around the loss in a replay, so that ops there are reported as ``loss``.
LOSS_SCOPE = "stability_loss"
#: The scope TensorFlow's tape puts a gradient op in: ``gradient_tape/<forward op's scope>``.
GRADIENT_SCOPE = "gradient_tape"
#: How many ops back from a failing gradient op ``forward_op_of`` looks for forward tensors.
_GRADIENT_WALK_DEPTH = 4

_NODE = re.compile(r"Detected at node (\S+?)/CheckNumerics\w*")
_OP = re.compile(r'of (?:graph )?op "(\w+)"')
_INPUT = re.compile(r'Tensor\("([^"]+)"')


#: Ops that divide, with the index of their denominator input: a non-finite output where
#: the denominator is 0 is a division by zero (0/0 or x/0), not an overflow.
DENOMINATOR = {
    "RealDiv": 1,
    "Div": 1,
    "DivNoNan": 1,
    "Xdivy": 1,
    "FloorDiv": 1,
    "Reciprocal": 0,
    "Inv": 0,
    "SqrtGrad": 0,  # dy * 0.5 / y
}


@dataclass(frozen=True)
class OpEvidence:
    """What the first non-finite op computed, read by running the step again unchecked.

    ``has_nan`` / ``has_inf``: its output holds NaN / +-Inf; ``inputs_finite``: every float
    input was finite (so this op made the first non-finite value); ``zero_denominator``: a
    dividing op (``DENOMINATOR``) whose denominator is 0 where the output is not finite.
    """

    op_type: str
    has_nan: bool
    has_inf: bool
    inputs_finite: bool
    zero_denominator: bool


@dataclass(frozen=True)
class NanSite:
    """Where a first non-finite value came from.

    ``where`` is one of ``forward``, ``loss``, ``gradient``, ``weights``; ``layer`` is the
    Keras layer path (``message_passing_0/net``) or None; ``op`` the TensorFlow op type with
    its node name, e.g. ``Exp (softmax_exp)``. ``evidence`` holds the failing op's values
    (None where the op could not be run again, e.g. under XLA); ``max_abs_grad`` the largest
    |gradient| of the weight an optimizer update failed for, and ``grad_norm`` the global
    norm of all the step's raw gradients, computed in float64 (a float32 sum of squares
    overflows for gradients above about 1e19, exactly when it matters).
    """

    where: str
    layer: str | None = None
    op: str | None = None
    evidence: OpEvidence | None = field(default=None, compare=False)
    max_abs_grad: float | None = field(default=None, compare=False)
    grad_norm: float | None = field(default=None, compare=False)


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
            lambda: predict(batch), _both(compute_loss), weights, gradient_transform, LOSS_SCOPE
        )
        return done.loss, done.gradients

    return _checked(step, inputs, layer_names(model), gradient_transform)


def replay_forward(
    model: keras.Model, predict: Callable[[Any], Any], inputs: Any
) -> NanSite | None:
    """Re-run one forward pass (``predict(inputs)``) with every op checked; None if finite."""
    return _checked(predict, inputs, layer_names(model), None)


def _both(compute_loss: Callable[[Any], tf.Tensor]) -> Callable[[Any], tuple]:
    """A replay's loss as ``differentiate`` takes it: the loss it reports is the one it
    differentiates."""

    def loss_of(predictions: Any) -> tuple[tf.Tensor, tf.Tensor]:
        loss = compute_loss(predictions)
        return loss, loss

    return loss_of


def _checked(
    fn: Callable[[Any], Any], inputs: Any, known_layers: set[str], gradient_transform: Any
) -> NanSite | None:
    error = _first_check_error(fn, inputs)
    if error is None:
        return None
    message, graph = error
    site = site_from_error(message, known_layers, graph)
    node = failing_node(message, graph)
    if gradient_transform is not None and node and TRANSFORM_SCOPE in node:
        name = transform_name(gradient_transform)
        site = NanSite("gradient", None, f"{site.op} in gradient transform {name}")
    evidence = probe_op(fn, inputs, node) if node else None
    return NanSite(site.where, site.layer, site.op, evidence)


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


def _first_check_error(fn: Callable[[Any], Any], inputs: Any) -> tuple[str, tf.Graph] | None:
    """Run ``fn(inputs)`` traced afresh with every op checked: the error's message and the
    traced graph, or None if every op stayed finite."""
    traced = tf.function(fn, jit_compile=False)
    tf.debugging.enable_check_numerics()
    try:
        with one_off_traces():
            traced(inputs)
    except tf.errors.InvalidArgumentError as error:
        return str(error), traced.get_concrete_function(inputs).graph
    finally:
        tf.debugging.disable_check_numerics()
    return None


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
        traced = tf.function(probed, jit_compile=False)
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


def evidence_from(
    op_type: str, values: Sequence[np.ndarray], denominator: int | None
) -> OpEvidence:
    """``OpEvidence`` from an op's float inputs and its output (the last of ``values``)."""
    *operands, out = (np.asarray(v) for v in values)
    bad = ~np.isfinite(out)
    zero = False
    if denominator is not None:
        below = operands[denominator]
        try:
            zero = bool(np.any((np.broadcast_to(below, out.shape) == 0) & bad))
        except ValueError:  # shapes that do not broadcast: any zero denominator
            zero = bool(np.any(below == 0))
    return OpEvidence(
        op_type=op_type,
        has_nan=bool(np.isnan(out).any()),
        has_inf=bool(np.isinf(out).any()),
        inputs_finite=all(bool(np.isfinite(v).all()) for v in operands),
        zero_denominator=zero,
    )


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
            lambda: predict(batch), _both(compute_loss), weights, gradient_transform
        )
        return done.raw, done.gradients

    def update(grads: list) -> tf.Tensor:
        apply(optimizer, grads, weights)
        return tf.constant(0.0)

    try:
        with one_off_traces():
            raw, final = tf.function(gradients, jit_compile=False)(inputs)
        _restore(state, saved)
        stale = _nonfinite_state(optimizer)
        if stale is not None:  # e.g. a NaN learning rate: no op of this update made it
            largest = _max_abs_value(raw)
            text = f"{type(optimizer).__name__} update: {stale} was not finite before the step"
            return NanSite("weights", None, text, None, largest, _global_norm(raw))
        error = _first_check_error(update, list(final))
        if error is None:
            return None
        message, graph = error
        node = failing_node(message, graph)
        op = _OP.search(message)
        op_type = op.group(1) if op else "?"
        written = _written_variable(graph, node, [*weights, *optimizer.variables])
        present = [k for k, g in enumerate(final) if g is not None]
        index = _weight_index(graph, node, written, weights, present)
        _restore(state, saved)
        evidence = probe_op(update, list(final), node) if node else None
    finally:
        _restore(state, saved)

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
    return NanSite("weights", layer, text, evidence, largest, _global_norm(raw))


def _nonfinite_state(optimizer: Any) -> str | None:
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


def what_happened(evidence: OpEvidence) -> str:
    """A failing op's arithmetic in a few words, from its values: ``overflow``, ``0/0``,
    ``division by 0``, ``inf - inf`` (a subtraction fed two infinities), ``NaN``."""
    if evidence.zero_denominator:
        return "0/0" if evidence.has_nan else "division by 0"
    if not evidence.inputs_finite:
        if evidence.op_type == "Sub" and evidence.has_nan:
            return "inf - inf"
        return "fed a non-finite value"
    return "overflow" if evidence.has_inf and not evidence.has_nan else "NaN"


def _restore(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
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
    captured = {id(internal): external for external, internal in graph.captures}
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
        owners = [
            (len(w.path), k)
            for k, w in enumerate(weights)
            if written.name.startswith(w.path.replace("/", "_") + "_")
        ]
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
    name = slot.name.removeprefix(weight.path.replace("/", "_") + "_")
    if name == "momentum" and type(optimizer).__name__ in _FIRST_MOMENT_OPTIMIZERS:
        return "first moment (momentum)"
    return SLOT_WORDS.get(name, f"slot {name!r}")


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
        done = differentiate(
            lambda: predict(batch), _both(compute_loss), weights, gradient_transform
        )
        return (
            tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in done.raw]),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in done.gradients]),
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
