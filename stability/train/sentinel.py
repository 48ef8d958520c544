"""``NanSentinel``: the harness's failure sentinel as a Keras callback, for any ``Model.fit``.

Keras' ``TerminateOnNaN`` looks at the loss alone. Inside ``tf.function`` a
``Dense(relu)`` fed NaN returns 0, so a model's weights can go NaN while its loss stays
finite, and ``TerminateOnNaN`` never fires. ``NanSentinel`` runs the harness's own step
guard (``stability.train.guard``, the trainer's checks in the trainer's order) in every
training step: the model's forward tensors (where it exposes them), the attention
normalization invariant (where it exposes its attention weights with their receivers), the
loss, the raw gradients (before the optimizer clips them), and after the update every weight
and the optimizer's own variables (Adam's second moment overflows before any weight does).
It keeps the weights from before a failing update, and replays the failing batch once with
a per-op check to name the layer and op.

Usage::

    sentinel = NanSentinel()
    model.fit(x, y, epochs=100, callbacks=[sentinel])
    print(sentinel.result)  # {"first_nan_epoch": 31, "first_nan_where": "forward", ...}

The checks run inside the compiled step, so they are right under ``steps_per_execution > 1``
(the first failing step is counted in optimizer steps, and the steps after it in the same
execution update nothing) and under ``jit_compile`` (``True`` or ``"auto"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from stability.core.failures import Failure, Kind
from stability.core.results import NAN_FIELDS
from stability.train import guard
from stability.train.cause import failure_cause
from stability.train.checks import nonfinite_weight_site, normalization_site
from stability.train.diagnosis import failure_of
from stability.train.forward import completed, forward, stats_dtype
from stability.train.guard import REPORT_SIZE, StepReport
from stability.train.guarded_optimizer import GuardedOptimizer
from stability.train.keras_private import COMPUTE_LOSS_ARGS
from stability.train.replay import replay_step
from stability.train.site import NanSite
from stability.train.update_replay import nonfinite_state

#: ``first_nan_op`` under XLA: the batch cannot be kept in a variable (XLA fixes a resource
#: variable's shape), so there is nothing to replay.
XLA_NOT_REPLAYED = "not named under XLA (the failing batch cannot be kept)"


class NanSentinelError(RuntimeError):
    """Raised by ``NanSentinel(raise_error=True)`` at the first failure (a RuntimeError,
    as Keras' ``TerminateOnNaN(raise_error=True)`` raises)."""


class NanSentinel(keras.callbacks.Callback):
    """Stops ``fit`` at the first numerical failure and names its source.

    For the length of ``fit`` the sentinel puts the model's optimizer behind a
    ``GuardedOptimizer`` (the wrapper pattern of Keras' ``LossScaleOptimizer``), whose
    ``apply`` every Keras ``train_step`` calls with the step's raw gradients: there it runs
    the step guard and applies the update only if every check before it passed, so the
    weights from before the failing step survive for the replay. It reads the step's loss,
    predictions and batch through the model's ``compute_loss``, and its attention through
    ``forward`` where the model has one. It restores all of them when training ends, so one
    sentinel can watch several ``fit`` calls and models, and a new sentinel on the same model
    sees everything afresh.

    After ``fit``, ``result`` holds the fields of the harness's result row:
    ``first_nan_epoch``, ``first_nan_step`` (counted in optimizer steps from the start of
    that ``fit``), ``first_nan_where``, ``first_nan_layer``, ``first_nan_op``,
    ``loss_nan_epoch``, ``failure_kind`` and ``failure_cause`` (None where nothing happened).
    An update failure is not replayed here (the state before the step is gone); its cause is
    read from the failing step's largest |gradient|: ``gradient explosion`` at sqrt(max) of
    the weights' dtype and above, where Adam's ``g * g`` overflows, else ``optimizer``.
    ``report`` is the failing step's ``StepReport`` (its flags and statistics), and
    ``failure`` its failure record (``stability.core.failures.Failure``), or None.

    Args:
        replay: replay the failing batch to name the layer and op.
        raise_error: raise ``NanSentinelError`` instead of stopping training gracefully.
        verbose: print one line when training is stopped (as ``TerminateOnNaN`` does).
    """

    def __init__(self, replay: bool = True, raise_error: bool = False, verbose: bool = True):
        super().__init__()
        self.replay, self.raise_error, self.verbose = replay, raise_error, verbose
        self.result: dict[str, Any] = _empty_result()
        self.report: StepReport | None = None
        self.failure: Failure | None = None
        self._stash: list[tf.Variable] | None = None
        self._structure: Any = None
        self._captured: dict[str, Any] = {}
        self._epoch = 0
        self._restore: list[tuple[Any, str, Any]] = []
        self._optimizer: keras.optimizers.Optimizer | None = None

    # --- wiring ---------------------------------------------------------------------------

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._unwrap()
        self.result, self.report, self.failure = _empty_result(), None, None
        with tf.init_scope():
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._failed_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
            # float64 holds any step's report exactly (a float32 one, or a float64 model's),
            # and the model's weights may not exist yet to say which it will be.
            self._failed_report = tf.Variable(tf.ones([REPORT_SIZE], tf.float64), trainable=False)
        self._stash, self._structure = None, None
        self._exact = bool(getattr(model, "jit_compile", False))
        self._keeps_batch = not self._exact
        if hasattr(model, "forward"):
            self._patch(model, "forward", self._capturing(model.forward))
        self._patch(model, "compute_loss", self._capturing_loss(model.compute_loss))
        if getattr(model, "optimizer", None) is not None:  # compiled: fit can train it
            self._optimizer = model.optimizer
            wrapped = GuardedOptimizer(self._optimizer, self._guard_step(model, self._optimizer))
            self._patch(model, "optimizer", wrapped)
            # fit() builds its train function only if none is cached: build it afresh, so
            # the step that gets traced is the one whose calls are wrapped.
            model.make_train_function(force=True)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        had = name in vars(owner)
        self._restore.append((owner, name, vars(owner)[name] if had else None))
        setattr(owner, name, replacement)

    def _unwrap(self) -> None:
        for owner, name, original in reversed(self._restore):
            if original is None:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, original)
        self._restore = []

    def _capturing(self, forward_pass: Any) -> Any:
        """``model.forward`` that also hands its outputs to the step being traced."""

        def captured_forward(*args: Any, **kwargs: Any) -> Any:
            out = forward_pass(*args, **kwargs)
            self._captured = dict(out) if isinstance(out, dict) else {}
            return out

        return captured_forward

    def _capturing_loss(self, compute_loss: Any) -> Any:
        """``model.compute_loss`` that hands the step's batch, predictions and loss to the
        step being traced, and keeps the batch (for the replay) while no step has failed."""

        def captured_compute_loss(*args: Any, **kwargs: Any) -> Any:
            # Keras calls compute_loss(x, y, y_pred, sample_weight, ...), positionally.
            named = dict(zip(COMPUTE_LOSS_ARGS, args, strict=False))
            named.update(kwargs)
            loss = compute_loss(*args, **kwargs)
            captured = dict(self._captured)
            if "predictions" not in captured and named.get("y_pred") is not None:
                captured["predictions"] = named["y_pred"]
            captured["_x"], captured["_loss"] = named.get("x"), loss
            self._captured = captured
            if self._keeps_batch:
                batch = keras.utils.pack_x_y_sample_weight(
                    named.get("x"), named.get("y"), named.get("sample_weight")
                )
                tf.cond(self._failed_step < 0, lambda: self._keep(batch), tf.no_op)
            return loss

        return captured_compute_loss

    def _guard_step(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer
    ) -> Callable[[list, list | None, Callable[[], Any]], None]:
        """The step guard ``GuardedOptimizer`` runs around ``optimizer``'s update."""

        def guard_step(grads: list, variables: list | None, update: Callable[[], Any]) -> None:
            dtype = stats_dtype(model.trainable_variables)
            captured, self._captured = self._captured, {}
            loss = captured.pop("_loss", None)
            x = captured.pop("_x", None)
            # Raw gradients, as the step computed them: the optimizer's own clipping
            # (clipnorm, clipvalue) has not run yet, so it cannot hide a NaN.
            before = guard.before_update(
                completed(captured),
                x,
                tf.constant(0.0) if loss is None else loss,
                grads,
                exact=self._exact,
                dtype=dtype,
            )
            # Skip a failing update, and every update after it in the same execution: the
            # weights from before the failing step are what the replay needs.
            guard.guarded(before.healthy & (self._failed_step < 0), update)
            weights_ok, max_abs_weight = guard.after_update(
                model.trainable_variables if variables is None else variables,
                guard.optimizer_state(optimizer),
                exact=self._exact,
                dtype=dtype,
            )
            vector = guard.report(before, weights_ok, max_abs_weight)
            self._steps.assign_add(1)
            first = (self._failed_step < 0) & ~tf.reduce_all(vector[: len(guard.CHECKS)] > 0.5)
            tf.cond(first, lambda: self._mark(vector), tf.no_op)

        return guard_step

    def _mark(self, vector: tf.Tensor) -> tf.Operation:
        self._failed_step.assign(self._steps)
        self._failed_report.assign(tf.cast(vector, tf.float64))
        return tf.no_op()

    def _keep(self, data: Any) -> tf.Operation:
        """Copy the batch into variables (made once, shape-free, outside the graph)."""
        leaves = tf.nest.flatten(data)
        if self._stash is None:
            with tf.init_scope():
                self._stash = [
                    tf.Variable(
                        tf.zeros([0] * leaf.shape.rank, leaf.dtype),
                        shape=tf.TensorShape(None),
                        trainable=False,
                    )
                    for leaf in leaves
                ]
            self._structure = data
        for variable, leaf in zip(self._stash, leaves, strict=True):
            variable.assign(leaf)
        return tf.no_op()

    # --- callbacks ------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.result, self.report, self.failure = _empty_result(), None, None
        self._steps.assign(0)
        self._failed_step.assign(-1)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._unwrap()
        if getattr(self.model, "optimizer", None) is not None:
            self.model.make_train_function(force=True)  # a later fit traces it unwatched

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        failed_step = int(self._failed_step.numpy())
        if failed_step < 0 or self.result["first_nan_epoch"] is not None:
            return
        report = StepReport.of(self._failed_report.numpy())
        self.report = report
        check = report.first_failure()
        if not report.passed("loss"):
            self.result["loss_nan_epoch"] = self._epoch
        site = self._locate(check)
        kind = Kind.NORMALIZATION if check == "attention" else Kind.NONFINITE
        largest = report.stat("max_abs_grad")
        cause = failure_cause(
            kind.value, site, self._weights_dtype(), largest if math.isfinite(largest) else None
        )
        self.failure = failure_of(site, kind, cause, self._epoch, failed_step, report)
        columns = self.failure.columns()
        self.result.update({name: columns[name] for name in self.result if name in columns})
        self._stop(site, failed_step)

    def _stop(self, site: NanSite, failed_step: int) -> None:
        line = (
            f"NanSentinel: epoch {self._epoch}, step {failed_step}: "
            f"{self.result['failure_kind']} ({self.result['failure_cause']}) at {site.where}"
            f" ({site.layer or '-'}: {site.op or '-'}); training stopped"
        )
        if self.raise_error:
            self._unwrap()
            raise NanSentinelError(line)
        if self.verbose:
            print(line)
        self.model.stop_training = True

    def _weights_dtype(self) -> str:
        weights = self.model.trainable_variables
        return tf.as_dtype(weights[0].dtype).name if weights else "float32"

    # --- naming ---------------------------------------------------------------------------

    def _locate(self, check: str) -> NanSite:
        stage = guard.stage_of(check)
        model = self.model
        if check == "weights":
            return nonfinite_state_site(model.trainable_variables, self._optimizer)
        if not self._keeps_batch:
            return NanSite(stage, None, XLA_NOT_REPLAYED)
        if not self.replay or self._stash is None:
            return NanSite(stage)
        data = tf.nest.pack_sequence_as(self._structure, [v.value() for v in self._stash])
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if check == "attention":
            # The step's own forward pass, with its training flag, from the kept weights.
            out = forward(model, x, training=True)
            receivers = out["receivers"]
            site = normalization_site(
                "forward",
                [a.numpy() for a in out["alpha"][: len(receivers)]],
                [r.numpy() for r in receivers],
                out["attention_layers"],
            )
            return site or NanSite(stage, None, "softmax normalization")
        site = replay_step(
            model,
            lambda y_pred: model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight),
            x,
            predict=lambda inputs: model(inputs, training=True),
        )
        return site or NanSite(stage)


def nonfinite_state_site(weights: list, optimizer: keras.optimizers.Optimizer) -> NanSite:
    """The site of an update that left a weight, or only the optimizer's state, non-finite:
    the weight's layer, or the first non-finite optimizer variable (e.g. Adam's second
    moment, ``velocity``, of a weight whose ``g * g`` overflowed)."""
    site = nonfinite_weight_site(weights, optimizer)
    stale = nonfinite_state(optimizer) if site.layer is None else None
    return site if stale is None else NanSite("weights", None, f"{site.op}: {stale} not finite")


def _empty_result() -> dict[str, Any]:
    return {**dict.fromkeys(NAN_FIELDS), "failure_kind": None, "failure_cause": None}
