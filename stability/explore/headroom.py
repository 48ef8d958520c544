"""How far a run came from its dtype's limits, and which way the edge distances push it.

The hunt (``stability.explore.hunt``) climbs towards a failure on the harness's own
statistics. Every epoch's history row records how close the run came to each limit a float
can break at:

- ``exp overflow``: the largest argument of a naive softmax's ``exp`` against log(max)
  (88.72 in float32), where ``exp`` is inf and the softmax ``inf / inf``;
- ``exp underflow``: the smallest per-node max logit against log(tiny) (-87.34), below
  which every ``exp`` into that node flushes to 0 and the softmax is ``0 / 0``;
- ``gradient square``: the largest |raw gradient| against sqrt(max) (1.8e19), where Adam's
  ``g * g`` overflows;
- ``logit``: the largest |attention logit| against max itself (3.4e38);
- ``loss exp``: the seed's loss takes ``exp(-log sigma)`` of the head's second output, so
  the largest ``-log sigma`` against log(max). The history does not record it: it is read
  off the model before training (large distances break a run at its first step, through
  the predictions their messages sum to) and after it.

A **margin** puts them on one scale: the natural log of the factor by which the quantity
must still grow to reach its line (0: at the line; 0.69: half-way in ratio). The smallest
margin over the run's epochs and limits names the limit that binds, and ``direction`` is
the gradient, with respect to each edge's log distance, of a smooth version of that limit's
quantity under the trained model: the way the data moves the run towards the line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from stability.core.failures import Cause
from stability.core.limits import exp_limits
from stability.core.results import EpochRecord, RunResult
from stability.data.graphs import Graph, batch_graphs
from stability.model.recipe import Recipe
from stability.train.config import storage_dtype
from stability.train.forward import forward

#: The limits a margin is measured against, in the order ties are broken.
LIMITS = ("exp underflow", "exp overflow", "gradient square", "logit", "loss exp")
#: The limits a model's forward pass shows (the history holds the others' values too).
FORWARD_LIMITS = ("exp underflow", "exp overflow", "logit", "loss exp")

#: The limit each failure cause means the run crossed (``stability.core.failures.Cause``).
LIMIT_OF_CAUSE = {
    Cause.FORWARD_UNDERFLOW.value: "exp underflow",
    Cause.FORWARD_OVERFLOW.value: "exp overflow",
    Cause.GRADIENT_EXPLOSION.value: "gradient square",
    Cause.OPTIMIZER.value: "gradient square",
    Cause.LOSS.value: "loss exp",
}


@dataclass(frozen=True)
class Margin:
    """The limit a run came closest to, the margin left (e-folds), and the epoch of it."""

    limit: str
    margin: float
    epoch: int | None

    def describe(self) -> str:
        if not math.isfinite(self.margin):
            return "no limit approached"
        where = f" at epoch {self.epoch}" if self.epoch is not None else ""
        return f"{self.limit}: margin {self.margin:.3g} e-folds{where}"


def record_margins(record: EpochRecord, dtype: str) -> dict[str, float]:
    """Each limit's margin in one epoch (inf where the epoch has no such value)."""
    lines = exp_limits(dtype)
    largest = float(np.finfo(np.dtype(storage_dtype(dtype).removeprefix("mixed_"))).max)
    values = {
        "exp underflow": (-record.min_node_max_logit, lines.underflow),
        "exp overflow": (record.max_exp_arg, lines.overflow),
        "gradient square": (record.max_abs_grad, math.sqrt(largest)),
        "logit": (record.max_abs_logit, largest),
    }
    return {limit: _log_factor(*values[limit]) for limit in values}


def _log_factor(value: float, line: float) -> float:
    if not math.isfinite(value) or value <= 0.0:
        return math.inf
    return max(0.0, math.log(line / value))


def history_margins(result: RunResult) -> dict[str, Margin]:
    """Each limit's smallest margin over the run's epochs, with the epoch it came at."""
    margins: dict[str, Margin] = {}
    for record in result.history:
        for limit, margin in record_margins(record, result.dtype).items():
            if limit not in margins or margin < margins[limit].margin:
                margins[limit] = Margin(limit, margin, record.epoch)
    return margins


def run_margin(result: RunResult) -> Margin:
    """The smallest margin over the run's epochs; a failed run's cause names its limit."""
    margins = history_margins(result)
    best = min(margins.values(), key=lambda m: m.margin, default=Margin(LIMITS[0], math.inf, None))
    crossed = LIMIT_OF_CAUSE.get(result.failure_cause or "")
    if result.hit_nan:
        return Margin(crossed or best.limit, 0.0, result.first_nan_epoch)
    return best


def model_margins(recipe: Recipe, graphs: Sequence[Graph], dtype: str) -> dict[str, float]:
    """Each forward limit's margin under the recipe's model as it is now, on ``graphs``."""
    batch = batch_graphs(list(graphs), dtype=storage_dtype(dtype))
    out = forward(recipe.model, batch.as_inputs(), training=False)
    lines = exp_limits(dtype)
    largest = float(np.finfo(np.dtype(storage_dtype(dtype))).max)
    lines_of = {
        "exp underflow": lines.underflow,
        "exp overflow": lines.overflow,
        "logit": largest,
        "loss exp": lines.overflow,
    }
    inputs = {k: tf.constant(v) for k, v in batch.as_inputs().items()}
    margins = {}
    for limit, line in lines_of.items():
        values = _site_values(out, inputs, limit)
        top = float(tf.reduce_max(values).numpy()) if values is not None else math.nan
        margins[limit] = _log_factor(top, line)
    return margins


