"""The probe: a variant's model built and checked on a real batch before its step is made.

A ``keras.Model`` subclass creates its weights on its first call. The compiled step reads
``model.trainable_variables`` when it is made, so a model that was never called trained
nothing at all: zero gradients, a validation MAE that never moved, and a report that ranked
it the best variant. The probe calls every model once, eagerly, on the first graphs of the
training set, which builds it from the data set's own shapes, then checks what the trainer
relies on: predictions ``[num_graphs, k]`` of a float dtype, a loss that takes them and gives
a scalar, weights of the run's dtype, and at least one weight that the loss reaches. A model
that fails a check is refused with one line (``ModelError``), before any run trains.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from stability.core.errors import ModelError
from stability.data import Dataset
from stability.data.graphs import batch_graphs
from stability.model.losses import loss_predictions, prediction_need
from stability.model.recipe import Recipe
from stability.train.config import storage_dtype
from stability.train.forward import forward

#: How many training graphs the probe's batch holds: enough for several graphs per batch
#: (a pooling over graphs is exercised), few enough to cost milliseconds.
PROBE_GRAPHS = 4


def probe(recipe: Recipe, dataset: Dataset, dtype: str) -> None:
    """Build ``recipe.model`` by calling it once on a batch of ``dataset``'s first
    training graphs, and check it can train there; raise ``ModelError`` where it cannot."""
    storage = storage_dtype(dtype)
    graphs = dataset.train[:PROBE_GRAPHS]
    targets = np.array([g.target for g in graphs], dtype=np.float64)
    batch = batch_graphs(
        graphs, targets=(targets - dataset.target_mean) / dataset.target_std, dtype=storage
    )
    inputs = {name: tf.constant(value) for name, value in batch.as_inputs().items()}
    model = recipe.model
    with tf.GradientTape() as tape:
        try:
            with _quiet_autobuild():
                predictions = forward(model, inputs, training=False)["predictions"]
        except Exception as exc:  # the user's model code: any error is a bad model
            raise ModelError(
                f"its model fails on a batch of {batch.num_graphs} graphs "
                f"({batch.num_nodes} nodes, {batch.num_edges} edges): {_first_line(exc)}"
            ) from exc
        _check_predictions(predictions, batch.num_graphs, recipe.loss)
        loss = _loss_of(recipe, batch.targets, predictions)
    weights = model.trainable_variables
    if not weights:
        raise ModelError(
            f"its model {type(model).__name__} has no trainable weights after a call on a "
            "batch: it would train nothing"
        )
    _check_weight_dtype(weights, dtype)
    gradients = tape.gradient(loss, weights)
    if all(g is None for g in gradients):
        raise ModelError(
            f"no weight of its model {type(model).__name__} gets a gradient from the loss: "
            "it would train nothing (are the predictions computed from the weights?)"
        )


@contextlib.contextmanager
def _quiet_autobuild() -> Iterator[None]:
    """Keras warns, on the first call of a subclassed model without ``build()``, that it
    "looks like it has unbuilt state" and advises calling it eagerly on test input first:
    that call is this one, which builds it, so the advice is noise here."""
    with warnings.catch_warnings():
        for text in _AUTOBUILD_WARNINGS:
            warnings.filterwarnings("ignore", message=text, category=UserWarning)
        yield


#: The starts of Keras' warnings about a layer built by its first call (layer.py).
_AUTOBUILD_WARNINGS = (r"`build\(\)` was called on layer", r"Layer '.*' looks like it has unbuilt")


def _check_predictions(predictions: Any, num_graphs: int, loss: Any) -> None:
    """Predictions are one float tensor ``[num_graphs, k]``, the shape the loss needs:
    the trainer reads column 0 as the prediction in validation."""
    if not isinstance(predictions, tf.Tensor | tf.Variable | np.ndarray):
        raise ModelError(
            f"its model returns {type(predictions).__name__}, not one tensor of predictions "
            f"[num_graphs, k]"
        )
    shape, kind = list(predictions.shape), tf.as_dtype(predictions.dtype)
    need = prediction_need(loss)
    wanted = f"[num_graphs, {need[0]}]: {need[1]}" if need else "[num_graphs, k]"
    if not kind.is_floating:
        raise ModelError(f"its model returns {kind.name} predictions; they must be float")
    width_ok = len(shape) == 2 and (need is None or shape[1] == need[0])
    if not width_ok or shape[0] != num_graphs:
        raise ModelError(
            f"its model returns predictions of shape {shape} for a batch of {num_graphs} "
            f"graphs; the loss {_name(loss)} needs {wanted}"
        )


def _loss_of(recipe: Recipe, targets: np.ndarray, predictions: tf.Tensor) -> tf.Tensor:
    """The recipe's loss on the probe's batch: a scalar, or ``ModelError``."""
    shape = list(predictions.shape)
    try:
        predictions = loss_predictions(recipe.loss, predictions)
        loss = recipe.loss(tf.constant(targets, predictions.dtype), predictions)
    except Exception as exc:  # the user's loss code: any error is a bad recipe
        raise ModelError(
            f"the loss {_name(recipe.loss)} fails on predictions of shape {shape}: "
            f"{_first_line(exc)}"
        ) from exc
    if list(getattr(loss, "shape", [None])) != []:
        raise ModelError(
            f"the loss {_name(recipe.loss)} returns shape {list(loss.shape)}, not a scalar: "
            "reduce it over the graphs (e.g. tf.reduce_mean)"
        )
    return loss


def _check_weight_dtype(weights: list, dtype: str) -> None:
    """The weights are of the run's dtype (float32 under a mixed policy): a float32 model in
    a float64 case would train in float32 while its rows say float64."""
    wanted = storage_dtype(dtype)
    other = [w for w in weights if tf.as_dtype(w.dtype).name != wanted]
    if other:
        raise ModelError(
            f"its weight {other[0].path} is {tf.as_dtype(other[0].dtype).name} in a {dtype} "
            f"case: build its layers with dtype=ctx.dtype (or leave the dtype to Keras' "
            f"policy, which the trainer sets to {dtype} while the variant builds)"
        )


def _name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _first_line(exc: BaseException) -> str:
    """``exc`` in one line: its type and its first line of substance. Keras wraps an error
    raised in ``call`` as "Exception encountered when calling X.call()." with the cause a
    paragraph below, in terminal colours; that wrapper line says nothing, so it is skipped,
    and so is the traceback a traced function's error starts with ("in user code:")."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).splitlines()]
    wrapped = [i for i, line in enumerate(lines) if line.startswith(_KERAS_WRAPPER)]
    if wrapped:  # the cause follows Keras' wrapper line; the traceback before it is noise
        lines = lines[wrapped[-1] + 1 :]
    lines = [line for line in lines if line and line != "in user code:"]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def error_line(exc: BaseException) -> str:
    """``exc`` in one line, as the probe reports an error in a user's model."""
    return _first_line(exc)


#: The line Keras puts before an error raised inside a layer's ``call``.
_KERAS_WRAPPER = "Exception encountered when calling"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
