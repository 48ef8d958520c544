"""The failing op: from a ``check_numerics`` error to the stage, layer and op a report names.

A forward op is named by its Keras layer (the name scope it ran in) and its type; a gradient
op by the forward op whose gradient it computes; an op in ``LOSS_SCOPE`` is the loss's, and
one in the gradient transform's scope the transform's.
"""

from __future__ import annotations

import tensorflow as tf

from stability.compat.tf_private import (
    GRADIENT_SCOPE,
    error_first_input,
    error_node,
    error_op_type,
    is_gradient_op,
    strip_uniquifier,
)
from stability.train.site import NanSite
from stability.train.tape import TRANSFORM_SCOPE

#: Name scope around the loss in a replay, so that ops there are reported as ``loss``.
LOSS_SCOPE = "stability_loss"
#: How many ops back from a failing gradient op ``forward_op_of`` looks for forward tensors.
_GRADIENT_WALK_DEPTH = 4


def site_from_error(
    message: str,
    known_layers: set[str],
    graph: tf.Graph | None = None,
    model_name: str | None = None,
) -> NanSite:
    """Read a ``check_numerics`` error: the failing node's scope and op type.

    A gradient op (scope ``gradient_tape/...``) is named by the forward op whose gradient it
    computes when ``graph`` (the replay's graph) is given: ``Sqrt (Sqrt) gradient: SqrtGrad``.
    The layer is the path of ``known_layers`` in the op's scope; an op in the model's own
    ``call`` (scope ``model_name``, entered when the model is called as ``model(inputs)``)
    is named by the model's name, once.
    """
    return site_from_node(
        failing_node(message, graph), error_op_type(message), known_layers, graph, model_name
    )


def site_from_node(
    node_name: str | None,
    op_type: str | None,
    known_layers: set[str],
    graph: tf.Graph | None = None,
    model_name: str | None = None,
) -> NanSite:
    """The stage, layer and op of the op ``node_name`` (of type ``op_type``), named as
    ``site_from_error`` names the op a ``check_numerics`` error is about."""
    scope = node_name.split("/") if node_name else []
    where = "forward"
    in_tape = bool(scope) and scope[0] == GRADIENT_SCOPE
    if any(strip_uniquifier(part, {TRANSFORM_SCOPE}) == TRANSFORM_SCOPE for part in scope):
        where = "gradient"
    elif in_tape:
        where, scope = "gradient", scope[1:]
    elif LOSS_SCOPE in (strip_uniquifier(part, {LOSS_SCOPE}) for part in scope):
        where = "loss"
    layers = layer_path(scope[:-1], known_layers, model_name if where != "loss" else None)
    op_text = f"{op_type} ({scope[-1]})" if op_type and scope else op_type
    if in_tape and graph is not None:
        forward_op = forward_op_of(graph, node_name)
        if forward_op is not None:
            op_text = (
                f"{forward_op.type} ({forward_op.name.rsplit('/', 1)[-1]}) gradient: "
                f"{op_type or '?'}"
            )
    return NanSite(where=where, layer=layers, op=op_text)


def layer_path(scopes: list[str], known_layers: set[str], model_name: str | None) -> str | None:
    """``message_passing_0/net`` from an op's enclosing scopes: the known layers among them,
    with TensorFlow's uniquifying suffixes taken off. The model's own scope is left out of
    the path (every op of the model is inside it), and names the layer only when no other
    layer does: the op ran in the model's own ``call``."""
    model = {model_name} if model_name else set()
    parts = [strip_uniquifier(part, known_layers | model) for part in scopes]
    if parts and parts[0] in model:  # the model's call scope, around everything it runs
        inner = [part for part in parts[1:] if part in known_layers]
        return "/".join(inner) or parts[0]
    return "/".join(part for part in parts if part in known_layers) or None


def failing_node(message: str, graph: tf.Graph | None = None) -> str | None:
    """The name of the op a ``check_numerics`` error is about.

    The error names the node ("Detected at node ...") when TensorFlow attaches the
    node's traceback; otherwise only the op type and its input tensors are given, and the
    node is the op of that type in ``graph`` that reads the first input (or, without a
    graph, a name in that input's scope).
    """
    node = error_node(message)
    if node:
        return node
    op_type, tensor = error_op_type(message), error_first_input(message)
    if not (op_type and tensor):
        return None
    if graph is not None:
        for candidate in graph.get_operations():
            if candidate.type == op_type and tensor in (t.name for t in candidate.inputs):
                return candidate.name
    scope = tensor.rsplit("/", 1)[0] if "/" in tensor else ""
    return f"{scope}/{op_type}" if scope else op_type


