"""The doctor's model remedies: changes to a built variant's recipe, each under a name, so
that a variant with one applied is a variant too: ``raw_e+clip``, or with the layer a
remedy acts in, ``my_gat+kernel_constraint@edge_attention``.

Every remedy works on any Keras model and optimizer through public Keras APIs (an
optimizer rebuilt from its config, a weight's ``constraint`` and ``regularizer``), except
where it says which models it needs: the softmax and logit remedies act on layers that
name a registered softmax or logit transform (``use_softmax``, ``use_logit_transform``, as
the built-in ``AttentionMessagePassing`` does). A remedy that cannot act on a variant
raises ``RemedyError``; the doctor reports it as not applicable, with that reason.

Why each remedy can help which failure is the doctor's table (``stability.doctor.remedies``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import keras
import tensorflow as tf

from stability.compat.keras_layers import nested_layers
from stability.core.errors import RemedyError, StabilityError
from stability.core.registry import Registry
from stability.model.recipe import BuildContext, Recipe, Variant

#: What joins a variant's name and a remedy's in the name of the remedied variant.
REMEDY_MARK = "+"

#: What joins a remedy's name and the layer it acts in: ``kernel_constraint@message_passing_0``.
LAYER_MARK = "@"

#: The seed's clipping (its grad_clip variant): Adam's clipnorm, then the global norm and
#: the value of every gradient clipped in the gradient transform.
CLIPNORM, GLOBAL_NORM, CLIP_VALUE = 1.0, 1.0, 5.0
#: The larger Adam epsilon: 1e-4 is a normal float16 number (float16's smallest normal is
#: 6.1e-5), where Keras' default 1e-7 is not, and it bounds an update |m| / (sqrt(v) + eps)
#: on a weight whose second moment is ~0 to lr * |m| * 1e4 instead of lr * |m| * 1e7.
ADAM_EPSILON = 1e-4
#: The seed's accepted fix (its weight_constrained variant) on every kernel it constrains.
MIN_NORM, MAX_NORM, L2 = 1e-30, 1.0, 1e-6

Change = Callable[[Recipe, BuildContext, str | None], Recipe]


def clip_gradients(gradients: list[tf.Tensor], global_norm: float, value: float) -> list[tf.Tensor]:
    """The gradients clipped to a global norm, then each to [-value, value] (the seed's)."""
    clipped, _ = tf.clip_by_global_norm(gradients, global_norm)
    return [tf.clip_by_value(g, -value, value) for g in clipped]


@dataclass(frozen=True)
class ModelRemedy:
    """One change to a built recipe. ``apply(recipe, ctx, layer)`` returns the changed recipe
    (``layer``: the layer path after ``@``, or None); ``code`` is the change in a user's own
    code it stands for, for the doctor's report."""

    name: str
    description: str
    apply: Change
    code: str
    takes_layer: bool = False


_remedies: Registry[ModelRemedy] = Registry("model remedy")


def model_remedy(description: str, code: str, takes_layer: bool = False):
    """Decorator: register a change of a built recipe as the model remedy of its name."""

    def decorate(fn: Change) -> Change:
        remedy = ModelRemedy(fn.__name__, description, fn, code, takes_layer)
        _remedies.add(fn.__name__, remedy, owner=fn)
        return fn

    return decorate


def get_model_remedy(name: str) -> ModelRemedy:
    return _remedies.get(name)


def list_model_remedies() -> list[str]:
    return _remedies.names()


def remedied_name(variant: str, remedy: str, layer: str | None = None) -> str:
    """``raw_e+clip``, or ``raw_e+kernel_constraint@message_passing_0`` with a layer."""
    suffix = f"{LAYER_MARK}{layer}" if layer else ""
    return f"{variant}{REMEDY_MARK}{remedy}{suffix}"


def remedied_variant(name: str, lookup: Callable[[str], Variant]) -> Variant:
    """The variant ``base+remedy[@layer]``: ``base`` (found by ``lookup``, the registry's)
    built as registered, then the remedy applied once its model is built
    (``Variant.adjust``)."""
    base_name, _, spec = name.partition(REMEDY_MARK)
    remedy_name, _, layer = spec.partition(LAYER_MARK)
    if not base_name or not remedy_name or REMEDY_MARK in spec:
        raise StabilityError(
            f"variant {name!r}: a remedied variant is VARIANT{REMEDY_MARK}REMEDY, one remedy, "
            f"of: {', '.join(list_model_remedies())}"
        )
    base = lookup(base_name)
    remedy = get_model_remedy(remedy_name)
    if layer and not remedy.takes_layer:
        raise StabilityError(f"variant {name!r}: remedy {remedy_name!r} takes no {LAYER_MARK}layer")

    def adjust(recipe: Recipe, ctx: BuildContext) -> Recipe:
        changed = base.adjust(recipe, ctx) if base.adjust is not None else recipe
        return remedy.apply(changed, ctx, layer or None)

    description = f"{base.description}; doctor's remedy: {remedy.description}"
    return Variant(name, description, base.build, adjust)


def rebuilt_optimizer(optimizer: keras.optimizers.Optimizer, **changes: Any):
    """A new optimizer of ``optimizer``'s class from its config with ``changes``: the one
    public way to change a built Keras optimizer's clipping or epsilon."""
    config = {**optimizer.get_config(), **changes}
    return type(optimizer).from_config(config)


@model_remedy(
    "the seed's gradient clipping: clipnorm 1, then global norm 1 and value 5",
    "keras.optimizers.Adam(learning_rate, clipnorm=1.0), and "
    "tf.clip_by_global_norm(gradients, 1.0) with tf.clip_by_value(g, -5, 5) before the update",
)
def clip(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    # Keras 3 takes one of clipnorm, clipvalue and global_clipnorm per optimizer, so the
    # optimizer keeps clipnorm and the rest of the seed's clipping runs in the transform.
    optimizer = rebuilt_optimizer(
        recipe.optimizer, clipnorm=CLIPNORM, clipvalue=None, global_clipnorm=None
    )
    seed_clip = partial(clip_gradients, global_norm=GLOBAL_NORM, value=CLIP_VALUE)
    before = recipe.gradient_transform
    transform = seed_clip if before is None else _then(before, seed_clip)
    return replace(recipe, optimizer=optimizer, gradient_transform=transform)


def _then(first: Callable, second: Callable) -> Callable:
    def both(gradients: list) -> list:
        return second(first(gradients))

    both.__qualname__ = f"{getattr(first, '__qualname__', 'transform')}+clip"
    return both


@model_remedy(
    f"Adam's epsilon raised to {ADAM_EPSILON:g}",
    f"keras.optimizers.Adam(learning_rate, epsilon={ADAM_EPSILON:g})",
)
def adam_epsilon(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    config = recipe.optimizer.get_config()
    if "epsilon" not in config:
        raise RemedyError(f"the optimizer {type(recipe.optimizer).__name__} has no epsilon")
    if config["epsilon"] >= ADAM_EPSILON:
        raise RemedyError(f"the optimizer's epsilon is already {config['epsilon']:g}")
    return replace(recipe, optimizer=rebuilt_optimizer(recipe.optimizer, epsilon=ADAM_EPSILON))


@model_remedy(
    f"MinMaxNorm({MIN_NORM:g}, {MAX_NORM:g}) and l2({L2:g}) on the kernels of the Dense "
    "layers inside the failing layer (the seed's accepted fix)",
    "keras.layers.Dense(..., kernel_constraint=keras.constraints.MinMaxNorm(1e-30, 1.0), "
    "kernel_regularizer=keras.regularizers.L2(1e-6))",
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
        found.kernel.constraint = keras.constraints.MinMaxNorm(MIN_NORM, MAX_NORM)
        found.kernel.regularizer = keras.regularizers.L2(L2)
    return recipe


def dense_layers_in(model: keras.Layer, path: str | None) -> list[keras.layers.Dense]:
    """The ``Dense`` layers inside the layer at ``path`` (``message_passing_0`` or
    ``edge_attention/dense_1``, names as a failure names them), or in the whole model for
    None; the layer itself when it is a ``Dense``."""
    scope: keras.Layer = model
    for part in path.split("/") if path else []:
        inside = [layer for layer in nested_layers(scope) if layer.name == part]
        if not inside:
            if part == model.name and scope is model:  # the model's own call
                continue
            raise RemedyError(f"the model has no layer {path!r}")
        scope = inside[0]
    candidates = [scope, *nested_layers(scope)]
    return [layer for layer in candidates if isinstance(layer, keras.layers.Dense)]


def _switch(model: keras.Layer, method: str, name: str, attribute: str) -> int:
    """Call ``method(name)`` on every layer that has it and uses another; how many did."""
    switched = 0
    for layer in [model, *nested_layers(model)]:
        if callable(getattr(layer, method, None)) and getattr(layer, attribute, None) != name:
            getattr(layer, method)(name)
            switched += 1
    return switched


@model_remedy(
    "the softmax that subtracts each node's largest logit before exp",
    "alpha = exp(a - max_i a) / sum exp(a - max_i a): "
    "a - tf.gather(tf.math.unsorted_segment_max(a, receivers, num_nodes), receivers)",
)
def stable_softmax(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    if not _switch(recipe.model, "use_softmax", "stable", "softmax"):
        raise RemedyError(
            "no layer of the model uses a registered softmax other than 'stable' "
            "(a layer takes one through use_softmax)"
        )
    return recipe


@model_remedy(
    "every attention logit bounded as 5 tanh(logit / 5) before the softmax",
    "a = 5.0 * tf.tanh(a / 5.0) before exp",
)
def tanh_cap(recipe: Recipe, ctx: BuildContext, layer: str | None) -> Recipe:
    if not _switch(recipe.model, "use_logit_transform", "tanh_cap", "logit_transform"):
        raise RemedyError(
            "no layer of the model applies a registered logit transform "
            "(a layer takes one through use_logit_transform)"
        )
    return recipe
