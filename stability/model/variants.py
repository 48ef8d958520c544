"""The registry of model variants: the seed's model, its fixes and its controls.

A variant is a named builder that turns a ``BuildContext`` (data statistics and case
settings) into a ``Recipe``: a model, an optimizer, a loss and an optional gradient
transform. Register your own from your own module::

    from stability import BuildContext, Recipe, register_variant
    from stability.model.variants import create_recipe

    @register_variant
    def my_fix(ctx: BuildContext) -> Recipe:
        \"\"\"raw e with a tanh-squashed attention logit\"\"\"
        ...

then run it with ``python -m stability run my_case.toml --plugin my_module``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import keras

from stability.core.errors import StabilityError
from stability.core.registry import Registry
from stability.model.losses import robust_loss
from stability.model.network import GraphNetwork
from stability.model.recipe import BuildContext, GradientTransform, Loss, Recipe, Variant
from stability.model.remedies import (
    CLIPNORM,
    SEED_CLIP,
    seed_kernel_constraint,
    seed_kernel_regularizer,
)
from stability.model.remedy import REMEDY_MARK, remedied_variant

__all__ = [  # Recipe and its kin are defined in stability.model.recipe and named here too
    "BuildContext",
    "GradientTransform",
    "Loss",
    "Recipe",
    "Variant",
    "create_recipe",
    "get_variant",
    "list_variants",
    "register_variant",
]

_variants: Registry[Variant] = Registry("variant")  # name -> Variant


def register_variant(
    fn: Callable[[BuildContext], Recipe] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Decorator: register ``fn`` as a variant named ``name`` (default: the function's name).

    The description defaults to the first line of ``fn``'s docstring.
    """

    def decorate(builder: Callable[[BuildContext], Recipe]) -> Callable[[BuildContext], Recipe]:
        key = name or builder.__name__
        if REMEDY_MARK in key:
            raise StabilityError(
                f"variant name {key!r}: {REMEDY_MARK!r} is reserved for remedied variants "
                "(raw_e+clip); choose a name without it"
            )
        text = description if description is not None else _first_line(builder.__doc__)
        _variants.add(key, Variant(key, text, builder), owner=builder)
        return builder

    return decorate(fn) if fn is not None else decorate


def get_variant(name: str) -> Variant:
    """The variant called ``name``; an unknown name raises ``NameNotFound`` with a suggestion.

    ``base+remedy`` names the registered variant ``base`` with one of the doctor's model
    remedies applied (``stability.model.remedies``): ``raw_e+clip``."""
    if REMEDY_MARK in name:
        return remedied_variant(name, _variants.get)
    return _variants.get(name)


def list_variants(filter: str | None = None) -> list[Variant]:
    """Registered variants in name order, optionally those whose name contains ``filter``."""
    return [_variants.get(k) for k in _variants.names(filter)]


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def create_recipe(
    ctx: BuildContext,
    *,
    edge_mode: str = "raw",
    softmax: str = "naive",
    net_kernel_constraint: Any = None,
    net_kernel_regularizer: Any = None,
    optimizer_options: dict[str, Any] | None = None,
    loss: Loss = robust_loss,
    gradient_transform: GradientTransform | None = None,
    logit_transform: str = "none",
) -> Recipe:
    """The seed's model and Adam with the given changes; every built-in variant calls this.

    Options and their allowed values (docs/plugins.md has the same table):

    - ``edge_mode``: how ``e`` enters ``z``: "raw", "sigmoid", "normalized", "relu", "none".
    - ``softmax``: "naive", "stable", or a name registered with ``register_softmax``.
    - ``logit_transform``: "none", or a name registered with ``register_logit_transform``.
    - ``net_kernel_constraint``, ``net_kernel_regularizer``: a Keras constraint/regularizer
      (object, name or config) for ``Net``'s kernel, or None.
    - ``optimizer_options``: keyword arguments for ``keras.optimizers.Adam`` (``clipnorm``...).
    - ``loss``: ``loss(targets [num_graphs], predictions [num_graphs, 2]) -> scalar``.
    - ``gradient_transform``: ``f(list of gradients) -> list of gradients``, or None.
    """
    model = GraphNetwork(
        ctx.num_features,
        hidden=ctx.hidden,
        num_layers=ctx.num_layers,
        edge_mode=edge_mode,
        edge_mean=ctx.edge_mean,
        edge_std=ctx.edge_std,
        softmax=softmax,
        net_kernel_constraint=net_kernel_constraint,
        net_kernel_regularizer=net_kernel_regularizer,
        logit_transform=logit_transform,
        dtype=ctx.dtype,
    )
    optimizer = keras.optimizers.Adam(ctx.learning_rate, **(optimizer_options or {}))
    return Recipe(model, optimizer, loss, gradient_transform)


@register_variant
def raw_e(ctx: BuildContext) -> Recipe:
    """the seed: concat raw e, naive softmax (expected to fail)"""
    return create_recipe(ctx)


@register_variant
def sigmoid_e(ctx: BuildContext) -> Recipe:
    """concat sigmoid(e) instead of e (the seed's first fix)"""
    return create_recipe(ctx, edge_mode="sigmoid")


@register_variant
def normalized_e(ctx: BuildContext) -> Recipe:
    """e standardized with the training set's mean and std"""
    return create_recipe(ctx, edge_mode="normalized")


@register_variant
def weight_constrained(ctx: BuildContext) -> Recipe:
    """Net kernel with MinMaxNorm(1e-30, 1.0) and l2(1e-6) (the seed's accepted fix)"""
    # The doctor's kernel_constraint remedy, on Net's kernel only (stability.model.remedies).
    return create_recipe(
        ctx,
        net_kernel_constraint=seed_kernel_constraint(),
        net_kernel_regularizer=seed_kernel_regularizer(),
    )


@register_variant
def stable_softmax(ctx: BuildContext) -> Recipe:
    """segment max subtracted before exp (the textbook fix)"""
    return create_recipe(ctx, softmax="stable")


@register_variant
def no_e(ctx: BuildContext) -> Recipe:
    """e left out of z (control; the seed says it avoids the NaN)"""
    return create_recipe(ctx, edge_mode="none")


@register_variant
def relu_e(ctx: BuildContext) -> Recipe:
    """concat relu(e) (control; the seed says it fails)"""
    return create_recipe(ctx, edge_mode="relu")


@register_variant
def grad_clip(ctx: BuildContext) -> Recipe:
    """Adam clipnorm=1, clipvalue=5, plus global-norm clipping 1.0 (control; seed: fails)"""
    # Keras 3 accepts only one of clipnorm/clipvalue on an optimizer, so Adam keeps clipnorm
    # and the clipvalue=5 of the seed's Adam runs in the gradient transform, after the
    # seed's tf.clip_by_global_norm(gradients, 1.0): the doctor's clip remedy, built in.
    return create_recipe(
        ctx, optimizer_options={"clipnorm": CLIPNORM}, gradient_transform=SEED_CLIP
    )


@register_variant
def sigma_clip(ctx: BuildContext) -> Recipe:
    """log sigma clipped to [-4, 1] in the loss (control; the seed says it fails)"""
    return create_recipe(ctx, loss=partial(robust_loss, log_sigma_clip=(-4.0, 1.0)))
