"""The compiled training step and validation's forward pass, both watched by the step guard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from stability.core.graph_function import graph_function
from stability.model.losses import loss_predictions
from stability.model.recipe import Recipe
from stability.train import guard as step_guard
from stability.train.checks import all_finite
from stability.train.forward import forward, normalized, stats_dtype, watched_tensors
from stability.train.tape import differentiate


def input_signature(
    num_features: int, dtype: str, padded: bool = False
) -> tuple[dict[str, tf.TensorSpec], tf.TensorSpec]:
    """Specs of a ``GraphBatch``'s inputs and targets; every dimension that varies between
    batches is ``None``, so a compiled step is traced once per run, never per batch.
    ``padded`` adds the masks of a padded batch."""
    inputs = {
        "nodes": tf.TensorSpec([None, num_features], dtype),
        "edges": tf.TensorSpec([None, 1], dtype),
        "senders": tf.TensorSpec([None], tf.int32),
        "receivers": tf.TensorSpec([None], tf.int32),
        "node_graph": tf.TensorSpec([None], tf.int32),
        "num_graphs": tf.TensorSpec([], tf.int32),
    }
    if padded:
        inputs["edge_mask"] = tf.TensorSpec([None], tf.bool)
        inputs["graph_mask"] = tf.TensorSpec([None], tf.bool)
    return inputs, tf.TensorSpec([None], dtype)


def make_train_step(
    recipe: Recipe, signature: tuple[Any, Any], guard: bool, jit_compile: bool = False
) -> Callable[..., Any]:
    """A compiled step: forward, loss, gradients, transform, update, and the step guard.

    Returns one ``[14]`` tensor (``guard.report``; float64 for a float64 model), which
    ``guard.StepReport.of`` reads by name: one read back to the host per step, not two. With
    ``guard``, a step that fails any check before the update leaves the weights as they
    were, so the last good state survives for inspection.
    """
    model, optimizer, weights = recipe.model, recipe.optimizer, recipe.model.trainable_variables
    state = step_guard.optimizer_state(optimizer)
    dtype = stats_dtype(weights)

    @graph_function(input_signature=signature, reduce_retracing=True, jit_compile=jit_compile)
    def step(inputs: dict[str, tf.Tensor], targets: tf.Tensor) -> tf.Tensor:
        done = differentiate(
            lambda: forward(model, inputs, training=True),
            lambda out: step_loss(recipe, targets, out["predictions"], inputs),
            weights,
            recipe.gradient_transform,
        )
        transformed = done.gradients if recipe.gradient_transform is not None else None
        return step_guard.guarded_step(
            step_guard.Checked(done.out, inputs, done.loss, done.raw, transformed),
            lambda: apply_update(optimizer, done.gradients, weights),
            weights,
            state,
            exact=jit_compile,
            dtype=dtype,
            apply=None if guard else _always,
        )

    return step


def _always(healthy: tf.Tensor, update: Callable[[], Any]) -> None:
    """An unguarded step's update: applied whatever the checks found."""
    update()


def step_loss(
    recipe: Recipe, targets: Any, predictions: tf.Tensor, inputs: dict | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """The step's reported loss (the variant's loss over the real graphs of padded
    ``inputs``) and its optimized loss, which adds the model's regularization losses (the
    weight_constrained variant's l2); the reported loss stays the seed's robust loss."""
    loss = recipe.loss(targets, loss_predictions(recipe.loss, predictions))
    if inputs is not None:
        loss = real_mean(loss, inputs)
    total = loss + tf.add_n(recipe.model.losses) if recipe.model.losses else loss
    return loss, total


def total_loss(
    recipe: Recipe, targets: Any, predictions: tf.Tensor, inputs: dict | None = None
) -> tf.Tensor:
    """The optimized loss of ``step_loss``, for a replay."""
    return step_loss(recipe, targets, predictions, inputs)[1]


def real_mean(loss: tf.Tensor, inputs: dict[str, tf.Tensor]) -> tf.Tensor:
    """A batch-mean ``loss`` as the mean over the real graphs of a padded batch.

    The loss is a mean over all graphs, and a padding graph's term is exactly 0 (see
    ``GraphNetwork.forward``), so scaling by all graphs over the real ones gives the real
    graphs' mean. A batch without padding is returned as it is.
    """
    if "graph_mask" not in inputs:
        return loss
    mask = tf.cast(inputs["graph_mask"], loss.dtype)
    return loss * (tf.cast(tf.size(mask), loss.dtype) / tf.reduce_sum(mask))


def apply_update(optimizer: keras.optimizers.Optimizer, gradients: list, weights: list) -> None:
    """``optimizer.apply(gradients, weights)`` in a traced step, without leaking the step.

    In a replica context Keras' TensorFlow optimizer first all-reduces the gradients, and
    TensorFlow wraps that all-reduce in a graph-mode ``tf.custom_gradient``, which registers
    its gradient function in TensorFlow's global gradient registry for good
    (tensorflow/tensorflow#27492, #97697). That function holds the traced step's tensors, so
    every run's step graph stayed alive after ``clear_session()``: about 5.7 MB a run, and
    runs got slower as the heap grew. Inside ``merge_call`` there is no replica context, so
    Keras skips the all-reduce: under the default strategy it is a sum over one replica, and
    the update is the same to the bit.
    """
    context = tf.distribute.get_replica_context()
    if tf.distribute.has_strategy() or context is None:
        # A real strategy's all-reduce sums its replicas' gradients and must stay; in a
        # cross-replica context Keras does not all-reduce anyway.
        optimizer.apply(gradients, weights)
    else:
        context.merge_call(lambda _strategy: optimizer.apply(gradients, weights))


def fed(function: Any, signature: tuple[Any, ...]) -> Callable[..., Any]:
    """``function`` (a ``tf.function`` with the input ``signature``) called through its one
    concrete function, each argument converted to its spec's dtype first: the same graph,
    the same arithmetic, without ``tf.function``'s per-call binding of NumPy inputs to the
    signature (a type lookup and a cast per input, each call: its share of a step is
    measured in reports/bench.md, "The step called through its concrete function")."""
    concrete = function.get_concrete_function()

    def call(*args: Any) -> Any:
        return concrete(*tf.nest.map_structure(_tensor, signature[: len(args)], args))

    return call


def _tensor(spec: tf.TensorSpec, value: Any) -> tf.Tensor:
    return tf.convert_to_tensor(value, dtype=spec.dtype)


def make_predict(model: keras.Model, signature: tuple[Any, Any]) -> Callable[..., tf.Tensor]:
    """Validation's compiled forward pass (``training=False``): predictions and ``[1]`` bool,
    whether the forward tensors are finite and the attention is normalized."""

    @graph_function(input_signature=signature[:1], reduce_retracing=True)
    def predict(inputs: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        out = forward(model, inputs, training=False)
        healthy = all_finite(watched_tensors(out)) & normalized(out, inputs)
        return out["predictions"], healthy

    return predict