def forward_op_of(graph: tf.Graph, gradient_node: str) -> tf.Operation | None:
    """The forward op whose gradient the op ``gradient_node`` computes, or None.

    The tape runs the gradient function of a forward op in scope ``s`` in scope
    ``gradient_tape/s``, and names its ops after the gradient's own math (``SqrtGrad``,
    ``RealDiv_1``). An op that opens a name scope of its own takes the scope's name (``x / y``:
    op ``truediv`` in scope ``truediv/``; ``tf.matmul``: ``dense/MatMul``), so its gradient
    ops sit in a scope named after it (``gradient_tape/dense/truediv/RealDiv``): that scope
    names the forward op. Otherwise (``tf.math.acos``: op ``dense/Acos``, gradient ops in
    ``gradient_tape/dense``) the gradient reads the forward op's inputs and outputs, so: walk
    back from the failing op through the gradient ops of the same scope, collect the forward
    tensors met (nearer ones count more), and take the forward op of scope ``s`` whose inputs
    and outputs hold most of them (``_best_in_scope``).
    """
    try:
        failing = graph.get_operation_by_name(gradient_node)
    except (KeyError, ValueError):
        return None
    scope = gradient_node.rsplit("/", 1)[0]
    forward_scope = scope[len(GRADIENT_SCOPE) + 1 :] if scope != GRADIENT_SCOPE else ""
    named = _operation(graph, forward_scope) if forward_scope else None
    if named is not None:
        return named
    weights = _forward_tensors_met(failing, scope)
    return _best_in_scope(graph, forward_scope, weights) if weights else None


def _operation(graph: tf.Graph, name: str) -> tf.Operation | None:
    """The op called ``name`` in ``graph``, or None."""
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return None


def _forward_tensors_met(failing: tf.Operation, scope: str) -> dict[str, float]:
    """``tensor name -> weight`` of the forward tensors read within ``_GRADIENT_WALK_DEPTH``
    ops back from ``failing`` through the gradient ops of its ``scope``: 1 for a tensor the
    failing op reads itself, 1/2 one op further back, and so on (a tensor read twice counts
    twice)."""
    weights: dict[str, float] = {}
    frontier, seen = [failing], {failing.name}
    for depth in range(_GRADIENT_WALK_DEPTH):
        following = []
        for operation in frontier:
            for tensor in operation.inputs:
                producer = tensor.op
                if not is_gradient_op(producer.name):
                    weights[tensor.name] = weights.get(tensor.name, 0.0) + 1.0 / (1 + depth)
                elif producer.name.rsplit("/", 1)[0] == scope and producer.name not in seen:
                    seen.add(producer.name)
                    following.append(producer)
        frontier = following
    return weights


def _best_in_scope(
    graph: tf.Graph, forward_scope: str, weights: dict[str, float]
) -> tf.Operation | None:
    """The forward op of ``forward_scope`` whose inputs and outputs hold most of the forward
    tensors met (``weights``), or None where no op of the scope touches one.

    Left out: ops without inputs (constants: no gradient), and ops whose gradient ops sit in
    a scope of their own (``_own_gradient_scopes``), which holds no gradient op of
    ``forward_scope`` itself. The second matters where one op's output is another's input
    (``acos(z / r)``): ``Acos``' gradient reads its input, the division's output, which ties
    the two. Of the rest, an op whose own output was met wins a tie: ``SqrtGrad`` reads the
    ``Sqrt``'s output, which is also its consumer's input.
    """
    owners = _own_gradient_scopes(graph)
    best, best_score = None, (0.0, False)
    for candidate in graph.get_operations():
        name = candidate.name
        if (name.rsplit("/", 1)[0] if "/" in name else "") != forward_scope:
            continue
        if not candidate.inputs or name in owners:
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


def _own_gradient_scopes(graph: tf.Graph) -> set[str]:
    """The forward ops whose gradient ops the tape put in a scope named after them:
    ``dense/truediv`` for ``gradient_tape/dense/truediv/RealDiv``.

    A gradient op's name can also be a scope: ``enable_check_numerics`` puts the check of op
    ``gradient_tape/dense/Sqrt`` in ``gradient_tape/dense/Sqrt/``, and ``x * 2.0`` in a
    gradient function puts its constant in ``.../mul/y``. So an op there counts only if it
    reads a tensor other than the outputs of the op its scope is named after (a check reads
    only those, a constant nothing); otherwise a forward ``dense/Sqrt`` would be left out
    for its namesake's check.
    """
    owners = set()
    for operation in graph.get_operations():
        if not is_gradient_op(operation.name):
            continue
        scope = operation.name.rsplit("/", 1)[0]
        if scope != GRADIENT_SCOPE and any(t.op.name != scope for t in operation.inputs):
            owners.add(scope[len(GRADIENT_SCOPE) + 1 :])
    return owners


#: The ops of ``tf.where``: they choose between their branches, and discard one.
SELECT_OPS = frozenset({"Select", "SelectV2"})


def selected_away(graph: tf.Graph | None, node: str | None, hops: int = 3) -> bool:
    """Whether the output of forward op ``node`` in ``graph`` reaches a ``tf.where`` within
    ``hops`` ops (``tf.where(d == 0, limit, sin(x) / d)``: the division is the branch the
    where discards, tensorflow/tensorflow#38349). A non-finite value that a later op hides
    in another way (a max or relu that drops NaN on some CPUs' kernels) is not selected
    away: the forward pass really computed it."""
    if graph is None or not node:
        return False
    try:
        frontier = [graph.get_operation_by_name(node)]
    except (KeyError, ValueError):
        return False
    for _ in range(hops):
        consumers = _consumers(frontier)
        if any(c.type in SELECT_OPS for c in consumers):
            return True
        frontier = consumers
    return False


def _consumers(ops: list) -> list:
    """The ops that read ``ops``' outputs, looking through the check ops the replay adds
    after every op (``tf.debugging.enable_check_numerics`` passes each output through one)."""
    found = [c for op in ops for out in op.outputs for c in out.consumers()]
    checks = [c for c in found if c.type.startswith("CheckNumerics")]
    return [c for c in found if c not in checks] + (_consumers(checks) if checks else [])
