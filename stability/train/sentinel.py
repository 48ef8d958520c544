"""``NanSentinel``: the harness's failure sentinel as a Keras callback, for any ``Model.fit``.

Keras' ``TerminateOnNaN`` looks at the loss alone. Inside ``tf.function`` a
``Dense(relu)`` fed NaN returns 0, so a model's weights can go NaN while its loss stays
finite, and ``TerminateOnNaN`` never fires. ``NanSentinel`` checks, in every training step,
the model's forward tensors (where it exposes them), the attention normalization invariant
(where it exposes its attention weights with their receivers), the loss, the raw gradients
(before the optimizer clips them) and every weight; keeps the weights from before a failing
update; and replays the failing batch once with a per-op check to name the layer and op.

Usage::

    sentinel = NanSentinel()
    model.fit(x, y, epochs=100, callbacks=[sentinel])
    print(sentinel.result)  # {"first_nan_epoch": 31, "first_nan_where": "forward", ...}

The checks run inside the compiled step, so they are right under ``steps_per_execution > 1``
(the first failing step is counted in optimizer steps, and the steps after it in the same
execution update nothing) and under ``jit_compile`` (``True`` or ``"auto"``).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from stability.core.results import NAN_FIELDS
from stability.train.cause import failure_cause
from stability.train.checks import (
    all_finite,
    attention_ok,
    nonfinite_weight_site,
    normalization_site,
)
from stability.train.replay import NanSite, replay_step

#: The checks the sentinel runs each step, in causal order, and the stage each reports.
SENTINEL_CHECKS = ("forward", "attention", "loss", "gradient", "weights")
_STAGE = {"attention": "forward"}

#: ``first_nan_op`` under XLA: the batch cannot be kept in a variable (XLA fixes a resource
#: variable's shape), so there is nothing to replay.
XLA_NOT_REPLAYED = "not named under XLA (the failing batch cannot be kept)"


class NanSentinelError(RuntimeError):
    """Raised by ``NanSentinel(raise_error=True)`` at the first failure (a RuntimeError,
    as Keras' ``TerminateOnNaN(raise_error=True)`` raises)."""


class NanSentinel(keras.callbacks.Callback):
    """Stops ``fit`` at the first numerical failure and names its source.

    It wraps the model's ``train_step`` (to check each step and keep the batch) and its
    optimizer's ``apply_gradients`` (to skip an update that follows a failure, so the
    weights from before the failing step survive for the replay), and restores both when
    training ends, so one sentinel can watch several ``fit`` calls and models, and a new
    sentinel on the same model sees everything afresh.

    After ``fit``, ``result`` holds the fields of the harness's result row:
    ``first_nan_epoch``, ``first_nan_step`` (counted in optimizer steps from the start of
    that ``fit``), ``first_nan_where``, ``first_nan_layer``, ``first_nan_op``,
    ``loss_nan_epoch``, ``failure_kind`` and ``failure_cause`` (None where nothing happened;
    an update failure is not replayed here, so its cause is ``optimizer`` unless the
    trainer names it).

    Args:
        replay: replay the failing batch to name the layer and op.
        raise_error: raise ``NanSentinelError`` instead of stopping training gracefully.
        verbose: print one line when training is stopped (as ``TerminateOnNaN`` does).
    """

    def __init__(self, replay: bool = True, raise_error: bool = False, verbose: bool = True):
        super().__init__()
        self.replay, self.raise_error, self.verbose = replay, raise_error, verbose
        self.result: dict[str, Any] = _empty_result()
        self._stash: list[tf.Variable] | None = None
        self._structure: Any = None
        self._captured: dict[str, Any] = {}
        self._epoch = 0
        self._restore: list[tuple[Any, str, Any]] = []

    # --- wiring ---------------------------------------------------------------------------

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._unwrap()
        self.result = _empty_result()
        with tf.init_scope():
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._failed_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self._failed_flags = tf.Variable([True] * len(SENTINEL_CHECKS), trainable=False)
            self._step_ok = tf.Variable([True] * 3, trainable=False)
        self._stash, self._structure = None, None
        self._keeps_batch = not bool(getattr(model, "jit_compile", False))
        self._wrap(model)
        # fit() builds its train function after set_model and only if none is cached:
        # drop a cached one so the wrapped step is the one that gets traced.
        model.train_function = None

    def _wrap(self, model: keras.Model) -> None:
        train_step = model.train_step
        self._patch(model, "train_step", self._checked_step(model, train_step))
        if hasattr(model, "forward"):
            self._patch(model, "forward", self._capturing(model.forward))
        self._patch(model, "compute_loss", self._capturing_predictions(model.compute_loss))

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

    def _capturing(self, forward: Any) -> Any:
        """``model.forward`` that also hands its outputs to the step being traced."""

        def captured_forward(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            self._captured = out if isinstance(out, dict) else {}
            return out

        return captured_forward

    def _capturing_predictions(self, compute_loss: Any) -> Any:
        """``model.compute_loss`` that hands ``y_pred`` to the step being traced, for a
        model without ``forward``."""

        def captured_compute_loss(*args: Any, **kwargs: Any) -> Any:
            # Keras calls compute_loss(x, y, y_pred, sample_weight, ...), positionally.
            y_pred = kwargs.get("y_pred", args[2] if len(args) > 2 else None)
            if "predictions" not in self._captured and y_pred is not None:
                self._captured = {**self._captured, "predictions": y_pred}
            return compute_loss(*args, **kwargs)

        return captured_compute_loss

    def _checked_step(self, model: keras.Model, train_step: Any) -> Any:
        def sentinel_train_step(data: Any) -> Any:
            healthy_so_far = self._failed_step < 0
            if self._keeps_batch:
                tf.cond(healthy_so_far, lambda: self._keep(data), tf.no_op)
            self._captured = {}
            self._wrap_apply(model.optimizer)
            logs = train_step(data)
            self._optimizer_unwrap(model.optimizer)
            loss = logs.get("loss") if isinstance(logs, dict) else None
            before = tf.unstack(self._step_ok.read_value())
            flags = tf.stack(
                [
                    before[0],
                    before[1],
                    all_finite([] if loss is None else [loss]),
                    before[2],
                    all_finite(model.trainable_variables),
                ]
            )
            self._steps.assign_add(1)
            first = healthy_so_far & ~tf.reduce_all(flags)
            tf.cond(first, lambda: self._mark(flags), tf.no_op)
            return logs

        return sentinel_train_step

    def _mark(self, flags: tf.Tensor) -> tf.Operation:
        self._failed_step.assign(self._steps)
        self._failed_flags.assign(flags)
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

    def _wrap_apply(self, optimizer: keras.optimizers.Optimizer) -> None:
        apply_gradients = optimizer.apply_gradients

        def guarded_apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            grads_and_vars = list(grads_and_vars)
            out = self._captured
            watched = [
                *tf.nest.flatten(out.get("predictions")),
                *(out.get("alpha") or []),
                *(out.get("logits") or []),
            ]
            # Multi-output models may predict integers or leave outputs out: float ones only.
            forward_ok = all_finite(
                [t for t in watched if t is not None and tf.as_dtype(t.dtype).is_floating]
            )
            receivers = list(out.get("receivers") or [])
            normalized = (
                attention_ok(list(out.get("alpha") or [])[: len(receivers)], receivers)
                if receivers
                else tf.constant(True)
            )
            # Raw gradients, as the step computed them: the optimizer's own clipping
            # (clipnorm, clipvalue) has not run yet, so it cannot hide a NaN.
            gradients_ok = all_finite([g for g, _ in grads_and_vars if g is not None])
            self._step_ok.assign(tf.stack([forward_ok, normalized, gradients_ok]))
            healthy = forward_ok & normalized & gradients_ok & (self._failed_step < 0)
            # Skip a failing update, and every update after it in the same execution: the
            # weights from before the failing step are what the replay needs.
            tf.cond(
                healthy,
                lambda: _applied(apply_gradients, grads_and_vars, *args, **kwargs),
                tf.no_op,
            )

        optimizer.apply_gradients = guarded_apply_gradients

    def _optimizer_unwrap(self, optimizer: keras.optimizers.Optimizer) -> None:
        # The wrapper lives only while the step is traced: a second sentinel on the same
        # optimizer wraps the original, never this one.
        if "apply_gradients" in vars(optimizer):
            del optimizer.apply_gradients

    # --- callbacks ------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.result = _empty_result()
        self._steps.assign(0)
        self._failed_step.assign(-1)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._unwrap()
        self.model.train_function = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        failed_step = int(self._failed_step.numpy())
        if failed_step < 0 or self.result["first_nan_epoch"] is not None:
            return
        flags = self._failed_flags.numpy()
        check = next(c for c, ok in zip(SENTINEL_CHECKS, flags, strict=True) if not ok)
        if check == "loss" or not flags[SENTINEL_CHECKS.index("loss")]:
            self.result["loss_nan_epoch"] = self._epoch
        site = self._locate(check)
        self.result.update(
            first_nan_epoch=self._epoch,
            first_nan_step=failed_step,
            first_nan_where=site.where,
            first_nan_layer=site.layer,
            first_nan_op=site.op,
            failure_kind="normalization" if check == "attention" else "nonfinite",
        )
        self.result["failure_cause"] = failure_cause(self.result["failure_kind"], site)
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

    # --- naming ---------------------------------------------------------------------------

    def _locate(self, check: str) -> NanSite:
        stage = _STAGE.get(check, check)
        model = self.model
        if check == "weights":
            return nonfinite_weight_site(model.trainable_variables, model.optimizer)
        if not self._keeps_batch:
            return NanSite(stage, None, XLA_NOT_REPLAYED)
        if not self.replay or self._stash is None:
            return NanSite(stage)
        data = tf.nest.pack_sequence_as(self._structure, [v.value() for v in self._stash])
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if check == "attention":
            out = model.forward(x)
            receivers = list(out.get("receivers") or [])
            alphas = list(out.get("alpha") or [])[: len(receivers)]
            names = list(out.get("attention_layers") or [])
            names += [f"attention_{k}" for k in range(len(names), len(alphas))]
            site = normalization_site(
                "forward",
                [a.numpy() for a in alphas],
                [r.numpy() for r in receivers],
                names,
            )
            return site or NanSite(stage, None, "softmax normalization")
        site = replay_step(
            model,
            lambda y_pred: model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight),
            x,
            predict=lambda inputs: model(inputs, training=True),
        )
        return site or NanSite(stage)


def _applied(apply_gradients: Any, grads_and_vars: list, *args: Any, **kwargs: Any) -> Any:
    apply_gradients(grads_and_vars, *args, **kwargs)
    return tf.no_op()


def _empty_result() -> dict[str, Any]:
    return {**dict.fromkeys(NAN_FIELDS), "failure_kind": None, "failure_cause": None}
