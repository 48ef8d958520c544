"""The forward contract: what a model's forward pass hands the step guard.

A model may return more than its predictions: ``model.forward(inputs)`` returns a dict with
``predictions`` and, where it has attention, its ``logits``, ``alpha``, ``receivers``,
``attention_layers`` and ``softmax_shifted`` (docs/plugins.md, "The forward contract").
``forward`` fills in what a model leaves out, so the guard reads one shape of dict.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from stability.train.checks import as_columns, attention_ok


def forward(
    model: keras.Model, inputs: dict[str, tf.Tensor], training: bool = True
) -> dict[str, Any]:
    """``model.forward(inputs)`` if the model has it, else its predictions alone.

    ``training`` is passed on to ``forward`` if it takes it, and to ``model(inputs)``: the
    step trains with True, validation predicts with False, and a replay repeats the flag of
    what it replays. The result always has ``predictions``, ``logits``, ``alpha``,
    ``receivers``, ``attention_layers`` and ``softmax_shifted`` (lists may be empty; see
    docs/plugins.md, "The forward contract").
    """
    if hasattr(model, "forward"):
        takes_flag = "training" in inspect.signature(model.forward).parameters
        out = dict(
            model.forward(inputs, training=training) if takes_flag else model.forward(inputs)
        )
    else:
        out = {"predictions": model(inputs, training=training)}
    return completed(out)


def completed(out: dict[str, Any]) -> dict[str, Any]:
    """A forward pass's outputs with every key of the contract (lists may be empty)."""
    out = dict(out)
    alphas = list(out.get("alpha") or [])
    out["logits"] = list(out.get("logits") or [])
    out["alpha"] = alphas
    out["receivers"] = list(out.get("receivers") or [])
    names = list(out.get("attention_layers") or [])
    out["attention_layers"] = names + [f"attention_{k}" for k in range(len(names), len(alphas))]
    shifted = list(out.get("softmax_shifted") or [])
    out["softmax_shifted"] = shifted + [False] * (len(out["logits"]) - len(shifted))
    return out


def watched_tensors(out: dict[str, Any]) -> list[tf.Tensor]:
    """The forward tensors whose finiteness is checked: the float predictions (a model with
    several outputs may predict integers or leave some out), attention and logits."""
    predictions = [
        t
        for t in tf.nest.flatten(out.get("predictions"))
        if t is not None and tf.as_dtype(t.dtype).is_floating
    ]
    return [*predictions, *out["alpha"], *out["logits"]]


def num_nodes_of(inputs: Any) -> tf.Tensor | None:
    """``[]`` int32, the batch's node count, for inputs laid out as a ``GraphBatch``'s (a
    dict with ``nodes``); None for any other inputs (each receivers tensor then counts its
    nodes as its largest receiver plus one)."""
    if isinstance(inputs, dict) and "nodes" in inputs:
        return tf.shape(inputs["nodes"])[0]
    return None


def normalized(out: dict[str, Any], inputs: Any) -> tf.Tensor:
    """Scalar bool: the attention of a model that returns its receivers sums to 1 per node."""
    receivers = out["receivers"]
    if not receivers:
        return tf.constant(True)
    return attention_ok(out["alpha"][: len(receivers)], receivers, num_nodes_of(inputs))


def logit_stats(out: dict[str, Any], inputs: Any, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """``[3]`` in ``dtype`` (``stats_dtype``): max |attention logit|, the largest ``exp``
    argument and the smallest per-node max logit.

    The last two are signed: the first is the overflow side (``exp`` is inf above
    log(max)), the second the underflow side (a node whose every logit is below log(tiny)
    has ``exp`` 0 on all its edges). A shifted softmax's ``exp`` sees ``logit - max <= 0``,
    whose largest value at every node is exactly 0, so such a layer counts as 0 on both
    sides. Padding edges of a padded batch are left out. NaN where the model returns no
    logits, and NaN or inf (read as "none" on the host) where it returns no receivers or no
    node has an incoming edge, for the third.
    """
    logits, receivers, shifted = out["logits"], out["receivers"], out["softmax_shifted"]
    mask = inputs.get("edge_mask") if isinstance(inputs, dict) else None
    num_nodes = num_nodes_of(inputs)
    highs, lows = [], []
    for k, logit in enumerate(logits):
        if shifted[k]:
            highs.append(tf.constant(0.0, dtype))
            lows.append(tf.constant(0.0, dtype))
            continue
        logit = tf.cast(as_columns(logit), dtype)
        lowest = dtype.min
        if mask is not None:
            logit = tf.where(mask[:, None], logit, lowest)
        highs.append(tf.reduce_max(logit))
        if k < len(receivers):
            nodes = tf.reduce_max(receivers[k]) + 1 if num_nodes is None else num_nodes
            # A node without (real) incoming edges gets the dtype's lowest: left out below.
            node_max = tf.math.unsorted_segment_max(logit, receivers[k], nodes)
            # inf where no node has an incoming edge: the host reads it as "none".
            inf = tf.constant(math.inf, dtype)
            lows.append(tf.reduce_min(tf.where(node_max > lowest, node_max, inf)))
    return tf.stack(
        [
            max_abs(logits, dtype),
            _extreme(highs, tf.reduce_max, dtype),
            _extreme(lows, tf.reduce_min, dtype),
        ]
    )


def max_abs(tensors: list, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """max |x| over ``tensors``, in ``dtype``; NaN for none.

    One abs and one max over the tensors flattened into one vector, rather than a pair per
    tensor: the step's cost is mostly its number of small ops (the seed's model has 10
    weights), and this is the reduction the weights check reads (``finite_given``). A
    tensor that is already a vector (a bias, its Adam slots) is not reshaped: a reshape is
    an op like any other, and a max is the same whatever the grouping.
    """
    if not tensors:
        return tf.constant(math.nan, dtype)
    flat = [_vector(tf.cast(t, dtype)) for t in tensors]
    return tf.reduce_max(tf.abs(flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)))


def _vector(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` as a vector ``[n]``: itself when it is one (no op added), else reshaped."""
    return tensor if tensor.shape.rank == 1 else tf.reshape(tensor, [-1])


def stats_dtype(weights: list) -> tf.DType:
    """The dtype a step's statistics are kept in: float64 for a model with float64 weights
    (a float64 loss above 3.4e38 is finite, and float32 would round every figure), float32
    otherwise (a mixed policy's float16 figures fit in float32)."""
    wide = any(tf.as_dtype(w.dtype) == tf.float64 for w in weights)
    return tf.float64 if wide else tf.float32


def _extreme(values: list, reduce: Callable[..., tf.Tensor], dtype: tf.DType) -> tf.Tensor:
    """``reduce`` over scalar ``values``; NaN for none (a single one is used as it is)."""
    if not values:
        return tf.constant(math.nan, dtype)
    return values[0] if len(values) == 1 else reduce(tf.stack(values))
