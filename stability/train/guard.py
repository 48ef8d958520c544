"""The step guard: one set of checks for every training step, in the trainer and in
``NanSentinel``.

A step is checked in causal order (``CHECKS``): the forward tensors are finite, the
attention weights are normalized, the loss is finite, the raw gradients are finite, the
gradients after the variant's transform are finite, and, after the update, the weights and
the optimizer's own variables are finite. The first check that fails is where the step's
failure came from; ``STAGE_OF`` maps it to the stage a report names (``forward``, ``loss``,
``gradient``, ``weights``). ``before_update`` runs the first five and decides whether the
update may be applied; ``after_update`` runs the last; ``report`` packs the flags and the
step's statistics (``STATS``) into one ``[14]`` float32 vector, one read back to the host per
step, which ``StepReport`` reads by name. The statistics are float64 for a float64 model
and float32 otherwise (``stats_dtype``), and a norm whose sum of squares overflows while
every element is finite is rescaled rather than recorded as inf (``unoverflowed_norm``).

The optimizer's variables are checked with the weights: Adam's second moment can overflow
to inf while every weight stays finite (``m / sqrt(inf) = 0``), and the weights go NaN a
step later (``inf - inf``). The raw gradients are checked before any transform or clipping,
so a transform that masks a non-finite gradient cannot hide it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.train.checks import all_finite, finite_given, finite_max
from stability.train.forward import logit_stats, max_abs, normalized, watched_tensors

#: The checks of a step, in causal order and in the order of ``StepReport.flags``.
CHECKS = ("forward", "attention", "loss", "gradient", "transform", "weights")

#: The checks ``before_update`` runs, the ones that decide whether the update may run.
BEFORE_UPDATE = CHECKS[:-1]

#: The stage each check reports: the attention invariant is a forward failure, a failure
#: the gradient transform introduces or hides is a gradient failure.
STAGE_OF = {"attention": "forward", "transform": "gradient"}

#: The stages a training step's failure can be reported at, in causal order.
STAGES = ("forward", "loss", "gradient", "weights")

#: The per-step statistics, in the order of ``StepReport.stats``. ``grad_norm`` is the
#: global norm of the gradients the optimizer gets (after the variant's transform);
#: ``raw_grad_norm`` and ``max_abs_grad`` are the backward pass's own.
STATS = (
    "loss",
    "max_abs_logit",
    "grad_norm",
    "max_abs_weight",
    "max_exp_arg",
    "min_node_max_logit",
    "raw_grad_norm",
    "max_abs_grad",
)

#: Length of a step's report vector: one flag per check, then the statistics.
REPORT_SIZE = len(CHECKS) + len(STATS)


@dataclass(frozen=True)
class Before:
    """What ``before_update`` found: ``flags`` ``[5]`` bool (``BEFORE_UPDATE``, stacked by
    name) and the statistics read before the update (scalars, in the statistics' dtype)."""

    flags: tf.Tensor
    loss: tf.Tensor
    logits: tf.Tensor  # [3]: max |logit|, largest exp argument, smallest per-node max logit
    grad_norm: tf.Tensor
    raw_grad_norm: tf.Tensor
    max_abs_grad: tf.Tensor

    @property
    def healthy(self) -> tf.Tensor:
        """Scalar bool: every check before the update passed, so it may be applied."""
        return tf.reduce_all(self.flags)


def before_update(
    out: dict[str, Any],
    inputs: Any,
    loss: tf.Tensor,
    raw: Sequence[tf.Tensor | None],
    gradients: Sequence[tf.Tensor | None] | None = None,
    exact: bool = False,
    dtype: tf.DType = tf.float32,
    skipped: tf.Tensor | None = None,
) -> Before:
    """Check a step up to its update.

    ``out`` is the forward pass's outputs (``forward.completed``), ``inputs`` the batch it
    was fed, ``loss`` the scalar reported loss, ``raw`` the backward pass's gradients and
    ``gradients`` the ones the optimizer gets after the variant's transform (None: no
    transform). ``exact`` (a step compiled with XLA, whose max drops NaN) checks every
    tensor one by one instead of reading finiteness off a max. The statistics are kept in
    ``dtype`` (``forward.stats_dtype``). ``skipped`` (a scalar bool, or None) is a step whose
    non-finite gradients the optimizer skips by design (a loss scale's overflow): its
    gradient checks pass, and its update is the optimizer's to skip.
    """
    raw = [g for g in raw if g is not None]
    # Norms the statistics report anyway double as the finiteness checks (see
    # checks.finite_given): a healthy step pays no separate pass over the gradients.
    raw_norm = tf.linalg.global_norm(raw) if raw else tf.constant(0.0, dtype)
    if gradients is not None:
        gradients = [g for g in gradients if g is not None]
        norm = tf.linalg.global_norm(gradients) if gradients else tf.constant(0.0, dtype)
        transform_ok = finite_given(norm, gradients)
        norm = unoverflowed_norm(norm, gradients)
    else:
        norm, transform_ok = None, None
    raw_max = max_abs(raw, dtype)
    raw_ok = finite_max(raw_max, raw, exact=exact) if raw else tf.constant(True)
    raw_norm = unoverflowed_norm(raw_norm, raw, raw_max)
    attention = normalized(out, inputs)
    logits = logit_stats(out, inputs, dtype)
    if skipped is not None:
        raw_ok = raw_ok | skipped
        transform_ok = None if transform_ok is None else transform_ok | skipped
    checks = {
        "forward": forward_finite(out, attention, logits[0], exact=exact),
        "attention": attention,
        "loss": tf.reduce_all(tf.math.is_finite(loss)),
        "gradient": raw_ok,
        "transform": raw_ok if transform_ok is None else transform_ok,
    }
    return Before(
        tf.stack([checks[name] for name in BEFORE_UPDATE]),
        tf.cast(loss, dtype),
        logits,
        tf.cast(raw_norm if norm is None else norm, dtype),
        tf.cast(raw_norm, dtype),
        raw_max,
    )


def unoverflowed_norm(
    norm: tf.Tensor, tensors: Sequence[tf.Tensor], largest: tf.Tensor | None = None
) -> tf.Tensor:
    """``norm`` (the global norm of ``tensors``), or, where its sum of squares overflowed
    while every element is finite, the norm rescaled by the largest |x|: gradients of 1e20
    are finite, the float32 sum of their squares is not (sqrt(max) is 1.84e19). The healthy
    path pays one ``is_finite``; a non-finite element keeps the norm non-finite.

    ``largest`` is their max |x| where the step has it already (``max_abs``; a max is exact
    whatever its grouping, so the value is the same): the branch not taken then holds only
    the rescaled norm, and a lowered ``tf.cond`` still walks every op of that branch.
    """

    def rescaled() -> tf.Tensor:
        top = largest
        if top is None:
            top = tf.reduce_max([tf.reduce_max(tf.abs(t)) for t in tensors])
        top = tf.cast(top, tensors[0].dtype)
        safe = tf.math.is_finite(top) & (top > 0)
        scale = tf.where(safe, top, tf.ones_like(top))
        return tf.where(safe, scale * tf.linalg.global_norm([t / scale for t in tensors]), norm)

    if not tensors:
        return norm
    return tf.cond(tf.math.is_finite(norm), lambda: norm, rescaled)


def forward_finite(
    out: dict[str, Any], attention: tf.Tensor, max_abs_logit: tf.Tensor, exact: bool = False
) -> tf.Tensor:
    """Scalar bool: predictions, attention weights and logits are all finite.

    The logits are read off their max |logit| (``finite_given``). Attention weights that
    sum to 1 at every node are finite (a NaN or inf weight makes its node's sum NaN or
    inf), so ``attention`` vouches for them, and their own ``is_finite`` decides only where
    it fails. That check runs on every step, as ``attention | all_finite(...)``: two small
    ops, fewer than the switches and merge a lowered ``tf.cond`` around it would add.
    Weights the model returns no receivers for are always checked one by one.
    """
    alphas, checked = out["alpha"], len(out["receivers"])
    predictions = watched_tensors({**out, "alpha": [], "logits": []})
    ok = all_finite([*predictions, *alphas[checked:]])
    # Under XLA (``exact``) a max drops NaN: the logits are then checked one by one.
    ok &= finite_max(max_abs_logit, out["logits"], exact=exact) if out["logits"] else True
    if checked:
        ok &= attention | all_finite(alphas[:checked])
    return ok


def guarded(healthy: tf.Tensor, update: Callable[[], Any]) -> None:
    """Run ``update`` only if ``healthy``: a step that failed a check before its update
    leaves the weights as they were, so the last good state survives for the replay."""

    def applied() -> tf.Operation:
        update()
        return tf.no_op()

    tf.cond(healthy, applied, tf.no_op)


def optimizer_state(optimizer: keras.optimizers.Optimizer) -> list:
    """The optimizer's float variables (its slots and learning rate; not its step count)."""
    return [v for v in optimizer.variables if tf.as_dtype(v.dtype).is_floating]


def after_update(
    weights: Sequence[tf.Variable],
    state: Sequence[tf.Variable],
    exact: bool = False,
    dtype: tf.DType = tf.float32,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Scalar bool, the weights and the optimizer's ``state`` (``optimizer_state``) are
    finite after the update, and the max |weight| (in ``dtype``)."""
    max_abs_weight = max_abs(list(weights), dtype)
    ok = finite_max(max_abs_weight, weights, exact=exact) if weights else tf.constant(True)
    if state:
        ok &= finite_max(max_abs(list(state), dtype), state, exact=exact)
    return ok, max_abs_weight


def report(before: Before, weights_ok: tf.Tensor, max_abs_weight: tf.Tensor) -> tf.Tensor:
    """``[14]`` in the statistics' dtype: the six flags (1 passed, 0 failed, in ``CHECKS``'
    order) then ``STATS``, each placed by its name."""
    dtype = before.loss.dtype
    flags = tf.cast(tf.concat([before.flags, [weights_ok]], axis=0), dtype)
    stats = {
        "loss": before.loss,
        "max_abs_logit": before.logits[0],
        "grad_norm": before.grad_norm,
        "max_abs_weight": max_abs_weight,
        "max_exp_arg": before.logits[1],
        "min_node_max_logit": before.logits[2],
        "raw_grad_norm": before.raw_grad_norm,
        "max_abs_grad": before.max_abs_grad,
    }
    return tf.concat([flags, tf.stack([tf.cast(stats[name], dtype) for name in STATS])], axis=0)


def guarded_step(
    checked: Checked,
    update: Callable[[], Any],
    weights: Sequence[tf.Variable],
    state: Sequence[tf.Variable],
    exact: bool = False,
    dtype: tf.DType = tf.float32,
    apply: Callable[[tf.Tensor, Callable[[], Any]], None] | None = None,
) -> tf.Tensor:
    """The guard's whole sequence, the one every watched step runs (the trainer's compiled
    step and ``NanSentinel``'s): the checks before the update, the update where they passed
    (``apply(healthy, update)``; by default ``guarded``, and a caller that must not hold the
    update back passes one that always runs it), the checks after it, and the report
    (``[14]``, see ``report``). ``checked`` is what the step computed (``Checked``).
    """
    before = before_update(
        checked.out,
        checked.inputs,
        checked.loss,
        checked.raw,
        checked.gradients,
        exact=exact,
        dtype=dtype,
        skipped=checked.skipped,
    )
    (guarded if apply is None else apply)(before.healthy, update)
    weights_ok, max_abs_weight = after_update(weights, state, exact=exact, dtype=dtype)
    return report(before, weights_ok, max_abs_weight)


@dataclass(frozen=True)
class Checked:
    """What a step computed that the guard checks before its update: the forward pass's
    outputs (``forward.completed``), the batch it was fed, the scalar reported loss, the
    backward pass's raw gradients and the ones the optimizer gets after a transform (None:
    no transform), and whether the optimizer skips the step by design (see
    ``before_update``)."""

    out: dict[str, Any]
    inputs: Any
    loss: tf.Tensor
    raw: Sequence[tf.Tensor | None]
    gradients: Sequence[tf.Tensor | None] | None = None
    skipped: tf.Tensor | None = None


def failed(vector: tf.Tensor) -> tf.Tensor:
    """Scalar bool, in a traced step: the report ``vector`` has a failed check."""
    return ~tf.reduce_all(vector[: len(CHECKS)] > 0.5)


@dataclass(frozen=True)
class StepReport:
    """A step's report read on the host: ``flags`` ``[6]`` bool (``CHECKS``) and ``stats``
    ``[8]`` float32 (``STATS``)."""

    flags: np.ndarray
    stats: np.ndarray

    @classmethod
    def of(cls, vector: Any) -> StepReport:
        """The report of a step's output vector (a tensor or array ``[14]``)."""
        vector = np.asarray(vector)
        return cls(vector[: len(CHECKS)] > 0.5, vector[len(CHECKS) :])

    @property
    def ok(self) -> bool:
        return bool(self.flags.all())

    def passed(self, check: str) -> bool:
        return bool(self.flags[CHECKS.index(check)])

    def stat(self, name: str) -> float:
        return float(self.stats[STATS.index(name)])

    def first_failure(self) -> str | None:
        """The first check whose flag is False, or None when the step was fine."""
        return first_failure(self.flags)


def first_failure(flags: Sequence[bool]) -> str | None:
    """The first check (of ``CHECKS``) whose flag is False, or None when the step was fine."""
    for check, ok in zip(CHECKS, flags, strict=True):
        if not ok:
            return check
    return None


def stage_of(check: str) -> str:
    """The stage a failed check is reported at."""
    return STAGE_OF.get(check, check)
