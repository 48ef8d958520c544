"""The built-in remedies: every change the doctor makes without the user writing code, one
decorated function each, in the order the doctor's report lists them. To add one, write its
function here (or in your own module, as a plugin) under ``@model_remedy`` (a change of the
built model, optimizer or gradients) or ``@case_remedy`` (a case key's new value), with the
symptoms it is for and why, why not for the others, when it applies, and the code it stands
for. docs/doctor.md's table is rendered from these (``stability.doctor.report.remedy_table``).

Every model remedy works on any Keras model and optimizer through public Keras APIs (an
optimizer rebuilt from its config, a weight's ``constraint`` and ``regularizer``), except
where it says which models it needs: the softmax and logit remedies act on layers that
name a registered softmax or logit transform (``use_softmax``, ``use_logit_transform``, as
the built-in ``AttentionMessagePassing`` does). A remedy that cannot act on a variant
raises ``RemedyError``; the doctor reports it as not applicable, with that reason.

The seed's controls ``grad_clip`` and ``weight_constrained`` (``stability.model.variants``)
are built from the constants and pieces below (``SEED_CLIP``, ``seed_kernel_constraint``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import keras
import tensorflow as tf

from stability.compat.keras_layers import layer_at, nested_layers
from stability.core.errors import RemedyError
from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.data.graphs import batch_graphs
from stability.model.losses import loss_predictions
from stability.model.op_guard import (
    GUARDS,
    LOSS_SITE,
    OpGuard,
    Site,
    function_producer_types,
    guard_layer,
    guard_loss,
    loss_sites,
    model_sites,
    producer_types,
)
from stability.model.recipe import BuildContext, Recipe
from stability.model.remedy import (
    DIVERGENCE,
    HEADROOM,
    OP_GUARD,
    WEIGHT_GROWTH,
    CaseLike,
    Target,
    case_remedy,
    model_remedy,
)

#: The seed's clipping (its grad_clip variant): Adam's clipnorm, then the global norm and
#: the value of every gradient clipped in the gradient transform.
CLIPNORM, GLOBAL_NORM, CLIP_VALUE = 1.0, 1.0, 5.0
#: The larger Adam epsilon: 1e-4 is a normal float16 number (float16's smallest normal is
#: 6.1e-5), where Keras' default 1e-7 is not, and it bounds an update |m| / (sqrt(v) + eps)
#: on a weight whose second moment is ~0 to lr * |m| * 1e4 instead of lr * |m| * 1e7.
ADAM_EPSILON = 1e-4
#: The seed's accepted fix (its weight_constrained variant) on every kernel it constrains.
MIN_NORM, MAX_NORM, L2 = 1e-30, 1.0, 1e-6
#: Dividing the learning rate by this is the lower learning rate.
LR_FACTOR = 10.0
#: Multiplying the batch size by this is the larger batch.
BATCH_FACTOR = 4

_FORWARD_SYMPTOMS = (
    Cause.FORWARD_OVERFLOW.value,
    Cause.FORWARD_UNDERFLOW.value,
    Cause.NORMALIZATION.value,
    HEADROOM,
)
_F32, _F64 = exp_limits("float32"), exp_limits("float64")
_EDGE_HELP = (
    "the attention logits are made of the unscaled distance; on the scale of the other "
    "inputs they start far from exp's limits"
)
_LOGIT_HELP = "bounds what reaches exp, so its result is neither inf nor 0"


def clip_gradients(gradients: list[tf.Tensor], global_norm: float, value: float) -> list[tf.Tensor]:
    """The gradients clipped to a global norm, then each to [-value, value] (the seed's)."""
    clipped, _ = tf.clip_by_global_norm(gradients, global_norm)
    return [tf.clip_by_value(g, -value, value) for g in clipped]


#: The seed's gradient transform: global norm, then value (grad_clip's and ``clip``'s).
SEED_CLIP = partial(clip_gradients, global_norm=GLOBAL_NORM, value=CLIP_VALUE)


def seed_kernel_constraint() -> keras.constraints.Constraint:
    """The seed's accepted kernel constraint (weight_constrained's and ``kernel_constraint``'s)."""
    return keras.constraints.MinMaxNorm(min_value=MIN_NORM, max_value=MAX_NORM)


def seed_kernel_regularizer() -> keras.regularizers.Regularizer:
    """The seed's accepted kernel regularizer (weight_constrained's and ``kernel_constraint``'s)."""
    return keras.regularizers.L2(L2)


def rebuilt_optimizer(optimizer: keras.optimizers.Optimizer, **changes: Any):
    """A new optimizer of ``optimizer``'s class from its config with ``changes``: the one
    public way to change a built Keras optimizer's clipping or epsilon."""
    config = {**optimizer.get_config(), **changes}
    return type(optimizer).from_config(config)


# --- the optimizer -------------------------------------------------------------------------


@model_remedy(
    fix_class="optimizer setting",
    family="optimizer",
    label="gradient clipping (the seed's: clipnorm 1, global norm 1, value 5)",
    description="the seed's gradient clipping: clipnorm 1, then global norm 1 and value 5",
    code="keras.optimizers.Adam(learning_rate, clipnorm=1.0), and "
    "tf.clip_by_global_norm(gradients, 1.0) with tf.clip_by_value(g, -5, 5) before the update",
    helps={
        Cause.GRADIENT_EXPLOSION.value: "bounds the step a huge gradient makes",
        Cause.OPTIMIZER.value: "a bounded gradient keeps Adam's moments g and g*g finite",
        DIVERGENCE: "bounds each update, so one bad batch cannot undo the training",
        WEIGHT_GROWTH: "each update is at most the learning rate times the clip norm, so "
        "one large gradient cannot grow the weights past what a layer's sum can hold",
    },
    cannot="it acts on the gradients after the forward pass and the loss are computed; "
    "no forward value changes, so the weights still drift to where the forward pass "
    "fails",
)
def clip(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    # Keras 3 takes one of clipnorm, clipvalue and global_clipnorm per optimizer, so the
    # optimizer keeps clipnorm and the rest of the seed's clipping runs in the transform.
    optimizer = rebuilt_optimizer(
        recipe.optimizer, clipnorm=CLIPNORM, clipvalue=None, global_clipnorm=None
    )
    before = recipe.gradient_transform
    transform = SEED_CLIP if before is None else _then(before, SEED_CLIP)
    return replace(recipe, optimizer=optimizer, gradient_transform=transform)


def _then(first: Callable, second: Callable) -> Callable:
    def both(gradients: list) -> list:
        return second(first(gradients))

    both.__qualname__ = f"{getattr(first, '__qualname__', 'transform')}+clip"
    return both


def _takes_learning_rate(target: Target) -> str | None:
    """A variant whose optimizer ignores the case's learning rate cannot be given a lower one."""
    rate = target.recipe().optimizer.learning_rate
    value = float(rate.numpy()) if hasattr(rate, "numpy") else None
    if value is None or not math.isclose(value, target.learning_rate, rel_tol=1e-6):
        return (
            "the variant's optimizer does not take the case's learning rate "
            "(BuildContext.learning_rate)"
        )
    return None


@case_remedy(
    fix_class="optimizer setting",
    key="learning_rates",
    family="optimizer",
    label=f"learning rate divided by {LR_FACTOR:g}",
    code=f"keras.optimizers.Adam(learning_rate / {LR_FACTOR:g}), or learning_rates in the case",
    helps={
        DIVERGENCE: "smaller steps keep the optimizer from overshooting",
        WEIGHT_GROWTH: "a step too large for the network's curvature overshoots and grows "
        "the weights; a smaller one stays where the steps shrink the loss",
    },
    cannot="every step is scaled alike, so the weights drift to the same failing place "
    f"{LR_FACTOR:g} times more slowly: it can delay that failure, not remove it",
    applies=_takes_learning_rate,
)
def lower_lr(case: CaseLike) -> tuple[float, ...]:
    return tuple(lr / LR_FACTOR for lr in case.learning_rates)


@model_remedy(
    fix_class="optimizer setting",
    family="optimizer",
    label="a larger Adam epsilon",
    description=f"Adam's epsilon raised to {ADAM_EPSILON:g}",
    code=f"keras.optimizers.Adam(learning_rate, epsilon={ADAM_EPSILON:g})",
    helps={
        Cause.OPTIMIZER.value: "bounds the update m / (sqrt(v) + eps) where v is ~0",
        Cause.MASKED_GRADIENT.value: "bounds the update where a masked gradient left v ~0",
    },
    cannot="it changes only the update's denominator, not a forward value or a gradient",
)
def adam_epsilon(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    config = recipe.optimizer.get_config()
    if "epsilon" not in config:
        raise RemedyError(f"the optimizer {type(recipe.optimizer).__name__} has no epsilon")
    if config["epsilon"] >= ADAM_EPSILON:
        raise RemedyError(f"the optimizer's epsilon is already {config['epsilon']:g}")
    return replace(recipe, optimizer=rebuilt_optimizer(recipe.optimizer, epsilon=ADAM_EPSILON))


# --- the batch size and the dtype ------------------------------------------------------------


def _batch_fits(target: Target) -> str | None:
    train = len(target.data_after()[0].train)
    if target.after.batch_sizes[0] >= train:
        return f"the training set has only {train} graphs"
    return None


@case_remedy(
    fix_class="optimizer setting",
    key="batch_sizes",
    family="batch size",
    label=f"batch size times {BATCH_FACTOR}",
    code=f"batch_sizes {BATCH_FACTOR} times larger in the case",
    helps={
        DIVERGENCE: "the gradient is averaged over more graphs, so it is less noisy",
        Cause.GRADIENT_EXPLOSION.value: "averaging over more graphs damps one graph's "
        "huge gradient",
    },
    cannot="averaging over more graphs changes the gradient's noise, not what one "
    "graph's forward pass computes: a graph that overflows still does in a larger batch",
    applies=_batch_fits,
)
def larger_batch(case: CaseLike) -> tuple[int, ...]:
    return tuple(b * BATCH_FACTOR for b in case.batch_sizes)


def _not_float64(target: Target) -> str | None:
    return "the case already trains in float64" if target.before.dtype == "float64" else None


@case_remedy(
    fix_class="dtype",
    key="dtype",
    family="dtype",
    label="float64",
    code='dtype = "float64" in the case (every layer in float64)',
    helps={
        Cause.FORWARD_OVERFLOW.value: f"exp overflows at {_F64.overflow:.2f} instead of "
        f"float32's {_F32.overflow:.2f}",
        Cause.FORWARD_UNDERFLOW.value: f"exp reaches 0 below -{_F64.underflow:.2f} "
        f"instead of float32's -{_F32.underflow:.2f}",
        Cause.LOSS.value: "the loss overflows at 1.8e308 instead of 3.4e38",
        Cause.OPTIMIZER.value: "g*g overflows at |g| = 1.3e154 instead of 1.8e19",
        HEADROOM: "moves every limit the run came near far away",
    },
    cannot="more range does not change what the model computes: a value that keeps "
    "growing reaches float64's limits too",
    applies=_not_float64,
)
def float64(case: CaseLike) -> str:
    return "float64"


# --- the data ----------------------------------------------------------------------------


def _no_edge_transform(target: Target) -> str | None:
    if target.before.edge_transform != "none":
        return f"the case already has edge_transform = {target.before.edge_transform!r}"
    return None


_EDGE_LEFT = "a failure that does not start from the distances' scale is left as it was"
#: What the two edge remedies share: the case key, the symptoms and why, the predicate.
_EDGES = {
    "key": "edge_transform",
    "family": "data",
    "helps": dict.fromkeys(_FORWARD_SYMPTOMS, _EDGE_HELP),
    "applies": _no_edge_transform,
}


@case_remedy(
    fix_class="data cleaning",
    **_EDGES,
    label="edge distances standardized with the training set's mean and std",
    code="e = (e - mean) / std with the training set's mean and std, before the model",
    cannot=f"it rescales one input; {_EDGE_LEFT}",
)
def standardized_e(case: CaseLike) -> str:
    return "standardized"


@case_remedy(
    fix_class="data cleaning",
    **_EDGES,
    label="edge distances squashed by a sigmoid",
    code="e = sigmoid(e) before the model",
    cannot=f"it bounds one input; {_EDGE_LEFT}",
)
def squashed_e(case: CaseLike) -> str:
    return "squashed"


def _has_isolated_nodes(target: Target) -> str | None:
    """Self-loops are for nodes without an incoming edge; on data without one they would
    change every aggregation and give no node a neighbour it lacked."""
    if target.before.self_loops:
        return "the case already has self_loops = true"
    if not any(d.isolated_nodes for d in target.data_before()):
        return "every node of the data already has an incoming edge"
    return None


@case_remedy(
    fix_class="data cleaning",
    key="self_loops",
    family="data",
    label="an edge from every node to itself (distance 0)",
    code="g = dgl.add_self_loop(g), or self_loops = true in the case",
    helps=dict.fromkeys(
        (
            Cause.FORWARD_OVERFLOW.value,
            Cause.FORWARD_UNDERFLOW.value,
            Cause.NORMALIZATION.value,
            Cause.NONFINITE_GRADIENT_OP.value,
        ),
        "a node without an incoming edge aggregates an empty set: degree 0 (deg^-1/2 "
        "is inf), the lowest float as its segment max, 0 as its softmax denominator or "
        "sum of exponentials; with a self-loop no neighbourhood is empty",
    ),
    cannot="it gives nodes without an incoming edge a neighbour; a failure that does "
    "not start from an empty neighbourhood is left as it was",
    applies=_has_isolated_nodes,
)
def self_loops(case: CaseLike) -> bool:
    return True


# --- the model ---------------------------------------------------------------------------


@model_remedy(
    fix_class="architecture change",
    family="model",
    label="MinMaxNorm(1e-30, 1) and l2(1e-6) on the Dense kernels in the failing layer",
    description=f"MinMaxNorm({MIN_NORM:g}, {MAX_NORM:g}) and l2({L2:g}) on the kernels of the "
    "Dense layers inside the failing layer (the seed's accepted fix)",
    code="keras.layers.Dense(..., kernel_constraint=keras.constraints.MinMaxNorm(1e-30, 1.0), "
    "kernel_regularizer=keras.regularizers.L2(1e-6))",
    helps={
        **dict.fromkeys(
            _FORWARD_SYMPTOMS,
            "a kernel of norm at most 1 bounds each logit by the norm of its input "
            "(the seed's accepted fix)",
        ),
        Cause.GRADIENT_EXPLOSION.value: "bounded kernels bound the activations the "
        "gradient is made of",
        DIVERGENCE: "bounded kernels cannot run away",
        WEIGHT_GROWTH: "a kernel of norm at most 1 cannot grow, so a Dense layer's output is "
        "bounded by its input's norm",
    },
    cannot="it bounds the kernels, not the inputs or the ops after them",
    takes_layer=True,
)
def kernel_constraint(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    dense = dense_layers_in(recipe.model, layer)
    if not dense:
        where = f"inside layer {layer!r}" if layer else "in the model"
        raise RemedyError(f"no Dense layer {where}")
    for found in dense:
        # A built weight takes a constraint and a regularizer through public setters: the
        # optimizer applies the constraint after each update, the model's losses add the l2.
        found.kernel.constraint = seed_kernel_constraint()
        found.kernel.regularizer = seed_kernel_regularizer()
    return recipe


def dense_layers_in(model: keras.Layer, path: str | None) -> list[keras.layers.Dense]:
    """The ``Dense`` layers inside the layer at ``path`` (``message_passing_0`` or
    ``edge_attention/dense_1``, names as a failure names them), or in the whole model for
    None; the layer itself when it is a ``Dense``."""
    scope = _layer(model, path)
    candidates = [scope, *nested_layers(scope)]
    return [layer for layer in candidates if isinstance(layer, keras.layers.Dense)]


def _layer(model: keras.Layer, path: str | None) -> keras.Layer:
    try:
        return layer_at(model, path)
    except LookupError as exc:
        raise RemedyError(str(exc)) from None


def _switch(recipe: Recipe, method: str, name: str, attribute: str, none: str) -> Recipe:
    """Call ``method(name)`` on every layer of the model that has it and uses another;
    the recipe, or RemedyError(``none``) when no layer did."""
    switched = 0
    for layer in [recipe.model, *nested_layers(recipe.model)]:
        if callable(getattr(layer, method, None)) and getattr(layer, attribute, None) != name:
            getattr(layer, method)(name)
            switched += 1
    if not switched:
        raise RemedyError(none)
    return recipe


@model_remedy(
    fix_class="stable reformulation",
    family="model",
    label="the max-subtracted softmax",
    description="the softmax that subtracts each node's largest logit before exp",
    code="alpha = exp(a - max_i a) / sum exp(a - max_i a): "
    "a - tf.gather(tf.math.unsorted_segment_max(a, receivers, num_nodes), receivers)",
    helps={
        Cause.FORWARD_OVERFLOW.value: "every exp argument is <= 0, so exp cannot overflow",
        Cause.FORWARD_UNDERFLOW.value: "each node's largest term is exactly 1, so no "
        "denominator is 0",
        Cause.NORMALIZATION.value: "each node's largest term is exactly 1, so its weights sum to 1",
        HEADROOM: "exp never sees the raw logit",
    },
    cannot="it changes the softmax only: a failure elsewhere stays",
)
def stable_softmax(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    return _switch(
        recipe,
        "use_softmax",
        "stable",
        "softmax",
        none="no layer of the model uses a registered softmax other than 'stable' "
        "(a layer takes one through use_softmax)",
    )


@model_remedy(
    fix_class="architecture change",
    family="model",
    label="attention logits bounded by 5 tanh(logit / 5)",
    description="every attention logit bounded as 5 tanh(logit / 5) before the softmax",
    code="a = 5.0 * tf.tanh(a / 5.0) before exp",
    helps=dict.fromkeys(_FORWARD_SYMPTOMS, _LOGIT_HELP),
    cannot="it bounds the attention logits only: a failure elsewhere stays",
)
def tanh_cap(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    return _switch(
        recipe,
        "use_logit_transform",
        "tanh_cap",
        "logit_transform",
        none="no layer of the model applies a registered logit transform "
        "(a layer takes one through use_logit_transform)",
    )


# --- the failing op ------------------------------------------------------------------------

#: The symptoms an op guard is for: every failure the replay pins on one op.
_OP_SYMPTOMS = (
    Cause.FORWARD.value,
    Cause.FORWARD_OVERFLOW.value,
    Cause.FORWARD_UNDERFLOW.value,
    Cause.NONFINITE_GRADIENT_OP.value,
    Cause.LOSS.value,
)
#: The symptoms a segmented guard is for too: weights that do not sum to 1 over a segment.
_SEGMENT_SYMPTOMS = (Cause.NORMALIZATION.value,)
#: How many training graphs the guard's check runs through the remedied model.
_CHECK_GRAPHS = 32


def _guard_applies(guard: OpGuard, target: Target) -> str | None:
    """An op guard applies when the failure names an op of its type, or an op of its type
    feeds the failing op in its layer (``producer_ops``), and the failing layer builds one:
    the remedied model runs one batch, and the guard must rewrite an op."""
    types = set(guard.op_types)
    if not types & {*target.failing_ops, *target.producer_ops}:
        named = ", ".join(target.failing_ops) or "no op"
        ops = " or ".join(guard.op_types)
        upstream = f", and no {ops} feeds it in its layer" if target.producer_ops else ""
        return f"the failure names {named}, not {ops}{upstream}"
    recipe = target.recipe()
    try:
        _batch_loss(recipe, target)
    except Exception as exc:  # the user's model: any error means the guard cannot apply
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"the guarded model fails on a batch: {type(exc).__name__}: {first}"
    if not recipe_sites(recipe):
        ops = " or ".join(guard.op_types)
        if guard.segmented:
            return f"the failing layer builds no {ops} op whose output feeds a segment reduction"
        return f"the failing layer builds no {ops} op"
    return None


def recipe_sites(recipe: Recipe) -> list[Site]:
    """Every op the guards on the recipe's model (any layer) and on its loss rewrote."""
    return [*model_sites(recipe.model), *loss_sites(recipe.loss)]


def _batch_loss(recipe: Recipe, target: Target) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The recipe's targets, predictions and loss on the check's batch (eagerly, as the
    trial's first step computes them), so that every guarded op is built once."""
    run, inputs, targets = _forward(recipe, target)
    out = run(inputs)
    predictions = loss_predictions(
        recipe.loss, out["predictions"] if isinstance(out, dict) else out
    )
    targets = tf.constant(targets, predictions.dtype)
    return targets, predictions, recipe.loss(targets, predictions)


def _forward(recipe: Recipe, target: Target) -> tuple[Callable[[Any], Any], Any, Any]:
    """The remedied model's forward pass, and the inputs and targets ``[num_graphs]`` of a
    batch of the first ``_CHECK_GRAPHS`` training graphs of the target's data, as the
    trial's first run feeds it."""
    data = target.data_after()[0]
    dtype = "float64" if target.after.dtype == "float64" else "float32"
    batch = batch_graphs(data.train[:_CHECK_GRAPHS], dtype=dtype)

    def run(inputs: Any) -> Any:
        # Looked up at each call: a guard or a tracer of the model's own ops replaces it on
        # the instance. In training mode, as the step computes it: a batch normalization
        # computes its batch's moments only then (Keras calls in inference mode by default).
        own = getattr(recipe.model, "forward", None)
        return own(inputs) if own is not None else recipe.model(inputs, training=True)

    return run, batch.as_inputs(), batch.targets


def failing_op_producers(target: Target, layer: str, ops: Sequence[str]) -> tuple[str, ...]:
    """The types of the ops that feed an op of ``ops`` inside ``layer`` (a path, or
    ``LOSS_SITE`` for the loss) of the target's variant, nearest first
    (``op_guard.producer_types``); none where the layer cannot be found or the model cannot
    be traced (the user's model: any error)."""
    recipe = target.recipe()
    try:
        targets, predictions, _ = _batch_loss(recipe, target)  # builds the weights, eagerly
        if layer == LOSS_SITE:
            return function_producer_types(recipe.loss, (targets, predictions), ops)
        run, inputs, _ = _forward(recipe, target)
        return producer_types(layer_at(recipe.model, layer), run, inputs, ops)
    except Exception:  # the user's model: a failure to trace is no producer, not an error
        return ()


def _same_call(model: keras.Layer, layer: keras.Layer) -> list[keras.Layer]:
    """``layer`` and every other layer of ``model`` whose class has the same ``call`` (its
    class, or a subclass that does not override it): the instances that run the line a
    guard's fix changes."""
    if layer is model:
        return [model]
    call = getattr(type(layer), "call", None)
    return [each for each in nested_layers(model) if getattr(type(each), "call", None) is call]


def _register_guard(guard: OpGuard) -> None:
    def change(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
        if layer == LOSS_SITE:  # a failure in the loss: the user's loss function is guarded
            return replace(recipe, loss=guard_loss(recipe.loss, guard))
        # The fix is a line of the layer's class, so the proof guards every instance of it:
        # the second of two attention layers meets the same 0 / 0 on other weights or data.
        for each in _same_call(recipe.model, _layer(recipe.model, layer)):
            guard_layer(each, guard)
        return recipe

    change.__name__ = change.__qualname__ = guard.name
    ops = " or ".join(guard.op_types)
    model_remedy(
        family=OP_GUARD,
        fix_class=guard.fix_class,
        label=f"the failing {ops} guarded: {guard.label}",
        description=(
            f"every {ops} op in the failing layer, and in the other layers that run its call, "
            f"computed as {guard.label}"
        ),
        code=guard.label.replace("X", "x").replace("Y", "y"),
        helps=dict.fromkeys(
            (*_OP_SYMPTOMS, *_SEGMENT_SYMPTOMS) if guard.segmented else _OP_SYMPTOMS, guard.why
        ),
        cannot=f"it rewrites {ops} ops only: a failure at another op is left as it was",
        takes_layer=True,
        applies=partial(_guard_applies, guard),
    )(change)


for _guard in GUARDS:
    _register_guard(_guard)
