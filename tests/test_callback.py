"""NanSentinel on plain Keras models that are not GNNs."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from stability import NanSentinel

BATCH = 32

#: The pruned entry of ``PrunedDense``'s kernel, and the optimizer step (1-based, counted
#: from the start of ``fit``) in whose update ``NaNAtStep`` writes NaN into it: in the
#: second epoch, after finite steps, so that both the step and the epoch must be found.
PRUNED = (0, 0)
NAN_STEP = 11


@keras.saving.register_keras_serializable(package="stability_tests")
class PlantedExp(keras.layers.Layer):
    """exp(50 x): overflows float32 once x > 1.77."""

    def call(self, x):
        return tf.exp(50.0 * x)


@keras.saving.register_keras_serializable(package="stability_tests")
class PrunedDense(keras.layers.Layer):
    """``x @ where(keep, kernel, 0)``: a dense layer whose kernel entry ``PRUNED`` is pruned.

    A select does no arithmetic on the entry it drops, so that entry reaches neither the
    output nor any gradient but its own (exactly 0), NaN or not, on every machine. A mask
    multiplied in would not do: NaN * 0 = NaN.
    """

    def __init__(self, units, kernel_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.kernel_constraint = units, kernel_constraint

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="glorot_uniform",
            constraint=self.kernel_constraint,
            name="kernel",
        )

    def call(self, x):
        keep = np.ones(self.kernel.shape, bool)
        keep[PRUNED] = False
        return tf.matmul(x, tf.where(keep, self.kernel, tf.zeros(self.kernel.shape)))


class NaNAtStep(keras.constraints.Constraint):
    """Writes NaN into the kernel entry ``PRUNED`` in the update of optimizer step ``step``.

    Keras applies a weight's constraint inside the optimizer's update, after the gradient
    step, so the failing update is the step's own, and where and when it fails is set by
    counting updates, not by a training trajectory's rounding. Later updates keep the NaN
    (Adam subtracts a finite step from it).
    """

    def __init__(self, step):
        self.step = step
        self.updates = tf.Variable(0, trainable=False)

    def __call__(self, kernel):
        count = self.updates.assign_add(1)
        planted = tf.tensor_scatter_nd_update(kernel, [PRUNED], [math.nan])
        return tf.where(count == self.step, planted, kernel)


def model_with(planted: keras.layers.Layer) -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="first")(inputs)
    hidden = planted(hidden)
    # Whether this relu maps a NaN input to 0 depends on the CPU's kernel: no test relies on it.
    hidden = keras.layers.Dense(8, activation="relu", name="relu")(hidden)
    outputs = keras.layers.Dense(1, name="out")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


@pytest.fixture
def data():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(scale=2.0, size=(256, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def all_weights_finite(model):
    return all(np.isfinite(w).all() for w in model.get_weights())


def test_planted_overflow_is_named(data):
    model = model_with(PlantedExp(name="planted_exp"))
    sentinel = NanSentinel()
    history = model.fit(*data, epochs=3, batch_size=BATCH, verbose=0, callbacks=[sentinel])
    assert sentinel.result["first_nan_step"] == 1
    assert sentinel.result["first_nan_where"] == "forward"
    assert sentinel.result["first_nan_layer"] == "planted_exp"
    assert sentinel.result["first_nan_op"].startswith("Exp ")
    assert len(history.history["loss"]) == 1, "training must stop at the first NaN"
    assert all_weights_finite(model), "the failing update must not have been applied"


def silent_model():
    """``model_with`` a ``PrunedDense`` whose update writes NaN into its pruned entry at
    step ``NAN_STEP``: the weights go NaN, and the loss stays finite by construction."""
    return model_with(PrunedDense(8, kernel_constraint=NaNAtStep(NAN_STEP), name="pruned"))


def epoch_of(step, data):
    return (step - 1) // math.ceil(len(data[0]) / BATCH) + 1


def test_terminate_on_nan_misses_weights_going_nan_behind_a_finite_loss(data):
    model = silent_model()
    history = model.fit(
        *data, epochs=3, batch_size=BATCH, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()]
    )
    assert epoch_of(NAN_STEP, data) < 3, "the planted step must come before the last epoch"
    assert len(history.history["loss"]) == 3, "TerminateOnNaN stopped: the case is not silent"
    assert np.isfinite(history.history["loss"]).all()
    assert not all_weights_finite(model), "the weights were expected to go NaN"


def test_sentinel_catches_weights_going_nan_behind_a_finite_loss(data):
    model = silent_model()
    sentinel = NanSentinel()
    history = model.fit(*data, epochs=3, batch_size=BATCH, verbose=0, callbacks=[sentinel])
    result = sentinel.result
    assert (result["first_nan_epoch"], result["first_nan_step"]) == (
        epoch_of(NAN_STEP, data),
        NAN_STEP,
    )
    assert (result["first_nan_where"], result["first_nan_layer"]) == ("weights", "pruned")
    assert result["first_nan_op"] == f"{type(model.optimizer).__name__} update"
    assert result["loss_nan_epoch"] is None, "the loss stayed finite"
    assert np.isfinite(history.history["loss"]).all()
    assert len(history.history["loss"]) == epoch_of(NAN_STEP, data), "training must stop there"


def test_healthy_training_is_left_alone(data):
    model = model_with(keras.layers.Activation("tanh", name="tanh"))
    sentinel = NanSentinel()
    history = model.fit(*data, epochs=2, batch_size=BATCH, verbose=0, callbacks=[sentinel])
    assert len(history.history["loss"]) == 2
    assert sentinel.result["first_nan_epoch"] is None