def direction(
    recipe: Recipe,
    graphs: Sequence[Graph],
    limit: str,
    dtype: str,
    target_scale: tuple[float, float],
    lookahead: bool = True,
) -> np.ndarray:
    """``[num_edges_total]``: d(objective)/d(log e) over every edge of ``graphs``
    (concatenated in order) under the recipe's model as it is now; zeros where the limit
    does not depend on the distances. ``target_scale`` is the training set's (mean, std) of
    the target, which the trainer standardizes the targets with.

    The objective is the limit's quantity ``q`` (``_sites``) plus, with ``lookahead``, how
    fast training drives it: ``|w| * <dq/dw, -dL/dw> / |dL/dw|``, the first-order change of
    ``q`` when the weights move their own length down the loss gradient. The level alone
    only finds the sites already near the line; the rate finds data that makes training
    push them there (a close race between two neighbours sharpens the attention).
    """
    mean, std = target_scale
    scaled = (np.array([g.target for g in graphs]) - mean) / std
    batch = batch_graphs(list(graphs), targets=scaled, dtype=storage_dtype(dtype))
    inputs = {k: tf.constant(v) for k, v in batch.as_inputs().items()}
    targets = tf.constant(batch.targets)
    log_edges = tf.Variable(np.log(np.maximum(batch.edges, 1e-300)), dtype=inputs["edges"].dtype)
    weights = recipe.model.trainable_variables
    with tf.GradientTape() as outer:
        inputs["edges"] = tf.exp(log_edges)
        with tf.GradientTape(persistent=True) as inner:
            out = forward(recipe.model, inputs, training=False)
            loss = tf.reduce_mean(tf.cast(recipe.loss(targets, out["predictions"]), tf.float64))
            quantity = None if limit == "gradient square" else _sites(out, inputs, limit)
        loss_grads = inner.gradient(loss, weights)
        if limit == "gradient square":
            # log of the loss gradient's global norm: its size in e-folds, the margin's unit.
            quantity = 0.5 * tf.math.log(_dot(loss_grads, loss_grads))
        elif quantity is not None and lookahead and bool(tf.math.is_finite(loss)):
            # (A model at the edge of failing can give NaN on some graphs: its loss then has
            # no gradient to follow, and only the level, over the finite sites, is used.)
            quantity_grads = inner.gradient(quantity, weights)
            length = tf.sqrt(_dot([tf.stop_gradient(w) for w in weights], weights))
            rate = -_dot(quantity_grads, loss_grads) / tf.sqrt(_dot(loss_grads, loss_grads))
            quantity = quantity + length * rate
        del inner
    if quantity is None:
        return np.zeros(batch.edges.shape[0])
    grad = outer.gradient(quantity, log_edges)
    if grad is None:
        return np.zeros(batch.edges.shape[0])
    return np.nan_to_num(grad.numpy().reshape(-1).astype(np.float64), posinf=0.0, neginf=0.0)


def _dot(left: list, right: list) -> Any:
    """The sum over weights of ``<left_k, right_k>`` in float64 (None gradients count 0)."""
    terms = [
        tf.reduce_sum(tf.cast(a, tf.float64) * tf.cast(b, tf.float64))
        for a, b in zip(left, right, strict=True)
        if a is not None and b is not None
    ]
    return tf.add_n(terms) if terms else tf.constant(0.0, tf.float64)


def _sites(out: dict[str, Any], inputs: dict[str, Any], limit: str) -> Any:
    """A smooth scalar that grows as the forward pass nears ``limit``: a soft max over the
    sites of that limit; None where there are none."""
    values = _site_values(out, inputs, limit)
    return None if values is None else _soft_max(values)


def _site_values(out: dict[str, Any], inputs: dict[str, Any], limit: str) -> Any:
    """``[num_sites]`` float64, the value at each site of ``limit`` that grows towards its
    line: edges' logits, nodes' negated max logits (underflow), graphs' ``-log sigma``."""
    if limit == "loss exp":
        predictions = tf.cast(out["predictions"], tf.float64)
        if predictions.shape.rank != 2 or predictions.shape[-1] != 2:
            return None  # not the (mean, log sigma) head the seed's loss reads
        return -predictions[:, 1]
    logits = [tf.reshape(tf.cast(logit, tf.float64), [-1]) for logit in out["logits"]]
    if limit == "logit":
        return tf.concat([tf.abs(logit) for logit in logits], axis=0) if logits else None
    # A shifted softmax's exp never sees the raw logit: only naive layers count.
    naive = [k for k, shifted in enumerate(out["softmax_shifted"]) if not shifted]
    if limit == "exp overflow":
        return tf.concat([logits[k] for k in naive], axis=0) if naive else None
    lows = []
    num_nodes = tf.shape(inputs["nodes"])[0]
    for k in naive:
        if k >= len(out["receivers"]):
            continue
        node_max = tf.math.unsorted_segment_max(logits[k], out["receivers"][k], num_nodes)
        # Nodes without incoming edges hold the dtype's lowest value: leave them out.
        lows.append(-tf.boolean_mask(node_max, node_max > tf.float64.min / 2))
    return tf.concat(lows, axis=0) if lows else None


def _soft_max(values: Any) -> Any:
    """None for no sites, else a log-sum-exp at a temperature of the values' standard
    deviation (at least 1): the gradient goes to every site in proportion to how near the
    extreme it is, not to one site alone, so one move shifts every node nearly as close."""
    if values.shape[0] == 0:
        return None
    values = tf.boolean_mask(values, tf.math.is_finite(values))
    if values.shape[0] == 0:
        return None
    scale = tf.stop_gradient(tf.maximum(tf.constant(1.0, values.dtype), tf.math.reduce_std(values)))
    return scale * tf.reduce_logsumexp(values / scale)
