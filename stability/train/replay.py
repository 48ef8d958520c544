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

_NODE = re.compile(r"Detected at node (\S+?)/CheckNumerics\w*")
_OP = re.compile(r'of (?:graph )?op "(\w+)"')


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
) -> NanSite | None:
    """Re-run forward, loss and gradients of one step with every op checked.

    ``compute_loss(predictions)`` returns the scalar loss; ``inputs`` go to ``model``'s
    ``forward`` (if it has one) or ``__call__``. Returns the first non-finite site, or None
    if the replay stayed finite (then the update itself made the weights non-finite).
    """
    weights = model.trainable_variables

    def step(batch: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            predictions = _predict(model, batch)
            with tf.name_scope(LOSS_SCOPE):
                loss = compute_loss(predictions)
        gradients = tape.gradient(loss, weights)
        if gradient_transform is not None:
            gradients = gradient_transform(gradients)
        return loss, gradients

    tf.debugging.enable_check_numerics()
    try:
        tf.function(step, jit_compile=False)(inputs)
    except tf.errors.InvalidArgumentError as error:
        return site_from_error(str(error), layer_names(model))
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

    def finite_gradients(batch: Any) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = compute_loss(_predict(model, batch))
        raw = tape.gradient(loss, weights)
        final = gradient_transform(raw) if gradient_transform is not None else raw
        return (
            tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in raw]),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in final]),
        )

    raw_finite, final_finite = tf.function(finite_gradients, jit_compile=True)(inputs)
    bad = [w.path for w, ok in zip(weights, raw_finite.numpy(), strict=True) if not ok]
    if bad:
        return NanSite("gradient", bad[-1].rsplit("/", 1)[0], XLA_ONLY)
    return None if final_finite.numpy() else NanSite("gradient", None, XLA_ONLY)


def _predict(model: keras.Model, batch: Any) -> tf.Tensor:
    if hasattr(model, "forward"):
        return model.forward(batch)["predictions"]
    return model(batch, training=True)


def site_from_error(message: str, known_layers: set[str]) -> NanSite:
    """Read a ``check_numerics`` error: the failing node's scope and op type."""
    node = _NODE.search(message)
    op = _OP.search(message)
    scope = node.group(1).split("/") if node else []
    where = "forward"
    if scope and scope[0] == "gradient_tape":
        where, scope = "gradient", scope[1:]
    elif LOSS_SCOPE in (_strip_suffix(part, {LOSS_SCOPE}) for part in scope):
        where = "loss"
    layers = [_strip_suffix(part, known_layers) for part in scope[:-1]]
    layers = [part for part in layers if part in known_layers]
    op_text = f"{op.group(1)} ({scope[-1]})" if op and scope else (op.group(1) if op else None)
    return NanSite(where=where, layer="/".join(layers) or None, op=op_text)


def _strip_suffix(part: str, known: set[str]) -> str:
    """``message_passing_0_1`` -> ``message_passing_0``: TensorFlow uniquifies a name scope
    that is entered again in the same graph by appending ``_<n>``."""
    if part in known:
        return part
    base, _, number = part.rpartition("_")
    return base if number.isdigit() and base in known else part
