"""One step's differentiation, written once: the forward pass and loss under a tape, the
raw gradients, and the variant's gradient transform, for the step and for every replay."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

#: Name scope around the gradient transform, in the step and in a replay: its ops are
#: reported at stage ``gradient``, with the transform named.
TRANSFORM_SCOPE = "stability_gradient_transform"

#: A gradient transform: the variant's function from raw gradients to the optimizer's.
Transform = Callable[[list[tf.Tensor]], list[tf.Tensor]]


@dataclass(frozen=True)
class Differentiated:
    """A step up to its update: what ``predict`` returned, the reported ``loss``, the raw
    gradients (one per weight, None where a weight gets none) and the transformed ones
    (the raw ones themselves without a transform)."""

    out: Any
    loss: tf.Tensor
    raw: list
    gradients: list


def differentiate(
    predict: Callable[[], Any],
    loss_of: Callable[[Any], tuple[tf.Tensor, tf.Tensor]],
    weights: list,
    transform: Transform | None = None,
    loss_scope: str | None = None,
) -> Differentiated:
    """Run ``predict()`` and ``loss_of(out)`` (the reported loss and the optimized one,
    which adds the model's regularization losses) under a tape, differentiate the optimized
    loss with respect to ``weights`` and apply ``transform`` inside ``TRANSFORM_SCOPE``.

    ``loss_scope`` puts the loss's ops in a name scope, so a replay reports them as the loss.
    """
    scope = tf.name_scope(loss_scope) if loss_scope else contextlib.nullcontext()
    with tf.GradientTape() as tape:
        out = predict()
        with scope:
            loss, total = loss_of(out)
    raw = tape.gradient(total, weights)
    gradients = transformed(transform, raw) if transform is not None else raw
    return Differentiated(out, loss, raw, gradients)


def transformed(gradient_transform: Transform, gradients: list) -> list[tf.Tensor]:
    """``gradient_transform(gradients)`` inside ``TRANSFORM_SCOPE``, so its ops are named."""
    with tf.name_scope(TRANSFORM_SCOPE):
        return gradient_transform(gradients)


def transform_name(gradient_transform: Any) -> str:
    """A gradient transform's name for a report: its function's name (through partials)."""
    fn = getattr(gradient_transform, "func", gradient_transform)
    return getattr(fn, "__qualname__", None) or type(fn).__name__
