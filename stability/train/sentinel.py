"""``NanSentinel``: the harness's NaN sentinel as a Keras callback, for any ``Model.fit``.

Keras' ``TerminateOnNaN`` looks at the loss alone. Inside ``tf.function`` a
``Dense(relu)`` fed NaN returns 0, so a model's weights can go NaN while its loss stays
finite, and ``TerminateOnNaN`` never fires. ``NanSentinel`` checks, after every batch, the
loss, the gradients and every weight; keeps the weights from before a failing update; and
replays the failing batch once with a per-op check to name the layer and op.

Usage::

    sentinel = NanSentinel()
    model.fit(x, y, epochs=100, callbacks=[sentinel])
    print(sentinel.result)  # {"first_nan_epoch": 31, "first_nan_where": "forward", ...}
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stability.core.results import NAN_FIELDS
from stability.train.checks import all_finite, nonfinite_weight_site
from stability.train.replay import NanSite, replay_step


class NanSentinel(keras.callbacks.Callback):
    """Stops ``fit`` at the first non-finite loss, gradient or weight, and names its source.

    It wraps the model's ``train_step`` to keep a copy of the current batch and the
    optimizer's ``apply_gradients`` to skip an update whose gradients are not finite (so
    the weights from before the failing step survive for the replay). Healthy batches pay
    one fused finiteness check of the weights and two small variable writes.

    After ``fit``, ``result`` holds the fields of the harness's result row:
    ``first_nan_epoch``, ``first_nan_step``, ``first_nan_where``, ``first_nan_layer``,
    ``first_nan_op`` and ``loss_nan_epoch`` (None where nothing happened).
    """

    def __init__(self, replay: bool = True):
        super().__init__()
        self.replay = replay
        self.result: dict[str, Any] = _empty_result()
        self._stash: list[tf.Variable] | None = None
        self._structure: Any = None
        self._gradients_finite: tf.Variable | None = None
        self._epoch = 0
        self._step = 0

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._gradients_finite = tf.Variable(True, trainable=False)
        self._wrap_train_step(model)
        # fit() builds its train function after set_model and only if none is cached:
        # drop a cached one so the wrapped step is the one that gets traced.
        model.train_function = None
        self._weights_finite = tf.function(lambda: all_finite(model.weights))

    def _wrap_train_step(self, model: keras.Model) -> None:
        train_step = type(model).train_step.__get__(model)

        def sentinel_train_step(data: Any) -> Any:
            self._keep(data)
            self._wrap_apply(model.optimizer)
            return train_step(data)

        model.train_step = sentinel_train_step

    def _keep(self, data: Any) -> None:
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

    def _wrap_apply(self, optimizer: keras.optimizers.Optimizer) -> None:
        if getattr(optimizer, "_stability_guarded", False):
            return
        apply_gradients = optimizer.apply_gradients
        flag = self._gradients_finite

        def guarded_apply_gradients(grads_and_vars: Any) -> Any:
            grads_and_vars = list(grads_and_vars)
            healthy = all_finite([g for g, _ in grads_and_vars])
            flag.assign(healthy)
            # Skip a non-finite update: the weights from before the failing step are what
            # the replay needs, and training stops right after this batch anyway.
            tf.cond(healthy, lambda: _applied(apply_gradients, grads_and_vars), tf.no_op)

        optimizer.apply_gradients = guarded_apply_gradients
        optimizer._stability_guarded = True

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._step += 1
        loss = (logs or {}).get("loss")
        loss_finite = loss is None or bool(np.isfinite(np.asarray(loss)).all())
        gradients_finite = bool(self._gradients_finite.numpy())
        weights_finite = bool(self._weights_finite().numpy())
        if loss_finite and gradients_finite and weights_finite:
            return
        if not loss_finite and self.result["loss_nan_epoch"] is None:
            self.result["loss_nan_epoch"] = self._epoch
        if self.result["first_nan_epoch"] is None:
            site = self._locate(loss_finite, gradients_finite)
            self.result.update(
                first_nan_epoch=self._epoch,
                first_nan_step=self._step,
                first_nan_where=site.where,
                first_nan_layer=site.layer,
                first_nan_op=site.op,
            )
        self.model.stop_training = True

    def _locate(self, loss_finite: bool, gradients_finite: bool) -> NanSite:
        if loss_finite and gradients_finite:
            return nonfinite_weight_site(self.model.trainable_variables, self.model.optimizer)
        stage = NanSite("loss" if not loss_finite else "gradient")
        if not self.replay or self._stash is None:
            return stage
        data = tf.nest.pack_sequence_as(self._structure, [v.value() for v in self._stash])
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        model = self.model
        site = replay_step(
            model,
            lambda y_pred: model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight),
            x,
        )
        return site or stage


def _applied(apply_gradients: Any, grads_and_vars: list) -> tf.Operation:
    apply_gradients(grads_and_vars)
    return tf.no_op()


def _empty_result() -> dict[str, Any]:
    return dict.fromkeys(NAN_FIELDS)
